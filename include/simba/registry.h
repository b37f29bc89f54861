// File: simba/registry.h
//
// Maps a URI scheme to the function that opens that kind of store, so one URI
// picks a store:  OpenBackend("sqlite:///var/lib/app/simba.db").
//
// The default registry holds every backend compiled into this build
// (RegisterBuiltinBackends, generated from the CMake options). There is no
// static self-registration: static libraries drop objects nobody references.
// Default(), OpenBackend() and RegisterBuiltinBackends() are in the `simba`
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
#include "simba/status.h"
#include "simba/uri.h"

namespace simba {

class BackendRegistry {
 public:
  using Opener = std::function<Result<std::shared_ptr<Backend>>(const Uri&)>;

  // Adds `scheme` (lower-cased first). kAlreadyExists if it is registered
  // already; kInvalidArgument for a scheme Uri::Parse would not accept or an
  // empty opener.
  Status Register(std::string scheme, Opener opener);

  // Parses `uri` and calls its scheme's opener with the result, without
  // holding the registry's lock. kInvalidArgument for a malformed URI;
  // kUnimplemented for an unknown scheme, listing the registered schemes; the
  // opener's own error prefixed with "opening <uri>" (password hidden);
  // kInternal if the opener returns a null backend.
  Result<std::shared_ptr<Backend>> Open(std::string_view uri) const;

  // The registered schemes, sorted.
  std::vector<std::string> Schemes() const;

  // The process-wide registry, filled with the built-in backends on first use
  // and never destroyed. More schemes may be registered into it.
  static BackendRegistry& Default();

 private:
  mutable std::mutex mu_;
  std::map<std::string, Opener, std::less<>> openers_;
};

// Registers every backend compiled into this build.
Status RegisterBuiltinBackends(BackendRegistry& registry);

// BackendRegistry::Default().Open(uri).
Result<std::shared_ptr<Backend>> OpenBackend(std::string_view uri);

// The DDL a DBA runs to create the table of the SQL store `uri` names (its
// `table` query key included), for when the backend may not create it.
// kUnimplemented for stores without a schema to hand out; kInvalidArgument
// for a bad URI.
Result<std::string> SchemaSql(std::string_view uri);

}  // namespace simba

#endif  // SIMBA_REGISTRY_H_
