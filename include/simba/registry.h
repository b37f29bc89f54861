// File: simba/registry.h
//
// The composition root: maps a URI scheme to what that kind of store brings,
// so one URI picks a store for every API:
//
//   StoreEntry::open        its contention backend (simba/backend.h):
//                           open_backend("sqlite:///var/lib/app/simba.db"),
//                           MutexContendServiceFactory::open,
//                           ClusteredLockManager::open
//   StoreEntry::open_keyed  its keyed-lock backend (simba/keyed_backend.h),
//                           for KeyedLockProvider::open; by default leases on
//                           the store's mutexes
//   StoreEntry::schema      the DDL a DBA runs (SchemaSql), for SQL servers
//
// Adding a backend is a folder with the store's calls and one add() call
// in RegisterBuiltinBackends (src/registry/builtin_backends.cc).
//
// The default registry holds every backend compiled into this build
// (RegisterBuiltinBackends, generated from the CMake options). There is no
// static self-registration: static libraries drop objects nobody references.
// global(), open_backend() and register_builtin_backends() are in the `simba`
// library (simba::simba), which links the enabled backends; simba_core alone
// has the BackendRegistry class.
//
// Thread safety: a registry is safe to use from several threads.

#ifndef SIMBA_REGISTRY_H_
#define SIMBA_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "simba/backend.h"
#include "simba/keyed_backend.h"
#include "simba/status.h"
#include "simba/uri.h"

namespace simba {

struct KeyedLockOptions;

class BackendRegistry {
 public:
  using Opener = std::function<Result<std::shared_ptr<Backend>>(const Uri&)>;
  // Opens the keyed-lock backend of a URI; `options` are the provider's
  // (lease, metrics, events).
  using KeyedOpener = std::function<Result<std::shared_ptr<KeyedLockBackend>>(
      const Uri&, const KeyedLockOptions& options)>;
  using SchemaMaker = std::function<Result<std::string>(const Uri&)>;

  // Everything one scheme brings.
  struct StoreEntry {
    // Required.
    Opener open;
    // Empty: keys are leases on the store's mutexes (NewLeaseKeyedLockBackend
    // over open()).
    KeyedOpener open_keyed;
    // Empty: the store has no table for a DBA to create (kUnimplemented).
    SchemaMaker schema;
  };

  // Adds `scheme` (lower-cased first). kAlreadyExists if it is registered
  // already; kInvalidArgument for a scheme Uri::parse would not accept or an
  // empty opener.
  Status add(std::string scheme, StoreEntry entry);
  // add(scheme, StoreEntry{opener}).
  Status add(std::string scheme, Opener opener);

  // Parses `uri` and calls its scheme's opener with the result, without
  // holding the registry's lock. kInvalidArgument for a malformed URI;
  // kUnimplemented for an unknown scheme, listing the registered schemes; the
  // opener's own error prefixed with "opening <uri>" (password hidden);
  // kInternal if the opener returns a null backend.
  Result<std::shared_ptr<Backend>> open(std::string_view uri) const;

  // The keyed-lock backend of `uri`: its scheme's open_keyed, or leases on
  // what open(uri) opens. Errors as Open's, or the keyed opener's own.
  Result<std::shared_ptr<KeyedLockBackend>> open_keyed(std::string_view uri,
                                                       const KeyedLockOptions& options) const;

  // The DDL of `uri`'s scheme (its query keys applied). kUnimplemented for a
  // scheme without one (or not registered); kInvalidArgument for a bad URI.
  Result<std::string> schema(std::string_view uri) const;

  // The registered schemes, sorted.
  std::vector<std::string> schemes() const;

  // The process-wide registry, filled with the built-in backends on first use
  // and never destroyed. More schemes may be registered into it.
  static BackendRegistry& global();

 private:
  // The entry of `uri`'s scheme, or kUnimplemented listing the schemes.
  Result<StoreEntry> find(const Uri& uri) const;

  mutable std::mutex mu_;
  std::map<std::string, StoreEntry, std::less<>> entries_;
};

// Registers every backend compiled into this build.
Status register_builtin_backends(BackendRegistry& registry);

// BackendRegistry::global().open(uri).
Result<std::shared_ptr<Backend>> open_backend(std::string_view uri);

// The DDL a DBA runs to create the table of the SQL store `uri` names (its
// `table` query key included), for when the backend may not create it:
// BackendRegistry::global().schema(uri). kUnimplemented for stores without
// a schema to hand out; kInvalidArgument for a bad URI.
Result<std::string> schema_sql(std::string_view uri);

}  // namespace simba

#endif  // SIMBA_REGISTRY_H_
