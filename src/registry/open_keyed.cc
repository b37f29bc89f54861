// KeyedLockProvider::open lives in the `simba` library: it picks the keyed
// backend a URI names, and simba_core must not depend on the backends.
//
//   memory://NAME           a per-key FIFO inside the process
//   postgresql://, mysql:// the server's native session locks
//   anything else           leases on the store's mutexes (SQLite, Redis,
//                           ZooKeeper, etcd)
#include "simba/backends/memory.h"
#include "simba/internal/backends_config.h"
#include "simba/keyed_lock.h"
#include "simba/registry.h"

#if SIMBA_HAVE_POSTGRES
#include "simba/backends/postgres_keyed.h"
#endif
#if SIMBA_HAVE_MYSQL
#include "simba/backends/mysql_keyed.h"
#endif

namespace simba {
namespace {

Result<std::shared_ptr<KeyedLockBackend>> OpenKeyedBackend(std::string_view text,
                                                           const KeyedLockOptions& options) {
  SIMBA_ASSIGN_OR_RETURN(Uri uri, Uri::Parse(text));
  if (uri.scheme == "memory") {
    SIMBA_ASSIGN_OR_RETURN(MemoryOptions memory, MemoryOptionsFromUri(uri));
    return NewMemoryKeyedLockBackend(memory.name);
  }
#if SIMBA_HAVE_POSTGRES
  if (uri.scheme == "postgresql" || uri.scheme == "postgres") {
    return OpenPostgresKeyedLockBackend(uri);
  }
#endif
#if SIMBA_HAVE_MYSQL
  if (uri.scheme == "mysql" || uri.scheme == "mariadb") return OpenMysqlKeyedLockBackend(uri);
#endif
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, OpenBackend(text));
  return NewLeaseKeyedLockBackend(std::move(backend), options.lease, options.metrics,
                                  options.events);
}

}  // namespace

Result<std::unique_ptr<KeyedLockProvider>> KeyedLockProvider::open(std::string_view uri,
                                                                   KeyedLockOptions options) {
  SIMBA_RETURN_IF_ERROR(options.lease.Validate());
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<KeyedLockBackend> backend,
                         OpenKeyedBackend(uri, options));
  return create(std::move(backend), std::move(options));
}

}  // namespace simba
