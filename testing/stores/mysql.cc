// MySQL/MariaDB: a real server started by scripts/servers/mysql.sh (the ctest
// fixture `mysql`, or on first use when a binary runs by hand). Every test
// gets a table of its own, so tests on one database never see each other's
// mutexes; the cross-process cases reach the same table from a second
// process through the same URI.
#include "testing/stores/store.h"
#include "testing/test_util.h"

namespace simba::testing {
namespace {

StoreDescription mysql_store() {
  StoreDescription store;
  store.name = "mysql";
  store.server = "mysql";
  store.at = [](const std::string& server, const std::string& ns) {
    return server + "?table=" + table_for(ns);
  };
  store.bad_uris = {
      {"mysql://", StatusCode::kInvalidArgument, "host"},
      {"mysql://u@127.0.0.1:3306", StatusCode::kInvalidArgument, "database"},  // no database
      {"mysql://u@127.0.0.1:3306/db?unknown=1", StatusCode::kInvalidArgument, "'unknown'"},
      {"mysql://u@127.0.0.1:3306/db?connections=0", StatusCode::kInvalidArgument, "connections"},
      {"mysql://u@127.0.0.1:3306/db?table=a-b", StatusCode::kInvalidArgument, "table"},
      {"mysql://u@127.0.0.1:3306/db?ssl_mode=maybe", StatusCode::kInvalidArgument, "ssl_mode"},
      // Several hosts are a primary and its replicas (mysql_ha_test.cc); an
      // empty one in the list is an error naming the list.
      {"mysql://a:1,,b:2/db", StatusCode::kInvalidArgument, "empty entry in host list"},
  };
  // docs/backends/mysql.md: MySQL cannot notify; the wait line pushes hand-offs, and a forced
  // holder learns at its next renewal
  store.expect = {.push_release = true,
                  .forced_loss_pushed = false,
                  .lists_waiters = false,
                  .fifo = false,
                  .batch_renewals = true,
                  // the holder's line session ends with its process
                  // (session_grace, 1 s by default), then the waiter's grant
                  // and two acquisitions, with a loaded machine's slack
                  .killed_owner_replaced_within = std::chrono::seconds(3),
                  // its place in line (a connect, 1 ms, the lock) and the record
                  .killed_owner_backed_within = std::chrono::seconds(1)};
  // Rows survive a restart (InnoDB commits are durable), connections do not.
  store.restarts = true;
  // keys: GET_LOCK; keys carry the test name, so tests sharing the server
  // never meet.
  store.keyed_on_server = true;
  // The key lives in the holder's session: a SIGKILL closes its socket, the
  // server ends the session at once and wakes the waiter (docs/keyed-locks.md:
  // "as soon as the server notices the session is gone"). A second covers the
  // kill, the server's reaction and the waiter's wake-up on a loaded machine;
  // a lease (ttl 2 s + transition 1 s) could not meet it.
  store.keyed_crash_freed_within = scaled(std::chrono::milliseconds(1000));
  store.keyed_expect = {
      .fencing_tokens = false, .fifo = false, .push_handoff = true, .freed_with_session = true};
  return store;
}

}  // namespace
}  // namespace simba::testing

SIMBA_STORE_SUITES(Mysql, mysql_store);
