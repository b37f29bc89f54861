// The conformance suite on MySQL/MariaDB: a real server started by
// scripts/servers/mysql.sh (the ctest fixture `mysql`, or on first use when
// the binary runs by hand). Every test gets a table of its own, so tests on
// one database never see each other's mutexes; the cross-process cases
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

BackendTarget MysqlTarget() {
  BackendTarget target;
  target.name = "mysql";
  target.uri = [](const std::string& unique) {
    return SharedServerUri("mysql") + "?table=" + TableFor(unique);
  };
  target.bad_uris = {
      {"mysql://", StatusCode::kInvalidArgument, "host"},
      {"mysql://u@127.0.0.1:3306", StatusCode::kInvalidArgument, "database"},  // no database
      {"mysql://u@127.0.0.1:3306/db?unknown=1", StatusCode::kInvalidArgument, "'unknown'"},
      {"mysql://u@127.0.0.1:3306/db?connections=0", StatusCode::kInvalidArgument, "connections"},
      {"mysql://u@127.0.0.1:3306/db?table=a-b", StatusCode::kInvalidArgument, "table"},
      {"mysql://u@127.0.0.1:3306/db?ssl_mode=maybe", StatusCode::kInvalidArgument, "ssl_mode"},
      {"mysql://a:1,b:2/db", StatusCode::kInvalidArgument, "one host"},
  };
  target.options.ttl = std::chrono::seconds(2);
  target.options.transition = std::chrono::seconds(1);
  // docs/backends/mysql.md: MySQL cannot notify, so waiters poll and a forced holder learns at its
  // next renewal
  target.expect = {.push_release = false,
                   .forced_loss_pushed = false,
                   .lists_waiters = false,
                   .fifo = false};
  return target;
}

INSTANTIATE_TEST_SUITE_P(Mysql, Conformance, ::testing::Values(MysqlTarget()), TargetName);
INSTANTIATE_TEST_SUITE_P(Mysql, CrossProcessConformance, ::testing::Values(MysqlTarget()),
                         TargetName);

}  // namespace
}  // namespace simba::testing
