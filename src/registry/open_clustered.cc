// ClusteredLockManager::open lives in the `simba` library, next to the
// built-in registration it needs: simba_core must not depend on the backends.
#include "simba/clustered_lock.h"
#include "simba/registry.h"

namespace simba {

Result<std::unique_ptr<ClusteredLockManager>> ClusteredLockManager::open(
    std::string_view uri, ClusteredLockOptions options) {
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, OpenBackend(uri));
  return create(std::move(backend), std::move(options));
}

}  // namespace simba
