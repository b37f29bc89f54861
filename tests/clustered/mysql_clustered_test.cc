// The clustered-lock suite on MySQL/MariaDB: a real server started by
// scripts/servers/mysql.sh (the ctest fixture `mysql`, or on first use when the
// binary runs by hand). Every test gets a table of its own, so tests on one
// server never see each other's locks; the killed-node case reaches the same
// one from a second process through the same URI.
#include <algorithm>
#include <cctype>

#include "testing/clustered_conformance.h"
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

ClusteredTarget MysqlTarget() {
  ClusteredTarget target;
  target.name = "mysql";
  target.uri = [](const std::string& unique) {
    return SharedServerUri("mysql") + "?table=" + TableFor(unique);
  };
  target.lease.ttl = std::chrono::seconds(2);
  target.lease.transition = std::chrono::seconds(1);
  return target;
}

INSTANTIATE_TEST_SUITE_P(Mysql, ClusteredConformance, ::testing::Values(MysqlTarget()),
                         ClusteredTargetName);
INSTANTIATE_TEST_SUITE_P(Mysql, ClusteredCrossProcess, ::testing::Values(MysqlTarget()),
                         ClusteredTargetName);

}  // namespace
}  // namespace simba::testing
