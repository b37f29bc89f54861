// Redis: a real redis-server started by scripts/servers/redis.sh (the ctest
// fixture `redis`, or on first use when a binary runs by hand). Every test
// gets its own key prefix, so tests on one server never see each other's
// mutexes; the cross-process cases reach the same prefix from a second
// process through the same URI.
#include "testing/stores/store.h"

namespace simba::testing {
namespace {

StoreDescription redis_store() {
  StoreDescription store;
  store.name = "redis";
  store.server = "redis";
  // Durable, as the fixture (tests/CMakeLists.txt): every write fsynced.
  store.server_args = {"--appendonly", "yes", "--appendfsync", "always"};
  store.at = [](const std::string& server, const std::string& ns) {
    return server + "?key_prefix=" + ns;
  };
  store.bad_uris = {
      {"redis://", StatusCode::kInvalidArgument, "host"},
      {"redis://127.0.0.1:6379/not-a-db", StatusCode::kInvalidArgument, "database number"},
      {"redis://127.0.0.1:6379?unknown=1", StatusCode::kInvalidArgument, "'unknown'"},
      {"redis://127.0.0.1:6379?connect_timeout=fast", StatusCode::kInvalidArgument,
       "connect_timeout"},
      {"redis://127.0.0.1:6379?key_prefix=a*b", StatusCode::kInvalidArgument, "key_prefix"},
      {"redis://127.0.0.1:6379?restart_guard=maybe", StatusCode::kInvalidArgument, "restart_guard"},
      {"redis://a:1,b:2", StatusCode::kInvalidArgument, "one host"},
  };
  // docs/backends/redis.md: pub/sub pushes releases and forced releases; the contender set lists
  // waiters; the oldest live waiter is woken first, but nothing queues them
  store.expect = {.push_release = true,
                  .forced_loss_pushed = true,
                  .lists_waiters = true,
                  .fifo = false,
                  .batch_renewals = true,
                  .push_channel_starts_on_subscribe = true};
  // A durable server keeps its keys across the restart (no restart guard).
  store.restarts = true;
  // keys: leases, push hand-off
  store.keyed_crash_freed_within = std::chrono::seconds(6);
  store.keyed_expect = {
      .fencing_tokens = true, .fifo = false, .push_handoff = true, .freed_with_session = false};
  return store;
}

}  // namespace
}  // namespace simba::testing

SIMBA_STORE_SUITES(Redis, redis_store);
