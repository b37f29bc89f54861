// The composition root: the backends compiled into this build (one registry
// entry per store), the process-wide registry that holds them, and the
// open(uri) doors of the public APIs. This file belongs to the `simba` library, not simba_core: it
// references every enabled backend library, and simba_core must not depend
// on them (they depend on it).

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
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
BackendRegistry::StoreEntry entry_of(Result<Options> (*from_uri)(const Uri&),
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
BackendRegistry::KeyedOpener keyed_entry_of(
    Result<Options> (*from_uri)(const Uri&),
    Result<std::shared_ptr<KeyedLockBackend>> (*open)(Options)) {
  return [from_uri, open](const Uri& uri,
                          const KeyedLockOptions&) -> Result<std::shared_ptr<KeyedLockBackend>> {
    SIMBA_ASSIGN_OR_RETURN(Options options, from_uri(uri));
    return open(std::move(options));
  };
}

// `ddl` for table `table` instead of simba_mutex.
std::string for_table(std::string ddl, const std::string& table) {
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
BackendRegistry::SchemaMaker sql_schema(Result<Options> (*from_uri)(const Uri&),
                                        std::string (*ddl)()) {
  return [from_uri, ddl](const Uri& uri) -> Result<std::string> {
    SIMBA_ASSIGN_OR_RETURN(Options options, from_uri(uri));
    SIMBA_RETURN_IF_ERROR(internal::sql::validate_table_name(options.table));
    std::string statements = for_table(ddl(), options.table);
    // The side table's statement only where its name fits (as the backend
    // uses it only then); the table's comes first.
    if (!internal::sql::session_table_fits(options.table)) {
      statements.erase(statements.find(";\n") + 2);
    }
    return statements;
  };
}
#endif

// Registers `entry` under each of `schemes`.
Status register_as(BackendRegistry& registry, std::initializer_list<const char*> schemes,
                   const BackendRegistry::StoreEntry& entry) {
  for (const char* scheme : schemes) SIMBA_RETURN_IF_ERROR(registry.add(scheme, entry));
  return ok_status();
}

}  // namespace

// One entry per store: its contention backend, its keyed-lock backend when
// it is not leases on the mutexes, its schema when it has one.
Status register_builtin_backends(BackendRegistry& registry) {
  {
    BackendRegistry::StoreEntry memory = entry_of(&memory_options_from_uri, &new_memory_backend);
    memory.open_keyed = [](const Uri& uri,
                           const KeyedLockOptions&) -> Result<std::shared_ptr<KeyedLockBackend>> {
      SIMBA_ASSIGN_OR_RETURN(MemoryKeyedOptions options, memory_keyed_options_from_uri(uri));
      return new_memory_keyed_lock_backend(std::move(options));
    };
    SIMBA_RETURN_IF_ERROR(register_as(registry, {"memory"}, memory));
  }
#if SIMBA_HAVE_SQLITE
  SIMBA_RETURN_IF_ERROR(
      register_as(registry, {"sqlite"}, entry_of(&sqlite_options_from_uri, &new_sqlite_backend)));
#endif
#if SIMBA_HAVE_REDIS
  SIMBA_RETURN_IF_ERROR(register_as(registry,
                                    {"redis", "rediss", "redis-sentinel", "rediss-sentinel",
                                     "redis-cluster", "rediss-cluster"},  // s: TLS
                                    entry_of(&redis_options_from_uri, &new_redis_backend)));
#endif
#if SIMBA_HAVE_POSTGRES
  {
    // Keyed locks are the server's advisory locks.
    BackendRegistry::StoreEntry postgres =
        entry_of(&postgres_options_from_uri, &new_postgres_backend);
    postgres.open_keyed =
        keyed_entry_of(&postgres_keyed_options_from_uri, &new_postgres_keyed_lock_backend);
    postgres.schema = sql_schema(&postgres_options_from_uri, &postgres_schema_sql);
    SIMBA_RETURN_IF_ERROR(register_as(registry, {"postgresql", "postgres"}, postgres));
  }
#endif
#if SIMBA_HAVE_MYSQL
  {
    // Keyed locks are the server's GET_LOCK.
    BackendRegistry::StoreEntry mysql = entry_of(&mysql_options_from_uri, &new_mysql_backend);
    mysql.open_keyed = keyed_entry_of(&mysql_keyed_options_from_uri, &new_mysql_keyed_lock_backend);
    mysql.schema = sql_schema(&mysql_options_from_uri, &mysql_schema_sql);
    SIMBA_RETURN_IF_ERROR(register_as(registry, {"mysql", "mariadb"}, mysql));
  }
#endif
#if SIMBA_HAVE_ZOOKEEPER
  SIMBA_RETURN_IF_ERROR(register_as(registry, {"zookeeper"},
                                    entry_of(&zookeeper_options_from_uri, &new_zookeeper_backend)));
#endif
#if SIMBA_HAVE_ETCD
  SIMBA_RETURN_IF_ERROR(
      register_as(registry, {"etcd"}, entry_of(&etcd_options_from_uri, &new_etcd_backend)));
#endif
  return ok_status();
}

BackendRegistry& BackendRegistry::global() {
  // Never destroyed, so a backend opened from another static's destructor at
  // exit still finds it.
  static BackendRegistry* const kRegistry = [] {
    auto* filled = new BackendRegistry();
    if (const Status status = register_builtin_backends(*filled); !status.ok()) {
      // Only a programming error gets here (a duplicate or malformed built-in
      // scheme); there is no caller that could handle it.
      std::fprintf(stderr, "simba: registering the built-in backends failed: %s\n",
                   status.to_string().c_str());
      std::abort();
    }
    return filled;
  }();
  return *kRegistry;
}

Result<std::shared_ptr<Backend>> open_backend(std::string_view uri) {
  return BackendRegistry::global().open(uri);
}

Result<std::string> schema_sql(std::string_view uri) {
  return BackendRegistry::global().schema(uri);
}

// The open() doors of the public APIs: the default registry picks the store.

Result<std::unique_ptr<MutexContendServiceFactory>> MutexContendServiceFactory::open(
    std::string_view uri, FactoryOptions options) {
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, open_backend(uri));
  return create(std::move(backend), std::move(options));
}

Result<std::unique_ptr<ClusteredLockManager>> ClusteredLockManager::open(
    std::string_view uri, ClusteredLockOptions options) {
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, open_backend(uri));
  return create(std::move(backend), std::move(options));
}

Result<std::unique_ptr<KeyedLockProvider>> KeyedLockProvider::open(std::string_view uri,
                                                                   KeyedLockOptions options) {
  SIMBA_RETURN_IF_ERROR(options.lease.validate());
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<KeyedLockBackend> backend,
                         BackendRegistry::global().open_keyed(uri, options));
  return create(std::move(backend), std::move(options));
}

}  // namespace simba
