// The timeout argument of poll() for a store call's deadline, shared by the
// backends that drive their own sockets (Redis, PostgreSQL, MySQL).
#ifndef SIMBA_CORE_POLL_TIMEOUT_H_
#define SIMBA_CORE_POLL_TIMEOUT_H_

#include <algorithm>
#include <chrono>

#include "simba/backend.h"

namespace simba::internal {

// Milliseconds left until `deadline`, rounded up so that poll() never wakes
// before it (and capped to fit an int); -1 once it has passed.
inline int poll_timeout(Deadline deadline) {
  const auto left = deadline - std::chrono::steady_clock::now();
  if (left <= std::chrono::steady_clock::duration::zero()) return -1;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<long long>(ms, 1 << 30));
}

}  // namespace simba::internal

#endif  // SIMBA_CORE_POLL_TIMEOUT_H_
