// PostgreSQL: a real server started by scripts/servers/postgres.sh (the ctest
// fixture `postgres`, or on first use when a binary runs by hand). Every test
// gets a table of its own, so tests on one database never see each other's
// mutexes; the cross-process cases reach the same table from a second
// process through the same URI.
#include "testing/stores/store.h"
#include "testing/test_util.h"

namespace simba::testing {
namespace {

StoreDescription postgres_store() {
  StoreDescription store;
  store.name = "postgres";
  store.server = "postgres";
  store.at = [](const std::string& server, const std::string& ns) {
    return server + "?table=" + table_for(ns);
  };
  store.bad_uris = {
      {"postgresql://", StatusCode::kInvalidArgument, "host"},
      {"postgresql://u@127.0.0.1:5432", StatusCode::kInvalidArgument, "database"},  // no database
      {"postgresql://u@127.0.0.1:5432/db?unknown=1", StatusCode::kInvalidArgument, "'unknown'"},
      {"postgresql://u@127.0.0.1:5432/db?connections=0", StatusCode::kInvalidArgument,
       "connections"},
      {"postgresql://u@127.0.0.1:5432/db?table=a-b", StatusCode::kInvalidArgument, "table"},
      // Several hosts are a primary and its standbys (postgres_ha_test.cc); an
      // empty entry in the list is still an error.
      {"postgresql://a:1,,b:2/db", StatusCode::kInvalidArgument, "host"},
  };
  // docs/backends/postgres.md: LISTEN/NOTIFY pushes releases and forced releases; no queue
  store.expect = {.push_release = true,
                  .forced_loss_pushed = true,
                  .lists_waiters = false,
                  .fifo = false,
                  .batch_renewals = true,
                  .push_channel_starts_on_subscribe = true,
                  // the holder's line session ends with its process
                  // (session_grace, 1 s by default), then the waiter's grant
                  // and two acquisitions, with a loaded machine's slack
                  .killed_owner_replaced_within = std::chrono::seconds(3),
                  // its place in line (a connect, 1 ms, the lock) and the record
                  .killed_owner_backed_within = std::chrono::seconds(1)};
  // Rows survive a restart (every commit is durable), connections do not.
  store.restarts = true;
  // keys: pg_advisory_lock; keys carry the test name, so tests sharing the
  // server never meet.
  store.keyed_on_server = true;
  // The key lives in the holder's session: a SIGKILL closes its socket, the
  // server ends the session at once and wakes the waiter (docs/keyed-locks.md:
  // "as soon as the server notices the session is gone"). A second covers the
  // kill, the server's reaction and the waiter's wake-up on a loaded machine;
  // a lease (ttl 2 s + transition 1 s) could not meet it.
  store.keyed_crash_freed_within = scaled(std::chrono::milliseconds(1000));
  store.keyed_expect = {
      .fencing_tokens = true, .fifo = true, .push_handoff = true, .freed_with_session = true};
  store.keyed_order_tested_by =
      "PostgresKeyed.WaitersAreServedInArrivalOrder (tests/keyed/postgres_keyed_test.cc)";
  return store;
}

}  // namespace
}  // namespace simba::testing

SIMBA_STORE_SUITES(Postgres, postgres_store);
