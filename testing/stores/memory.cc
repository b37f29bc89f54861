// The in-process store (the reference backend): a test's store is the named
// in-process store of its namespace; no other process reaches it.
#include "testing/stores/store.h"

namespace simba::testing {
namespace {

StoreDescription memory_store() {
  StoreDescription store;
  store.name = "memory";
  store.at = [](const std::string&, const std::string& ns) { return "memory://" + ns; };
  store.shared_across_processes = false;
  store.bad_uris = {
      {"memory://", StatusCode::kInvalidArgument, "NAME"},
      {"memory://name:1234", StatusCode::kInvalidArgument, "port"},
      {"memory://name/path", StatusCode::kInvalidArgument, "path"},
      {"memory://name?unknown=1", StatusCode::kInvalidArgument, "'unknown'"},
  };
  // in-process: every release and force is a call the store sees
  store.expect = {
      .push_release = true, .forced_loss_pushed = true, .lists_waiters = true, .fifo = false};
  // keys: a FIFO per key inside the process
  store.keyed_crash_freed_within = std::chrono::seconds(5);
  store.keyed_expect = {
      .fencing_tokens = true, .fifo = true, .push_handoff = true, .freed_with_session = true};
  store.keyed_order_tested_by =
      "KeyedLockTest.WaitersOfTheMemoryStoreAreServedInArrivalOrder "
      "(tests/unit/keyed_lock_test.cc)";
  return store;
}

}  // namespace
}  // namespace simba::testing

SIMBA_STORE_SUITES(Memory, memory_store);
