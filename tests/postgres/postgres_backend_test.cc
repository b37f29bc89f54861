// The PostgreSQL backend beyond the conformance suite: names, the table's
// creation and privileges, push hand-off, killed sessions (a restarted
// server is the conformance suite's ServerRestartConformance). Every test
// but the tables of error codes (PostgresErrorCodes) runs against a real
// PostgreSQL server.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <netdb.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/postgres/pg_connection.h"
#include "backends/sql/wait_line.h"
#include "core/host_lookup.h"
#include "simba/backends/postgres.h"
#include "simba/backends/postgres_keyed.h"
#include "simba/contend_service.h"
#include "simba/contender.h"
#include "simba/registry.h"
#include "testing/child_holder.h"
#include "testing/fake_resolver.h"
#include "testing/latch.h"
#include "testing/status_matchers.h"
#include "testing/store_test_helpers.h"
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
  std::string table = std::string("pt_") + info->name();
  std::transform(table.begin(), table.end(), table.begin(), [](unsigned char c) {
    return std::isalnum(c) ? static_cast<char>(std::tolower(c)) : '_';
  });
  return table.substr(0, 60);
}

std::string shared_uri() { return shared_server_uri("postgres") + "?table=" + test_table(); }

// Adds `query` ("a=b&c=d") to `uri`, which may have a query already.
std::string with_query(const std::string& uri, const std::string& query) {
  return uri + (uri.find('?') == std::string::npos ? "?" : "&") + query;
}

// Plain libpq for what the test itself does to the server.
class Psql {
 public:
  explicit Psql(const std::string& uri) {
    // Our URIs carry query keys of ours that libpq does not know.
    conn_ = PQconnectdb(uri.substr(0, uri.find('?')).c_str());
  }
  ~Psql() { PQfinish(conn_); }
  bool ok() const { return PQstatus(conn_) == CONNECTION_OK; }
  // The first column of the first row ("" if none), or "ERROR: ..." text.
  std::string exec(const std::string& sql) {
    PGresult* r = PQexec(conn_, sql.c_str());
    std::string out;
    const auto status = PQresultStatus(r);
    if (status == PGRES_TUPLES_OK && PQntuples(r) > 0) {
      out = PQgetvalue(r, 0, 0);
    } else if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) {
      out = std::string("ERROR: ") + PQresultErrorMessage(r);
    }
    PQclear(r);
    return out;
  }
  // The payloads of the notices that have come in (after a LISTEN), oldest
  // first; "ERROR: ..." if the connection failed.
  std::vector<std::string> notices() {
    std::vector<std::string> out;
    if (PQconsumeInput(conn_) != 1) return {std::string("ERROR: ") + PQerrorMessage(conn_)};
    while (PGnotify* notify = PQnotifies(conn_)) {
      out.emplace_back(notify->extra != nullptr ? notify->extra : "");
      PQfreemem(notify);
    }
    return out;
  }

 private:
  PGconn* conn_;
};

// The application_name of this test's session(s) called `who`: sessions of
// other tests on the shared server never carry it.
std::string app_name(const std::string& who) { return (who + "_" + test_table()).substr(0, 63); }

// shared_uri() for the sessions called `who`.
std::string named_uri(const std::string& who) {
  return with_query(shared_uri(), "application_name=" + app_name(who));
}

// True once the backend whose sessions carry application_name `app` listens
// for pushes: its LISTEN session has finished the LISTEN (pg_stat_activity
// shows it idle after it; the listener sends nothing else for 15 s), so a
// NOTIFY from now on reaches it.
bool is_listening(Psql& admin, const std::string& app) {
  return eventually(
      [&] {
        return admin.exec("SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + app +
                          "' AND state = 'idle' AND query LIKE 'LISTEN %'") != "0";
      },
      seconds(5));
}

// True once `waiter` has asked the store and been told `owner` holds it.
bool told_owner_is(const MutexContendService& waiter, const std::string& owner) {
  return eventually([&] { return waiter.after_owner().owner_id == owner; }, seconds(5));
}

// ---- names, URIs, the table -----------------------------------------------------

TEST(PostgresNames, LongNamesAreRejectedNotTruncated) {
  auto backend = open(shared_uri());
  ASSERT_TRUE(backend);
  const std::string at_limit(66, 'm');
  SIMBA_EXPECT_OK(backend->acquire_or_renew(request_for(at_limit, "a"), in(seconds(5))));
  EXPECT_THAT(backend->acquire_or_renew(request_for(at_limit + "x", "a"), in(seconds(5))),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("66")));
  EXPECT_THAT(backend->acquire_or_renew(request_for("m", std::string(129, 'c')), in(seconds(5))),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("contender_id")));
  // The 66-character row is there under its full name.
  Psql psql(shared_server_uri("postgres"));
  ASSERT_TRUE(psql.ok());
  EXPECT_EQ(psql.exec("SELECT owner_id FROM " + test_table() + " WHERE mutex = '" + at_limit + "'"),
            "a");
}

TEST(PostgresUri, ParsesAndPassesLibpqOptionsThrough) {
  auto uri = Uri::parse(
      "postgresql://alice:s3cret@db.example:5433/app?sslmode=require&application_name=x&"
      "connections=3&table=locks&create_table=off&lock_connections=4&"  // keyed locks'
      "queue_connections=0");
  ASSERT_THAT(uri, IsOk());
  auto options = postgres_options_from_uri(*uri);
  ASSERT_THAT(options, IsOk());
  EXPECT_EQ(options->params.at("host"), "db.example");
  EXPECT_EQ(options->params.at("port"), "5433");
  EXPECT_EQ(options->params.at("dbname"), "app");
  EXPECT_EQ(options->params.at("user"), "alice");
  EXPECT_EQ(options->params.at("password"), "s3cret");
  EXPECT_EQ(options->params.at("sslmode"), "require");
  EXPECT_EQ(options->params.at("application_name"), "x");
  EXPECT_EQ(options->connections, 3);
  EXPECT_EQ(options->queue_connections, 0);
  EXPECT_EQ(options->table, "locks");
  EXPECT_FALSE(options->create_table);
  for (const char* bad :
       {"postgresql://h/db?sslmdoe=require", "postgresql://h/db?host=x",
        "postgresql://h/db?connections=0", "postgresql://h/db?create_table=1",
        "postgresql://h/db?queue_connections=17", "postgresql://h/db?queue_connections=-1",
        "postgresql://h", "mysql://h/db"}) {
    auto parsed = Uri::parse(bad);
    ASSERT_THAT(parsed, IsOk()) << bad;
    EXPECT_THAT(postgres_options_from_uri(*parsed), StatusIs(StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(PostgresUri, LibpqOptionsReachTheConnection) {
  // The test server has no TLS: sslmode=require must fail (libpq got it),
  // and for good (a server's TLS setup does not change by itself);
  // sslmode=disable must work.
  auto required = open(with_query(shared_uri(), "sslmode=require"));
  ASSERT_TRUE(required);
  EXPECT_THAT(required->read("m", in(seconds(5))),
              StatusIs(StatusCode::kPermissionDenied, HasSubstr("SSL")));
  auto disabled = open(with_query(shared_uri(), "sslmode=disable"));
  ASSERT_TRUE(disabled);
  SIMBA_EXPECT_OK(disabled->read("m", in(seconds(5))));
}

// ---- host names ------------------------------------------------------------------

constexpr char kFakeHost[] = "db.simba-test.invalid";

// `uri` with the test server's host (127.0.0.1) replaced by `host`.
std::string with_host(std::string uri, const std::string& host) {
  const std::string server_host = "127.0.0.1";
  return uri.replace(uri.find(server_host), server_host.size(), host);
}

using PostgresHostNames = FakeResolverTest;

TEST_F(PostgresHostNames, AHungResolverCannotStallACallPastItsDeadline) {
  auto backend = open(with_host(shared_uri(), kFakeHost));
  ASSERT_TRUE(backend);
  const auto deadline = milliseconds(300);
  const auto start = steady_clock::now();
  auto read = backend->read("m", start + deadline);
  const auto took = steady_clock::now() - start;
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().code(),
              ::testing::AnyOf(StatusCode::kDeadlineExceeded, StatusCode::kUnavailable));
  EXPECT_THAT(read.status().message(), HasSubstr(kFakeHost));
  EXPECT_LT(took, deadline + scaled(milliseconds(1500)))
      << std::chrono::duration_cast<milliseconds>(took).count() << " ms";
  // The lookup was ours, and still hangs: libpq was never asked to resolve.
  EXPECT_EQ(internal::host_lookups_in_flight_for_testing(), 1u);
  // Once the resolver answers, the same backend connects to the address.
  fake_->release.set();
  EXPECT_TRUE(eventually([&] { return backend->read("m", in(seconds(5))).ok(); }, seconds(20)));
}

TEST_F(PostgresHostNames, AnUnknownHostIsUnavailableAndNamed) {
  fake_->error = EAI_NONAME;
  fake_->release.set();
  auto backend = open(with_host(shared_uri(), kFakeHost));
  ASSERT_TRUE(backend);
  auto read = backend->read("m", in(seconds(5)));
  EXPECT_THAT(read, StatusIs(StatusCode::kUnavailable, HasSubstr("cannot resolve host")));
  EXPECT_THAT(read.status().message(), HasSubstr(kFakeHost));
}

TEST_F(PostgresHostNames, EveryAddressOfANameIsTriedInTurn) {
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

TEST_F(PostgresHostNames, HostListsAreResolvedEntryByEntry) {
  fake_->unknown_host = "unknown.simba-test.invalid";
  fake_->release.set();
  auto uri = Uri::parse(shared_uri());
  ASSERT_THAT(uri, IsOk());
  auto options = postgres_options_from_uri(*uri);
  ASSERT_THAT(options, IsOk());
  // A socket directory without a server, a name that does not resolve (left
  // out), then the server by name: libpq tries them in turn.
  options->params["host"] =
      std::string("/nonexistent-simba-dir,unknown.simba-test.invalid,") + kFakeHost;
  auto backend = new_postgres_backend(*options);
  ASSERT_THAT(backend, IsOk());
  SIMBA_EXPECT_OK((*backend)->read("m", in(seconds(10))));
  // With no entry left to try, the lookup's error.
  options->params["host"] = "unknown.simba-test.invalid";
  auto unknown = new_postgres_backend(*options);
  ASSERT_THAT(unknown, IsOk());
  EXPECT_THAT((*unknown)->read("m", in(seconds(5))),
              StatusIs(StatusCode::kUnavailable, HasSubstr("unknown.simba-test.invalid")));
}

TEST_F(PostgresHostNames, LocalhostStillConnects) {
  internal::set_get_addr_info_for_testing({});  // the system's resolver
  auto backend = open(with_host(shared_uri(), "localhost"));
  ASSERT_TRUE(backend);
  SIMBA_EXPECT_OK(backend->read("m", in(seconds(10))));
}

// `simba schema` prints the side table only where its name fits in 63
// bytes, as the backend uses it only then (a longer name would be cut by
// PostgreSQL and refused by MySQL).
TEST(PostgresTable, TheSchemaLeavesOutASideTableWhoseNameWouldNotFit) {
  const std::string fits(55, 'a');
  auto with = schema_sql("postgresql://u@127.0.0.1:1/db?table=" + fits);
  ASSERT_THAT(with, IsOk());
  EXPECT_THAT(*with, HasSubstr("CREATE TABLE IF NOT EXISTS " + fits + "_session ("));
  auto without = schema_sql("postgresql://u@127.0.0.1:1/db?table=" + fits + "b");
  ASSERT_THAT(without, IsOk());
  EXPECT_THAT(*without, Not(HasSubstr("_session")));
  EXPECT_THAT(*without, HasSubstr("CREATE TABLE IF NOT EXISTS " + fits + "b ("));
}

TEST(PostgresTable, MissingTableWithoutPrivilegeSaysWhatToRun) {
  const std::string admin_uri = shared_server_uri("postgres");
  Psql admin(admin_uri);
  ASSERT_TRUE(admin.ok());
  // A user that may connect but not create tables (PostgreSQL 15 no longer
  // lets everyone create in the public schema).
  admin.exec("DROP TABLE IF EXISTS " + test_table());
  admin.exec("DROP ROLE IF EXISTS simba_reader");
  ASSERT_EQ(admin.exec("CREATE ROLE simba_reader LOGIN"), "");
  ASSERT_EQ(admin.exec("REVOKE CREATE ON SCHEMA public FROM PUBLIC"), "");
  const std::string rest = admin_uri.substr(admin_uri.find('@'));
  const std::string reader_uri = "postgresql://simba_reader" + rest + "?table=" + test_table();
  auto reader = open(reader_uri);
  ASSERT_TRUE(reader);
  auto denied = reader->acquire_or_renew(request_for("m", "a"), in(seconds(5)));
  EXPECT_THAT(denied, StatusIs(StatusCode::kPermissionDenied, HasSubstr("CREATE TABLE")));
  EXPECT_THAT(denied.status().message(), HasSubstr(test_table()));
  // With create_table=off it does not even try: the same advice.
  auto no_create = open(with_query(reader_uri, "create_table=off"));
  ASSERT_TRUE(no_create);
  EXPECT_THAT(no_create->read("m", in(seconds(5))),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("CREATE TABLE")));
  // A DBA runs the DDL (as printed: the table and its side table) and
  // grants; then it works.
  auto ddl = schema_sql(shared_uri());
  ASSERT_THAT(ddl, IsOk());
  EXPECT_THAT(*ddl, HasSubstr("CREATE TABLE IF NOT EXISTS " + test_table() + "_session ("));
  ASSERT_EQ(admin.exec(*ddl), "");
  ASSERT_EQ(admin.exec("GRANT SELECT, INSERT, UPDATE ON " + test_table() + " TO simba_reader"), "");
  auto granted = reader->acquire_or_renew(request_for("m", "a"), in(seconds(5)));
  ASSERT_THAT(granted, IsOk());
  EXPECT_EQ(granted->owner.owner_id, "a");
  admin.exec("DROP TABLE " + test_table());
  admin.exec("DROP ROLE simba_reader");
}

TEST(PostgresTable, LayoutIsSimbasAndTokensAreVersions) {
  auto backend = open(shared_uri());
  ASSERT_TRUE(backend);
  auto first = backend->acquire_or_renew(request_for("m", "a"), in(seconds(5)));
  ASSERT_THAT(first, IsOk());
  EXPECT_EQ(first->owner.transition_at - first->owner.acquired_at, milliseconds(3000));
  EXPECT_EQ(first->owner.ttl_at - first->owner.acquired_at, milliseconds(2000));
  Psql psql(shared_server_uri("postgres"));
  ASSERT_TRUE(psql.ok());
  EXPECT_EQ(psql.exec("SELECT version FROM " + test_table() + " WHERE mutex = 'm'"),
            std::to_string(first->owner.fencing_token));
  // A renewal keeps the version; a release and the next acquisition raise it.
  auto renewed = backend->acquire_or_renew(request_for("m", "a"), in(seconds(5)));
  ASSERT_THAT(renewed, IsOk());
  EXPECT_EQ(renewed->owner.fencing_token, first->owner.fencing_token);
  ASSERT_THAT(backend->release("m", "a", in(seconds(5))), IsOk());
  EXPECT_EQ(psql.exec("SELECT owner_id || '/' || transition_at FROM " + test_table() +
                      " WHERE mutex = 'm'"),
            "/0");
  auto next = backend->acquire_or_renew(request_for("m", "b"), in(seconds(5)));
  ASSERT_THAT(next, IsOk());
  EXPECT_GT(next->owner.fencing_token, first->owner.fencing_token);
}

// When a release wakes every waiter, each one's attempt finds the mutex
// held by the one that came first. Such an attempt must read the row and
// write nothing: when each took the row lock and flushed a commit in turn,
// 16 waiting processes cut the hand-off rate to a fifth of one process's.
// Here a session of the test's holds the row lock: a waiter still hears who
// owns the mutex at once, because it never asks for that lock.
TEST(PostgresTable, AWaiterThatFindsTheMutexHeldTakesNoRowLock) {
  auto owner = open(shared_uri());
  auto waiter = open(shared_uri());
  ASSERT_TRUE(owner && waiter);
  ASSERT_THAT(owner->acquire_or_renew(request_for("m", "a"), in(seconds(5))), IsOk());
  Psql locker(shared_server_uri("postgres"));
  ASSERT_TRUE(locker.ok());
  ASSERT_EQ(locker.exec("BEGIN"), "");
  ASSERT_EQ(locker.exec("SELECT owner_id FROM " + test_table() + " WHERE mutex = 'm' FOR UPDATE"),
            "a");
  const auto asked = steady_clock::now();
  auto told = waiter->acquire_or_renew(request_for("m", "b"), in(seconds(3)));
  const auto took = steady_clock::now() - asked;
  locker.exec("ROLLBACK");
  ASSERT_THAT(told, IsOk());
  EXPECT_EQ(told->owner.owner_id, "a");
  EXPECT_LT(took, seconds(2)) << "the waiter's attempt waited for the row lock";
  // The owner's renewal does take it (and waited for the test's session).
  auto renewed = owner->acquire_or_renew(request_for("m", "a"), in(seconds(5)));
  ASSERT_THAT(renewed, IsOk());
  EXPECT_EQ(renewed->owner.owner_id, "a");
}

// A renewal whose statement waited on the row lock (behind a commit held
// for a synchronous standby, in the fault runs that found this) runs with the
// `now` of when it began. Meanwhile the owner renewed again; the late one
// must not move the lease back to its older now + ttl, or a contender takes
// the mutex while the owner still counts on the later renewal.
TEST(PostgresTable, ARenewalThatWaitedOnTheRowNeverShortensTheLease) {
  auto owner = open(shared_uri());
  auto late = open(shared_uri());  // its own session, the same owner id
  ASSERT_TRUE(owner && late);
  ASSERT_THAT(owner->acquire_or_renew(request_for("m", "a"), in(seconds(5))), IsOk());
  Psql row(shared_server_uri("postgres"));
  ASSERT_TRUE(row.ok());
  const std::string table = test_table();
  ASSERT_EQ(row.exec("BEGIN"), "");
  ASSERT_EQ(row.exec("SELECT owner_id FROM " + table + " WHERE mutex = 'm' FOR UPDATE"), "a");
  Result<OwnerRecord> waited = unavailable_error("not run");
  std::thread renewal(
      [&] { waited = late->acquire_or_renew(request_for("m", "a"), in(seconds(10))); });
  std::this_thread::sleep_for(milliseconds(1500));
  // The owner's later renewal, as the row lock's holder writes it.
  const std::string later =
      row.exec("UPDATE " + table +
               " SET ttl_at = floor(extract(epoch from clock_timestamp()) * 1000) + 2000, "
               "transition_at = floor(extract(epoch from clock_timestamp()) * 1000) + 3000 "
               "WHERE mutex = 'm' RETURNING transition_at");
  ASSERT_EQ(row.exec("COMMIT"), "");
  renewal.join();
  ASSERT_THAT(waited, IsOk());
  EXPECT_EQ(waited->owner.owner_id, "a");
  const long long now_at =
      std::stoll(row.exec("SELECT transition_at FROM " + table + " WHERE mutex = 'm'"));
  EXPECT_GE(now_at, std::stoll(later)) << "the late renewal moved the lease back";
  // And another contender still finds it held.
  auto other = owner->acquire_or_renew(request_for("m", "b"), in(seconds(5)));
  ASSERT_THAT(other, IsOk());
  EXPECT_EQ(other->owner.owner_id, "a");
}

// Several processes using a new table at once each try to create it; the
// losers must carry on, not fail (CI once saw "type ... already exists").
// A release does not wait for its commit to be durable (the driver's
// lazy_release_sql): lost in a crash, it leaves the row held by a process
// that acts on it no more, until its lease ends, and the next holder's
// durable commit makes it durable too. Here every durable commit waits for
// a synchronous standby that never comes: a release still returns, and an
// acquisition, whose lease must survive a crash, does not (the control).
TEST(PostgresTable, AReleaseDoesNotWaitForItsCommitToBeDurable) {
  auto server = TestServer::start("postgres");
  ASSERT_THAT(server, IsOk());
  const std::string uri = (*server)->uri();
  Psql admin(uri);
  ASSERT_TRUE(admin.ok());
  ASSERT_EQ(admin.exec(postgres_schema_sql()), "");
  const std::string now = "(extract(epoch from clock_timestamp()) * 1000)::bigint";
  ASSERT_EQ(admin.exec("INSERT INTO simba_mutex (mutex, acquired_at, ttl_at, transition_at, "
                       "owner_id, version) VALUES ('m', " +
                       now + ", " + now + " + 60000, " + now + " + 70000, 'a', 7)"),
            "");
  ASSERT_EQ(admin.exec("ALTER SYSTEM SET synchronous_standby_names = 'absent'"), "");
  ASSERT_EQ(admin.exec("SELECT pg_reload_conf()::text"), "true");
  // Sessions that begin after the reload have it.
  ASSERT_TRUE(eventually(
      [&] { return Psql(uri).exec("SHOW synchronous_standby_names") == "absent"; }, seconds(5)));
  auto backend = open(uri);
  ASSERT_TRUE(backend);
  auto released = backend->release("m", "a", 7, in(seconds(5)));
  ASSERT_THAT(released, IsOk());
  EXPECT_TRUE(*released);
  EXPECT_EQ(admin.exec("SELECT owner_id || '/' || version FROM simba_mutex WHERE mutex = 'm'"),
            "/8");
  auto acquired =
      backend->acquire_or_renew(request_for("m", "b", seconds(10), seconds(6)), in(seconds(1)));
  EXPECT_FALSE(acquired.ok()) << "the acquisition did not wait for a durable commit";
}

TEST(PostgresTable, ConcurrentFirstUseCreatesTheTableOnce) {
  Psql psql(shared_server_uri("postgres"));
  ASSERT_TRUE(psql.ok());
  constexpr int kBackends = 8;
  for (int round = 0; round < 20; ++round) {
    ASSERT_EQ(psql.exec("DROP TABLE IF EXISTS " + test_table()), "");
    std::vector<std::shared_ptr<Backend>> backends;
    for (int i = 0; i < kBackends; ++i) {
      backends.push_back(open(shared_uri()));
      ASSERT_TRUE(backends.back());
    }
    const std::vector<Status> results = acquire_all_at_once(backends);
    for (int i = 0; i < kBackends; ++i) EXPECT_THAT(results[i], IsOk()) << "round " << round;
  }
}

// ---- hand-off ---------------------------------------------------------------------

TEST(PostgresHandOff, WaiterTakesOverWithinARoundTripOfTheRelease) {
  Psql admin(shared_server_uri("postgres"));
  ASSERT_TRUE(admin.ok());
  auto factory_a = make_factory(shared_uri(), seconds(10), seconds(6));
  auto factory_b = make_factory(named_uri("b"), seconds(10), seconds(6));
  ASSERT_TRUE(factory_a && factory_b);
  Recorder a, b;
  auto holder = factory_a->create_contend_service(a.contender("m", "a")).value();
  auto waiter = factory_b->create_contend_service(b.contender("m", "b")).value();
  SIMBA_ASSERT_OK(holder->start());
  ASSERT_TRUE(a.acquired.wait(seconds(5)));
  SIMBA_ASSERT_OK(waiter->start());
  // b has looked and is waiting, and listens.
  ASSERT_TRUE(told_owner_is(*waiter, "a"));
  ASSERT_TRUE(is_listening(admin, app_name("b")));
  EXPECT_FALSE(b.acquired.is_set());
  const auto released_at = steady_clock::now();
  SIMBA_ASSERT_OK(holder->stop());
  // Polling would take the hard lease (16 s); NOTIFY takes a round trip.
  ASSERT_TRUE(b.acquired.wait(seconds(3)));
  EXPECT_LT(steady_clock::now() - released_at, seconds(1));
  EXPECT_GT(b.token.load(), a.token.load());
  SIMBA_ASSERT_OK(waiter->stop());
}

// An operator's force_release NOTIFYs the holder with its token in the same
// transaction: the holder stops at once, not at its next renewal (20 s
// here), and the waiter is woken as by a release.
// The listener's thread runs the listener; a listener that drops the
// backend destroys the LISTEN thread's owner on that very thread (before
// #21 it detached and then freed what the thread still read).
TEST(PostgresHandOff, AListenerMayDestroyTheBackendAndItsOwnSubscription) {
  expect_a_listener_may_destroy_its_backend(shared_uri());
}

TEST(PostgresForce, HolderIsToldAtOnceAndTheWaiterTakesOver) {
  Psql admin(shared_server_uri("postgres"));
  ASSERT_TRUE(admin.ok());
  auto factory_a = make_factory(shared_uri(), seconds(20), seconds(5));
  auto factory_b = make_factory(named_uri("b"), seconds(20), seconds(5));
  ASSERT_TRUE(factory_a && factory_b);
  Recorder a, b;
  auto holder = factory_a->create_contend_service(a.contender("m", "a")).value();
  auto waiter = factory_b->create_contend_service(b.contender("m", "b")).value();
  SIMBA_ASSERT_OK(holder->start());
  ASSERT_TRUE(a.acquired.wait(seconds(5)));
  const std::uint64_t a_token = holder->fencing_token();
  // What the store pushes about a's hold, as the core's subscription hears it.
  auto backend = open(named_uri("events"));
  ASSERT_TRUE(backend);
  std::mutex events_mu;
  std::vector<MutexEvent> events;
  auto listening = backend->subscribe("m", "a", [&](const MutexEvent& e) {
    std::lock_guard<std::mutex> lock(events_mu);
    events.push_back(e);
  });
  ASSERT_THAT(listening, IsOk());
  SIMBA_ASSERT_OK(waiter->start());
  // Both listen, and b has looked and waits.
  ASSERT_TRUE(is_listening(admin, app_name("events")));
  ASSERT_TRUE(is_listening(admin, app_name("b")));
  ASSERT_TRUE(told_owner_is(*waiter, holder->contender_id()));
  EXPECT_FALSE(b.acquired.is_set());

  const auto forced_at = steady_clock::now();
  auto forced = backend->force_release("m", in(seconds(3)));
  ASSERT_THAT(forced, IsOk());
  EXPECT_EQ(forced->previous.owner_id, holder->contender_id());
  ASSERT_TRUE(a.released.wait(seconds(3)));
  EXPECT_LT(steady_clock::now() - forced_at, seconds(2));
  ASSERT_TRUE(eventually([&] { return holder->is_owner() || waiter->is_owner(); }, seconds(3)));
  EXPECT_GT(std::max(holder->fencing_token(), waiter->fencing_token()), forced->fencing_floor);
  // The loss reaches this backend's own LISTEN session, which need not have
  // read it yet.
  ASSERT_TRUE(eventually(
      [&] {
        std::lock_guard<std::mutex> lock(events_mu);
        return std::any_of(events.begin(), events.end(),
                           [](const MutexEvent& e) { return e.kind == MutexEvent::Kind::kLost; });
      },
      seconds(3)));
  {
    std::lock_guard<std::mutex> lock(events_mu);
    const auto lost = std::find_if(events.begin(), events.end(), [](const MutexEvent& e) {
      return e.kind == MutexEvent::Kind::kLost;
    });
    ASSERT_NE(lost, events.end());
    EXPECT_EQ(lost->owner_id, holder->contender_id());
    EXPECT_EQ(lost->fencing_token, a_token);
    EXPECT_TRUE(lost->forced);
  }
  SIMBA_ASSERT_OK(waiter->stop());
  SIMBA_ASSERT_OK(holder->stop());
}

// A free mutex has nobody to tell: forcing it pushes no loss (an empty
// owner would match every owner).
TEST(PostgresForce, ForcingAFreeMutexPushesNoLoss) {
  Psql admin(shared_server_uri("postgres"));
  ASSERT_TRUE(admin.ok());
  auto backend = open(named_uri("x"));
  ASSERT_TRUE(backend);
  std::mutex events_mu;
  std::vector<MutexEvent> events;
  auto listening = backend->subscribe("free", "x", [&](const MutexEvent& e) {
    std::lock_guard<std::mutex> lock(events_mu);
    events.push_back(e);
  });
  ASSERT_THAT(listening, IsOk());
  ASSERT_TRUE(is_listening(admin, app_name("x")));
  ASSERT_THAT(backend->force_release("free", in(seconds(3))), IsOk());
  ASSERT_TRUE(eventually(
      [&] {
        std::lock_guard<std::mutex> lock(events_mu);
        return std::any_of(events.begin(), events.end(), [](const MutexEvent& e) {
          return e.kind == MutexEvent::Kind::kReleased && e.mutex == "free";
        });
      },
      seconds(3)));
  std::lock_guard<std::mutex> lock(events_mu);
  for (const MutexEvent& e : events) EXPECT_NE(e.kind, MutexEvent::Kind::kLost);
}

// ---- the wait line (backends/sql/wait_line.h) -----------------------------------

// The line lock of `mutex` in this test's table, as the two ints of
// pg_advisory_lock(int, int).
std::string line_key(const std::string& mutex) {
  const auto key =
      static_cast<std::uint64_t>(postgres_advisory_lock_key(test_table() + "\n" + mutex));
  return std::to_string(static_cast<std::int32_t>(static_cast<std::uint32_t>(key >> 32))) + ", " +
         std::to_string(static_cast<std::int32_t>(static_cast<std::uint32_t>(key)));
}

// True once a session called `app` holds (`granted`) or waits for an
// advisory lock.
bool in_line(Psql& admin, const std::string& app, bool granted) {
  return eventually(
      [&] {
        return admin.exec(
                   "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                   "WHERE l.locktype = 'advisory' AND l.granted = " +
                   std::string(granted ? "true" : "false") + " AND a.application_name = '" + app +
                   "'") != "0";
      },
      seconds(5));
}

// A waiter first in line has the released row reserved: the releaser,
// asking again at once (a loop around lock()), cannot take it back, which
// it did every time before the line (16 processes: the least served got 1
// acquisition). The control: with nobody in line (a waiter that asked once
// and does not listen), the releaser does take it back at once.
TEST(PostgresLine, AReleaserCannotTakeTheMutexBackFromTheFirstInLine) {
  Psql admin(shared_server_uri("postgres"));
  ASSERT_TRUE(admin.ok());
  for (const bool line : {true, false}) {
    SCOPED_TRACE(line ? "a waiter in line" : "nobody in line");
    const std::string mutex = line ? "m" : "m0";
    auto holder = open(shared_uri());
    auto factory = make_factory(named_uri("b"), seconds(10), seconds(6));
    ASSERT_TRUE(holder && factory);
    ASSERT_THAT(
        holder->acquire_or_renew(request_for(mutex, "a", seconds(10), seconds(6)), in(seconds(5))),
        IsOk());
    Recorder b;
    std::unique_ptr<MutexContendService> waiter;
    if (line) {
      waiter = factory->create_contend_service(b.contender(mutex, "b")).value();
      SIMBA_ASSERT_OK(waiter->start());
      ASSERT_TRUE(told_owner_is(*waiter, "a"));
      ASSERT_TRUE(in_line(admin, app_name("b"), /*granted=*/true));
    } else {
      auto asked =
          open(shared_uri())
              ->acquire_or_renew(request_for(mutex, "b", seconds(10), seconds(6)), in(seconds(5)));
      ASSERT_THAT(asked, IsOk());
      ASSERT_EQ(asked->owner.owner_id, "a");
    }
    const auto released_at = steady_clock::now();
    ASSERT_THAT(holder->release(mutex, "a", in(seconds(5))), IsOk());
    auto again =
        holder->acquire_or_renew(request_for(mutex, "a", seconds(10), seconds(6)), in(seconds(5)));
    ASSERT_THAT(again, IsOk());
    if (!line) {
      EXPECT_EQ(again->owner.owner_id, "a");
      continue;
    }
    EXPECT_NE(again->owner.owner_id, "a") << "the releaser took the mutex back";
    ASSERT_TRUE(b.acquired.wait(seconds(3)));
    EXPECT_LT(b.acquired_at() - released_at, seconds(1));
    SIMBA_ASSERT_OK(waiter->stop());
  }
}

// Who plays in a wait-line test: a session of the test's for reading the
// table, one that takes the line lock ahead of the waiter, the holder's
// backend and the waiter's ("b", its sessions named so pg_locks shows them).
struct LineScene {
  Psql admin{shared_server_uri("postgres")};
  Psql ahead{shared_server_uri("postgres")};
  std::shared_ptr<Backend> holder = open(shared_uri());
  std::shared_ptr<Backend> waiter = open(named_uri("b"));
  bool ok() const { return admin.ok() && ahead.ok() && holder && waiter; }
};

// A mutex name of `prefix` used by no earlier run (a release reserves the
// row for the first in line, and a rerun on the same server must not meet
// that).
std::string fresh_mutex(const std::string& prefix) {
  static int made = 0;
  return prefix + "-" + std::to_string(getpid()) + "-" + std::to_string(++made);
}

// `ahead` (a session of the test's) holds `mutex`'s line lock, `holder`'s
// contender "a" holds the mutex, and `waiter`'s contender "b", told so, is
// queued on the server behind `ahead` with its attempt.
void wait_behind(LineScene& scene, const std::string& mutex) {
  Psql& admin = scene.admin;
  Psql& ahead = scene.ahead;
  Backend& holder = *scene.holder;
  Backend& waiter = *scene.waiter;
  ASSERT_EQ(ahead.exec("SELECT pg_advisory_lock(" + line_key(mutex) + ")::text"), "");
  ASSERT_THAT(
      holder.acquire_or_renew(request_for(mutex, "a", seconds(10), seconds(6)), in(seconds(5))),
      IsOk());
  auto told =
      waiter.acquire_or_renew(request_for(mutex, "b", seconds(10), seconds(6)), in(seconds(5)));
  ASSERT_THAT(told, IsOk());
  ASSERT_EQ(told->owner.owner_id, "a");
  ASSERT_TRUE(in_line(admin, app_name("b"), /*granted=*/false));
}

// "a" holds `mutex` (taken on the pool) and "b" waits in line behind a
// session of the test's (wait_behind); "a"'s release is announced and the
// grant hands "b" the mutex on its line session, which it keeps. Then "c",
// another process (*c), queues behind "b".
void b_holds_in_line_and_c_queues(LineScene& scene, const std::string& mutex,
                                  std::shared_ptr<Backend>* c) {
  const std::string owner_of =
      "SELECT owner_id FROM " + test_table() + " WHERE mutex = '" + mutex + "'";
  ASSERT_NO_FATAL_FAILURE(wait_behind(scene, mutex));
  ASSERT_THAT(scene.holder->release(mutex, "a", in(seconds(5))), IsOk());
  ASSERT_EQ(scene.ahead.exec("SELECT pg_advisory_unlock(" + line_key(mutex) + ")::text"), "true");
  ASSERT_TRUE(eventually([&] { return scene.admin.exec(owner_of) == "b"; }, seconds(5)));
  auto b = scene.waiter->acquire_or_renew(request_for(mutex, "b", seconds(10), seconds(6)),
                                          in(seconds(5)));
  ASSERT_THAT(b, IsOk());
  ASSERT_EQ(b->owner.owner_id, "b");
  *c = open(named_uri("c"));
  ASSERT_TRUE(*c);
  auto told =
      (*c)->acquire_or_renew(request_for(mutex, "c", seconds(10), seconds(6)), in(seconds(5)));
  ASSERT_THAT(told, IsOk());
  ASSERT_EQ(told->owner.owner_id, "b");
  ASSERT_TRUE(in_line(scene.admin, app_name("c"), /*granted=*/false));
}

// A waiter's attempt goes with its wait in line, so it runs on the server
// as the line lock is granted, with no round trip of its own: the store
// names the waiter as the owner before the waiter asks again. Its next call
// takes that hold (the same token); had it left instead, the hold is given
// back (at once, or when the reply comes if it comes after the leave). Here
// the waiter is a bare backend, which calls only when the test
// does, queued behind a session of the test's that holds the line lock.
TEST(PostgresLine, AnAttemptSentWithTheWaitRunsAsTheLineLockIsGranted) {
  LineScene scene;
  ASSERT_TRUE(scene.ok());
  const std::string table = test_table();
  for (const bool leaves : {false, true}) {
    SCOPED_TRACE(leaves ? "the waiter leaves" : "the waiter asks again");
    const std::string mutex = fresh_mutex(leaves ? "m2" : "m1");
    ASSERT_NO_FATAL_FAILURE(wait_behind(scene, mutex));
    ASSERT_THAT(scene.holder->release(mutex, "a", in(seconds(5))), IsOk());
    ASSERT_EQ(scene.ahead.exec("SELECT pg_advisory_unlock(" + line_key(mutex) + ")::text"), "true");
    const std::string owner_of = "SELECT owner_id FROM " + table + " WHERE mutex = '" + mutex + "'";
    ASSERT_TRUE(eventually([&] { return scene.admin.exec(owner_of) == "b"; }, seconds(5)))
        << "the attempt did not run with the grant";
    const std::string version =
        scene.admin.exec("SELECT version FROM " + table + " WHERE mutex = '" + mutex + "'");
    if (leaves) {
      SIMBA_ASSERT_OK(scene.waiter->leave(mutex, "b", in(seconds(5))));
      // By the leave, or by the line when the attempt's reply comes after
      // it (a compensating release, as for the core's own attempts).
      EXPECT_TRUE(eventually([&] { return scene.admin.exec(owner_of).empty(); }, seconds(5)))
          << "the hold taken for the waiter was not given back";
      continue;
    }
    auto taken = scene.waiter->acquire_or_renew(request_for(mutex, "b", seconds(10), seconds(6)),
                                                in(seconds(5)));
    ASSERT_THAT(taken, IsOk());
    EXPECT_EQ(taken->owner.owner_id, "b");
    EXPECT_EQ(std::to_string(taken->owner.fencing_token), version);
    ASSERT_THAT(scene.waiter->release(mutex, "b", in(seconds(5))), IsOk());
    EXPECT_EQ(scene.admin.exec(owner_of), "");
  }
}

// A contender that took the mutex by its own call while its attempt still
// waited in line keeps it when the line lock comes: the attempt then only
// renews that same tenure, and giving it back released a live hold. The
// postgres-standby fault run caught it: a holder acted on token 21 while
// another took token 23 (the give-back's release made 22). There the
// attempt's reply was on its way when the contender's own take came back;
// here another contender of the process ("c") keeps the process in line.
TEST(PostgresLine, AnAttemptThatComesAfterTheContendersOwnTakeGivesNothingBack) {
  LineScene scene;
  ASSERT_TRUE(scene.ok());
  const std::string mutex = fresh_mutex("own-take");
  const std::string table = test_table();
  // "b"'s attempt goes with the wait (the first waiter by name).
  ASSERT_NO_FATAL_FAILURE(wait_behind(scene, mutex));
  auto told = scene.waiter->acquire_or_renew(request_for(mutex, "c", seconds(10), seconds(6)),
                                             in(seconds(5)));
  ASSERT_THAT(told, IsOk());
  ASSERT_EQ(told->owner.owner_id, "a");
  ASSERT_THAT(scene.holder->release(mutex, "a", in(seconds(5))), IsOk());
  // Once the release's reserve for the first in line is over, "b"'s own
  // call (on the pool) takes the row; its attempt is still queued.
  std::uint64_t token = 0;
  ASSERT_TRUE(eventually(
      [&] {
        auto taken = scene.waiter->acquire_or_renew(
            request_for(mutex, "b", seconds(10), seconds(6)), in(seconds(5)));
        if (!taken.ok() || taken->owner.owner_id != "b") return false;
        token = taken->owner.fencing_token;
        return true;
      },
      internal::sql::kQueueReserve + seconds(3)));
  ASSERT_EQ(scene.ahead.exec("SELECT pg_advisory_unlock(" + line_key(mutex) + ")::text"), "true");
  ASSERT_TRUE(in_line(scene.admin, app_name("b"), /*granted=*/true));
  // The attempt ran with the grant; a give-back would follow its reply at
  // once (a commit on loopback).
  std::this_thread::sleep_for(milliseconds(300));
  const std::string row =
      "SELECT owner_id || '/' || version FROM " + table + " WHERE mutex = '" + mutex + "'";
  EXPECT_EQ(scene.admin.exec(row), "b/" + std::to_string(token)) << "b's hold was given back";
  auto released = scene.waiter->release(mutex, "b", in(seconds(5)));
  ASSERT_THAT(released, IsOk());
  EXPECT_TRUE(*released);
  SIMBA_ASSERT_OK(scene.waiter->leave(mutex, "c", in(seconds(5))));
}

// A hold the line's attempt took for a contender is handed to that
// contender's next call only while nothing has overtaken it. Here the
// contender releases it first (by its token, as a clustered lock's run
// that took it by its own call would): its next call must ask the store,
// not be handed the released tenure. A clustered lock's next run (a new
// service, the same contender id) was, and two nodes held the lock at once
// (Postgres/ClusteredConformance.TwoNodesExcludeEachOther, 6 of 180 runs
// under load).
TEST(PostgresLine, AHoldTakenInLineIsNeverHandedOutAfterItsRelease) {
  LineScene scene;
  ASSERT_TRUE(scene.ok());
  const std::string mutex = fresh_mutex("handed");
  const std::string table = test_table();
  // The line tells the process's subscribers once it has read the
  // attempt's reply (a look for its waiters).
  Latch looked;
  auto listening = scene.waiter->subscribe(mutex, "b", [&](const MutexEvent& e) {
    if (e.kind == MutexEvent::Kind::kReleased && e.owner_id == "(first in line)") looked.set();
  });
  ASSERT_THAT(listening, IsOk());
  ASSERT_NO_FATAL_FAILURE(wait_behind(scene, mutex));
  ASSERT_THAT(scene.holder->release(mutex, "a", in(seconds(5))), IsOk());
  ASSERT_EQ(scene.ahead.exec("SELECT pg_advisory_unlock(" + line_key(mutex) + ")::text"), "true");
  ASSERT_TRUE(looked.wait(seconds(5))) << "the line did not read the attempt's reply";
  const std::string row =
      "SELECT owner_id || '/' || version FROM " + table + " WHERE mutex = '" + mutex + "'";
  const std::string taken = scene.admin.exec(row);
  ASSERT_EQ(taken.substr(0, 2), "b/") << "the attempt did not take the mutex";
  const std::uint64_t token = std::stoull(taken.substr(2));
  auto released = scene.waiter->release(mutex, "b", token, in(seconds(5)));
  ASSERT_THAT(released, IsOk());
  ASSERT_TRUE(*released);
  auto next = scene.waiter->acquire_or_renew(request_for(mutex, "b", seconds(10), seconds(6)),
                                             in(seconds(5)));
  ASSERT_THAT(next, IsOk());
  if (next->owner.owner_id == "b") {
    EXPECT_GT(next->owner.fencing_token, token) << "handed the released tenure";
    EXPECT_EQ(scene.admin.exec(row), "b/" + std::to_string(next->owner.fencing_token));
    ASSERT_THAT(scene.waiter->release(mutex, "b", next->owner.fencing_token, in(seconds(5))),
                IsOk());
  }
}

// A waiter that leaves while its wait (and the attempt sent with it) is
// queued on the server takes nothing when the lock comes: leaving cancels
// the wait on the server. Before, the process only closed its connection,
// and the server, which notices a gone client only when it next writes to
// it, ran the attempt when the lock came: the mutex was held for a process
// that had left, until its lease ended (caught by `simba elect` runs).
TEST(PostgresLine, AWaiterThatLeavesTheLineTakesNothingWhenTheLockComes) {
  LineScene scene;
  ASSERT_TRUE(scene.ok());
  const std::string mutex = fresh_mutex("left");
  const std::string owner_of =
      "SELECT owner_id FROM " + test_table() + " WHERE mutex = '" + mutex + "'";
  ASSERT_NO_FATAL_FAILURE(wait_behind(scene, mutex));
  SIMBA_ASSERT_OK(scene.waiter->leave(mutex, "b", in(seconds(5))));
  // The lock comes to whoever still waits for it, at once.
  ASSERT_THAT(scene.holder->release(mutex, "a", in(seconds(5))), IsOk());
  ASSERT_EQ(scene.ahead.exec("SELECT pg_advisory_unlock(" + line_key(mutex) + ")::text"), "true");
  // Its queued attempt would have run by now (a commit on loopback).
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(scene.admin.exec(owner_of), "") << "the attempt ran for a waiter that had left";
  auto next = scene.holder->acquire_or_renew(request_for(mutex, "c", seconds(10), seconds(6)),
                                             in(seconds(5)));
  ASSERT_THAT(next, IsOk());
  EXPECT_EQ(next->owner.owner_id, "c");
  ASSERT_THAT(scene.holder->release(mutex, "c", in(seconds(5))), IsOk());
}

// A release that frees the line lock for a session waiting for it is not
// announced: the server wakes that session, whose attempt takes the row,
// and a NOTIFY would only reach every listening process (each process in
// line holds it back unread; with 16 processes on one mutex that fan-out
// was a fifth of the machine's CPU). A release with nobody queued is
// announced, as is one made without the line lock.
TEST(PostgresLine, AReleaseThatHandsTheLineLockOnIsNotAnnounced) {
  LineScene scene;
  ASSERT_TRUE(scene.ok());
  Psql listener(shared_server_uri("postgres"));
  ASSERT_TRUE(listener.ok());
  const std::string table = test_table();
  ASSERT_EQ(listener.exec("LISTEN " + table), "");
  const std::string mutex = fresh_mutex("quiet");
  const std::string owner_of = "SELECT owner_id FROM " + table + " WHERE mutex = '" + mutex + "'";
  std::shared_ptr<Backend> c_backend;
  ASSERT_NO_FATAL_FAILURE(b_holds_in_line_and_c_queues(scene, mutex, &c_backend));
  // "b"'s release hands the line lock to "c", whose attempt (sent with its
  // wait) takes the row on the server as the lock is granted. That is only
  // after the release committed (Statement::after_commit): granted before,
  // the attempt read the row as still held, nothing was announced, and "c"
  // took the row only when the reserve ran out, a second later. So within
  // less than the reserve, though no call of "c"'s runs meanwhile. The
  // release's commit is made slow (a deferred trigger sleeps in it) so that
  // a grant before it would be seen.
  ASSERT_EQ(scene.admin.exec("CREATE OR REPLACE FUNCTION " + table +
                             "_slow() RETURNS trigger LANGUAGE plpgsql AS "
                             "$$BEGIN PERFORM pg_sleep(0.3); RETURN NULL; END$$"),
            "");
  ASSERT_EQ(scene.admin.exec("DROP TRIGGER IF EXISTS slow_release ON " + table), "");
  ASSERT_EQ(scene.admin.exec("CREATE CONSTRAINT TRIGGER slow_release AFTER UPDATE ON " + table +
                             " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.owner_id = '') "
                             "EXECUTE FUNCTION " +
                             table + "_slow()"),
            "");
  ASSERT_THAT(scene.waiter->release(mutex, "b", in(seconds(5))), IsOk());
  ASSERT_TRUE(eventually([&] { return scene.admin.exec(owner_of) == "c"; },
                         internal::sql::kQueueReserve * 8 / 10))
      << "the grant did not hand the mutex on";
  auto c =
      c_backend->acquire_or_renew(request_for(mutex, "c", seconds(10), seconds(6)), in(seconds(5)));
  ASSERT_THAT(c, IsOk());
  ASSERT_EQ(c->owner.owner_id, "c");
  // Nobody waits behind "c": its release is announced. Notices come in
  // commit order, so once it is here every earlier one is too.
  ASSERT_THAT(c_backend->release(mutex, "c", in(seconds(5))), IsOk());
  std::vector<std::string> heard;
  ASSERT_TRUE(eventually(
      [&] {
        for (std::string& n : listener.notices()) heard.push_back(std::move(n));
        return std::find(heard.begin(), heard.end(), mutex + "\nc") != heard.end();
      },
      seconds(5)))
      << "c's release was not announced";
  EXPECT_NE(std::find(heard.begin(), heard.end(), mutex + "\na"), heard.end())
      << "a's release (without the line lock) was not announced";
  EXPECT_EQ(std::find(heard.begin(), heard.end(), mutex + "\nb"), heard.end())
      << "b's release was announced although it woke c through the line lock";
  EXPECT_EQ(scene.admin.exec("DROP TRIGGER slow_release ON " + table), "");
}

// A release that hands the line lock to a session queued for it leaves the
// row reserved for that session: the releaser's next try could only find
// it taken (and would lock the row beside that session's attempt), so it
// is answered without a call and the releaser gets in line at once. The
// store's INSERTs are counted (a statement trigger): the only one after the
// release is the attempt of the process the release woke.
TEST(PostgresLine, TheReleaserOfAHandOffGetsInLineWithoutATry) {
  LineScene scene;
  ASSERT_TRUE(scene.ok());
  const std::string table = test_table();
  const std::string mutex = fresh_mutex("handed");
  const std::string owner_of = "SELECT owner_id FROM " + table + " WHERE mutex = '" + mutex + "'";
  std::shared_ptr<Backend> c_backend;
  ASSERT_NO_FATAL_FAILURE(b_holds_in_line_and_c_queues(scene, mutex, &c_backend));
  const std::string tries = table + "_tries";
  ASSERT_EQ(scene.admin.exec("CREATE SEQUENCE IF NOT EXISTS " + tries), "");
  ASSERT_EQ(scene.admin.exec("CREATE OR REPLACE FUNCTION " + tries +
                             "() RETURNS trigger LANGUAGE plpgsql AS "
                             "$$BEGIN PERFORM nextval('" +
                             tries + "'); RETURN NULL; END$$"),
            "");
  ASSERT_EQ(scene.admin.exec("DROP TRIGGER IF EXISTS count_tries ON " + table), "");
  ASSERT_EQ(scene.admin.exec("CREATE TRIGGER count_tries BEFORE INSERT ON " + table +
                             " FOR EACH STATEMENT EXECUTE FUNCTION " + tries + "()"),
            "");
  const auto count = [&] {
    return std::stoll(
        scene.admin.exec("SELECT last_value + CASE WHEN is_called THEN 0 ELSE -1 "
                         "END FROM " +
                         tries));
  };
  const long long before = count();
  ASSERT_THAT(scene.waiter->release(mutex, "b", in(seconds(5))), IsOk());
  // At once, as a loop around lock() asks: the answer is kept only for
  // less than the reserve.
  auto again = scene.waiter->acquire_or_renew(request_for(mutex, "b", seconds(10), seconds(6)),
                                              in(seconds(5)));
  ASSERT_THAT(again, IsOk());
  EXPECT_NE(again->owner.owner_id, "b");
  ASSERT_TRUE(eventually([&] { return scene.admin.exec(owner_of) == "c"; }, seconds(5)));
  // In line behind "c", whose hold it waits for.
  ASSERT_TRUE(in_line(scene.admin, app_name("b"), /*granted=*/false));
  EXPECT_EQ(count() - before, 1) << "the releaser tried the row the hand-off reserved";
  // The line still hands it on: "c"'s release wakes "b", whose attempt
  // takes it.
  ASSERT_THAT(
      c_backend->acquire_or_renew(request_for(mutex, "c", seconds(10), seconds(6)), in(seconds(5))),
      IsOk());
  ASSERT_THAT(c_backend->release(mutex, "c", in(seconds(5))), IsOk());
  ASSERT_TRUE(eventually([&] { return scene.admin.exec(owner_of) == "b"; },
                         internal::sql::kQueueReserve * 8 / 10));
  EXPECT_EQ(scene.admin.exec("DROP TRIGGER count_tries ON " + table), "");
  ASSERT_THAT(scene.waiter->acquire_or_renew(request_for(mutex, "b", seconds(10), seconds(6)),
                                             in(seconds(5))),
              IsOk());
  ASSERT_THAT(scene.waiter->release(mutex, "b", in(seconds(5))), IsOk());
}

// The line decides who tries first, never who may hold: a process paused
// while first in line (here a session of the test's holding the line lock)
// costs the one behind it at most the reserve and one lock wait, not the
// end of the last holder's lease (16 s here), when it would ask next.
TEST(PostgresLine, APausedFirstInLineDelaysTheNextTakeOnlyByTheReserve) {
  Psql admin(shared_server_uri("postgres"));
  Psql paused(shared_server_uri("postgres"));
  ASSERT_TRUE(admin.ok() && paused.ok());
  auto holder = open(shared_uri());
  auto factory = make_factory(named_uri("b"), seconds(10), seconds(6));
  ASSERT_TRUE(holder && factory);
  ASSERT_THAT(
      holder->acquire_or_renew(request_for("m", "a", seconds(10), seconds(6)), in(seconds(5))),
      IsOk());
  ASSERT_EQ(paused.exec("SELECT pg_advisory_lock(" + line_key("m") + ")::text"), "");
  Recorder b;
  auto waiter = factory->create_contend_service(b.contender("m", "b")).value();
  SIMBA_ASSERT_OK(waiter->start());
  ASSERT_TRUE(told_owner_is(*waiter, "a"));
  ASSERT_TRUE(is_listening(admin, app_name("b")));
  ASSERT_TRUE(in_line(admin, app_name("b"), /*granted=*/false));
  const auto released_at = steady_clock::now();
  ASSERT_THAT(holder->release("m", "a", in(seconds(5))), IsOk());
  ASSERT_TRUE(b.acquired.wait(seconds(10)));
  const auto bound =
      internal::sql::kQueueReserve + internal::sql::WaitLine::kWaitChunk + seconds(1);
  EXPECT_LT(b.acquired_at() - released_at, bound);
  SIMBA_ASSERT_OK(waiter->stop());
}

// ---- failures -----------------------------------------------------------------------

// Without session-backed tenures (session_grace=0ms): a holder whose
// sessions the server ended renews on new ones and keeps its lease. (With
// them, the default, it loses the tenure its line session backed: the next
// test.)
TEST(PostgresFailures, TerminatedSessionsAreReplacedAndPushResumes) {
  const std::string uri = with_query(shared_uri(), "session_grace=0ms");
  auto factory_a =
      make_factory(with_query(uri, "application_name=simba_kill_a"), seconds(2), seconds(1));
  auto factory_b =
      make_factory(with_query(uri, "application_name=simba_kill_b"), seconds(10), seconds(6));
  ASSERT_TRUE(factory_a && factory_b);
  Recorder a, b;
  auto holder = factory_a->create_contend_service(a.contender("m", "a")).value();
  auto waiter = factory_b->create_contend_service(b.contender("m", "b")).value();
  SIMBA_ASSERT_OK(holder->start());
  ASSERT_TRUE(a.acquired.wait(seconds(5)));
  SIMBA_ASSERT_OK(waiter->start());
  // b has looked, and both backends' sessions (b's listener too) are up
  // before they are killed.
  Psql admin(shared_server_uri("postgres"));
  ASSERT_TRUE(admin.ok());
  ASSERT_TRUE(told_owner_is(*waiter, "a"));
  ASSERT_TRUE(is_listening(admin, "simba_kill_b"));
  const std::string killed = admin.exec(
      "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name IN "
      "('simba_kill_a', 'simba_kill_b')");
  EXPECT_NE(killed, "0");
  // The holder renews on a new connection (ttl 2 s) and keeps its lease.
  std::this_thread::sleep_for(seconds(3));
  EXPECT_TRUE(holder->is_owner());
  EXPECT_FALSE(a.released.is_set());
  // The waiter's listener reconnected: a release still reaches it at once.
  ASSERT_TRUE(is_listening(admin, "simba_kill_b"));
  const auto released_at = steady_clock::now();
  SIMBA_ASSERT_OK(holder->stop());
  ASSERT_TRUE(b.acquired.wait(seconds(3)));
  EXPECT_LT(steady_clock::now() - released_at, seconds(1));
  SIMBA_ASSERT_OK(waiter->stop());
}

// ---- error codes (no server) -------------------------------------------------------

namespace pg = internal::sql::pg;
using internal::sql::SqlFailure;
using ::testing::AllOf;

// libpq 15's texts, one entry per host and address tried.
constexpr char kRefused[] =
    "connection to server at \"127.0.0.1\", port 5433 failed: Connection refused\n"
    "\tIs the server running on that host and accepting TCP/IP connections?\n";
constexpr char kWrongPassword[] =
    "connection to server at \"127.0.0.1\", port 5432 failed: FATAL:  password authentication "
    "failed for user \"simba\"\n";

// Transient (kUnavailable) if any host's failure is, else the first's code.
TEST(PostgresErrorCodes, AConnectFailureIsTransientIfAnyHostsIs) {
  struct Case {
    const char* what;
    std::string message;
    StatusCode code;
  };
  const Case cases[] = {
      {"one host, refused", kRefused, StatusCode::kUnavailable},
      {"refused, then a wrong password", std::string(kRefused) + kWrongPassword,
       StatusCode::kUnavailable},
      {"a wrong password, then refused", std::string(kWrongPassword) + kRefused,
       StatusCode::kUnavailable},
      {"a wrong password on both", std::string(kWrongPassword) + kWrongPassword,
       StatusCode::kPermissionDenied},
      {"no pg_hba.conf entry",
       "connection to server at \"127.0.0.1\", port 5432 failed: FATAL:  no pg_hba.conf entry "
       "for host \"127.0.0.1\", user \"simba\", database \"simba\", no encryption\n",
       StatusCode::kPermissionDenied},
      {"certificate verify failed",
       "connection to server at \"127.0.0.1\", port 5432 failed: SSL error: certificate verify "
       "failed\n",
       StatusCode::kPermissionDenied},
      {"host name mismatch",
       "connection to server at \"127.0.0.1\", port 5432 failed: server certificate for "
       "\"localhost\" (and 1 other name) does not match host name \"wrong.simba-test.invalid\"\n",
       StatusCode::kPermissionDenied},
      {"a server without TLS",
       "connection to server at \"127.0.0.1\", port 5432 failed: server does not support SSL, but "
       "SSL was required\n",
       StatusCode::kPermissionDenied},
      {"a client certificate refused",
       "connection to server at \"127.0.0.1\", port 5432 failed: SSL error: tlsv1 alert unknown "
       "ca\n",
       StatusCode::kPermissionDenied},
      {"a role that may not log in",
       "connection to server at \"127.0.0.1\", port 5432 failed: FATAL:  role \"reader\" is not "
       "permitted to log in\n",
       StatusCode::kPermissionDenied},
      {"no CONNECT privilege",
       "connection to server at \"127.0.0.1\", port 5432 failed: FATAL:  permission denied for "
       "database \"simba\"\nDETAIL:  User does not have CONNECT privilege.\n",
       StatusCode::kPermissionDenied},
      {"no such database",
       "connection to server at \"127.0.0.1\", port 5432 failed: FATAL:  database \"x\" does not "
       "exist\n",
       StatusCode::kNotFound},
      {"no such role",
       "connection to server at \"127.0.0.1\", port 5432 failed: FATAL:  role \"x\" does not "
       "exist\n",
       StatusCode::kNotFound},
      {"no root certificate file",
       "connection to server at \"127.0.0.1\", port 5432 failed: root certificate file "
       "\"/nonexistent/ca.pem\" does not exist\nEither provide the file or change sslmode to "
       "disable server certificate verification.\n",
       StatusCode::kInvalidArgument},
      {"no client key file",
       "connection to server at \"127.0.0.1\", port 5432 failed: could not open private key file "
       "\"/nonexistent/key.pem\": No such file or directory\n",
       StatusCode::kInvalidArgument},
      {"only standbys (read-write)",
       "connection to server at \"127.0.0.1\", port 5433 failed: session is read-only\n"
       "connection to server at \"127.0.0.1\", port 5434 failed: session is read-only\n",
       StatusCode::kUnavailable},
      {"only standbys (primary)",
       "connection to server at \"127.0.0.1\", port 5433 failed: server is in hot standby mode\n",
       StatusCode::kUnavailable},
      {"starting up",
       "connection to server at \"127.0.0.1\", port 5432 failed: FATAL:  the database system is "
       "starting up\n",
       StatusCode::kUnavailable},
      {"shutting down",
       "connection to server at \"127.0.0.1\", port 5432 failed: FATAL:  the database system is "
       "shutting down\n",
       StatusCode::kUnavailable},
      {"too many clients",
       "connection to server at \"127.0.0.1\", port 5432 failed: FATAL:  sorry, too many clients "
       "already\n",
       StatusCode::kUnavailable},
      {"a socket without a server",
       "connection to server on socket \"/tmp/.s.PGSQL.5432\" failed: No such file or directory\n"
       "\tIs the server running locally and accepting connections on that socket?\n",
       StatusCode::kUnavailable},
      {"a socket without a server, then a wrong password",
       "connection to server on socket \"/tmp/.s.PGSQL.5432\" failed: No such file or directory\n"
       "\tIs the server running locally and accepting connections on that socket?\n" +
           std::string(kWrongPassword),
       StatusCode::kUnavailable},
      {"no marker (an older libpq)", "FATAL:  password authentication failed for user \"simba\"\n",
       StatusCode::kPermissionDenied},
      {"timed out", "timeout expired\n", StatusCode::kUnavailable},
  };
  for (const Case& c : cases) {
    const Status status = pg::connect_failure_status("postgresql at h:5432/db", c.message);
    EXPECT_EQ(status.code(), c.code) << c.what << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr("postgresql at h:5432/db: ")) << c.what;
  }
}

TEST(PostgresErrorCodes, AConnectFailureKeepsItsHintsAndNamesHostsThatDidNotResolve) {
  // The hints, once each.
  const Status standbys = pg::connect_failure_status(
      "d",
      "connection to server at \"127.0.0.1\", port 5433 failed: session is read-only\n"
      "connection to server at \"127.0.0.1\", port 5434 failed: session is read-only\n");
  EXPECT_THAT(standbys, StatusIs(StatusCode::kUnavailable, HasSubstr("no host is a primary")));
  const std::string hint = "a failover under way";
  const std::string& text = standbys.message();
  EXPECT_EQ(text.find(hint), text.rfind(hint)) << text;
  EXPECT_THAT(pg::connect_failure_status("d",
                                         "connection to server at \"127.0.0.1\", port 5432 "
                                         "failed: SSL error: certificate verify failed\n"),
              StatusIs(StatusCode::kPermissionDenied, HasSubstr("not signed by the CA given")));
  EXPECT_THAT(pg::connect_failure_status(
                  "d",
                  "connection to server at \"127.0.0.1\", port 5432 failed: FATAL:  no "
                  "pg_hba.conf entry for host \"127.0.0.1\", user \"simba\", database "
                  "\"simba\", no encryption\n"),
              StatusIs(StatusCode::kPermissionDenied, HasSubstr("takes only TLS")));
  // A host whose name did not resolve is transient, and named.
  const Status unresolved =
      pg::connect_failure_status("postgresql at db1:5432,db2:5432/simba", kWrongPassword,
                                 {"host 'db2': cannot resolve host: Name or service not known"});
  EXPECT_THAT(unresolved,
              StatusIs(StatusCode::kUnavailable,
                       AllOf(HasSubstr("password authentication failed"),
                             HasSubstr("; host 'db2': cannot resolve host: Name or service"))));
}

TEST(PostgresErrorCodes, ServerErrorsBySqlstate) {
  struct Case {
    const char* sqlstate;
    StatusCode code;
    SqlFailure kind;
  };
  const Case cases[] = {
      {"25006", StatusCode::kUnavailable, SqlFailure::kOther},        // read_only_sql_transaction
      {"55P03", StatusCode::kUnavailable, SqlFailure::kLockTimeout},  // lock_not_available
      {"40001", StatusCode::kUnavailable, SqlFailure::kOther},        // serialization_failure
      {"40P01", StatusCode::kUnavailable, SqlFailure::kOther},        // deadlock_detected
      {"57P01", StatusCode::kUnavailable, SqlFailure::kOther},        // admin_shutdown
      {"53300", StatusCode::kUnavailable, SqlFailure::kOther},        // too_many_connections
      {"08006", StatusCode::kUnavailable, SqlFailure::kOther},        // connection_failure
      {"57014", StatusCode::kDeadlineExceeded, SqlFailure::kOther},
      {"42501", StatusCode::kPermissionDenied, SqlFailure::kNoPrivilege},
      {"42P01", StatusCode::kNotFound, SqlFailure::kNoTable},
      {"23505", StatusCode::kAborted, SqlFailure::kDuplicateKey},
      {"42P07", StatusCode::kAlreadyExists, SqlFailure::kAlreadyExists},
      {"XX000", StatusCode::kInternal, SqlFailure::kOther},
      {"", StatusCode::kInternal, SqlFailure::kOther},
  };
  for (const Case& c : cases) {
    SqlFailure kind = SqlFailure::kOther;
    const Status status = pg::sqlstate_status(c.sqlstate, "ERROR:  it failed", &kind);
    EXPECT_EQ(status.code(), c.code) << c.sqlstate << ": " << status;
    EXPECT_EQ(kind, c.kind) << c.sqlstate;
    if (c.sqlstate[0] != 0) {
      EXPECT_THAT(status.message(), HasSubstr(c.sqlstate));
    }
  }
}

// ---- a holder's death, seen through its line session (session-backed tenures) ---------

// A short grace for these tests (the default is 1 s).
constexpr milliseconds kGrace{300};
// What the protocol allows a takeover after a holder's session ended: the
// grace and its margin (WaitLine::takeover_after), a lock grant and two
// acquisitions, with the slack of a loaded machine. The lease would take
// ttl + transition, 15 s.
constexpr milliseconds kTakeoverBound = kGrace + kGrace / 8 + seconds(2);

// The shared server with a table of the test's own, named so that its side
// table's name (`<table>_session`) fits in 63 bytes, and the grace.
std::string backed_uri(const std::string& table) {
  return shared_server_uri("postgres") + "?table=" + table +
         "&session_grace=" + std::to_string(kGrace.count()) + "ms";
}

// True once the side table records the row's tenure of `mutex` as backed.
bool backed(Psql& admin, const std::string& table, const std::string& mutex) {
  return eventually(
      [&] {
        return admin.exec("SELECT count(*) FROM " + table + "_session s JOIN " + table +
                          " t ON t.mutex = s.mutex WHERE s.mutex = '" + mutex +
                          "' AND s.version = t.version AND t.owner_id <> ''") == "1";
      },
      seconds(5));
}

// A holder in a child process whose tenure is backed, and a waiting
// service in this process that has been told the child holds: what the
// session-backed tests start from. `holder_query` goes on the child's URI.
struct BackedHold {
  explicit BackedHold(const std::string& name, const std::string& holder_query = "")
      : table(name),
        holder(holder_query.empty() ? backed_uri(name) : with_query(backed_uri(name), holder_query),
               "m"),
        admin(shared_server_uri("postgres")) {}
  // Asserts each step; call with ASSERT_NO_FATAL_FAILURE.
  void start() {
    ASSERT_TRUE(holder.started()) << "the child did not take the mutex";
    ASSERT_TRUE(admin.ok());
    ASSERT_TRUE(backed(admin, table, "m")) << "the holder's tenure was never recorded as backed";
    factory = make_factory(backed_uri(table), seconds(10), seconds(5));
    ASSERT_TRUE(factory);
    service = factory->create_contend_service(waiter.contender("m", "waiter")).value();
    SIMBA_ASSERT_OK(service->start());
    ASSERT_TRUE(told_owner_is(*service, "child"));
  }

  const std::string table;
  ChildHolder holder;
  Psql admin;
  std::unique_ptr<MutexContendServiceFactory> factory;
  Recorder waiter;
  std::unique_ptr<MutexContendService> service;
};

// The holder's process dies while its lease has 15 s to go. Its line
// session ends with it, the waiter's process is granted the line lock, and
// takes the tenure over a grace later: not at the lease's end.
TEST(PostgresSessionBacked, AKilledHoldersMutexIsTakenOverWithinTheGrace) {
  BackedHold hold("pt_backed_kill");
  ASSERT_NO_FATAL_FAILURE(hold.start());
  const std::string held =
      hold.admin.exec("SELECT version FROM " + hold.table + " WHERE mutex = 'm'");
  const auto killed = steady_clock::now();
  hold.holder.signal(SIGKILL);
  ASSERT_TRUE(hold.waiter.acquired.wait(kTakeoverBound)) << "the dead holder's lease decided";
  const auto taken = hold.waiter.acquired_at() - killed;
  RecordProperty("taken_after_kill_ms",
                 static_cast<int>(std::chrono::duration_cast<milliseconds>(taken).count()));
  EXPECT_GE(taken, kGrace) << "taken over before the grace";
  EXPECT_GT(hold.waiter.token.load(), std::stoull(held));
  SIMBA_ASSERT_OK(hold.service->stop());
}

// The server ends the sessions of a holder that lives on but is paused (a
// restart, pg_terminate_backend, a timeout: it cannot tell). The waiter
// takes the mutex over a grace later, while the holder is still paused; the
// holder, resumed, no longer believes it holds: its bound (the last answered
// ping + grace) passed while it was stopped. Without that bound its lease
// (15 s) would still run, and two would hold.
TEST(PostgresSessionBacked, APausedHolderWhoseSessionEndedNoLongerBelievesOnceTakenOver) {
  const std::string app = "pt_backed_pause_child";
  BackedHold hold("pt_backed_pause", "application_name=" + app);
  ASSERT_NO_FATAL_FAILURE(hold.start());
  ASSERT_TRUE(hold.holder.signal(SIGSTOP));
  hold.holder.drain();
  EXPECT_NE(hold.admin.exec("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE application_name = '" +
                            app + "'"),
            "0");
  ASSERT_TRUE(hold.waiter.acquired.wait(kTakeoverBound)) << "the waiter did not take it over";
  ASSERT_TRUE(hold.holder.signal(SIGCONT));
  // (The first byte may have been worked out before the pause.)
  hold.holder.next(scaled(seconds(2)));
  EXPECT_EQ(hold.holder.next(scaled(seconds(2))), '0')
      << "the resumed holder believes in a tenure the waiter holds";
  EXPECT_TRUE(hold.service->is_owner());
  SIMBA_ASSERT_OK(hold.service->stop());
}

// A holder in this process whose line session the server ends is told at
// once that the hold that session backed is over (its lease, 10 s, still
// runs), and the log says why: an operator who sees holds lost wants the
// cause, and a grace too short for the server shows here.
TEST(PostgresSessionBacked, AHolderWhoseLineSessionEndsIsToldAndTheLogSaysWhy) {
  const std::string table = "pt_backed_told";
  const std::string app = "pt_backed_told_holder";
  Psql admin(shared_server_uri("postgres"));
  ASSERT_TRUE(admin.ok());
  auto factory = make_factory(with_query(backed_uri(table), "application_name=" + app), seconds(10),
                              seconds(5));
  ASSERT_TRUE(factory);
  Recorder holder;
  auto service = factory->create_contend_service(holder.contender("m", "holder")).value();
  SIMBA_ASSERT_OK(service->start());
  ASSERT_TRUE(holder.acquired.wait(seconds(5)));
  ASSERT_TRUE(backed(admin, table, "m")) << "the holder's tenure was never recorded as backed";
  ::testing::internal::CaptureStderr();
  const std::string ended = admin.exec(
      "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
      "WHERE application_name = '" +
      app + "'");
  const bool told = holder.released.wait(seconds(5));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(ended, "0");
  EXPECT_TRUE(told) << "the holder was not told its backed hold ended";
  EXPECT_THAT(log, HasSubstr("the session backing the hold of mutex 'm' (token ")) << log;
  SIMBA_ASSERT_OK(service->stop());
}

// A holder and a waiter start together, and the waiter's process has its
// line session open already (it held another mutex a moment ago): the
// waiter's place is first in line and the holder's queues behind it. The
// waiter's place steps back (WaitLine::unbacked), the holder's is granted,
// and the holder's tenure is backed. Without that, it would stay backed by
// nothing until its lease ended.
TEST(PostgresSessionBacked, AHolderWhoseWaiterGotInLineFirstIsStillBacked) {
  const std::string table = "pt_backed_order";
  Psql admin(shared_server_uri("postgres"));
  ASSERT_TRUE(admin.ok());
  auto waiters = make_factory(backed_uri(table), seconds(10), seconds(5));
  ASSERT_TRUE(waiters);
  {
    Recorder warm;
    auto service = waiters->create_contend_service(warm.contender("warm", "w")).value();
    SIMBA_ASSERT_OK(service->start());
    ASSERT_TRUE(warm.acquired.wait(seconds(5)));
    ASSERT_TRUE(backed(admin, table, "warm"));
    SIMBA_ASSERT_OK(service->stop());
  }
  auto holders = make_factory(backed_uri(table), seconds(10), seconds(5));
  ASSERT_TRUE(holders);
  Recorder holder;
  Recorder waiter;
  auto held = holders->create_contend_service(holder.contender("m", "h")).value();
  auto waiting = waiters->create_contend_service(waiter.contender("m", "w")).value();
  SIMBA_ASSERT_OK(held->start());
  ASSERT_TRUE(holder.acquired.wait(seconds(5)));
  // At once: the holder's place is still connecting.
  SIMBA_ASSERT_OK(waiting->start());
  EXPECT_TRUE(backed(admin, table, "m")) << "the holder's tenure was never backed";
  EXPECT_FALSE(waiter.acquired.is_set());
  SIMBA_ASSERT_OK(held->stop());
  ASSERT_TRUE(waiter.acquired.wait(seconds(5)));
  SIMBA_ASSERT_OK(waiting->stop());
}

}  // namespace
}  // namespace simba::testing
