// The composition root: the backends compiled into this build (one registry
// entry per store), the process-wide registry that holds them, and the
// open(uri) doors of the public APIs. This file belongs to the `simba` library, not simba_core: it
// references every enabled backend library, and simba_core must not depend
// on them (they depend on it).

#include <cstdio>
#include <cstdlib>
#include <string>
#include <memory>
#include <utility>

#include "simba/backends/memory.h"
#include "simba/clustered_lock.h"
#include "simba/contend_service.h"
#include "simba/internal/backends_config.h"
#include "simba/keyed_lock.h"
#include "simba/registry.h"

#if SIMBA_HAVE_SQLITE
#include "simba/backends/sqlite.h"
#endif
#if SIMBA_HAVE_REDIS
#include "simba/backends/redis.h"
#endif
#if SIMBA_HAVE_POSTGRES
#include "simba/backends/postgres.h"
#include "simba/backends/postgres_keyed.h"
#endif
#if SIMBA_HAVE_MYSQL
#include "simba/backends/mysql.h"
#include "simba/backends/mysql_keyed.h"
#endif
#if SIMBA_HAVE_ZOOKEEPER
#include "simba/backends/zookeeper.h"
#endif
#if SIMBA_HAVE_ETCD
#include "simba/backends/etcd.h"
#endif
#if SIMBA_HAVE_POSTGRES || SIMBA_HAVE_MYSQL
#include "backends/sql/sql_backend.h"
#endif

namespace simba {
namespace {

// The entry of a store opened from its options, `from_uri` reading them: its
// keyed locks are leases on its mutexes (the default), it has no schema.
template <typename Options>
BackendRegistry::StoreEntry EntryOf(Result<Options> (*from_uri)(const Uri&),
                                       Result<std::shared_ptr<Backend>> (*open)(Options)) {
  return {[from_uri, open](const Uri& uri) -> Result<std::shared_ptr<Backend>> {
            SIMBA_ASSIGN_OR_RETURN(Options options, from_uri(uri));
            return open(std::move(options));
          },
          nullptr, nullptr};
}

#if SIMBA_HAVE_POSTGRES || SIMBA_HAVE_MYSQL
// A store's own keyed-lock backend, opened from its options, `from_uri`
// reading them.
template <typename Options>
BackendRegistry::KeyedOpener KeyedEntryOf(
    Result<Options> (*from_uri)(const Uri&),
    Result<std::shared_ptr<KeyedLockBackend>> (*open)(Options)) {
  return [from_uri, open](const Uri& uri,
                          const KeyedLockOptions&) -> Result<std::shared_ptr<KeyedLockBackend>> {
    SIMBA_ASSIGN_OR_RETURN(Options options, from_uri(uri));
    return open(std::move(options));
  };
}

// `ddl` for table `table` instead of simba_mutex.
std::string ForTable(std::string ddl, const std::string& table) {
  const std::string name = "simba_mutex";
  for (std::size_t at = ddl.find(name); at != std::string::npos; at = ddl.find(name, at)) {
    ddl.replace(at, name.size(), table);
    at += table.size();
  }
  return ddl;
}

// A SQL server's DDL for the table its URI names. The table name goes into
// the DDL as it is: only a name the backend itself would accept (a DBA pipes
// this into psql or mysql).
template <typename Options>
BackendRegistry::SchemaMaker SqlSchema(Result<Options> (*from_uri)(const Uri&),
                                       std::string (*ddl)()) {
  return [from_uri, ddl](const Uri& uri) -> Result<std::string> {
    SIMBA_ASSIGN_OR_RETURN(Options options, from_uri(uri));
    SIMBA_RETURN_IF_ERROR(internal::sql::ValidateTableName(options.table));
    return ForTable(ddl(), options.table);
  };
}
#endif

// Registers `entry` under each of `schemes`.
Status RegisterAs(BackendRegistry& registry, std::initializer_list<const char*> schemes,
                  const BackendRegistry::StoreEntry& entry) {
  for (const char* scheme : schemes) SIMBA_RETURN_IF_ERROR(registry.Register(scheme, entry));
  return OkStatus();
}

}  // namespace

// One entry per store: its contention backend, its keyed-lock backend when
// it is not leases on the mutexes, its schema when it has one.
Status RegisterBuiltinBackends(BackendRegistry& registry) {
  {
    BackendRegistry::StoreEntry memory = EntryOf(&MemoryOptionsFromUri, &NewMemoryBackend);
    memory.open_keyed = [](const Uri& uri,
                           const KeyedLockOptions&) -> Result<std::shared_ptr<KeyedLockBackend>> {
      SIMBA_ASSIGN_OR_RETURN(MemoryKeyedOptions options, MemoryKeyedOptionsFromUri(uri));
      return NewMemoryKeyedLockBackend(std::move(options));
    };
    SIMBA_RETURN_IF_ERROR(RegisterAs(registry, {"memory"}, memory));
  }
#if SIMBA_HAVE_SQLITE
  SIMBA_RETURN_IF_ERROR(
      RegisterAs(registry, {"sqlite"}, EntryOf(&SqliteOptionsFromUri, &NewSqliteBackend)));
#endif
#if SIMBA_HAVE_REDIS
  SIMBA_RETURN_IF_ERROR(
      RegisterAs(registry, {"redis"}, EntryOf(&RedisOptionsFromUri, &NewRedisBackend)));
#endif
#if SIMBA_HAVE_POSTGRES
  {
    // Keyed locks are the server's advisory locks.
    BackendRegistry::StoreEntry postgres =
        EntryOf(&PostgresOptionsFromUri, &NewPostgresBackend);
    postgres.open_keyed =
        KeyedEntryOf(&PostgresKeyedOptionsFromUri, &NewPostgresKeyedLockBackend);
    postgres.schema = SqlSchema(&PostgresOptionsFromUri, &PostgresSchemaSql);
    SIMBA_RETURN_IF_ERROR(RegisterAs(registry, {"postgresql", "postgres"}, postgres));
  }
#endif
#if SIMBA_HAVE_MYSQL
  {
    // Keyed locks are the server's GET_LOCK.
    BackendRegistry::StoreEntry mysql = EntryOf(&MysqlOptionsFromUri, &NewMysqlBackend);
    mysql.open_keyed = KeyedEntryOf(&MysqlKeyedOptionsFromUri, &NewMysqlKeyedLockBackend);
    mysql.schema = SqlSchema(&MysqlOptionsFromUri, &MysqlSchemaSql);
    SIMBA_RETURN_IF_ERROR(RegisterAs(registry, {"mysql", "mariadb"}, mysql));
  }
#endif
#if SIMBA_HAVE_ZOOKEEPER
  SIMBA_RETURN_IF_ERROR(RegisterAs(registry, {"zookeeper"},
                                   EntryOf(&ZookeeperOptionsFromUri, &NewZookeeperBackend)));
#endif
#if SIMBA_HAVE_ETCD
  SIMBA_RETURN_IF_ERROR(
      RegisterAs(registry, {"etcd"}, EntryOf(&EtcdOptionsFromUri, &NewEtcdBackend)));
#endif
  return OkStatus();
}

BackendRegistry& BackendRegistry::Default() {
  // Never destroyed, so a backend opened from another static's destructor at
  // exit still finds it.
  static BackendRegistry* const registry = [] {
    auto* filled = new BackendRegistry();
    if (const Status status = RegisterBuiltinBackends(*filled); !status.ok()) {
      // Only a programming error gets here (a duplicate or malformed built-in
      // scheme); there is no caller that could handle it.
      std::fprintf(stderr, "simba: registering the built-in backends failed: %s\n",
                   status.ToString().c_str());
      std::abort();
    }
    return filled;
  }();
  return *registry;
}

Result<std::shared_ptr<Backend>> OpenBackend(std::string_view uri) {
  return BackendRegistry::Default().Open(uri);
}

Result<std::string> SchemaSql(std::string_view uri) {
  return BackendRegistry::Default().Schema(uri);
}

// The open() doors of the public APIs: the default registry picks the store.

Result<std::unique_ptr<MutexContendServiceFactory>> MutexContendServiceFactory::open(
    std::string_view uri, FactoryOptions options) {
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, OpenBackend(uri));
  return create(std::move(backend), std::move(options));
}

Result<std::unique_ptr<ClusteredLockManager>> ClusteredLockManager::open(
    std::string_view uri, ClusteredLockOptions options) {
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, OpenBackend(uri));
  return create(std::move(backend), std::move(options));
}

Result<std::unique_ptr<KeyedLockProvider>> KeyedLockProvider::open(std::string_view uri,
                                                                   KeyedLockOptions options) {
  SIMBA_RETURN_IF_ERROR(options.lease.Validate());
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<KeyedLockBackend> backend,
                         BackendRegistry::Default().OpenKeyed(uri, options));
  return create(std::move(backend), std::move(options));
}

}  // namespace simba
