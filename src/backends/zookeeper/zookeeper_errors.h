// What a ZooKeeper C client result code means for a caller: a connection
// that may come back (retry), a refusal (fail), or a broken invariant.
#ifndef SIMBA_BACKENDS_ZOOKEEPER_ZOOKEEPER_ERRORS_H_
#define SIMBA_BACKENDS_ZOOKEEPER_ZOOKEEPER_ERRORS_H_

#include <zookeeper/zookeeper.h>

#include "simba/status.h"

namespace simba::internal::zookeeper {

// The request's connection or session was lost or moved, or the client is
// closing: nothing was decided about the request itself.
inline bool is_connection_error(int rc) {
  return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT || rc == ZSESSIONEXPIRED ||
         rc == ZCLOSING || rc == ZINVALIDSTATE || rc == ZSESSIONMOVED;
}

// The code of a failed request (rc != ZOK): kUnavailable for what may pass
// (a lost connection, an expired or moved session, a member in read-only
// mode that has lost its quorum), kPermissionDenied for a refused
// authentication or ACL, kInternal for the rest (a request the server
// rejected for good: a bad path, a version that does not match).
inline StatusCode status_code_of(int rc) {
  if (is_connection_error(rc) || rc == ZNOTREADONLY) return StatusCode::kUnavailable;
  if (rc == ZNOAUTH || rc == ZAUTHFAILED) return StatusCode::kPermissionDenied;
  return StatusCode::kInternal;
}

}  // namespace simba::internal::zookeeper

#endif  // SIMBA_BACKENDS_ZOOKEEPER_ZOOKEEPER_ERRORS_H_
