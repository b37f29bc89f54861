// The MySQL/MariaDB backend beyond the conformance suite: names and
// literals, JVM Simba's layout, privileges, killed connections (a restarted
// server is the conformance suite's ServerRestartConformance), and JVM
// Simba's own statements contending with ours on one table.
// Every test runs against a real MariaDB server; raw access goes through
// libmariadb (as the TCP user of the URI, or as root over the Unix socket of
// a private server).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mysql.h>
#include <mysqld_error.h>
#include <netdb.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "backends/mysql/mysql_lock_name.h"
#include "backends/sql/wait_line.h"
#include "core/host_lookup.h"
#include "simba/backends/mysql.h"
#include "simba/contend_period.h"
#include "simba/contend_service.h"
#include "simba/contender.h"
#include "simba/registry.h"
#include "testing/child_holder.h"
#include "testing/critical_section.h"
#include "testing/fake_resolver.h"
#include "testing/latch.h"
#include "testing/status_matchers.h"
#include "testing/store_test_helpers.h"
#include "testing/tcp_proxy.h"
#include "testing/test_servers.h"
#include "testing/test_util.h"

namespace simba::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;
using ::testing::HasSubstr;

// A table of this test's own on the shared server.
std::string test_table() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string table = std::string("mt_") + info->name();
  std::transform(table.begin(), table.end(), table.begin(), [](unsigned char c) {
    return std::isalnum(c) ? static_cast<char>(std::tolower(c)) : '_';
  });
  return table.substr(0, 60);
}

std::string shared_uri() { return shared_server_uri("mysql") + "?table=" + test_table(); }

// Plain, blocking libmariadb for what the test itself does to the server.
class RawMysql {
 public:
  // As the user of `uri` (mysql://user:password@host:port/db[?...]), over TCP.
  explicit RawMysql(const std::string& uri) : m_(mysql_init(nullptr)) {
    auto parsed = Uri::parse(uri.substr(0, uri.find('?')));
    if (!parsed.ok() || parsed->hosts.size() != 1) return;
    const unsigned int timeout = 5;
    mysql_options(m_, MYSQL_OPT_CONNECT_TIMEOUT, &timeout);
    ok_ = mysql_real_connect(m_, parsed->hosts[0].host.c_str(), parsed->user.value_or("").c_str(),
                             parsed->password.value_or("").c_str(), parsed->path.substr(1).c_str(),
                             parsed->hosts[0].port.value_or(3306), nullptr, 0) != nullptr;
  }
  // As root over the Unix socket of a private server.
  static std::unique_ptr<RawMysql> root(const TestServer& server) {
    auto raw = std::unique_ptr<RawMysql>(new RawMysql());
    raw->ok_ = mysql_real_connect(raw->m_, "localhost", "root", nullptr, "simba", 0,
                                  (server.dir() + "/mysqld.sock").c_str(), 0) != nullptr;
    return raw;
  }
  ~RawMysql() { mysql_close(m_); }
  RawMysql(const RawMysql&) = delete;
  RawMysql& operator=(const RawMysql&) = delete;

  bool ok() const { return ok_; }
  std::string error() { return mysql_error(m_); }
  unsigned int error_code() { return mysql_errno(m_); }

  // All rows (NULL as ""), or nullopt on an error.
  std::optional<std::vector<std::vector<std::string>>> query(const std::string& sql) {
    if (mysql_real_query(m_, sql.data(), sql.size()) != 0) return std::nullopt;
    std::vector<std::vector<std::string>> rows;
    MYSQL_RES* result = mysql_store_result(m_);
    if (result == nullptr) {
      if (mysql_field_count(m_) != 0) return std::nullopt;
      affected_ = mysql_affected_rows(m_);
      return rows;
    }
    const unsigned int columns = mysql_num_fields(result);
    while (MYSQL_ROW row = mysql_fetch_row(result)) {
      const unsigned long* lengths = mysql_fetch_lengths(result);
      std::vector<std::string> values;
      for (unsigned int c = 0; c < columns; ++c) {
        values.emplace_back(row[c] != nullptr ? std::string(row[c], lengths[c]) : "");
      }
      rows.push_back(std::move(values));
    }
    mysql_free_result(result);
    return rows;
  }
  // The first column of the first row ("" if none), or "ERROR: ..." text.
  std::string exec(const std::string& sql) {
    auto rows = query(sql);
    if (!rows) return "ERROR: " + error();
    return rows->empty() || rows->front().empty() ? "" : rows->front().front();
  }
  std::uint64_t affected() const { return affected_; }
  // `text` as a quoted literal.
  std::string literal(const std::string& text) {
    std::string out(text.size() * 2 + 1, '\0');
    out.resize(mysql_real_escape_string(m_, out.data(), text.data(), text.size()));
    return "'" + out + "'";
  }

 private:
  RawMysql() : m_(mysql_init(nullptr)) {}
  MYSQL* m_;
  bool ok_ = false;
  std::uint64_t affected_ = 0;
};

// The fixture's server keeps its data between runs: a test that counts
// rows or versions starts without its table.
void drop_test_table() {
  RawMysql raw(shared_server_uri("mysql"));
  ASSERT_TRUE(raw.ok()) << raw.error();
  ASSERT_EQ(raw.exec("DROP TABLE IF EXISTS " + test_table()), "");
}

// ---- names, literals, URIs ---------------------------------------------------------

TEST(MysqlNames, LongNamesAreRejectedNotTruncated) {
  drop_test_table();
  auto backend = open(shared_uri());
  ASSERT_TRUE(backend);
  const std::string at_limit(66, 'm');
  SIMBA_EXPECT_OK(backend->acquire_or_renew(request_for(at_limit, "a"), in(seconds(5))));
  EXPECT_THAT(backend->acquire_or_renew(request_for(at_limit + "x", "a"), in(seconds(5))),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("66")));
  EXPECT_THAT(backend->acquire_or_renew(request_for("m", std::string(129, 'c')), in(seconds(5))),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("contender_id")));
  RawMysql raw(shared_server_uri("mysql"));
  ASSERT_TRUE(raw.ok()) << raw.error();
  EXPECT_EQ(raw.exec("SELECT owner_id FROM " + test_table() + " WHERE mutex = '" + at_limit + "'"),
            "a");
  EXPECT_EQ(raw.exec("SELECT COUNT(*) FROM " + test_table()), "1");
}

// Parameters are literals in a multi-statement query: they must be escaped,
// and a name that looks like a number must stay a string.
TEST(MysqlNames, QuotesBackslashesAndNumericNamesAreExact) {
  drop_test_table();
  auto backend = open(shared_uri());
  ASSERT_TRUE(backend);
  const std::vector<std::string> names = {
      "123",   "0123", "1e3",  "it's", "back\\slash", "x'; DROP TABLE t; --",
      "\"q\"", "ünï",  "Case", "case"};
  for (const auto& name : names) {
    auto acquired = backend->acquire_or_renew(request_for(name, "o'" + name), in(seconds(5)));
    ASSERT_THAT(acquired, IsOk()) << name;
    EXPECT_EQ(acquired->owner.owner_id, "o'" + name) << name;
    EXPECT_EQ(acquired->owner.fencing_token, 1u) << name;
  }
  RawMysql raw(shared_server_uri("mysql"));
  ASSERT_TRUE(raw.ok()) << raw.error();
  EXPECT_EQ(raw.exec("SELECT COUNT(*) FROM " + test_table()), std::to_string(names.size()));
  for (const auto& name : names) {
    EXPECT_EQ(
        raw.exec("SELECT owner_id FROM " + test_table() + " WHERE mutex = " + raw.literal(name)),
        "o'" + name);
  }
  auto listed = backend->list(in(seconds(5)));
  ASSERT_THAT(listed, IsOk());
  EXPECT_EQ(listed->size(), names.size());
}

TEST(MysqlUri, ParsesOurKeysAndRejectsOthers) {
  auto uri = Uri::parse(
      "mysql://alice:s3cret@db.example:3307/app?connections=3&table=locks&create_table=off&"
      "connect_timeout=2s&ssl_mode=verify_identity&ssl_ca=/etc/ca.pem&"
      "lock_connections=4&op_timeout=5s&"  // the keyed-lock backend's
      "queue_connections=0");
  ASSERT_THAT(uri, IsOk());
  auto options = mysql_options_from_uri(*uri);
  ASSERT_THAT(options, IsOk());
  EXPECT_EQ(options->host, "db.example");
  EXPECT_EQ(options->port, 3307);
  EXPECT_EQ(options->database, "app");
  EXPECT_EQ(options->user, "alice");
  EXPECT_EQ(options->password, "s3cret");
  EXPECT_EQ(options->connections, 3);
  EXPECT_EQ(options->queue_connections, 0);
  EXPECT_EQ(options->table, "locks");
  EXPECT_FALSE(options->create_table);
  EXPECT_EQ(options->connect_timeout, seconds(2));
  EXPECT_EQ(options->ssl_mode, "verify_identity");
  EXPECT_EQ(options->ssl_ca, "/etc/ca.pem");
  auto defaults = mysql_options_from_uri(*Uri::parse("mariadb://h/db"));
  ASSERT_THAT(defaults, IsOk());
  EXPECT_EQ(defaults->port, 3306);
  EXPECT_EQ(defaults->table, "simba_mutex");
  for (const char* bad :
       {"mysql://h/db?sslmode=required", "mysql://h/db?host=x", "mysql://h/db?connections=0",
        "mysql://h/db?create_table=1", "mysql://h", "mysql://h/a/b", "mysql://h/db?ssl_mode=x",
        "mysql://h/db?connect_timeout=5", "mysql://h/db?queue_connections=17",
        "postgresql://h/db"}) {
    auto parsed = Uri::parse(bad);
    ASSERT_THAT(parsed, IsOk()) << bad;
    EXPECT_THAT(mysql_options_from_uri(*parsed), StatusIs(StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(MysqlUri, SeveralHostsAreTriedInTheirOrder) {
  auto uri = Uri::parse("mysql://u:pw@replica.example:3307,primary.example,10.0.0.3:3309/app");
  ASSERT_THAT(uri, IsOk());
  auto options = mysql_options_from_uri(*uri);
  ASSERT_THAT(options, IsOk());
  EXPECT_EQ(options->host, "replica.example");
  EXPECT_EQ(options->port, 3307);
  ASSERT_EQ(options->more_hosts.size(), 2u);
  EXPECT_EQ(options->more_hosts[0].host, "primary.example");
  EXPECT_EQ(options->more_hosts[0].port, 3306);
  EXPECT_EQ(options->more_hosts[1].host, "10.0.0.3");
  EXPECT_EQ(options->more_hosts[1].port, 3309);
  // An empty host in the list is an error naming it, from the URI parser or
  // from ours.
  for (const char* bad : {"mysql://u@h1,,h2/db", "mysql://u@h1,:3307/db", "mysql://u@h1,/db"}) {
    auto parsed = Uri::parse(bad);
    const Status status = parsed.ok() ? mysql_options_from_uri(*parsed).status() : parsed.status();
    EXPECT_THAT(status, StatusIs(StatusCode::kInvalidArgument)) << bad;
    EXPECT_THAT(status.message(), ::testing::AnyOf(HasSubstr("empty"), HasSubstr("without a host")))
        << bad;
  }
  // A backend of options naming an empty extra host is refused too.
  MysqlOptions direct = *options;
  direct.more_hosts[1].host.clear();
  EXPECT_THAT(new_mysql_backend(direct),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("more_hosts[1]")));
}

TEST(MysqlUri, ConnectErrorsAreClearAndNeverShowThePassword) {
  const std::string uri = shared_server_uri("mysql");
  const std::string rest = uri.substr(uri.find('@'));
  auto backend = open("mysql://simba:wrong-pw-xyz" + rest + "?table=" + test_table());
  ASSERT_TRUE(backend);
  auto denied = backend->read("m", in(seconds(5)));
  EXPECT_THAT(denied, StatusIs(StatusCode::kPermissionDenied, HasSubstr("mysql at 127.0.0.1")));
  EXPECT_THAT(denied.status().message(), ::testing::Not(HasSubstr("wrong-pw-xyz")));
  const std::string no_db = uri.substr(0, uri.rfind('/')) + "/no_such_db";
  auto missing = open(no_db);
  ASSERT_TRUE(missing);
  // No such database, or (for this user) no access to it.
  auto read = missing->read("m", in(seconds(5)));
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(read.status().code() == StatusCode::kNotFound ||
              read.status().code() == StatusCode::kPermissionDenied)
      << read.status();
}

// ---- host names ------------------------------------------------------------------

constexpr char kFakeHost[] = "db.simba-test.invalid";

// `uri` with the test server's host (127.0.0.1) replaced by `host`.
std::string with_host(std::string uri, const std::string& host) {
  const std::string server_host = "127.0.0.1";
  return uri.replace(uri.find(server_host), server_host.size(), host);
}

using MysqlHostNames = FakeResolverTest;

TEST_F(MysqlHostNames, AHungResolverCannotStallACallPastItsDeadline) {
  // With verify_identity the library must get the name (for the
  // certificate), but our lookup first still bounds a hung resolver.
  for (const std::string query : {"", "&ssl_mode=verify_identity"}) {
    auto backend = open(with_host(shared_uri(), kFakeHost) + query);
    ASSERT_TRUE(backend);
    const auto deadline = milliseconds(300);
    const auto start = steady_clock::now();
    auto read = backend->read("m", start + deadline);
    const auto took = steady_clock::now() - start;
    ASSERT_FALSE(read.ok()) << query;
    EXPECT_THAT(read.status().code(),
                ::testing::AnyOf(StatusCode::kDeadlineExceeded, StatusCode::kUnavailable))
        << query;
    EXPECT_THAT(read.status().message(), HasSubstr(kFakeHost)) << query;
    EXPECT_LT(took, deadline + scaled(milliseconds(1500)))
        << query << ": " << std::chrono::duration_cast<milliseconds>(took).count() << " ms";
  }
  // Both lookups were ours, one still hanging: the library was never asked.
  EXPECT_EQ(internal::host_lookups_in_flight_for_testing(), 1u);
  // Once the resolver answers, a backend connects to the address.
  fake_->release.set();
  auto backend = open(with_host(shared_uri(), kFakeHost));
  ASSERT_TRUE(backend);
  SIMBA_EXPECT_OK(backend->read("m", in(seconds(10))));
}

TEST_F(MysqlHostNames, AnUnknownHostIsUnavailableAndNamed) {
  fake_->error = EAI_NONAME;
  fake_->release.set();
  auto backend = open(with_host(shared_uri(), kFakeHost));
  ASSERT_TRUE(backend);
  auto read = backend->read("m", in(seconds(5)));
  EXPECT_THAT(read, StatusIs(StatusCode::kUnavailable, HasSubstr("cannot resolve host")));
  EXPECT_THAT(read.status().message(), HasSubstr(kFakeHost));
}

TEST_F(MysqlHostNames, EveryAddressOfANameIsTriedInTurn) {
#ifndef __GLIBC__
  GTEST_SKIP() << "the fake resolver chains getaddrinfo() lists, which needs glibc";
#endif
  // Nothing listens on 127.0.0.2 (the server is bound to 127.0.0.1).
  fake_->addresses = {"127.0.0.2", "127.0.0.1"};
  fake_->release.set();
  auto backend = open(with_host(shared_uri(), kFakeHost));
  ASSERT_TRUE(backend);
  SIMBA_EXPECT_OK(backend->read("m", in(seconds(10))));
}

// ---- the table ---------------------------------------------------------------------

TEST(MysqlTable, LayoutIsJvmSimbasAndTokensAreVersions) {
  drop_test_table();
  auto backend = open(shared_uri());
  ASSERT_TRUE(backend);
  auto first = backend->acquire_or_renew(request_for("m", "a"), in(seconds(5)));
  ASSERT_THAT(first, IsOk());
  EXPECT_EQ(first->owner.transition_at - first->owner.acquired_at, milliseconds(3000));
  EXPECT_EQ(first->owner.ttl_at - first->owner.acquired_at, milliseconds(2000));
  RawMysql raw(shared_server_uri("mysql"));
  ASSERT_TRUE(raw.ok()) << raw.error();
  auto created = raw.query("SHOW CREATE TABLE " + test_table());
  ASSERT_TRUE(created && created->size() == 1 && created->front().size() == 2) << raw.error();
  const std::string ddl = created->front()[1];
  for (const char* column :
       {"`mutex` varchar(66) NOT NULL COMMENT 'mutex name'",
        "`acquired_at` bigint(20) unsigned NOT NULL", "`ttl_at` bigint(20) unsigned NOT NULL",
        "`transition_at` bigint(20) unsigned NOT NULL", "`owner_id` varchar(128) NOT NULL",
        "`version` int(10) unsigned NOT NULL", "PRIMARY KEY (`mutex`)"}) {
    EXPECT_THAT(ddl, HasSubstr(column));
  }
  // The DB clock and the lease agree with the row.
  EXPECT_EQ(raw.exec("SELECT CONCAT(owner_id, '/', version, '/', ttl_at - acquired_at, '/', "
                     "transition_at - ttl_at) FROM " +
                     test_table() + " WHERE mutex = 'm'"),
            "a/" + std::to_string(first->owner.fencing_token) + "/2000/1000");
  const long long db_now =
      std::stoll(raw.exec("SELECT CAST(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000 AS SIGNED)"));
  EXPECT_LT(std::llabs(db_now - first->owner.acquired_at.count()), 5000);
  // A renewal keeps the version; a release and the next acquisition raise it.
  auto renewed = backend->acquire_or_renew(request_for("m", "a"), in(seconds(5)));
  ASSERT_THAT(renewed, IsOk());
  EXPECT_EQ(renewed->owner.fencing_token, first->owner.fencing_token);
  EXPECT_GE(renewed->owner.acquired_at, first->owner.acquired_at);
  // Another contender does not get it, and changes nothing.
  auto other = backend->acquire_or_renew(request_for("m", "b"), in(seconds(5)));
  ASSERT_THAT(other, IsOk());
  EXPECT_EQ(other->owner.owner_id, "a");
  EXPECT_EQ(other->owner.fencing_token, first->owner.fencing_token);
  ASSERT_THAT(backend->release("m", "a", in(seconds(5))), IsOkAndHolds(true));
  // Free as JVM Simba writes it (owner, ttl_at, transition_at). acquired_at
  // is 0, or the end of the wait line's reserve (a moment from now) when
  // the release freed the line lock, which this process takes in the
  // background as the holder: either, by timing.
  EXPECT_EQ(raw.exec("SELECT CONCAT(owner_id, '/', ttl_at, '/', transition_at, '/', "
                     "acquired_at = 0 OR acquired_at - CAST(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) "
                     "* 1000 AS SIGNED) <= " +
                     std::to_string(internal::sql::kQueueReserve.count()) + ") FROM " +
                     test_table() + " WHERE mutex = 'm'"),
            "/0/0/1");
  // b gets it: at once, or once this process's place in line has the line
  // lock that a reserved row asks for. An attempt that does not take the
  // row leaves the version alone.
  Result<OwnerRecord> next = unavailable_error("not tried");
  EXPECT_TRUE(eventually(
      [&] {
        next = backend->acquire_or_renew(request_for("m", "b"), in(seconds(5)));
        return next.ok() && next->owner.owner_id == "b";
      },
      seconds(3)));
  ASSERT_THAT(next, IsOk());
  EXPECT_EQ(next->owner.owner_id, "b");
  EXPECT_EQ(next->owner.fencing_token, first->owner.fencing_token + 2);
  EXPECT_EQ(raw.exec("SELECT version FROM " + test_table() + " WHERE mutex = 'm'"),
            std::to_string(next->owner.fencing_token));
  // The DDL for a DBA is the one the backend runs.
  EXPECT_THAT(mysql_schema_sql(),
              HasSubstr("varchar(66) not null primary key comment 'mutex name'"));
  auto schema = schema_sql(shared_uri());
  ASSERT_THAT(schema, IsOk());
  EXPECT_THAT(*schema, HasSubstr("CREATE TABLE IF NOT EXISTS " + test_table() + " ("));
}

// A renewal whose statement waited on the row lock runs with the NOW(3) of
// when it began; the owner's later renewal meanwhile must survive it (see
// PostgresTable.ARenewalThatWaitedOnTheRowNeverShortensTheLease).
TEST(MysqlTable, ARenewalThatWaitedOnTheRowNeverShortensTheLease) {
  drop_test_table();
  auto owner = open(shared_uri());
  auto late = open(shared_uri());  // its own session, the same owner id
  ASSERT_TRUE(owner && late);
  ASSERT_THAT(owner->acquire_or_renew(request_for("m", "a"), in(seconds(5))), IsOk());
  RawMysql row(shared_server_uri("mysql"));
  ASSERT_TRUE(row.ok()) << row.error();
  const std::string table = test_table();
  ASSERT_TRUE(row.query("BEGIN")) << row.error();
  ASSERT_EQ(row.exec("SELECT owner_id FROM " + table + " WHERE mutex = 'm' FOR UPDATE"), "a");
  Result<OwnerRecord> waited = unavailable_error("not run");
  std::thread renewal(
      [&] { waited = late->acquire_or_renew(request_for("m", "a"), in(seconds(10))); });
  std::this_thread::sleep_for(milliseconds(1500));
  // The owner's later renewal, as the row lock's holder writes it.
  const std::string now_ms = "CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)";
  ASSERT_TRUE(row.query("UPDATE " + table + " SET ttl_at = " + now_ms +
                        " + 2000, transition_at = " + now_ms + " + 3000 WHERE mutex = 'm'"))
      << row.error();
  const std::string later = row.exec("SELECT transition_at FROM " + table + " WHERE mutex = 'm'");
  ASSERT_TRUE(row.query("COMMIT")) << row.error();
  renewal.join();
  ASSERT_THAT(waited, IsOk());
  EXPECT_EQ(waited->owner.owner_id, "a");
  const long long now_at =
      std::stoll(row.exec("SELECT transition_at FROM " + table + " WHERE mutex = 'm'"));
  EXPECT_GE(now_at, std::stoll(later)) << "the late renewal moved the lease back";
  auto other = owner->acquire_or_renew(request_for("m", "b"), in(seconds(5)));
  ASSERT_THAT(other, IsOk());
  EXPECT_EQ(other->owner.owner_id, "a");
}

TEST(MysqlTable, MissingTableWithoutPrivilegeSaysWhatToRun) {
  auto server = TestServer::start("mysql");
  ASSERT_THAT(server, IsOk());
  auto root = RawMysql::root(**server);
  ASSERT_TRUE(root->ok()) << root->error();
  // A user that may read and write rows but not create tables (the simba
  // user may not grant; root, over the socket, may).
  ASSERT_EQ(root->exec("CREATE USER 'reader'@'%' IDENTIFIED BY 'reader-pw'"), "");
  ASSERT_EQ(root->exec("GRANT SELECT, INSERT, UPDATE ON simba.* TO 'reader'@'%'"), "");
  const std::string uri = (*server)->uri();
  const std::string reader_uri = "mysql://reader:reader-pw" + uri.substr(uri.find('@'));
  auto reader = open(reader_uri);
  ASSERT_TRUE(reader);
  auto denied = reader->acquire_or_renew(request_for("m", "a"), in(seconds(5)));
  EXPECT_THAT(denied, StatusIs(StatusCode::kPermissionDenied, HasSubstr("CREATE TABLE")));
  EXPECT_THAT(denied.status().message(), HasSubstr("simba_mutex"));
  EXPECT_THAT(denied.status().message(), HasSubstr("mysql at 127.0.0.1"));
  // With create_table=off it does not even try: the same advice.
  auto no_create = open(reader_uri + "?create_table=off");
  ASSERT_TRUE(no_create);
  EXPECT_THAT(no_create->read("m", in(seconds(5))),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("CREATE TABLE")));
  // A DBA runs the DDL as printed (the table and its side table, one
  // statement at a time here: this client sends one per call); then it works.
  const std::string ddl = mysql_schema_sql();
  EXPECT_THAT(ddl, HasSubstr("CREATE TABLE IF NOT EXISTS simba_mutex_session ("));
  for (std::size_t at = 0, end; (end = ddl.find(";\n", at)) != std::string::npos; at = end + 2) {
    ASSERT_EQ(root->exec(ddl.substr(at, end - at)), "");
  }
  auto granted = reader->acquire_or_renew(request_for("m", "a"), in(seconds(5)));
  ASSERT_THAT(granted, IsOk());
  EXPECT_EQ(granted->owner.owner_id, "a");
  // Without UPDATE: a clear permission error, not a retry forever.
  ASSERT_EQ(root->exec("REVOKE UPDATE ON simba.* FROM 'reader'@'%'"), "");
  auto reader2 = open(reader_uri);
  ASSERT_TRUE(reader2);
  EXPECT_THAT(reader2->release("m", "a", in(seconds(5))), StatusIs(StatusCode::kPermissionDenied));
}

// Several processes using a new table at once each try to create it; the
// losers must carry on, not fail.
TEST(MysqlTable, ConcurrentFirstUseCreatesTheTableOnce) {
  constexpr int kBackends = 8;
  for (int round = 0; round < 5; ++round) {
    drop_test_table();
    std::vector<std::shared_ptr<Backend>> backends;
    for (int i = 0; i < kBackends; ++i) {
      backends.push_back(open(shared_uri()));
      ASSERT_TRUE(backends.back());
    }
    const std::vector<Status> results = acquire_all_at_once(backends);
    for (int i = 0; i < kBackends; ++i) EXPECT_THAT(results[i], IsOk()) << "round " << round;
  }
}

// ---- failures -----------------------------------------------------------------------

// Without session-backed tenures (session_grace=0ms): a holder whose
// connections the server killed renews on new ones and keeps its lease.
// (With them, the default, it loses the tenure its line session backed:
// MysqlSessionBacked below.)
TEST(MysqlFailures, KilledConnectionsAreReplaced) {
  auto server = TestServer::start("mysql");
  ASSERT_THAT(server, IsOk());
  const std::string uri = (*server)->uri() + "?session_grace=0ms";
  auto factory_a = make_factory(uri, seconds(2), seconds(1));
  auto factory_b = make_factory(uri, seconds(2), seconds(1));
  ASSERT_TRUE(factory_a && factory_b);
  Recorder a, b;
  auto holder = factory_a->create_contend_service(a.contender("m", "a")).value();
  auto waiter = factory_b->create_contend_service(b.contender("m", "b")).value();
  SIMBA_ASSERT_OK(holder->start());
  ASSERT_TRUE(a.acquired.wait(seconds(5)));
  SIMBA_ASSERT_OK(waiter->start());
  std::this_thread::sleep_for(milliseconds(500));

  // Every connection of the simba user but ours: the private server has no
  // one else's.
  auto root = RawMysql::root(**server);
  ASSERT_TRUE(root->ok()) << root->error();
  auto ids = root->query("SELECT id FROM information_schema.processlist WHERE user = 'simba'");
  ASSERT_TRUE(ids) << root->error();
  EXPECT_FALSE(ids->empty());
  for (const auto& row : *ids) root->exec("KILL " + row[0]);
  // The holder renews on a new connection (ttl 2 s) and keeps its lease.
  std::this_thread::sleep_for(seconds(3));
  EXPECT_TRUE(holder->is_owner());
  EXPECT_FALSE(a.released.is_set());
  EXPECT_FALSE(b.acquired.is_set());
  EXPECT_NE(root->exec("SELECT COUNT(*) FROM information_schema.processlist WHERE user = "
                       "'simba'"),
            "0");
  // And hands over as usual.
  SIMBA_ASSERT_OK(holder->stop());
  ASSERT_TRUE(b.acquired.wait(seconds(6)));
  EXPECT_GT(b.token.load(), a.token.load());
  SIMBA_ASSERT_OK(waiter->stop());
}

TEST(MysqlFailures, PausedServerMakesCallsEndByTheirDeadline) {
  auto server = TestServer::start("mysql");
  ASSERT_THAT(server, IsOk());
  auto backend = open((*server)->uri());
  ASSERT_TRUE(backend);
  SIMBA_ASSERT_OK(backend->acquire_or_renew(request_for("m", "a"), in(seconds(5))));
  SIMBA_ASSERT_OK((*server)->pause());
  const auto started = steady_clock::now();
  auto late = backend->acquire_or_renew(request_for("m", "a"), in(milliseconds(300)));
  const auto took = steady_clock::now() - started;
  SIMBA_ASSERT_OK((*server)->resume());
  EXPECT_THAT(late, StatusIs(StatusCode::kDeadlineExceeded));
  EXPECT_LT(took, scaled(milliseconds(1500)))
      << std::chrono::duration_cast<milliseconds>(took).count() << " ms";
  // The broken connection was dropped; the next call works (the server may
  // first run and roll back the abandoned transaction).
  auto renewed = backend->acquire_or_renew(request_for("m", "a"), in(seconds(10)));
  ASSERT_THAT(renewed, IsOk()) << renewed.status();
  EXPECT_EQ(renewed->owner.owner_id, "a");
}

// ---- JVM Simba on the same table ---------------------------------------------------
//
// FakeJvmContender plays a JVM Simba node: JdbcMutexOwnerRepository's four
// statements (simba-behaviour.md §3.1.3) on a connection of its own, in the
// server's default time zone (ours run in UTC: the clock must agree), driven
// by JdbcMutexContendService's loop (§3.1.4) with ContendPeriod's delays
// (§2.1).

constexpr char kJvmNow[] = "UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3))*1000";

class FakeJvmContender {
 public:
  struct Hooks {
    std::function<void()> on_acquired;
    std::function<void()> on_released;
  };

  FakeJvmContender(const std::string& uri, std::string table, std::string mutex, std::string id,
                   milliseconds ttl, milliseconds transition, Hooks hooks)
      : db_(uri),
        table_(std::move(table)),
        mutex_(std::move(mutex)),
        id_(std::move(id)),
        ttl_(ttl),
        transition_(transition),
        hooks_(std::move(hooks)),
        random_(std::random_device{}()) {}
  ~FakeJvmContender() {
    if (loop_.joinable()) stop();
  }
  bool ok() const { return db_.ok(); }

  void start() {
    std::lock_guard<std::mutex> lock(mu_);
    active_ = true;
    ++generation_;
    pending_ = steady_clock::now();  // initialDelay 0
    const std::uint64_t gen = generation_;
    if (loop_.joinable()) loop_.join();
    loop_ = std::thread([this, gen] { loop(gen); });
  }

  // stopContend: deactivate, notifyOwner(NONE), RELEASE.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      active_ = false;
      cv_.notify_all();
      notify_owner_locked(Owner{});
    }
    release();
    loop_.join();
  }

  int attempts() {
    std::lock_guard<std::mutex> lock(mu_);
    return attempts_;
  }

 private:
  struct Owner {
    std::string id;
    long long acquired_at = 0, ttl_at = 0, transition_at = 0, current_db_at = 0;
  };

  // ---- JdbcMutexOwnerRepository ----
  std::string m() { return db_.literal(mutex_); }
  bool acquire() {
    const std::string now = std::string("CAST(") + kJvmNow + " AS UNSIGNED)";
    auto r =
        db_.query("update " + table_ + " set acquired_at=" + now + ", ttl_at=" + now + "+" +
                  std::to_string(ttl_.count()) + ", transition_at=" + now + "+" +
                  std::to_string((ttl_ + transition_).count()) + ", owner_id=" + db_.literal(id_) +
                  ", version=version+1 where mutex=" + m() + " and ((transition_at < " + kJvmNow +
                  ") or (owner_id=" + db_.literal(id_) + " and transition_at > " + kJvmNow + "))");
    if (!r) throw std::runtime_error("ACQUIRE: " + db_.error());
    return db_.affected() > 0;
  }
  std::optional<Owner> get() {
    auto rows =
        db_.query("select acquired_at, ttl_at, transition_at, owner_id, version, CAST(" +
                  std::string(kJvmNow) + " AS UNSIGNED) from " + table_ + " where mutex=" + m());
    if (!rows) throw std::runtime_error("GET: " + db_.error());
    if (rows->empty()) return std::nullopt;
    const auto& row = rows->front();
    return Owner{row[3], std::stoll(row[0]), std::stoll(row[1]), std::stoll(row[2]),
                 std::stoll(row[5])};
  }
  void init() {
    if (!db_.query("insert into " + table_ +
                   " (mutex, acquired_at, ttl_at, transition_at, owner_id, version) values (" +
                   m() + ", 0, 0, 0, '', 0)") &&
        db_.error_code() != ER_DUP_ENTRY) {
      throw std::runtime_error("INIT: " + db_.error());
    }
  }
  Owner ensure_owner() {
    if (auto owner = get()) return *owner;
    init();
    if (auto owner = get()) return *owner;
    throw std::runtime_error("No mutex found");
  }
  Owner acquire_and_get_owner() {
    std::lock_guard<std::mutex> lock(db_mu_);
    if (!db_.query("start transaction")) throw std::runtime_error(db_.error());
    try {
      bool acquired = acquire();
      Owner owner = ensure_owner();
      if (!acquired && !(owner.transition_at >= owner.current_db_at)) {
        acquired = acquire();
        owner = ensure_owner();
      }
      if (acquired && owner.id != id_) throw std::runtime_error("inconsistent");
      if (!db_.query("commit")) throw std::runtime_error(db_.error());
      return owner;
    } catch (...) {
      db_.query("rollback");
      throw;
    }
  }
  void release() {
    std::lock_guard<std::mutex> lock(db_mu_);
    db_.query("update " + table_ +
              " set acquired_at=0, ttl_at=0, transition_at=0, owner_id='', version=version+1 "
              "where mutex=" +
              m() + " and owner_id=" + db_.literal(id_));
  }

  // ---- JdbcMutexContendService + ContendPeriod ----
  milliseconds next_delay(const Owner& owner) {
    long long delay;
    if (owner.id == id_) {
      delay = owner.ttl_at - owner.current_db_at;
    } else {
      const bool zero = owner.transition_at - owner.ttl_at == 0;
      std::uniform_int_distribution<long long> jitter(zero ? 0 : ContendPeriod::kJitterMin,
                                                      ContendPeriod::kJitterMax - 1);
      delay = owner.transition_at - owner.current_db_at + jitter(random_);
    }
    return milliseconds(std::max(0LL, delay));
  }

  void notify_owner_locked(const Owner& owner) {
    const bool was = view_ == id_;
    const bool is = owner.id == id_;
    const bool changed = view_ != owner.id;
    view_ = owner.id;
    if (changed && was && hooks_.on_released) hooks_.on_released();
    if (changed && is && hooks_.on_acquired) hooks_.on_acquired();
  }

  void loop(std::uint64_t gen) {
    std::unique_lock<std::mutex> lock(mu_);
    while (active_ && generation_ == gen) {
      if (steady_clock::now() < pending_) {
        cv_.wait_until(lock, pending_);
        continue;
      }
      lock.unlock();
      std::optional<Owner> owner;
      try {
        owner = acquire_and_get_owner();
      } catch (const std::exception&) {
        owner.reset();
      }
      lock.lock();
      ++attempts_;
      if (active_ && generation_ == gen) {
        if (owner) {
          notify_owner_locked(*owner);
          pending_ = steady_clock::now() + next_delay(*owner);
        } else {
          if (view_ == id_) notify_owner_locked(Owner{});
          pending_ = steady_clock::now() + ttl_;
        }
      } else if (owner && owner->id == id_) {
        lock.unlock();
        release();  // the compensating release of a late acquisition
        lock.lock();
      }
    }
  }

  RawMysql db_;
  std::mutex db_mu_;
  const std::string table_;
  const std::string mutex_;
  const std::string id_;
  const milliseconds ttl_;
  const milliseconds transition_;
  const Hooks hooks_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool active_ = false;
  std::uint64_t generation_ = 0;
  steady_clock::time_point pending_{};
  std::string view_;
  int attempts_ = 0;
  std::mt19937_64 random_;
  std::thread loop_;
};

TEST(MysqlJvmInterop, JvmRowsAreReadAndTakenOver) {
  drop_test_table();
  const std::string uri = shared_uri();
  auto backend = open(uri);
  ASSERT_TRUE(backend);
  SIMBA_ASSERT_OK(backend->list(in(seconds(5))));  // creates the table
  Latch jvm_acquired;
  FakeJvmContender jvm(shared_server_uri("mysql"), test_table(), "m", "jvm:4242@host", seconds(2),
                       seconds(1), {[&] { jvm_acquired.set(); }, nullptr});
  ASSERT_TRUE(jvm.ok());
  jvm.start();
  ASSERT_TRUE(jvm_acquired.wait(seconds(5)));
  // Ours reads the JVM's lease and cannot take it.
  auto read = backend->read("m", in(seconds(5)));
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(read->owner.owner_id, "jvm:4242@host");
  EXPECT_EQ(read->owner.transition_at - read->owner.ttl_at, milliseconds(1000));
  auto refused = backend->acquire_or_renew(request_for("m", "cpp"), in(seconds(5)));
  ASSERT_THAT(refused, IsOk());
  EXPECT_EQ(refused->owner.owner_id, "jvm:4242@host");
  // After JVM Simba's release ours takes it, with a higher version.
  jvm.stop();
  auto taken = backend->acquire_or_renew(request_for("m", "cpp"), in(seconds(5)));
  ASSERT_THAT(taken, IsOk());
  EXPECT_EQ(taken->owner.owner_id, "cpp");
  EXPECT_GE(taken->owner.fencing_token, 3u);  // JVM acquire (1), release (2), ours
}

// ---- the wait line (backends/sql/wait_line.h) -----------------------------------

// The holder keeps its GET_LOCK name while it holds, so its release grants
// it to the process waiting in line, which then asks at once: a hand-off at
// once, where polling waited for the lease's end (16 s
// at this lease). The control: without the line (queue_connections=0) the
// waiter is still waiting a second later.
TEST(MysqlLine, AReleaseWakesTheProcessWaitingInLine) {
  drop_test_table();
  for (const bool line : {true, false}) {
    SCOPED_TRACE(line ? "with the line" : "without it");
    const std::string uri = shared_uri() + (line ? "" : "&queue_connections=0");
    const std::string mutex = line ? "m" : "m0";
    auto factory_a = make_factory(uri, seconds(10), seconds(6));
    auto factory_b = make_factory(uri, seconds(10), seconds(6));
    ASSERT_TRUE(factory_a && factory_b);
    EXPECT_EQ(factory_b->backend()->capabilities().push_release, line);
    Recorder a, b;
    auto holder = factory_a->create_contend_service(a.contender(mutex, "a")).value();
    auto waiter = factory_b->create_contend_service(b.contender(mutex, "b")).value();
    SIMBA_ASSERT_OK(holder->start());
    ASSERT_TRUE(a.acquired.wait(seconds(5)));
    SIMBA_ASSERT_OK(waiter->start());
    ASSERT_TRUE(eventually([&] { return waiter->after_owner().owner_id == "a"; }, seconds(5)));
    if (line) {
      // The holder keeps the line's name.
      RawMysql raw(shared_server_uri("mysql"));
      ASSERT_TRUE(raw.ok());
      const std::string name =
          "#simba-line:" +
          internal::sql::mysql::sha256_hex(test_table() + "\n" + mutex).substr(0, 48);
      ASSERT_TRUE(eventually(
          [&] {
            auto rows = raw.query("SELECT IS_USED_LOCK('" + name + "') IS NOT NULL");
            return rows && !rows->empty() && (*rows)[0][0] == "1";
          },
          seconds(5)));
    }
    std::this_thread::sleep_for(milliseconds(200));
    const auto released_at = steady_clock::now();
    SIMBA_ASSERT_OK(holder->stop());
    if (!line) {
      EXPECT_FALSE(b.acquired.wait(seconds(1))) << "the control: a poller waits for the lease";
      SIMBA_ASSERT_OK(waiter->stop());
      continue;
    }
    ASSERT_TRUE(b.acquired.wait(seconds(3)));
    EXPECT_LT(b.acquired_at() - released_at, seconds(1));
    EXPECT_GT(b.token.load(), a.token.load());
    SIMBA_ASSERT_OK(waiter->stop());
  }
}

// JVM Simba holds without a place in the line, so its release wakes nobody:
// the first in line looks every 200 ms while such a holder has the mutex,
// and takes it within a look of the release, not at the lease's end (16 s).
TEST(MysqlLine, TheFirstInLineLooksWhileJvmSimbaHolds) {
  drop_test_table();
  auto factory = make_factory(shared_uri(), seconds(10), seconds(6));
  ASSERT_TRUE(factory);
  SIMBA_ASSERT_OK(factory->backend()->list(in(seconds(5))));  // creates the table
  Latch jvm_acquired;
  FakeJvmContender jvm(shared_server_uri("mysql"), test_table(), "m", "jvm:4242@host", seconds(10),
                       seconds(6), {[&] { jvm_acquired.set(); }, nullptr});
  ASSERT_TRUE(jvm.ok());
  jvm.start();
  ASSERT_TRUE(jvm_acquired.wait(seconds(5)));
  Recorder b;
  auto waiter = factory->create_contend_service(b.contender("m", "b")).value();
  SIMBA_ASSERT_OK(waiter->start());
  ASSERT_TRUE(
      eventually([&] { return waiter->after_owner().owner_id == "jvm:4242@host"; }, seconds(5)));
  std::this_thread::sleep_for(milliseconds(500));
  const auto released_at = steady_clock::now();
  jvm.stop();
  ASSERT_TRUE(b.acquired.wait(seconds(3)));
  EXPECT_LT(b.acquired_at() - released_at,
            internal::sql::WaitLine::kFirstLooks + milliseconds(800));
  SIMBA_ASSERT_OK(waiter->stop());
}

// A free row that is not reserved is anybody's, whoever holds its line
// lock (another process first in line, or a line session the server has not
// yet closed). MySQL assigns the upsert's columns left to right, and an
// attempt that wrote acquired_at before owner_id read its own `now` as a
// reserve: it refused the rest, left the row free with a new version, and
// a free mutex was refused (simba-bench's uncontended loop, after a few
// hundred pairs). The control: a row still reserved is refused while
// another session holds the line lock, and taken once it frees it.
TEST(MysqlLine, AFreeRowIsTakenWhileAnotherSessionHoldsTheLineLock) {
  drop_test_table();
  auto backend = open(shared_uri());
  ASSERT_TRUE(backend);
  SIMBA_ASSERT_OK(backend->list(in(seconds(5))));  // creates the table
  RawMysql raw(shared_server_uri("mysql"));
  ASSERT_TRUE(raw.ok()) << raw.error();
  const std::string name =
      "#simba-line:" + internal::sql::mysql::sha256_hex(test_table() + "\n" + "m").substr(0, 48);
  ASSERT_EQ(raw.exec("SELECT GET_LOCK('" + name + "', 0)"), "1");
  ASSERT_EQ(raw.exec("INSERT INTO " + test_table() +
                     " (mutex, acquired_at, ttl_at, transition_at, owner_id, version) "
                     "VALUES ('m', 0, 0, 0, '', 7)"),
            "");
  auto got = backend->acquire_or_renew(request_for("m", "a"), in(seconds(5)));
  SIMBA_ASSERT_OK(got);
  EXPECT_TRUE(got->owner.is_owner("a")) << got->owner;
  EXPECT_EQ(got->owner.fencing_token, 8u);
  auto row = raw.query("SELECT owner_id, version FROM " + test_table() + " WHERE mutex = 'm'");
  ASSERT_TRUE(row && row->size() == 1);
  EXPECT_EQ((*row)[0], (std::vector<std::string>{"a", "8"}));

  // The control: reserved for the first in line for a minute.
  ASSERT_EQ(raw.exec("UPDATE " + test_table() +
                     " SET owner_id = '', ttl_at = 0, transition_at = 0, acquired_at = "
                     "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + 60000 WHERE mutex = 'm'"),
            "");
  got = backend->acquire_or_renew(request_for("m", "b"), in(seconds(5)));
  SIMBA_ASSERT_OK(got);
  EXPECT_FALSE(got->owner.has_owner_id()) << got->owner;
  ASSERT_EQ(raw.exec("SELECT RELEASE_LOCK('" + name + "')"), "1");
  // (b's place in line may take the line lock now: then b's attempt goes
  // on that session, for which the reserved row is free too.)
  ASSERT_TRUE(eventually(
      [&] {
        auto again = backend->acquire_or_renew(request_for("m", "b"), in(seconds(5)));
        return again.ok() && again->owner.is_owner("b");
      },
      seconds(5)));
  SIMBA_EXPECT_OK(backend->release("m", "b", in(seconds(5))));
}

// MySQL ends a wait in line only by closing its session, and the server
// may grant the line lock to that session before it notices the close: the
// row a release reserved for the first in line, this process, was then
// refused to this process's own next try (a try_lock() right after another
// node's unlock returned false, clustered conformance 1-2 in 200). A proxy
// keeps the server's side of the closed session open, so the server counts
// it as the holder for as long as the test needs: our try takes the
// reserved row; the control, another process's try, is refused.
TEST(MysqlLine, OurTryTakesARowReservedForOurClosedWait) {
  drop_test_table();
  auto parsed = Uri::parse(shared_server_uri("mysql"));
  SIMBA_ASSERT_OK(parsed);
  const std::string port = ":" + std::to_string(*parsed->hosts.front().port);
  TcpProxy proxy(*parsed->hosts.front().port);
  std::string uri = shared_uri();
  uri.replace(uri.find(port), port.size(), ":" + std::to_string(proxy.port()));
  auto ours = open(uri);
  auto theirs = open(shared_uri());
  ASSERT_TRUE(ours && theirs);
  SIMBA_ASSERT_OK(ours->list(in(seconds(5))));  // creates the table
  RawMysql raw(shared_server_uri("mysql"));
  ASSERT_TRUE(raw.ok()) << raw.error();
  const std::string name =
      "#simba-line:" + internal::sql::mysql::sha256_hex(test_table() + "\n" + "m").substr(0, 48);
  const std::string used = "SELECT IFNULL(IS_USED_LOCK('" + name + "'), 0)";
  ASSERT_EQ(raw.exec("SELECT GET_LOCK('" + name + "', 0)"), "1");
  const std::string raw_id = raw.exec("SELECT CONNECTION_ID()");
  // Released a minute ago by someone, and reserved for the first in line.
  ASSERT_EQ(raw.exec("INSERT INTO " + test_table() +
                     " (mutex, acquired_at, ttl_at, transition_at, owner_id, version) "
                     "VALUES ('m', CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + 60000, 0, 0, "
                     "'', 7)"),
            "");
  auto got = ours->acquire_or_renew(request_for("m", "b"), in(seconds(5)));
  SIMBA_ASSERT_OK(got);
  ASSERT_FALSE(got->owner.has_owner_id()) << got->owner;
  // b waits in line: its place's session asks for the line lock.
  ASSERT_TRUE(eventually(
      [&] {
        return raw.exec(
                   "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE "
                   "'SELECT GET_LOCK(%'") == "1";
      },
      seconds(5)));
  // Granted as b gives up: the grant's answer never reaches b, and the
  // server is not told that b's session closed.
  proxy.set_drop_replies(true);
  proxy.set_keep_server_open(true);
  ASSERT_EQ(raw.exec("SELECT RELEASE_LOCK('" + name + "')"), "1");
  ASSERT_TRUE(eventually(
      [&] {
        const std::string holder = raw.exec(used);
        return holder != "0" && holder != raw_id;
      },
      seconds(5)));
  SIMBA_ASSERT_OK(ours->leave("m", "b", in(seconds(5))));
  ASSERT_TRUE(eventually([&] { return proxy.kept_open() == 1; }, seconds(5)));
  proxy.set_drop_replies(false);
  const std::string closed = raw.exec(used);
  ASSERT_NE(closed, "0");

  // The control: for another process the row is reserved.
  got = theirs->acquire_or_renew(request_for("m", "c"), in(seconds(5)));
  SIMBA_ASSERT_OK(got);
  EXPECT_FALSE(got->owner.has_owner_id()) << got->owner;
  SIMBA_ASSERT_OK(theirs->leave("m", "c", in(seconds(5))));
  // Ours: the line lock's holder is our closed session.
  EXPECT_EQ(raw.exec(used), closed);
  got = ours->acquire_or_renew(request_for("m", "b"), in(seconds(5)));
  SIMBA_ASSERT_OK(got);
  EXPECT_TRUE(got->owner.is_owner("b")) << got->owner;
  EXPECT_EQ(got->owner.fencing_token, 8u);
  SIMBA_EXPECT_OK(ours->release("m", "b", in(seconds(5))));
  proxy.set_keep_server_open(false);
}

// A try that will not wait (AcquireRequest::once, Locker::try_acquire)
// gets no place in line: MySQL ends a wait only by closing its session, so
// each failed try opened a connection and closed it (69 connections for 300
// failed tries). The control: an attempt that waits gets in line at once.
TEST(MysqlLine, ATryThatWillNotWaitGetsNoPlaceInLine) {
  drop_test_table();
  auto theirs = open(shared_uri());
  auto ours = open(shared_uri());
  ASSERT_TRUE(theirs && ours);
  auto held = theirs->acquire_or_renew(request_for("m", "a"), in(seconds(5)));
  SIMBA_ASSERT_OK(held);
  ASSERT_TRUE(held->owner.is_owner("a"));
  RawMysql raw(shared_server_uri("mysql"));
  ASSERT_TRUE(raw.ok()) << raw.error();
  const std::string name =
      "#simba-line:" + internal::sql::mysql::sha256_hex(test_table() + "\n" + "m").substr(0, 48);
  const std::string waits =
      "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT GET_LOCK(''" +
      name + "''%'";
  AcquireRequest once = request_for("m", "b");
  once.once = true;
  for (int i = 0; i < 3; ++i) {
    auto got = ours->acquire_or_renew(once, in(seconds(5)));
    SIMBA_ASSERT_OK(got);
    EXPECT_TRUE(got->owner.is_owner("a")) << got->owner;
  }
  // A place would be asking within milliseconds.
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(raw.exec(waits), "0");
  // The control.
  auto got = ours->acquire_or_renew(request_for("m", "b"), in(seconds(5)));
  SIMBA_ASSERT_OK(got);
  EXPECT_TRUE(got->owner.is_owner("a")) << got->owner;
  EXPECT_TRUE(eventually([&] { return raw.exec(waits) == "1"; }, seconds(5)));
  SIMBA_EXPECT_OK(ours->leave("m", "b", in(seconds(5))));
  SIMBA_EXPECT_OK(theirs->release("m", "a", in(seconds(5))));
}

// JVM Simba contenders and ours on one mutex, `line` saying whether ours
// wait in line (queue_connections): never two inside at once, and the
// mutex crosses from one side to the other.
void expect_mixed_contention_keeps_mutual_exclusion(bool line) {
  drop_test_table();
  const std::string uri = shared_uri() + (line ? "" : "&queue_connections=0");
  const std::string mutex = "interop";
  // The same on both sides: each side's loop decides when it renews by its
  // own config, and C++ holds believe their lease for ttl + transition from
  // the lease they wrote; with equal settings nobody's view outlives the
  // row. Holds are far shorter than ttl, so nobody needs to renew.
  constexpr milliseconds kTtl{2000};
  constexpr milliseconds kTransition{1000};
  CriticalSection section;
  std::atomic<bool> done{false};

  // Each holder: contend; once inside by its own view, hold 100-300 ms (or
  // until it learns it lost the mutex); leave the section *before* it
  // releases at the store (the release hands the mutex on); rest 0-100 ms;
  // contend again.
  auto hold_then_leave = [&done](std::mt19937& random, const std::function<bool()>& inside,
                                 const std::function<void()>& leave) {
    const auto end =
        steady_clock::now() + milliseconds(std::uniform_int_distribution<int>(100, 300)(random));
    while (steady_clock::now() < end && inside() && !done) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    leave();
  };

  // Rests between holds. A releaser starts again within its rest and finds
  // the mutex free, so a poller (at the lease end) gets in only when its
  // poll lands in someone's rest. Without the line both sides rest 300-1300
  // ms: at 0-100 ms a crossing took 13 s on a quiet machine, and once not
  // within the 60 s cap under CI's load. With the line ours hand the mutex
  // to each other at once, and a JVM contender, polling at the lease end,
  // gets it only when it is free then: ours rest 0.5-1.5 s, or JVM Simba's
  // pollers would never get in (docs/backends/mysql.md, "The wait line"),
  // and JVM Simba's 0-100 ms.
  const int rest_min = line ? 500 : 300;
  const int rest_max = line ? 1500 : 1300;
  const int jvm_rest_min = line ? 0 : 300;
  const int jvm_rest_max = line ? 100 : 1300;
  std::vector<std::unique_ptr<MutexContendServiceFactory>> factories;
  for (int i = 0; i < 2; ++i) {
    factories.push_back(make_factory(uri, kTtl, kTransition));
    ASSERT_TRUE(factories.back());
  }
  // Creates the table before the JVM side runs (JVM Simba's script would).
  SIMBA_ASSERT_OK(factories[0]->backend()->list(in(seconds(5))));
  std::vector<std::unique_ptr<FakeJvmContender>> jvms;
  std::vector<std::thread> workers;
  for (int i = 0; i < 2; ++i) {
    const std::string id = "cpp-" + std::to_string(i) + ":" + std::to_string(::getpid());
    auto contender = make_contender(
        mutex, [&section, id](const MutexState&) { section.enter(id, CriticalSection::kCpp); },
        [&section, id](const MutexState&) { section.exit(id); }, id);
    std::shared_ptr<MutexContendService> service =
        factories[static_cast<std::size_t>(i)]->create_contend_service(contender).value();
    workers.emplace_back([&, id, service] {
      std::mt19937 random(std::random_device{}());
      while (!done) {
        section.rejoin(id);
        if (!service->start().ok()) break;
        if (section.wait_inside(id)) {
          hold_then_leave(
              random, [&] { return section.is_inside(id); }, [&] { section.leave(id); });
        }
        SIMBA_EXPECT_OK(service->stop());
        std::this_thread::sleep_for(
            milliseconds(std::uniform_int_distribution<int>(rest_min, rest_max)(random)));
      }
    });
  }
  for (int i = 0; i < 2; ++i) {
    const std::string id = "jvm-" + std::to_string(i) + ":4242@jvm-host";
    jvms.push_back(std::make_unique<FakeJvmContender>(
        shared_server_uri("mysql"), test_table(), mutex, id, kTtl, kTransition,
        FakeJvmContender::Hooks{[&section, id] { section.enter(id, CriticalSection::kJvm); },
                                [&section, id] { section.exit(id); }}));
    ASSERT_TRUE(jvms.back()->ok());
    FakeJvmContender* jvm = jvms.back().get();
    workers.emplace_back([&, id, jvm] {
      std::mt19937 random(std::random_device{}());
      while (!done) {
        section.rejoin(id);
        jvm->start();
        if (section.wait_inside(id)) {
          hold_then_leave(
              random, [&] { return section.is_inside(id); }, [&] { section.leave(id); });
        }
        jvm->stop();
        std::this_thread::sleep_for(
            milliseconds(std::uniform_int_distribution<int>(jvm_rest_min, jvm_rest_max)(random)));
      }
    });
  }

  // At least 8 s, and on until ownership crossed sides at least once each
  // way (JVM Simba polls at the hard lease end, so its hand-offs are slow),
  // within a generous cap.
  const auto started = steady_clock::now();
  while (steady_clock::now() - started < seconds(8) ||
         ((section.jvm_to_cpp() < 1 || section.cpp_to_jvm() < 1) &&
          steady_clock::now() - started < scaled(seconds(60)))) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  section.close();
  done = true;
  for (auto& worker : workers) worker.join();

  EXPECT_EQ(section.max_inside(), 1u) << ::testing::PrintToString(section.overlaps());
  EXPECT_TRUE(section.overlaps().empty());
  EXPECT_GE(section.jvm_to_cpp(), 1);
  EXPECT_GE(section.cpp_to_jvm(), 1);
  std::cout << (line ? "with the line: " : "") << "entries " << section.entries() << ", JVM->C++ "
            << section.jvm_to_cpp() << ", C++->JVM " << section.cpp_to_jvm() << ", elapsed "
            << std::chrono::duration_cast<milliseconds>(steady_clock::now() - started).count()
            << " ms\n";
}

TEST(MysqlJvmInterop, MixedContentionKeepsMutualExclusion) {
  expect_mixed_contention_keeps_mutual_exclusion(/*line=*/false);
}

TEST(MysqlJvmInterop, MixedContentionWithTheWaitLineKeepsMutualExclusion) {
  expect_mixed_contention_keeps_mutual_exclusion(/*line=*/true);
}

// ---- a holder's death, seen through its line session (session-backed tenures) ---------

// The server ends the line session of a holder that lives on but is paused
// (KILL CONNECTION, wait_timeout, a restart: it cannot tell). The waiter
// takes the mutex over a grace later, while the holder is still paused;
// the holder, resumed, no longer believes it holds (its bound passed while
// it was stopped). A SIGKILLed holder is the conformance suite's
// KilledOwnerIsReplacedWithinTheLease.
TEST(MysqlSessionBacked, APausedHolderWhoseSessionEndedNoLongerBelievesOnceTakenOver) {
  constexpr milliseconds kGrace{300};
  const std::string table = "mt_backed_pause";
  const std::string uri = shared_server_uri("mysql") + "?table=" + table + "&session_grace=300ms";
  ChildHolder holder(uri, "m");
  ASSERT_TRUE(holder.started()) << "the child did not take the mutex";
  RawMysql raw(shared_server_uri("mysql"));
  ASSERT_TRUE(raw.ok()) << raw.error();
  ASSERT_TRUE(eventually(
      [&] {
        return raw.exec("SELECT COUNT(*) FROM " + table + "_session s JOIN " + table +
                        " t ON t.mutex = s.mutex WHERE s.mutex = 'm' AND s.version = t.version "
                        "AND t.owner_id = 'child'") == "1";
      },
      seconds(5)))
      << "the holder's tenure was never recorded as backed";
  auto factory = make_factory(uri, seconds(10), seconds(5));
  ASSERT_TRUE(factory);
  Recorder waiter;
  auto service = factory->create_contend_service(waiter.contender("m", "waiter")).value();
  SIMBA_ASSERT_OK(service->start());
  ASSERT_TRUE(eventually([&] { return service->after_owner().owner_id == "child"; }, seconds(5)));
  ASSERT_TRUE(holder.signal(SIGSTOP));
  holder.drain();
  // The session that holds the line's name is the holder's line session.
  const std::string line =
      "#simba-line:" + internal::sql::mysql::sha256_hex(table + "\n" + "m").substr(0, 48);
  const std::string session = raw.exec("SELECT IS_USED_LOCK(" + raw.literal(line) + ")");
  ASSERT_FALSE(session.empty()) << "nobody holds the line's name";
  ASSERT_EQ(raw.exec("KILL CONNECTION " + session), "");
  ASSERT_TRUE(waiter.acquired.wait(kGrace + kGrace / 8 + seconds(2)))
      << "the waiter did not take it over";
  ASSERT_TRUE(holder.signal(SIGCONT));
  // (The first byte may have been worked out before the pause.)
  holder.next(scaled(seconds(2)));
  EXPECT_EQ(holder.next(scaled(seconds(2))), '0')
      << "the resumed holder believes in a tenure the waiter holds";
  EXPECT_TRUE(service->is_owner());
  SIMBA_ASSERT_OK(service->stop());
}

}  // namespace
}  // namespace simba::testing
