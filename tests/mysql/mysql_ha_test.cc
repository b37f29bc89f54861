// MariaDB with a replica (scripts/servers/mysql.sh start DIR --replica
// [--semi-sync]): the multi-host URI (the first writable host serves), a
// read-only replica refused, naming it, by both backends, and the primary
// killed and the replica promoted while a holder holds and a waiter waits;
// and the checks for Galera and Group Replication, which cannot run here
// (Debian's MariaDB has no Galera provider configured, and Group
// Replication is MySQL's): the query is run against the real servers with
// their variables as they are (wsrep_on OFF, no group_replication_group_name),
// and the decision is checked with the values a Galera or Group Replication
// member reports. Each test starts its own primary and replica on loopback,
// but the tables of error codes (MysqlErrorCodes), which need no server.
//
// Bounds asserted (protocol bounds, not performance), with ttl T and
// transition X: through a failover the holder is told it lost by its lease
// deadline (T + X after its last renewal was sent); someone holds again
// within T + X + the promotion + kRetrySlack of the kill; a keyed holder is
// told within kToldWithin of the kill, and a keyed waiter holds within
// kRetrySlack of the promotion.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mysql.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends/mysql/mysql_client.h"
#include "simba/backend.h"
#include "simba/contend_service.h"
#include "simba/keyed_lock.h"
#include "simba/locker.h"
#include "simba/registry.h"
#include "simba/uri.h"
#include "testing/fresh_process.h"
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
namespace my = internal::sql::mysql;

// The reconnect backoff of the connection pool (at most 2 s) and a
// waiter's poll jitter (at most 1 s) after the promotion, less what
// overlaps: the brief's "+ 2 s".
constexpr milliseconds kRetrySlack{2000};
// A keyed holder's session ends with the killed primary: the kernel closes
// its socket at once; the monitor thread reports it.
constexpr milliseconds kToldWithin{2000};

struct Replicated {
  std::unique_ptr<TestServer> server;
  std::string primary_uri;
  std::string replica_uri;
  std::string primary_host_port;
  std::string replica_host_port;
  // The replica first, then the primary: the first writable host serves.
  std::string both_uri;
};

std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

std::string host_port_of(const std::string& uri) {
  auto parsed = Uri::parse(uri);
  if (!parsed.ok()) {
    ADD_FAILURE() << parsed.status();
    return "";
  }
  return "127.0.0.1:" + std::to_string(parsed->hosts[0].port.value_or(0));
}

std::optional<Replicated> start_replicated(bool semi_sync = false) {
  std::vector<std::string> args = {"--replica"};
  if (semi_sync) args.push_back("--semi-sync");
  auto server = TestServer::start("mysql", args);
  if (!server.ok()) {
    ADD_FAILURE() << server.status();
    return std::nullopt;
  }
  Replicated r;
  r.server = std::move(server).value();
  r.primary_uri = r.server->uri();
  auto replica = r.server->run("member-uri", {"2"});
  if (!replica.ok()) {
    ADD_FAILURE() << replica.status();
    return std::nullopt;
  }
  r.replica_uri = trimmed(*replica);
  r.primary_host_port = host_port_of(r.primary_uri);
  r.replica_host_port = host_port_of(r.replica_uri);
  if (r.primary_host_port.empty() || r.replica_host_port.empty()) return std::nullopt;
  r.both_uri =
      "mysql://simba:simba-test@" + r.replica_host_port + "," + r.primary_host_port + "/simba";
  return r;
}

std::shared_ptr<Backend> open(const std::string& uri) {
  auto backend = open_backend(uri);
  EXPECT_THAT(backend, IsOk()) << uri;
  return backend.ok() ? *backend : nullptr;
}

AcquireRequest request(std::string_view mutex, std::string_view id, milliseconds ttl,
                       milliseconds transition = milliseconds(0)) {
  return AcquireRequest{mutex, id, ttl, transition};
}

// Kills the primary (member 1) and promotes the replica (member 2); the
// time the promotion took.
// `promote_after` is the delay between them (an operator's, or a tool's).
// `killed_at` is taken as the kill command starts, `dead_by` (if given) as
// it returns: the primary died between the two, which takes up to a second
// of a loaded machine (a shell, a signal, a wait for the PID).
milliseconds kill_and_promote(Replicated& r, steady_clock::time_point* killed_at,
                              milliseconds promote_after = milliseconds(0),
                              steady_clock::time_point* dead_by = nullptr) {
  *killed_at = steady_clock::now();
  EXPECT_THAT(r.server->run("kill-member", {"1"}), IsOk());
  if (dead_by != nullptr) *dead_by = steady_clock::now();
  std::this_thread::sleep_for(promote_after);
  const auto promote_started = steady_clock::now();
  EXPECT_THAT(r.server->run("promote", {"2"}), IsOk());
  const auto took = std::chrono::duration_cast<milliseconds>(steady_clock::now() - promote_started);
  std::cout << "promotion took " << took.count() << " ms\n";
  EXPECT_EQ(trimmed(r.server->run("primary").value_or("")), "2");
  return took;
}

// The rows of kServerRoleSql from the server of `uri` (blocking libmariadb).
std::vector<internal::sql::SqlRow> role_rows(const std::string& uri) {
  std::vector<internal::sql::SqlRow> rows;
  auto parsed = Uri::parse(uri);
  if (!parsed.ok()) return rows;
  MYSQL* m = mysql_init(nullptr);
  if (mysql_real_connect(m, "127.0.0.1", parsed->user.value_or("").c_str(),
                         parsed->password.value_or("").c_str(), parsed->path.substr(1).c_str(),
                         parsed->hosts[0].port.value_or(3306), nullptr, 0) != nullptr &&
      mysql_query(m, my::kServerRoleSql) == 0) {
    if (MYSQL_RES* result = mysql_store_result(m)) {
      while (MYSQL_ROW row = mysql_fetch_row(result)) {
        rows.push_back({row[0] != nullptr ? row[0] : "", row[1] != nullptr ? row[1] : ""});
      }
      mysql_free_result(result);
    }
  } else {
    ADD_FAILURE() << mysql_error(m);
  }
  mysql_close(m);
  return rows;
}

Deadline in(milliseconds d) { return steady_clock::now() + d; }

// No two contenders of `timeline` held at once, by their own callbacks.
void expect_one_owner_at_a_time(Timeline& timeline) {
  std::lock_guard<std::mutex> lock(timeline.mu);
  std::vector<std::string> holding;
  for (const auto& [what, at] : timeline.events) {
    const std::string name = what.substr(0, what.find(' '));
    if (what.ends_with(" acquired")) {
      EXPECT_TRUE(holding.empty()) << name << " acquired while " << holding.front() << " held";
      holding.push_back(name);
    } else {
      holding.erase(std::remove(holding.begin(), holding.end(), name), holding.end());
    }
  }
}

void expect_tokens_increase(Timeline& timeline) {
  std::lock_guard<std::mutex> lock(timeline.mu);
  for (std::size_t i = 1; i < timeline.tokens.size(); ++i) {
    EXPECT_GT(timeline.tokens[i], timeline.tokens[i - 1]) << "token " << i;
  }
}

TEST(MysqlHa, AReadOnlyReplicaIsRefusedNamingItAndThePrimaryServes) {
  auto r = start_replicated();
  ASSERT_TRUE(r);
  EXPECT_EQ(trimmed(r->server->run("primary").value_or("")), "1");
  // The primary: the core of the protocol works.
  auto primary = open_backend(r->primary_uri);
  ASSERT_THAT(primary, IsOk());
  EXPECT_THAT((*primary)->capabilities().failover, HasSubstr("replica"));
  auto a = (*primary)->acquire_or_renew(AcquireRequest{"m", "a", seconds(5), milliseconds(0)},
                                        in(seconds(5)));
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->owner.owner_id, "a");
  // The replica: refused by the lease table (kUnavailable: it may be
  // promoted)...
  auto replica = open_backend(r->replica_uri);
  ASSERT_THAT(replica, IsOk());
  auto refused = (*replica)->acquire_or_renew(AcquireRequest{"m", "b", seconds(5), milliseconds(0)},
                                              in(seconds(5)));
  EXPECT_THAT(refused, StatusIs(StatusCode::kUnavailable,
                                AllOf(HasSubstr(r->replica_host_port), HasSubstr("read_only"))));
  std::cout << refused.status() << "\n";
  // ...and by GET_LOCK, which a replica would grant on its own.
  auto keyed = KeyedLockProvider::open(r->replica_uri);
  ASSERT_THAT(keyed, IsOk());
  EXPECT_THAT((*keyed)->try_acquire("k", milliseconds(0), seconds(10)),
              StatusIs(StatusCode::kUnavailable,
                       AllOf(HasSubstr(r->replica_host_port), HasSubstr("read-only"))));
  auto keyed_primary = KeyedLockProvider::open(r->primary_uri);
  ASSERT_THAT(keyed_primary, IsOk());
  auto lease = (*keyed_primary)->try_acquire("k", milliseconds(0), seconds(10));
  ASSERT_THAT(lease, IsOk());
  EXPECT_TRUE(lease->has_value());

  // Promoted, the replica serves (read_only is OFF).
  ASSERT_THAT(r->server->run("kill-member", {"1"}), IsOk());
  const auto promote_started = steady_clock::now();
  ASSERT_THAT(r->server->run("promote", {"2"}), IsOk());
  std::cout
      << "promotion took "
      << std::chrono::duration_cast<milliseconds>(steady_clock::now() - promote_started).count()
      << " ms\n";
  Result<OwnerRecord> b = unavailable_error("not tried");
  EXPECT_TRUE(eventually(
      [&] {
        b = (*replica)->acquire_or_renew(AcquireRequest{"m", "b", seconds(5), milliseconds(0)},
                                         in(seconds(2)));
        return b.ok();
      },
      seconds(10)))
      << b.status();
}

// ---- a process started before the promotion (issue #34) -----------------------------
//
// The primary is dead and the replica still read-only: a fresh `simba run`
// whose --timeout is shorter exits 69 naming both hosts and why each was
// passed over; one with 30 s, and a fresh keyed acquisition (GET_LOCK),
// wait and hold once the replica is promoted instead of failing at once.
TEST(MysqlHa, AProcessStartedBeforeThePromotionHoldsOnceItIsDone) {
  auto r = start_replicated();
  ASSERT_TRUE(r);
  ASSERT_THAT(r->server->run("kill-member", {"1"}), IsOk());
  expect_fresh_processes_wait_for_the_store(
      SIMBA_CLI_PATH, r->both_uri,
      {r->replica_host_port + "/simba: the server is read-only",
       r->primary_host_port + "/simba: connecting"},
      [&] { ASSERT_THAT(r->server->run("promote", {"2"}), IsOk()); }, kRetrySlack + seconds(3));
}

TEST(MysqlHa, TheMultiHostUriServesTheCoreCasesOnThePrimary) {
  auto r = start_replicated();
  ASSERT_TRUE(r);
  EXPECT_EQ(trimmed(r->server->run("primary").value_or("")), "1");
  // The replica is listed first and passed over (a write there would fail:
  // it is read-only). The table protocol, store calls first...
  auto backend = open(r->both_uri);
  ASSERT_TRUE(backend);
  EXPECT_THAT(backend->capabilities().failover, HasSubstr("Semi-synchronous replication"));
  auto a = backend->acquire_or_renew(request("core", "a", seconds(5)), in(seconds(5)));
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->owner.owner_id, "a");
  auto b = backend->acquire_or_renew(request("core", "b", seconds(5)), in(seconds(5)));
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(b->owner.owner_id, "a") << "b took a's hold";
  SIMBA_ASSERT_OK(backend->release("core", "a", in(seconds(5))));
  b = backend->acquire_or_renew(request("core", "b", seconds(5)), in(seconds(5)));
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(b->owner.owner_id, "b");
  EXPECT_GT(b->owner.fencing_token, a->owner.fencing_token);
  SIMBA_ASSERT_OK(backend->release("core", "b", in(seconds(5))));

  // ...then through contend services: a holder, a waiter that gets the
  // mutex when the holder stops, with a greater token.
  FactoryOptions options;
  options.contend.ttl = milliseconds(1500);
  options.contend.transition = milliseconds(500);
  auto factory = MutexContendServiceFactory::open(r->both_uri, options);
  ASSERT_THAT(factory, IsOk());
  Timeline timeline;
  auto holder = (*factory)->create_contend_service(timeline.contender("job", "holder", "holder"));
  ASSERT_THAT(holder, IsOk());
  SIMBA_ASSERT_OK((*holder)->start());
  ASSERT_TRUE(timeline.acquired.wait(seconds(5)));
  const std::uint64_t holder_token = (*holder)->fencing_token();
  auto waiter = (*factory)->create_contend_service(timeline.contender("job", "waiter", "waiter"));
  ASSERT_THAT(waiter, IsOk());
  SIMBA_ASSERT_OK((*waiter)->start());
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_TRUE((*holder)->is_owner());
  EXPECT_FALSE((*waiter)->is_owner());
  SIMBA_ASSERT_OK((*holder)->stop());
  ASSERT_TRUE(eventually([&] { return (*waiter)->is_owner(); }, seconds(5)));
  EXPECT_GT((*waiter)->fencing_token(), holder_token);
  SIMBA_ASSERT_OK((*waiter)->stop());
  EXPECT_FALSE((*waiter)->is_owner());

  // Keyed locks (GET_LOCK) too: on the primary, where they exclude.
  auto keyed = KeyedLockProvider::open(r->both_uri);
  auto other = KeyedLockProvider::open(r->both_uri);
  ASSERT_THAT(keyed, IsOk());
  ASSERT_THAT(other, IsOk());
  auto lease = (*keyed)->try_acquire("core-key", milliseconds(0), seconds(30));
  ASSERT_THAT(lease, IsOk());
  ASSERT_TRUE(lease->has_value());
  auto busy = (*other)->try_acquire("core-key", milliseconds(0), seconds(30));
  ASSERT_THAT(busy, IsOk());
  EXPECT_FALSE(busy->has_value()) << "two holders of one key";
  SIMBA_ASSERT_OK((*lease)->release());
  auto next = (*other)->try_acquire("core-key", seconds(5), seconds(30));
  ASSERT_THAT(next, IsOk());
  EXPECT_TRUE(next->has_value());
}

TEST(MysqlHa, NoWritableHostIsRefusedNamingEachHostWithinTheDeadline) {
  auto r = start_replicated();
  ASSERT_TRUE(r);
  // Only the replica: refused by both backends, naming it, in time
  // (kUnavailable: it may be promoted).
  auto replica = open(r->replica_uri);
  ASSERT_TRUE(replica);
  auto started = steady_clock::now();
  auto refused = replica->acquire_or_renew(request("m", "a", seconds(5)), in(seconds(2)));
  EXPECT_LT(steady_clock::now() - started, seconds(2));
  EXPECT_THAT(refused, StatusIs(StatusCode::kUnavailable,
                                AllOf(HasSubstr(r->replica_host_port), HasSubstr("read_only"))));
  auto keyed = KeyedLockProvider::open(r->replica_uri);
  ASSERT_THAT(keyed, IsOk());
  started = steady_clock::now();
  EXPECT_THAT((*keyed)->try_acquire("k", milliseconds(0), seconds(10)),
              StatusIs(StatusCode::kUnavailable,
                       AllOf(HasSubstr(r->replica_host_port), HasSubstr("read-only"))));
  EXPECT_LT(steady_clock::now() - started, seconds(2));

  // Both hosts, the primary killed and the replica not promoted yet (a
  // failover under way): kUnavailable (worth retrying), naming each host
  // and why it was passed over.
  auto both = open(r->both_uri);
  ASSERT_TRUE(both);
  ASSERT_THAT(r->server->run("kill-member", {"1"}), IsOk());
  started = steady_clock::now();
  auto none = both->acquire_or_renew(request("m", "a", seconds(5)), in(seconds(2)));
  EXPECT_LT(steady_clock::now() - started, seconds(2));
  EXPECT_THAT(none, StatusIs(StatusCode::kUnavailable,
                             AllOf(HasSubstr("no host is a writable primary"),
                                   HasSubstr(r->replica_host_port + "/simba: the server is "
                                                                    "read-only"),
                                   HasSubstr(r->primary_host_port + "/simba: connecting"))));
  std::cout << none.status() << "\n";
  // The next connection starts over from the list and finds the promoted
  // replica, once the pool's reconnect backoff (at most 2 s) allows.
  ASSERT_THAT(r->server->run("promote", {"2"}), IsOk());
  const auto promoted_at = steady_clock::now();
  Result<OwnerRecord> promoted = unavailable_error("not tried");
  EXPECT_TRUE(eventually(
      [&] {
        promoted = both->acquire_or_renew(request("m", "a", seconds(5)), in(seconds(2)));
        return promoted.ok();
      },
      kRetrySlack + milliseconds(500)))
      << promoted.status();
  std::cout << "served by the promoted replica "
            << std::chrono::duration_cast<milliseconds>(steady_clock::now() - promoted_at).count()
            << " ms after the promotion\n";
  ASSERT_THAT(promoted, IsOk());
  EXPECT_EQ(promoted->owner.owner_id, "a");
}

// What a failover test saw: both services sampled every millisecond.
struct Sampled {
  std::atomic<int> both{0};           // samples with two owners
  std::atomic<int> past_deadline{0};  // samples of the holder owning past its deadline
  std::mutex mu;
  std::optional<steady_clock::time_point> holder_deadline;  // its last lease deadline
  std::optional<steady_clock::time_point> nobody_since;     // the last gap's start
  std::optional<steady_clock::time_point> owner_again;      // the last gap's end
};

// The primary is killed and the replica promoted `promote_after` later
// while a holder holds and a waiter waits, both through the multi-host URI.
// With semi-synchronous replication (AFTER_SYNC) and a promotion that
// applies the relay log first, every lease and version the primary granted
// is on the promoted replica: one owner at a time and increasing tokens.
void run_semi_sync_failover(milliseconds promote_after) {
  auto r = start_replicated(/*semi_sync=*/true);
  ASSERT_TRUE(r);
  const milliseconds ttl(1500), transition(1500);
  FactoryOptions options;
  options.contend.ttl = ttl;
  options.contend.transition = transition;
  options.contend.operation_timeout = milliseconds(1000);
  auto holder_factory = MutexContendServiceFactory::open(r->both_uri, options);
  auto waiter_factory = MutexContendServiceFactory::open(r->both_uri, options);
  ASSERT_THAT(holder_factory, IsOk());
  ASSERT_THAT(waiter_factory, IsOk());
  Timeline timeline;
  auto holder =
      (*holder_factory)->create_contend_service(timeline.contender("job", "holder", "holder"));
  ASSERT_THAT(holder, IsOk());
  SIMBA_ASSERT_OK((*holder)->start());
  ASSERT_TRUE(timeline.acquired.wait(seconds(5)));
  auto waiter =
      (*waiter_factory)->create_contend_service(timeline.contender("job", "waiter", "waiter"));
  ASSERT_THAT(waiter, IsOk());
  SIMBA_ASSERT_OK((*waiter)->start());

  Sampled sampled;
  std::atomic<bool> stop{false};
  std::thread sampler([&] {
    while (!stop) {
      const auto before = steady_clock::now();
      const bool h = (*holder)->is_owner();
      const bool w = (*waiter)->is_owner();
      const auto now = steady_clock::now();
      {
        std::lock_guard<std::mutex> lock(sampled.mu);
        if (h && w) ++sampled.both;
        if (h) sampled.holder_deadline = (*holder)->lease_deadline();
        // is_owner() never outlives the lease deadline (taken before it).
        if (h && sampled.holder_deadline && before > *sampled.holder_deadline) {
          ++sampled.past_deadline;
        }
        if (!h && !w && !sampled.nobody_since) sampled.nobody_since = now;
        if ((h || w) && sampled.nobody_since) {
          sampled.owner_again = now;
          sampled.nobody_since.reset();
        }
      }
      std::this_thread::sleep_for(milliseconds(1));
    }
  });
  std::this_thread::sleep_for(milliseconds(700));  // the waiter has asked, and waits
  std::optional<steady_clock::time_point> deadline_before_kill;
  {
    std::lock_guard<std::mutex> lock(sampled.mu);
    deadline_before_kill = sampled.holder_deadline;
    sampled.owner_again.reset();
  }
  ASSERT_TRUE(deadline_before_kill) << "the holder did not hold";
  steady_clock::time_point killed_at, dead_by;
  const milliseconds promotion = kill_and_promote(*r, &killed_at, promote_after, &dead_by);

  // Someone holds again within ttl + transition + the promotion + slack
  // (after the delay before the promotion).
  const milliseconds bound = promote_after + ttl + transition + promotion + kRetrySlack;
  std::this_thread::sleep_until(killed_at + bound);
  const bool holder_holds = (*holder)->is_owner();
  const bool waiter_holds = (*waiter)->is_owner();
  std::optional<steady_clock::time_point> recovered;
  {
    std::lock_guard<std::mutex> lock(sampled.mu);
    recovered = sampled.owner_again;
  }
  std::cout
      << "after " << promote_after.count() << " ms + ttl + transition + promotion + "
      << kRetrySlack.count() << " ms: holder " << (holder_holds ? "holds" : "lost") << ", waiter "
      << (waiter_holds ? "holds" : "waits") << "; nobody held "
      << (recovered
              ? "until " +
                    std::to_string(
                        std::chrono::duration_cast<milliseconds>(*recovered - killed_at).count()) +
                    " ms after the kill"
              : std::string("at no time"))
      << "\n";
  EXPECT_TRUE(holder_holds || waiter_holds)
      << "nobody holds the mutex " << bound.count() << " ms after the primary was killed";
  if (recovered) {
    EXPECT_LE(*recovered - killed_at, bound);
  }
  // A holder that lost was told by its lease deadline (from its last
  // renewal; its callback runs on the callback thread, hence the margin).
  // One that could not renew for ttl + transition lost.
  if (promote_after >= ttl + transition) {
    EXPECT_TRUE(timeline.when("holder released")) << "the holder was not told it lost";
  }
  if (const auto released = timeline.when("holder released")) {
    std::lock_guard<std::mutex> lock(sampled.mu);
    ASSERT_TRUE(sampled.holder_deadline);
    // is_owner() checks the deadline itself; on_released runs on the
    // callback pool, late by the scheduler on a loaded machine.
    std::cout
        << "holder told "
        << std::chrono::duration_cast<milliseconds>(*released - *sampled.holder_deadline).count()
        << " ms after its lease deadline, "
        << std::chrono::duration_cast<milliseconds>(*released - killed_at).count()
        << " ms after the kill\n";
    EXPECT_LE(*released, *sampled.holder_deadline + milliseconds(500))
        << "the holder was told after its lease ended";
    // A renewal sent while the kill command ran may still have been
    // answered: the last lease began before the primary was dead, not
    // before the command started.
    EXPECT_LE(*released - dead_by, ttl + transition + milliseconds(500));
  }

  // Hand-off on the promoted replica: the waiter gets a greater token.
  SIMBA_ASSERT_OK((*holder)->stop());
  ASSERT_TRUE(eventually([&] { return (*waiter)->is_owner(); }, ttl + transition + kRetrySlack));
  stop = true;
  sampler.join();
  EXPECT_EQ(sampled.both.load(), 0) << "two owners at once";
  EXPECT_EQ(sampled.past_deadline.load(), 0) << "the holder owned past its lease deadline";
  expect_one_owner_at_a_time(timeline);
  expect_tokens_increase(timeline);
  SIMBA_ASSERT_OK((*waiter)->stop());
}

// A prompt promotion: the holder usually renews on the promoted replica
// and keeps the mutex.
TEST(MysqlHaFailover, SemiSyncFailoverKeepsOneOwnerAndIncreasingTokens) {
  run_semi_sync_failover(milliseconds(0));
}

// A promotion after the holder's lease has run out: the holder is told by
// its lease deadline, and the waiter (or the holder again) takes over on
// the promoted replica with a greater token.
TEST(MysqlHaFailover, SlowPromotionTellsTheHolderByItsLeaseDeadline) {
  run_semi_sync_failover(milliseconds(3000));
}

// GET_LOCK holds live in the primary's sessions: the kill ends them, the
// holder is told, and the waiter (its session broken too) tries again and
// holds on the promoted replica.
TEST(MysqlHaFailover, KeyedHolderIsToldAndTheWaiterHoldsOnThePromotedReplica) {
  auto r = start_replicated();
  ASSERT_TRUE(r);
  auto provider = KeyedLockProvider::open(r->both_uri);
  ASSERT_THAT(provider, IsOk());
  auto held = (*provider)->try_acquire("wallet", seconds(5), seconds(60));
  ASSERT_THAT(held, IsOk());
  ASSERT_TRUE(held->has_value());
  Lease lease = std::move(**held);
  auto waited = std::async(std::launch::async, [&] {
    return (*provider)->try_acquire("wallet", seconds(30), seconds(60));
  });
  std::this_thread::sleep_for(milliseconds(300));  // waiting in GET_LOCK

  const auto killed_at = steady_clock::now();
  ASSERT_THAT(r->server->run("kill-member", {"1"}), IsOk());
  EXPECT_TRUE(eventually([&] { return lease.lost_token().stop_requested(); }, kToldWithin))
      << "the holder was not told within " << kToldWithin.count() << " ms";
  std::cout << "holder told after "
            << std::chrono::duration_cast<milliseconds>(steady_clock::now() - killed_at).count()
            << " ms\n";
  EXPECT_FALSE(lease.is_held());
  ASSERT_THAT(r->server->run("promote", {"2"}), IsOk());
  const auto promoted_at = steady_clock::now();

  ASSERT_EQ(waited.wait_for(kRetrySlack + seconds(5)), std::future_status::ready);
  auto got = waited.get();
  ASSERT_THAT(got, IsOk());
  ASSERT_TRUE(got->has_value()) << "the waiter did not get the key";
  const auto held_after = steady_clock::now() - promoted_at;
  std::cout << "waiter held " << std::chrono::duration_cast<milliseconds>(held_after).count()
            << " ms after the promotion\n";
  EXPECT_LE(held_after, kRetrySlack);
}

// Negative control: asynchronous replication loses what the replica had not
// received. A lease granted then is unknown to the promoted replica, which
// grants the mutex again (two owners) with the same version: the token
// repeats. (The replica's receiving thread is stopped so that the loss does
// not depend on winning a race against replication on loopback.)
TEST(MysqlHaFailover, AsyncReplicationCanLoseALeaseAndRepeatATokenAtFailover) {
  auto r = start_replicated();
  ASSERT_TRUE(r);
  auto backend = open(r->both_uri);
  ASSERT_TRUE(backend);
  EXPECT_THAT(backend->capabilities().failover, HasSubstr("given again"));
  // The row exists on both (replicated), free.
  auto a = backend->acquire_or_renew(request("lost", "a", seconds(1)), in(seconds(5)));
  ASSERT_THAT(a, IsOk());
  SIMBA_ASSERT_OK(backend->release("lost", "a", in(seconds(5))));
  std::this_thread::sleep_for(milliseconds(500));  // replicated (loopback: microseconds)
  ASSERT_THAT(r->server->run("pause-replication", {"1"}), IsOk());
  auto b = backend->acquire_or_renew(request("lost", "b", seconds(30)), in(seconds(5)));
  ASSERT_THAT(b, IsOk());
  ASSERT_EQ(b->owner.owner_id, "b");
  steady_clock::time_point killed_at;
  kill_and_promote(*r, &killed_at);
  // c asks through the same URI: the promoted replica never heard of b.
  Result<OwnerRecord> c = unavailable_error("not tried");
  ASSERT_TRUE(eventually(
      [&] {
        c = backend->acquire_or_renew(request("lost", "c", seconds(30)), in(seconds(2)));
        return c.ok();
      },
      seconds(10)))
      << c.status();
  EXPECT_EQ(c->owner.owner_id, "c") << "b's lease survived: the replica had it";
  EXPECT_LE(c->owner.fencing_token, b->owner.fencing_token)
      << "the token did not repeat: the replica had b's acquisition";
  std::cout << "b (lost with the primary) token " << b->owner.fencing_token
            << ", c (on the promoted replica) token " << c->owner.fencing_token << "\n";
}

// The same with --semi-sync: while the replica receives nothing, the
// primary does not answer a commit (it waits for the replica's
// acknowledgement), so the call fails by its deadline and grants nothing
// that the promoted replica could lack.
TEST(MysqlHaFailover, SemiSyncGrantsNothingTheReplicaHasNotReceived) {
  auto r = start_replicated(/*semi_sync=*/true);
  ASSERT_TRUE(r);
  auto backend = open(r->both_uri);
  ASSERT_TRUE(backend);
  auto a = backend->acquire_or_renew(request("sync", "a", seconds(1)), in(seconds(5)));
  ASSERT_THAT(a, IsOk());
  SIMBA_ASSERT_OK(backend->release("sync", "a", in(seconds(5))));
  ASSERT_THAT(r->server->run("pause-replication", {"1"}), IsOk());
  const auto started = steady_clock::now();
  auto b = backend->acquire_or_renew(request("sync", "b", seconds(30)), in(seconds(2)));
  EXPECT_THAT(b, StatusIs(StatusCode::kDeadlineExceeded))
      << "a lease was granted that the replica had not received";
  EXPECT_LT(steady_clock::now() - started, milliseconds(2500));
  steady_clock::time_point killed_at;
  kill_and_promote(*r, &killed_at);
  // b's commit never reached the replica; nobody was told b holds.
  auto c = backend->acquire_or_renew(request("sync", "c", seconds(5)), in(seconds(5)));
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->owner.owner_id, "c");
  EXPECT_GT(c->owner.fencing_token, a->owner.fencing_token);
}

TEST(MysqlHa, TheRoleQueryReadsTheRealServersVariables) {
  auto r = start_replicated();
  ASSERT_TRUE(r);
  const auto primary_rows = role_rows(r->primary_uri);
  const auto replica_rows = role_rows(r->replica_uri);
  ASSERT_FALSE(primary_rows.empty()) << "SHOW GLOBAL VARIABLES returned nothing";
  for (const auto& row : primary_rows) std::cout << row[0] << " = " << row[1] << "\n";
  const my::ServerRole primary = my::server_role_of(primary_rows);
  const my::ServerRole replica = my::server_role_of(replica_rows);
  EXPECT_FALSE(primary.read_only);
  EXPECT_FALSE(primary.wsrep) << "this MariaDB runs without Galera";
  EXPECT_TRUE(primary.group_name.empty()) << "MariaDB has no Group Replication";
  EXPECT_TRUE(replica.read_only);
  SIMBA_EXPECT_OK(my::check_server_role(primary, "mysql at p", true));
  EXPECT_THAT(my::check_server_role(replica, "mysql at r", false),
              StatusIs(StatusCode::kUnavailable, HasSubstr("mysql at r")));
}

TEST(MysqlHa, GaleraAndGroupReplicationMembersAreRefusedForGetLockOnly) {
  // What a Galera node's SHOW GLOBAL VARIABLES says (names as MySQL and
  // MariaDB print them; case does not matter).
  const my::ServerRole galera =
      my::server_role_of({{"read_only", "OFF"}, {"WSREP_ON", "ON"}, {"innodb_read_only", "OFF"}});
  EXPECT_TRUE(galera.wsrep);
  EXPECT_THAT(my::check_server_role(galera, "mysql at g:3306/db", true),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("mysql at g:3306/db"), HasSubstr("Galera"))));
  SIMBA_EXPECT_OK(my::check_server_role(galera, "mysql at g:3306/db", false));
  // A Group Replication primary (MySQL 8): a group name, not read-only.
  const my::ServerRole group =
      my::server_role_of({{"group_replication_group_name", "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"},
                          {"read_only", "OFF"},
                          {"super_read_only", "OFF"},
                          {"wsrep_on", "OFF"}});
  EXPECT_THAT(my::check_server_role(group, "mysql at gr:3306/db", true),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("mysql at gr:3306/db"), HasSubstr("Group Replication"))));
  SIMBA_EXPECT_OK(my::check_server_role(group, "mysql at gr:3306/db", false));
  // A single-primary group's secondary is super_read_only: refused by both,
  // for good by the keyed backend (a group member), for now by the lease
  // table (a secondary may become the primary).
  const my::ServerRole secondary =
      my::server_role_of({{"group_replication_group_name", "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"},
                          {"read_only", "ON"},
                          {"super_read_only", "ON"}});
  EXPECT_THAT(my::check_server_role(secondary, "s", false),
              StatusIs(StatusCode::kUnavailable, HasSubstr("super_read_only")));
  EXPECT_THAT(my::check_server_role(secondary, "s", true),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("Group Replication")));
  // An empty group name (GR not configured) is no group.
  SIMBA_EXPECT_OK(
      my::check_server_role(my::server_role_of({{"group_replication_group_name", ""}}), "x", true));
}

// ---- error codes (no server) -------------------------------------------------------

// Permanent causes fail at once; transient ones are retried.
TEST(MysqlErrorCodes, AConnectFailureIsPermanentOnlyForWhatNoRetryCanFix) {
  struct Case {
    unsigned int code;
    const char* message;  // as error_of() writes it
    StatusCode expected;
  };
  const Case cases[] = {
      {1045,
       "Access denied for user 'simba'@'127.0.0.1' (using password: YES) (error 1045, SQLSTATE "
       "28000)",
       StatusCode::kPermissionDenied},
      {1044, "Access denied for user 'simba'@'%' to database 'other' (error 1044, SQLSTATE 42000)",
       StatusCode::kPermissionDenied},
      {1130,
       "Host '10.0.0.9' is not allowed to connect to this MariaDB server (error 1130, SQLSTATE "
       "HY000)",
       StatusCode::kPermissionDenied},
      {1251,
       "Client does not support authentication protocol requested by server; consider upgrading "
       "MariaDB client (error 1251, SQLSTATE 08004)",
       StatusCode::kPermissionDenied},
      {3159,
       "Connections using insecure transport are prohibited while --require_secure_transport=ON. "
       "(error 3159, SQLSTATE HY000)",
       StatusCode::kPermissionDenied},
      {1049, "Unknown database 'nosuch' (error 1049, SQLSTATE 42000)", StatusCode::kNotFound},
      {1129,
       "Host '10.0.0.9' is blocked because of many connection errors; unblock with "
       "'mariadb-admin flush-hosts' (error 1129, SQLSTATE HY000)",
       StatusCode::kPermissionDenied},
      {1040, "Too many connections (error 1040, SQLSTATE HY000)", StatusCode::kUnavailable},
      {2026,
       "TLS/SSL error: self-signed certificate in certificate chain (error 2026, SQLSTATE HY000)",
       StatusCode::kPermissionDenied},
      {2026, "TLS/SSL error: certificate has expired (error 2026, SQLSTATE HY000)",
       StatusCode::kPermissionDenied},
      {2026, "TLS/SSL error: unable to get local issuer certificate (error 2026, SQLSTATE HY000)",
       StatusCode::kPermissionDenied},
      {2026,
       "TLS/SSL error: Validation of SSL server certificate failed (error 2026, SQLSTATE HY000)",
       StatusCode::kPermissionDenied},
      {2026,
       "TLS/SSL error: SSL is required, but the server does not support it (error 2026, "
       "SQLSTATE HY000)",
       StatusCode::kPermissionDenied},
      {2026, "TLS/SSL error: unexpected eof while reading (error 2026, SQLSTATE HY000)",
       StatusCode::kUnavailable},
      {2003, "Can't connect to server on '127.0.0.1' (111) (error 2003, SQLSTATE HY000)",
       StatusCode::kUnavailable},
      {2002,
       "Can't connect to local server through socket '/run/mysqld/mysqld.sock' (2) "
       "(error 2002, SQLSTATE HY000)",
       StatusCode::kUnavailable},
      {2013,
       "Lost connection to server at 'handshake: reading initial communication packet', system "
       "error: 104 (error 2013, SQLSTATE HY000)",
       StatusCode::kUnavailable},
      {2005, "Unknown server host 'db.invalid' (-2) (error 2005, SQLSTATE HY000)",
       StatusCode::kUnavailable},
      {1053, "Server shutdown in progress (error 1053, SQLSTATE 08S01)", StatusCode::kUnavailable},
      {1105, "Unknown error (error 1105, SQLSTATE HY000)", StatusCode::kUnavailable},
  };
  for (const Case& c : cases) {
    const Status status = my::connect_failure_status(c.code, c.message);
    EXPECT_EQ(status.code(), c.expected) << c.code << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.code;
  }
  EXPECT_THAT(my::connect_failure_status(1129, "blocked"),
              StatusIs(StatusCode::kPermissionDenied, HasSubstr("FLUSH HOSTS")));
}

TEST(MysqlErrorCodes, AReadOnlyServerIsTransientAGetLockMisfitPermanent) {
  struct Case {
    const char* what;
    my::ServerRole role;
    bool session_locks;
    StatusCode expected;
  };
  my::ServerRole read_only;
  read_only.read_only = true;
  my::ServerRole super_read_only;
  super_read_only.super_read_only = true;
  my::ServerRole innodb_read_only;
  innodb_read_only.innodb_read_only = true;
  my::ServerRole galera;
  galera.wsrep = true;
  my::ServerRole galera_read_only = galera;
  galera_read_only.read_only = true;
  my::ServerRole group;
  group.group_name = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
  const Case cases[] = {
      {"a writable server", {}, true, StatusCode::kOk},
      {"read_only", read_only, false, StatusCode::kUnavailable},
      {"read_only, GET_LOCK", read_only, true, StatusCode::kUnavailable},
      {"super_read_only", super_read_only, false, StatusCode::kUnavailable},
      {"innodb_read_only", innodb_read_only, true, StatusCode::kUnavailable},
      {"Galera, the lease table", galera, false, StatusCode::kOk},
      {"Galera, GET_LOCK", galera, true, StatusCode::kFailedPrecondition},
      {"a read-only Galera member, GET_LOCK", galera_read_only, true,
       StatusCode::kFailedPrecondition},
      {"a read-only Galera member, the lease table", galera_read_only, false,
       StatusCode::kUnavailable},
      {"Group Replication, GET_LOCK", group, true, StatusCode::kFailedPrecondition},
  };
  for (const Case& c : cases) {
    const Status status = my::check_server_role(c.role, "mysql at h:3306/db", c.session_locks);
    EXPECT_EQ(status.code(), c.expected) << c.what << ": " << status;
  }
  EXPECT_THAT(my::check_server_role(read_only, "mysql at h:3306/db", false),
              StatusIs(StatusCode::kUnavailable,
                       AllOf(HasSubstr("mysql at h:3306/db"), HasSubstr("read_only=ON"),
                             HasSubstr("wait for a replica to be promoted"))));
}

TEST(MysqlErrorCodes, NoFitHostIsTransientIfAnyHostsFailureIs) {
  const Status read_only = unavailable_error("r: the server is read-only (read_only=ON)");
  const Status refused = unavailable_error("p: connecting: Can't connect (error 2003)");
  const Status denied = permission_denied_error("p: connecting: Access denied (error 1045)");
  const Status unknown_db = not_found_error("p: connecting: Unknown database (error 1049)");
  const Status galera = failed_precondition_error("g: a Galera cluster member");
  const Status late = deadline_exceeded_error("p: connecting timed out");
  struct Case {
    const char* what;
    std::vector<Status> failures;
    StatusCode expected;
  };
  const Case cases[] = {
      {"every host read-only", {read_only, read_only}, StatusCode::kUnavailable},
      {"refused and access denied", {refused, denied}, StatusCode::kUnavailable},
      {"access denied and refused", {denied, refused}, StatusCode::kUnavailable},
      {"access denied and read-only", {denied, read_only}, StatusCode::kUnavailable},
      {"access denied everywhere", {denied, denied}, StatusCode::kPermissionDenied},
      {"no database, then access denied", {unknown_db, denied}, StatusCode::kNotFound},
      {"every host a Galera member", {galera, galera}, StatusCode::kFailedPrecondition},
      {"Galera and access denied", {galera, denied}, StatusCode::kFailedPrecondition},
      {"Galera and read-only", {galera, read_only}, StatusCode::kUnavailable},
      {"access denied and out of time", {denied, late}, StatusCode::kDeadlineExceeded},
      {"out of time and refused", {late, refused}, StatusCode::kUnavailable},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(my::code_of_none_fit(c.failures), c.expected) << c.what;
  }
}

}  // namespace
}  // namespace simba::testing
