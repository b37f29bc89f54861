// The conformance suite on PostgreSQL: a real server started by
// scripts/servers/postgres.sh (the ctest fixture `postgres`, or on first use
// when the binary runs by hand). Every test gets a table of its own, so tests
// on one database never see each other's mutexes; the cross-process cases
// reach the same table from a second process through the same URI.
#include <algorithm>
#include <cctype>

#include "testing/backend_conformance.h"
#include "testing/test_servers.h"

namespace simba::testing {
namespace {

// A table name from the test's unique suffix (letters, digits, '_').
std::string TableFor(const std::string& unique) {
  std::string table = "t_" + unique;
  std::replace_if(
      table.begin(), table.end(),
      [](char c) { return !(std::isalnum(static_cast<unsigned char>(c)) || c == '_'); }, '_');
  std::transform(table.begin(), table.end(), table.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return table.substr(0, 63);
}

BackendTarget PostgresTarget() {
  BackendTarget target;
  target.name = "postgres";
  target.uri = [](const std::string& unique) {
    return SharedServerUri("postgres") + "?table=" + TableFor(unique);
  };
  target.bad_uris = {
      {"postgresql://", StatusCode::kInvalidArgument, "host"},
      {"postgresql://u@127.0.0.1:5432", StatusCode::kInvalidArgument, "database"},  // no database
      {"postgresql://u@127.0.0.1:5432/db?unknown=1", StatusCode::kInvalidArgument, "'unknown'"},
      {"postgresql://u@127.0.0.1:5432/db?connections=0", StatusCode::kInvalidArgument, "connections"},
      {"postgresql://u@127.0.0.1:5432/db?table=a-b", StatusCode::kInvalidArgument, "table"},
      {"postgresql://a:1,b:2/db", StatusCode::kInvalidArgument, "one host"},
  };
  target.options.ttl = std::chrono::seconds(2);
  target.options.transition = std::chrono::seconds(1);
  // docs/backends/postgres.md: LISTEN/NOTIFY pushes releases and forced releases; no queue
  target.expect = {.push_release = true,
                   .forced_loss_pushed = true,
                   .lists_waiters = false,
                   .fifo = false,
                   .push_channel_starts_on_subscribe = true};
  return target;
}

INSTANTIATE_TEST_SUITE_P(Postgres, Conformance, ::testing::Values(PostgresTarget()), TargetName);
INSTANTIATE_TEST_SUITE_P(Postgres, CrossProcessConformance, ::testing::Values(PostgresTarget()),
                         TargetName);

}  // namespace
}  // namespace simba::testing
