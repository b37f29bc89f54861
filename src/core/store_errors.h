// The error of a wait that ran out while the store could not be reached:
// one wording for contend services, keyed locks and clustered locks.
#ifndef SIMBA_CORE_STORE_ERRORS_H_
#define SIMBA_CORE_STORE_ERRORS_H_

#include <string>

#include "simba/status.h"

namespace simba::internal {

// kUnavailable "the store could not be reached: <last>" after one failed
// try, "... (N tries failed in a row; the last: <last>)" after several.
// `last`'s message names the hosts tried and what each said.
inline Status unreachable_after(int failures, const Status& last) {
  if (failures <= 1) return unavailable_error("the store could not be reached: " + last.message());
  return unavailable_error("the store could not be reached (" + std::to_string(failures) +
                           " tries failed in a row; the last: " + last.message() + ")");
}

}  // namespace simba::internal

#endif  // SIMBA_CORE_STORE_ERRORS_H_
