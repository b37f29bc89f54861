// ZooKeeper: a real server started by scripts/servers/zookeeper.sh (the ctest
// fixture `zookeeper`, or on first use when a binary runs by hand). Every test
// gets a root node of its own, so tests on one server never see each other's
// elections; the cross-process cases reach the same root from a second
// process through the same URI.
#include "testing/stores/store.h"

namespace simba::testing {
namespace {

StoreDescription zookeeper_store() {
  StoreDescription store;
  store.name = "zookeeper";
  store.server = "zookeeper";
  store.at = [](const std::string& server, const std::string& ns) {
    return server + "?root=/" + ns;
  };
  store.bad_uris = {
      {"zookeeper://", StatusCode::kInvalidArgument, "host"},
      {"zookeeper://u@127.0.0.1:2181", StatusCode::kInvalidArgument, "no password"},
      {"zookeeper://:p@127.0.0.1:2181", StatusCode::kInvalidArgument, "needs a user"},
      {"zookeeper://u:p@127.0.0.1:2181?read_acl=all", StatusCode::kInvalidArgument, "read_acl"},
      {"zookeeper://127.0.0.1:2181?tls=verify", StatusCode::kInvalidArgument,
       "TLS is not supported"},
      {"zookeeper://127.0.0.1:2181?tls_ca=/nonexistent.pem", StatusCode::kInvalidArgument,
       "TLS is not supported"},
      {"zookeeper://127.0.0.1:2181?unknown=1", StatusCode::kInvalidArgument, "'unknown'"},
      {"zookeeper://127.0.0.1:2181?session_timeout=fast", StatusCode::kInvalidArgument,
       "session_timeout"},
      {"zookeeper://127.0.0.1:2181?root=relative", StatusCode::kInvalidArgument, "root"},
      {"zookeeper://127.0.0.1:2181?root=/trailing/", StatusCode::kInvalidArgument, "root"},
      {"zookeeper://127.0.0.1:2181/chroot/", StatusCode::kInvalidArgument, "chroot"},
  };
  // docs/backends/zookeeper.md: a queue of sequential nodes, each watching its predecessor
  store.expect = {
      .push_release = true, .forced_loss_pushed = true, .lists_waiters = true, .fifo = true};
  // The nodes survive a restart (writes are fsynced); a session may outlive
  // a quick one or expire after it, and with it the ephemeral nodes:
  // ZookeeperFailures.RestartWhileALeaseIsHeldKeepsOneOwner allows 20 s for
  // the next owner.
  store.restarts = true;
  store.restart_owner_within = std::chrono::seconds(20);
  // keys: the sequential-ephemeral queue
  store.keyed_crash_freed_within = std::chrono::seconds(8);
  store.keyed_expect = {
      .fencing_tokens = true, .fifo = true, .push_handoff = true, .freed_with_session = true};
  store.keyed_store_lists_waiters = true;
  return store;
}

}  // namespace
}  // namespace simba::testing

SIMBA_STORE_SUITES(Zookeeper, zookeeper_store);
