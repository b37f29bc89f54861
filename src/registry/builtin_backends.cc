// The backends compiled into this build, and the process-wide registry that
// holds them. This file belongs to the `simba` library, not simba_core: it
// references every enabled backend library, and simba_core must not depend
// on them (they depend on it).

#include <cstdio>
#include <cstdlib>
#include <string>
#include <memory>
#include <utility>

#include "simba/backends/memory.h"
#include "simba/internal/backends_config.h"
#include "simba/registry.h"

#if SIMBA_HAVE_SQLITE
#include "simba/backends/sqlite.h"
#endif
#if SIMBA_HAVE_REDIS
#include "simba/backends/redis.h"
#endif
#if SIMBA_HAVE_POSTGRES
#include "simba/backends/postgres.h"
#endif
#if SIMBA_HAVE_MYSQL
#include "simba/backends/mysql.h"
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

Status RegisterBuiltinBackends(BackendRegistry& registry) {
  SIMBA_RETURN_IF_ERROR(
      registry.Register("memory", [](const Uri& uri) -> Result<std::shared_ptr<Backend>> {
        SIMBA_ASSIGN_OR_RETURN(MemoryOptions options, MemoryOptionsFromUri(uri));
        return NewMemoryBackend(std::move(options));
      }));
#if SIMBA_HAVE_SQLITE
  SIMBA_RETURN_IF_ERROR(
      registry.Register("sqlite", [](const Uri& uri) -> Result<std::shared_ptr<Backend>> {
        SIMBA_ASSIGN_OR_RETURN(SqliteOptions options, SqliteOptionsFromUri(uri));
        return NewSqliteBackend(std::move(options));
      }));
#endif
#if SIMBA_HAVE_REDIS
  SIMBA_RETURN_IF_ERROR(
      registry.Register("redis", [](const Uri& uri) -> Result<std::shared_ptr<Backend>> {
        SIMBA_ASSIGN_OR_RETURN(RedisOptions options, RedisOptionsFromUri(uri));
        return NewRedisBackend(std::move(options));
      }));
#endif
#if SIMBA_HAVE_POSTGRES
  for (const char* scheme : {"postgresql", "postgres"}) {
    SIMBA_RETURN_IF_ERROR(
        registry.Register(scheme, [](const Uri& uri) -> Result<std::shared_ptr<Backend>> {
          SIMBA_ASSIGN_OR_RETURN(PostgresOptions options, PostgresOptionsFromUri(uri));
          return NewPostgresBackend(std::move(options));
        }));
  }
#endif
#if SIMBA_HAVE_MYSQL
  for (const char* scheme : {"mysql", "mariadb"}) {
    SIMBA_RETURN_IF_ERROR(
        registry.Register(scheme, [](const Uri& uri) -> Result<std::shared_ptr<Backend>> {
          SIMBA_ASSIGN_OR_RETURN(MysqlOptions options, MysqlOptionsFromUri(uri));
          return NewMysqlBackend(std::move(options));
        }));
  }
#endif
#if SIMBA_HAVE_ZOOKEEPER
  SIMBA_RETURN_IF_ERROR(
      registry.Register("zookeeper", [](const Uri& uri) -> Result<std::shared_ptr<Backend>> {
        SIMBA_ASSIGN_OR_RETURN(ZookeeperOptions options, ZookeeperOptionsFromUri(uri));
        return NewZookeeperBackend(std::move(options));
      }));
#endif
#if SIMBA_HAVE_ETCD
  SIMBA_RETURN_IF_ERROR(
      registry.Register("etcd", [](const Uri& uri) -> Result<std::shared_ptr<Backend>> {
        SIMBA_ASSIGN_OR_RETURN(EtcdOptions options, EtcdOptionsFromUri(uri));
        return NewEtcdBackend(std::move(options));
      }));
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

namespace {

// `ddl` for table `table` instead of simba_mutex.
std::string ForTable(std::string ddl, const std::string& table) {
  const std::string name = "simba_mutex";
  for (std::size_t at = ddl.find(name); at != std::string::npos; at = ddl.find(name, at)) {
    ddl.replace(at, name.size(), table);
    at += table.size();
  }
  return ddl;
}

}  // namespace

Result<std::string> SchemaSql(std::string_view text) {
  SIMBA_ASSIGN_OR_RETURN(Uri uri, Uri::Parse(text));
  // The table name goes into the DDL as it is: only a name the backend
  // itself would accept (a DBA pipes this into psql or mysql).
#if SIMBA_HAVE_POSTGRES
  if (uri.scheme == "postgresql" || uri.scheme == "postgres") {
    SIMBA_ASSIGN_OR_RETURN(PostgresOptions options, PostgresOptionsFromUri(uri));
    SIMBA_RETURN_IF_ERROR(internal::sql::ValidateTableName(options.table));
    return ForTable(PostgresSchemaSql(), options.table);
  }
#endif
#if SIMBA_HAVE_MYSQL
  if (uri.scheme == "mysql" || uri.scheme == "mariadb") {
    SIMBA_ASSIGN_OR_RETURN(MysqlOptions options, MysqlOptionsFromUri(uri));
    SIMBA_RETURN_IF_ERROR(internal::sql::ValidateTableName(options.table));
    return ForTable(MysqlSchemaSql(), options.table);
  }
#endif
  (void)ForTable;
  return UnimplementedError("'" + uri.scheme +
                            "' stores have no table for a DBA to create (only SQL servers do; "
                            "the backend creates what it needs)");
}

}  // namespace simba
