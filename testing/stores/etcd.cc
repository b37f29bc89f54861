// etcd: a real etcd started by scripts/servers/etcd.sh (the ctest fixture
// `etcd`, or on first use when a binary runs by hand). Every test gets its
// own key prefix, so tests on one server never see each other's mutexes; the
// cross-process cases reach the same prefix from a second process through
// the same URI.
#include "testing/stores/store.h"

namespace simba::testing {
namespace {

StoreDescription etcd_store() {
  StoreDescription store;
  store.name = "etcd";
  store.server = "etcd";
  store.at = [](const std::string& server, const std::string& ns) {
    return server + "?key_prefix=" + ns;
  };
  store.bad_uris = {
      {"etcd://", StatusCode::kInvalidArgument, "host"},
      {"etcd://127.0.0.1:2379/some/path", StatusCode::kInvalidArgument, "path"},
      {"etcd://127.0.0.1:2379?unknown=1", StatusCode::kInvalidArgument, "'unknown'"},
      {"etcd://127.0.0.1:2379?connect_timeout=fast", StatusCode::kInvalidArgument,
       "connect_timeout"},
      {"etcd://127.0.0.1:2379?connect_timeout=0ms", StatusCode::kInvalidArgument,
       "connect_timeout"},
      {"etcd://127.0.0.1:2379?key_prefix=a/b", StatusCode::kInvalidArgument, "key_prefix"},
      {"etcd://127.0.0.1:2379?key_prefix=", StatusCode::kInvalidArgument, "key_prefix"},
      // user:password@ is etcd authentication (tests/etcd/etcd_tls_test.cc);
      // half of it is refused.
      {"etcd://user@127.0.0.1:2379", StatusCode::kInvalidArgument, "needs a password"},
      {"etcd://:secret@127.0.0.1:2379", StatusCode::kInvalidArgument, "needs a user"},
      {"etcd://127.0.0.1:2379?tls=maybe", StatusCode::kInvalidArgument, "tls"},
  };
  // docs/backends/etcd.md: a queue of keys by create revision, watched
  store.expect = {.push_release = true,
                  .forced_loss_pushed = true,
                  .lists_waiters = true,
                  .fifo = true,
                  .batch_renewals = true,
                  .lease_length_fixed = true};
  // Keys and leases survive a restart (etcd extends leases when a leader
  // starts); EtcdFailures.ServerRestartNeverOverlapsOwners allows 20 s for
  // the next owner.
  store.restarts = true;
  store.restart_owner_within = std::chrono::seconds(20);
  // keys: lease + transaction
  store.keyed_crash_freed_within = std::chrono::seconds(6);
  store.keyed_expect = {
      .fencing_tokens = true, .fifo = true, .push_handoff = true, .freed_with_session = false};
  store.keyed_store_lists_waiters = true;
  // gRPC's second timer thread (EtcdScale.ManyMutexesShareTwoConnectionsAndOneThread).
  store.client_library_threads_under_load = 1;
  return store;
}

}  // namespace
}  // namespace simba::testing

SIMBA_STORE_SUITES(Etcd, etcd_store);
