// Tests of the SQLite backend through the backend SPI, on real database files
// in a fresh temporary directory per test. Lease expiry uses short real
// sleeps (the database clock cannot be faked); everything else is exact.

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/sqlite/host_locks.h"
#include "backends/sqlite/sqlite_errors.h"
#include "backends/sqlite/sqlite_watcher.h"
#include "gtest/gtest.h"
#include "simba/backend.h"
#include "simba/backends/sqlite.h"
#include "simba/contend_service.h"
#include "simba/status.h"
#include "simba/uri.h"
#include "testing/child_holder.h"
#include "testing/fixed_random.h"
#include "testing/latch.h"
#include "testing/store_test_helpers.h"
#include "testing/test_util.h"

namespace simba {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using testing::eventually;
using testing::FixedRandom;
using testing::read_byte;
using testing::Recorder;
using testing::scaled;
using namespace std::chrono_literals;

Deadline soon(steady_clock::duration d = 10s) { return steady_clock::now() + d; }

std::int64_t system_now_ms() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Raw access to the same file, to look at what the backend stored and to
// hold the write lock the way another process would.
struct RawDb {
  explicit RawDb(const std::string& path) {
    if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
        SQLITE_OK) {
      ADD_FAILURE() << "cannot open " << path;
    }
  }
  ~RawDb() { sqlite3_close_v2(db); }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;

  int exec(const std::string& sql) {
    char* error = nullptr;
    const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
    if (error != nullptr) {
      last_error = error;
      sqlite3_free(error);
    }
    return rc;
  }
  // The rows of `sql`, each column as text joined with '|'.
  std::vector<std::string> query(const std::string& sql) {
    std::vector<std::string> rows;
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << "prepare failed: " << sqlite3_errmsg(db) << " for " << sql;
      return rows;
    }
    while (sqlite3_step(stmt) == SQLITE_ROW) {
      std::string row;
      for (int i = 0; i < sqlite3_column_count(stmt); ++i) {
        if (i > 0) row += "|";
        const unsigned char* text = sqlite3_column_text(stmt, i);
        row += text == nullptr ? "NULL" : reinterpret_cast<const char*>(text);
      }
      rows.push_back(row);
    }
    sqlite3_finalize(stmt);
    return rows;
  }

  sqlite3* db = nullptr;
  std::string last_error;
};

class SqliteBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = testing::scratch_parent() + "/simba-sqlite-test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << "mkdtemp: " << errno;
    dir_ = pattern;
  }

  void TearDown() override {
    // Permission tests may have left read-only parts behind.
    std::error_code ec;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(dir_, ec)) {
      std::filesystem::permissions(entry.path(), std::filesystem::perms::owner_all,
                                   std::filesystem::perm_options::add, ec);
    }
    std::filesystem::remove_all(dir_, ec);
  }

  std::string db_path() const { return dir_ + "/simba.db"; }

  std::shared_ptr<Backend> open(SqliteOptions options) {
    Result<std::shared_ptr<Backend>> backend = new_sqlite_backend(std::move(options));
    EXPECT_TRUE(backend.ok()) << backend.status();
    return backend.ok() ? *backend : nullptr;
  }
  std::shared_ptr<Backend> open() { return open({.path = db_path()}); }

  static Result<OwnerRecord> acquire(Backend& backend, std::string_view mutex,
                                     std::string_view contender, milliseconds ttl = 10s,
                                     milliseconds transition = 5s) {
    return backend.acquire_or_renew(
        {.mutex = mutex, .contender_id = contender, .ttl = ttl, .transition = transition}, soon());
  }

  std::string dir_;
};

// ---- the protocol ------------------------------------------------------------------

TEST_F(SqliteBackendTest, SchemeAndCapabilities) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->scheme(), "sqlite");
  const Capabilities& caps = backend->capabilities();
  EXPECT_TRUE(caps.push_release);
  EXPECT_TRUE(caps.cross_process);
  EXPECT_EQ(caps.fencing_source, "simba_mutex.version at acquisition");
  EXPECT_EQ(caps.max_mutex_length, 66u);
  EXPECT_EQ(caps.max_contender_id_length, 128u);
  auto subscription = backend->subscribe("m", [](const MutexEvent&) {});
  EXPECT_TRUE(subscription.ok()) << subscription.status();
  EXPECT_EQ(backend->subscribe("", [](const MutexEvent&) {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->subscribe(std::string(67, 'm'), [](const MutexEvent&) {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->subscribe("m", nullptr).status().code(), StatusCode::kInvalidArgument);
}

// Simba's table, column for column: the version is the token (the SQL
// protocol's rule, shared with PostgreSQL and MySQL).
TEST_F(SqliteBackendTest, CreatesSimbaTable) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  RawDb raw(db_path());
  EXPECT_EQ(raw.query("SELECT name, type, \"notnull\", pk, dflt_value"
                      " FROM pragma_table_info('simba_mutex') ORDER BY cid"),
            (std::vector<std::string>{"mutex|TEXT|0|1|NULL", "acquired_at|INTEGER|1|0|NULL",
                                      "ttl_at|INTEGER|1|0|NULL", "transition_at|INTEGER|1|0|NULL",
                                      "owner_id|TEXT|1|0|NULL", "version|INTEGER|1|0|NULL"}));
  EXPECT_EQ(raw.query("PRAGMA journal_mode"), std::vector<std::string>{"wal"});
}

TEST_F(SqliteBackendTest, AcquireFreeMutexMakesOwnerWithToken) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  const std::int64_t before = system_now_ms();
  auto record = acquire(*backend, "orders", "alice", 10s, 5s);
  const std::int64_t after = system_now_ms();
  ASSERT_TRUE(record.ok()) << record.status();
  const MutexOwner& owner = record->owner;
  EXPECT_EQ(owner.owner_id, "alice");
  EXPECT_GE(owner.fencing_token, 1u);
  EXPECT_EQ(owner.acquired_at, record->store_now);
  EXPECT_EQ(owner.ttl_at, owner.acquired_at + 10s);
  EXPECT_EQ(owner.transition_at, owner.ttl_at + 5s);
  // The database clock is this host's clock.
  EXPECT_GE(record->store_now.count(), before - 5);
  EXPECT_LE(record->store_now.count(), after + 5);

  RawDb raw(db_path());
  EXPECT_EQ(raw.query("SELECT owner_id, version, ttl_at - acquired_at,"
                      " transition_at - ttl_at FROM simba_mutex WHERE mutex = 'orders'"),
            std::vector<std::string>{"alice|1|10000|5000"});
  EXPECT_EQ(owner.fencing_token, 1u);
}

TEST_F(SqliteBackendTest, RenewKeepsTokenAndExtendsTimes) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  auto first = acquire(*backend, "m", "alice", 10s, 5s);
  ASSERT_TRUE(first.ok()) << first.status();
  std::this_thread::sleep_for(5ms);
  auto second = acquire(*backend, "m", "alice", 20s, 1s);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->owner.owner_id, "alice");
  EXPECT_EQ(second->owner.fencing_token, first->owner.fencing_token);
  EXPECT_GT(second->owner.acquired_at, first->owner.acquired_at);
  EXPECT_EQ(second->owner.acquired_at, second->store_now);
  EXPECT_EQ(second->owner.ttl_at, second->owner.acquired_at + 20s);
  EXPECT_EQ(second->owner.transition_at, second->owner.ttl_at + 1s);

  // A renewal keeps the version: it is the token.
  RawDb raw(db_path());
  EXPECT_EQ(raw.query("SELECT version FROM simba_mutex"), std::vector<std::string>{"1"});
}

TEST_F(SqliteBackendTest, OtherContenderGetsCurrentOwnerBack) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  auto alice = acquire(*backend, "m", "alice");
  ASSERT_TRUE(alice.ok()) << alice.status();
  auto bob = acquire(*backend, "m", "bob");
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_EQ(bob->owner, alice->owner);
  EXPECT_GE(bob->store_now, alice->store_now);
  RawDb raw(db_path());
  EXPECT_EQ(raw.query("SELECT version FROM simba_mutex"), std::vector<std::string>{"1"});
}

TEST_F(SqliteBackendTest, AfterReleaseAnotherAcquiresWithGreaterToken) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  auto alice = acquire(*backend, "m", "alice");
  ASSERT_TRUE(alice.ok()) << alice.status();
  auto released = backend->release("m", "alice", soon());
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_TRUE(*released);

  auto bob = acquire(*backend, "m", "bob");
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_EQ(bob->owner.owner_id, "bob");
  EXPECT_GT(bob->owner.fencing_token, alice->owner.fencing_token);

  // And alice coming back later gets a greater one still.
  ASSERT_TRUE(*backend->release("m", "bob", soon()));
  auto again = acquire(*backend, "m", "alice");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GT(again->owner.fencing_token, bob->owner.fencing_token);
}

TEST_F(SqliteBackendTest, ReleaseKeepsTokenAndFreesRow) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(acquire(*backend, "m", "alice").ok());
  ASSERT_TRUE(*backend->release("m", "alice", soon()));
  RawDb raw(db_path());
  EXPECT_EQ(raw.query("SELECT acquired_at, ttl_at, transition_at, owner_id, version"
                      " FROM simba_mutex"),
            std::vector<std::string>{"0|0|0||2"});
}

TEST_F(SqliteBackendTest, ExpiredLeaseLetsAnotherTakeOverWithGreaterToken) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  // A lease long enough that bob's early attempt falls inside it even on a
  // sanitized, loaded machine (a 100 ms one did not always).
  auto alice = acquire(*backend, "m", "alice", 250ms, 250ms);
  ASSERT_TRUE(alice.ok()) << alice.status();

  auto early = acquire(*backend, "m", "bob", 50ms, 50ms);
  ASSERT_TRUE(early.ok()) << early.status();
  ASSERT_LT(early->store_now, alice->owner.transition_at) << "the machine stalled for 500 ms";
  EXPECT_EQ(early->owner.owner_id, "alice");

  // Once the store says alice's hard lease is over:
  ASSERT_TRUE(eventually(
      [&] {
        auto read = backend->read("m", soon());
        return read.ok() && read->owner == MutexOwner::none();
      },
      2s));
  auto bob = acquire(*backend, "m", "bob", 10s, 5s);
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_EQ(bob->owner.owner_id, "bob");
  EXPECT_GT(bob->owner.fencing_token, alice->owner.fencing_token);
  EXPECT_GT(bob->store_now, alice->owner.transition_at);

  // alice's late renewal does not take it back, and cannot release it.
  auto late = acquire(*backend, "m", "alice", 50ms, 50ms);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->owner, bob->owner);
  auto released = backend->release("m", "alice", soon());
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_FALSE(*released);
}

// docs/backends/sqlite.md, "Failover after a holder dies": an ended lease is
// not pushed; a waiter takes the mutex at its poll, the end of the dead
// holder's hard lease plus its jitter (< 1 s), plus one store call. With the
// jitter pinned at its largest (+999 ms) the takeover comes ~1 s after the
// lease end: not before (nothing pushed it), and not later than 1 s + 250 ms
// (the timer and a local write, with room for a loaded machine; scaled).
TEST_F(SqliteBackendTest, DeadHoldersMutexIsTakenAtTheEndOfItsLeasePlusTheJitter) {
  auto crashed = open();
  auto backend = open();
  ASSERT_TRUE(crashed && backend);
  // A holder that never renews: hard lease 500 ms.
  ASSERT_EQ(acquire(*crashed, "m", "crashed").status().code(), StatusCode::kOk);
  ASSERT_TRUE(*crashed->release("m", "crashed", soon()));
  auto held = acquire(*crashed, "m", "crashed", 300ms, 200ms);
  const auto lease_end = steady_clock::now() + 500ms;  // at the latest
  ASSERT_TRUE(held.ok() && held->owner.owner_id == "crashed");

  FactoryOptions options;
  options.contend.ttl = 10s;
  options.contend.transition = 5s;
  options.random = std::make_shared<FixedRandom>(ContendPeriod::kJitterMax);
  auto factory = MutexContendServiceFactory::create(backend, options);
  ASSERT_TRUE(factory.ok()) << factory.status();
  Recorder waiter;
  auto service = (*factory)->create_contend_service(waiter.contender("m", "waiter")).value();
  ASSERT_TRUE(service->start().ok());
  ASSERT_TRUE(waiter.acquired.wait(5s));
  const auto after_lease =
      std::chrono::duration_cast<milliseconds>(waiter.acquired_at() - lease_end);
  RecordProperty("after_lease_ms", static_cast<int>(after_lease.count()));
  // The lease ended at most the acquire call's duration before lease_end.
  EXPECT_GE(after_lease, milliseconds(ContendPeriod::kJitterMax) - 100ms);
  EXPECT_LT(after_lease, milliseconds(ContendPeriod::kJitterMax) + scaled(250ms));
  ASSERT_TRUE(service->stop().ok());
}

TEST_F(SqliteBackendTest, OwnerRenewingAfterHardLeaseGetsNewToken) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  auto first = acquire(*backend, "m", "alice", 50ms, 50ms);
  ASSERT_TRUE(first.ok()) << first.status();
  std::this_thread::sleep_for(150ms);
  // The lease ended: this is a new acquisition, not a renewal.
  auto second = acquire(*backend, "m", "alice", 50ms, 50ms);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->owner.owner_id, "alice");
  EXPECT_GT(second->owner.fencing_token, first->owner.fencing_token);
}

TEST_F(SqliteBackendTest, OwnerRenewsInsideTransitionWindow) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  auto first = acquire(*backend, "m", "alice", 20ms, 10s);
  ASSERT_TRUE(first.ok()) << first.status();
  std::this_thread::sleep_for(60ms);  // past ttl_at, well before transition_at
  auto bob = acquire(*backend, "m", "bob");
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_EQ(bob->owner, first->owner);
  EXPECT_FALSE(bob->owner.is_in_ttl(bob->store_now));
  auto renewed = acquire(*backend, "m", "alice", 20ms, 10s);
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(renewed->owner.owner_id, "alice");
  EXPECT_EQ(renewed->owner.fencing_token, first->owner.fencing_token);
  EXPECT_TRUE(renewed->owner.is_in_ttl(renewed->store_now));
}

TEST_F(SqliteBackendTest, ReleaseByNonOwnerReturnsFalse) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  auto unknown = backend->release("never-used", "alice", soon());
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  EXPECT_FALSE(*unknown);

  auto alice = acquire(*backend, "m", "alice");
  ASSERT_TRUE(alice.ok()) << alice.status();
  auto bob = backend->release("m", "bob", soon());
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_FALSE(*bob);
  auto read = backend->read("m", soon());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->owner, alice->owner);

  ASSERT_TRUE(*backend->release("m", "alice", soon()));
  auto twice = backend->release("m", "alice", soon());
  ASSERT_TRUE(twice.ok()) << twice.status();
  EXPECT_FALSE(*twice);
}

TEST_F(SqliteBackendTest, ReadReportsOwnerOrNone) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  auto unknown = backend->read("m", soon());
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  EXPECT_EQ(unknown->owner, MutexOwner::none());
  EXPECT_GT(unknown->store_now.count(), 0);

  auto alice = acquire(*backend, "m", "alice");
  ASSERT_TRUE(alice.ok()) << alice.status();
  auto read = backend->read("m", soon());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->owner, alice->owner);
  EXPECT_GE(read->store_now, alice->store_now);

  ASSERT_TRUE(*backend->release("m", "alice", soon()));
  auto freed = backend->read("m", soon());
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(freed->owner, MutexOwner::none());
}

TEST_F(SqliteBackendTest, EndedLeaseReadsAndListsAsFree) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(acquire(*backend, "m", "alice", 30ms, 30ms).ok());
  std::this_thread::sleep_for(120ms);
  // Not released, but acquire_or_renew would hand it to anyone: free, by the
  // rule force_release also uses for the owner it removes.
  auto read = backend->read("m", soon());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->owner, MutexOwner::none());
  auto listed = backend->list(soon());
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].record.owner, MutexOwner::none());
  // The row itself is untouched until someone acquires.
  RawDb raw(db_path());
  EXPECT_EQ(raw.query("SELECT owner_id FROM simba_mutex"), std::vector<std::string>{"alice"});
}

TEST_F(SqliteBackendTest, ListsEveryRowSortedFreeOnesIncluded) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  auto empty = backend->list(soon());
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());

  auto b = acquire(*backend, "b", "bob");
  auto c = acquire(*backend, "c", "carol");
  auto a = acquire(*backend, "a", "alice");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_TRUE(*backend->release("c", "carol", soon()));

  auto listed = backend->list(soon());
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 3u);
  EXPECT_EQ((*listed)[0].mutex, "a");
  EXPECT_EQ((*listed)[0].record.owner, a->owner);
  EXPECT_EQ((*listed)[1].mutex, "b");
  EXPECT_EQ((*listed)[1].record.owner, b->owner);
  EXPECT_EQ((*listed)[2].mutex, "c");
  EXPECT_EQ((*listed)[2].record.owner, MutexOwner::none());
  for (const ListedMutex& m : *listed) {
    EXPECT_EQ(m.record.store_now, (*listed)[0].record.store_now);
    EXPECT_GE(m.record.store_now, a->store_now);
  }
}

TEST_F(SqliteBackendTest, UnicodeNamesAndLimits) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  const std::string longest_mutex(66, 'm');
  const std::string longest_id(128, 'c');
  auto ok = acquire(*backend, longest_mutex, longest_id);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->owner.owner_id, longest_id);

  auto unicode = acquire(*backend, "commandes-\xc3\xa9t\xc3\xa9", "\xe5\x8c\x97\xe4\xba\xac");
  ASSERT_TRUE(unicode.ok()) << unicode.status();
  auto read = backend->read("commandes-\xc3\xa9t\xc3\xa9", soon());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->owner.owner_id, "\xe5\x8c\x97\xe4\xba\xac");
}

TEST_F(SqliteBackendTest, RejectsBadArguments) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  const std::string too_long_mutex(67, 'm');
  const std::string too_long_id(129, 'c');
  EXPECT_EQ(acquire(*backend, "", "alice").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(acquire(*backend, too_long_mutex, "alice").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(acquire(*backend, "m", "").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(acquire(*backend, "m", too_long_id).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(acquire(*backend, "m\n", "alice").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(acquire(*backend, "m", "alice", 0ms, 1s).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(acquire(*backend, "m", "alice", -5ms, 1s).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(acquire(*backend, "m", "alice", 1s, -1ms).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(acquire(*backend, "m", "alice", milliseconds::max(), 0ms).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->release("", "alice", soon()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->release("m", "", soon()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->read(too_long_mutex, soon()).status().code(), StatusCode::kInvalidArgument);
  // A zero transition is allowed.
  auto zero = acquire(*backend, "m", "alice", 1s, 0ms);
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->owner.transition_at, zero->owner.ttl_at);
  // Nothing invalid reached the table.
  auto listed = backend->list(soon());
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 1u);
}

TEST_F(SqliteBackendTest, PassedDeadlineIsDeadlineExceeded) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  const Deadline past = steady_clock::now() - 1ms;
  EXPECT_EQ(backend->acquire_or_renew({"m", "alice", 1s, 1s}, past).status().code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_EQ(backend->release("m", "alice", past).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(backend->read("m", past).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(backend->list(past).status().code(), StatusCode::kDeadlineExceeded);
}

TEST_F(SqliteBackendTest, StatePersistsAcrossReopenAndTokensKeepGrowing) {
  std::uint64_t token = 0;
  {
    auto backend = open();
    ASSERT_NE(backend, nullptr);
    auto alice = acquire(*backend, "m", "alice");
    ASSERT_TRUE(alice.ok()) << alice.status();
    token = alice->owner.fencing_token;
  }
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  auto read = backend->read("m", soon());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->owner.owner_id, "alice");
  ASSERT_TRUE(*backend->release("m", "alice", soon()));
  auto bob = acquire(*backend, "m", "bob");
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_GT(bob->owner.fencing_token, token);
}

TEST_F(SqliteBackendTest, AdoptsSimbaTableWithoutFencingColumn) {
  {
    // The table as JVM Simba's DDL would have it, with its free row.
    RawDb raw(db_path());
    ASSERT_EQ(raw.exec("CREATE TABLE simba_mutex (mutex TEXT PRIMARY KEY,"
                       " acquired_at INTEGER NOT NULL, ttl_at INTEGER NOT NULL,"
                       " transition_at INTEGER NOT NULL, owner_id TEXT NOT NULL,"
                       " version INTEGER NOT NULL);"
                       "INSERT INTO simba_mutex VALUES ('m', 0, 0, 0, '', 0)"),
              SQLITE_OK)
        << raw.last_error;
  }
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  auto free = backend->read("m", soon());
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_EQ(free->owner, MutexOwner::none());
  auto alice = acquire(*backend, "m", "alice");
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->owner.fencing_token, 1u);
}

// ---- files written before SQLite was a driver of the SQL protocol ----------------------

// What the SQLite backend before #21 left in a file: its DDL, verbatim
// (checked against a file made by that build's `simba run` and
// `simba release --force`), and rows as its statements wrote them: version
// + 1 on every acquisition, renewal and release, the acquisition's version
// kept in fencing_token, and a force leaving token = version.
void write_file_of_the_old_token_rule(const std::string& path) {
  RawDb raw(path);
  const std::int64_t now = system_now_ms();
  const std::string held = std::to_string(now) + ", " + std::to_string(now + 60'000) + ", " +
                           std::to_string(now + 120'000);
  ASSERT_EQ(raw.exec("PRAGMA journal_mode=WAL"), SQLITE_OK) << raw.last_error;
  ASSERT_EQ(raw.exec("CREATE TABLE IF NOT EXISTS simba_mutex ("
                     " mutex TEXT PRIMARY KEY,"
                     " acquired_at INTEGER NOT NULL,"
                     " ttl_at INTEGER NOT NULL,"
                     " transition_at INTEGER NOT NULL,"
                     " owner_id TEXT NOT NULL,"
                     " version INTEGER NOT NULL,"
                     " fencing_token INTEGER NOT NULL DEFAULT 0);"
                     // Acquired (version 1, token 1), renewed twice.
                     "INSERT INTO simba_mutex VALUES ('held', " +
                     held +
                     ", 'alice', 3, 1);"
                     // Acquired, renewed twice, released.
                     "INSERT INTO simba_mutex VALUES ('released', 0, 0, 0, '', 4, 1);"
                     // Acquired, renewed, forced: the floor is the token.
                     "INSERT INTO simba_mutex VALUES ('forced', 0, 0, 0, '', 3, 3);"
                     // Edited by hand: a token above the version.
                     "INSERT INTO simba_mutex VALUES ('edited', 0, 0, 0, '', 2, 7)"),
            SQLITE_OK)
      << raw.last_error;
}

// Tokens keep growing across the upgrade: every token the old rule handed
// out is at most max(version, fencing_token), which becomes the version, and
// the next acquisition (or force) takes one more. The file then has Simba's
// table exactly, and the current holder stays the holder.
TEST_F(SqliteBackendTest, MigratesAFileOfTheOldTokenRuleOnOpen) {
  write_file_of_the_old_token_rule(db_path());
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  RawDb raw(db_path());
  EXPECT_EQ(raw.query("SELECT name FROM pragma_table_info('simba_mutex') ORDER BY cid"),
            (std::vector<std::string>{"mutex", "acquired_at", "ttl_at", "transition_at", "owner_id",
                                      "version"}));
  EXPECT_EQ(raw.query("SELECT mutex, owner_id, version FROM simba_mutex ORDER BY mutex"),
            (std::vector<std::string>{"edited||7", "forced||3", "held|alice|3", "released||4"}));

  auto held = backend->read("held", soon());
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->owner.owner_id, "alice");
  EXPECT_EQ(held->owner.fencing_token, 3u);
  // alice renews: same token; releases: the next owner's is greater.
  auto renewed = acquire(*backend, "held", "alice", 60s, 60s);
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(renewed->owner.fencing_token, 3u);
  ASSERT_TRUE(*backend->release("held", "alice", soon()));
  for (const auto& [mutex, next] : std::vector<std::pair<std::string, std::uint64_t>>{
           {"held", 5}, {"released", 5}, {"forced", 4}, {"edited", 8}}) {
    auto bob = acquire(*backend, mutex, "bob");
    ASSERT_TRUE(bob.ok()) << bob.status();
    EXPECT_EQ(bob->owner.owner_id, "bob") << mutex;
    EXPECT_EQ(bob->owner.fencing_token, next) << mutex;
  }
  auto forced = backend->force_release("edited", soon());
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_EQ(forced->fencing_floor, 9u);
}

// Processes opening an old file at once: one migrates it, in one write
// transaction; the others find it migrated (never half-done, never twice).
TEST_F(SqliteBackendTest, MigrationIsSafeWhenSeveralOpenTheOldFileAtOnce) {
  write_file_of_the_old_token_rule(db_path());
  constexpr int kOpeners = 4;
  std::vector<Result<std::shared_ptr<Backend>>> opened(
      kOpeners, Result<std::shared_ptr<Backend>>(internal_error("not run")));
  std::vector<std::thread> threads;
  for (int i = 0; i < kOpeners; ++i) {
    threads.emplace_back([&, i] { opened[i] = new_sqlite_backend({.path = db_path()}); });
  }
  for (std::thread& thread : threads) thread.join();
  for (const auto& backend : opened) ASSERT_TRUE(backend.ok()) << backend.status();
  auto edited = acquire(**opened[0], "edited", "carol");
  ASSERT_TRUE(edited.ok()) << edited.status();
  EXPECT_EQ(edited->owner.fencing_token, 8u);
  // Opening it again changes nothing.
  opened.clear();
  auto again = open();
  ASSERT_NE(again, nullptr);
  RawDb raw(db_path());
  EXPECT_EQ(raw.query("SELECT mutex, version FROM simba_mutex ORDER BY mutex"),
            (std::vector<std::string>{"edited|8", "forced|3", "held|3", "released|4"}));
}

// ---- force_release --------------------------------------------------------------------

TEST_F(SqliteBackendTest, ForceReleaseFreesHeldMutexAboveItsTokens) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  auto alice = acquire(*backend, "m", "alice");
  ASSERT_TRUE(alice.ok()) << alice.status();
  ASSERT_TRUE(acquire(*backend, "m", "alice").ok());  // a renewal: version and token 1

  auto forced = backend->force_release("m", soon());
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_EQ(forced->previous.owner_id, "alice");
  EXPECT_EQ(forced->previous.fencing_token, alice->owner.fencing_token);
  EXPECT_GT(forced->fencing_floor, forced->previous.fencing_token);
  EXPECT_GE(forced->store_now, alice->store_now);

  auto read = backend->read("m", soon());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->owner, MutexOwner::none());
  // Simba's free row, version moved on: the floor.
  RawDb raw(db_path());
  EXPECT_EQ(raw.query("SELECT acquired_at, ttl_at, transition_at, owner_id, version"
                      " FROM simba_mutex"),
            std::vector<std::string>{"0|0|0||2"});
  EXPECT_EQ(forced->fencing_floor, 2u);

  auto bob = acquire(*backend, "m", "bob");
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_EQ(bob->owner.owner_id, "bob");
  EXPECT_GT(bob->owner.fencing_token, forced->fencing_floor);
}

TEST_F(SqliteBackendTest, ForceReleaseOfUnknownOrFreeMutexStillRaisesTheFloor) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  auto unknown = backend->force_release("never-used", soon());
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  EXPECT_EQ(unknown->previous, MutexOwner::none());
  EXPECT_EQ(unknown->fencing_floor, 1u);
  EXPECT_GT(unknown->store_now.count(), 0);
  RawDb raw(db_path());
  EXPECT_EQ(raw.query("SELECT acquired_at, ttl_at, transition_at, owner_id, version"
                      " FROM simba_mutex WHERE mutex = 'never-used'"),
            std::vector<std::string>{"0|0|0||1"});

  // Free now: again, and the floor still grows.
  auto again = backend->force_release("never-used", soon());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->previous, MutexOwner::none());
  EXPECT_GT(again->fencing_floor, unknown->fencing_floor);

  // A released mutex likewise.
  auto alice = acquire(*backend, "m", "alice");
  ASSERT_TRUE(alice.ok()) << alice.status();
  ASSERT_TRUE(*backend->release("m", "alice", soon()));
  auto released = backend->force_release("m", soon());
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->previous, MutexOwner::none());
  EXPECT_GT(released->fencing_floor, alice->owner.fencing_token);

  auto next = acquire(*backend, "never-used", "carol");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_GT(next->owner.fencing_token, again->fencing_floor);
}

TEST_F(SqliteBackendTest, ForceReleaseOfEndedLeaseReportsNoPreviousOwner) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  auto alice = acquire(*backend, "m", "alice", 30ms, 30ms);
  ASSERT_TRUE(alice.ok()) << alice.status();
  std::this_thread::sleep_for(120ms);
  auto forced = backend->force_release("m", soon());
  ASSERT_TRUE(forced.ok()) << forced.status();
  // read()'s rule: an ended lease is nobody's.
  EXPECT_EQ(forced->previous, MutexOwner::none());
  EXPECT_GT(forced->fencing_floor, alice->owner.fencing_token);
}

TEST_F(SqliteBackendTest, OldOwnerRenewingAfterForceReleaseGetsANewToken) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  auto alice = acquire(*backend, "m", "alice");
  ASSERT_TRUE(alice.ok()) << alice.status();
  auto forced = backend->force_release("m", soon());
  ASSERT_TRUE(forced.ok()) << forced.status();

  // alice's next renewal finds a free row: it is a new acquisition (the core
  // reports on_released then on_acquired), never a renewal of the old token.
  std::this_thread::sleep_for(2ms);
  auto renewal = acquire(*backend, "m", "alice");
  ASSERT_TRUE(renewal.ok()) << renewal.status();
  EXPECT_EQ(renewal->owner.owner_id, "alice");
  EXPECT_NE(renewal->owner.fencing_token, alice->owner.fencing_token);
  EXPECT_GT(renewal->owner.fencing_token, forced->fencing_floor);
  EXPECT_EQ(renewal->owner.acquired_at, renewal->store_now);
  EXPECT_GT(renewal->owner.acquired_at, alice->owner.acquired_at);
}

TEST_F(SqliteBackendTest, ForceReleaseChecksNameAndDeadline) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->force_release("", soon()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->force_release(std::string(67, 'm'), soon()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->force_release("m\n", soon()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->force_release("m", steady_clock::now() - 1ms).status().code(),
            StatusCode::kDeadlineExceeded);
  // Nothing reached the table.
  auto listed = backend->list(soon());
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());

  // A held write lock elsewhere: waiting, then the deadline.
  RawDb other(db_path());
  ASSERT_EQ(other.exec("BEGIN IMMEDIATE"), SQLITE_OK) << other.last_error;
  auto blocked = backend->force_release("m", soon(150ms));
  EXPECT_EQ(blocked.status().code(), StatusCode::kDeadlineExceeded) << blocked.status();
  ASSERT_EQ(other.exec("ROLLBACK"), SQLITE_OK);
}

// ---- waiting for other connections ------------------------------------------------

TEST_F(SqliteBackendTest, HeldWriteLockMeansWaitingThenDeadlineExceeded) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(acquire(*backend, "m", "alice").ok());
  RawDb other(db_path());
  ASSERT_EQ(other.exec("BEGIN IMMEDIATE"), SQLITE_OK) << other.last_error;

  // Readers are not blocked by the writer (WAL).
  auto read = backend->read("m", soon(2s));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->owner.owner_id, "alice");
  EXPECT_TRUE(backend->list(soon(2s)).ok());

  const auto start = steady_clock::now();
  auto blocked = backend->acquire_or_renew({"m", "bob", 1s, 1s}, soon(200ms));
  const auto waited = steady_clock::now() - start;
  EXPECT_EQ(blocked.status().code(), StatusCode::kDeadlineExceeded) << blocked.status();
  EXPECT_EQ(blocked.status().message().find("database is locked"), std::string::npos);
  EXPECT_NE(blocked.status().message().find(db_path()), std::string::npos);
  EXPECT_GE(waited, 150ms);
  EXPECT_LT(waited, 3s);

  auto release = backend->release("m", "alice", soon(100ms));
  EXPECT_EQ(release.status().code(), StatusCode::kDeadlineExceeded) << release.status();

  ASSERT_EQ(other.exec("ROLLBACK"), SQLITE_OK) << other.last_error;
  EXPECT_TRUE(*backend->release("m", "alice", soon()));
}

TEST_F(SqliteBackendTest, BusyTimeoutShorterThanDeadlineIsUnavailable) {
  auto backend = open({.path = db_path(), .busy_timeout = 100ms});
  ASSERT_NE(backend, nullptr);
  RawDb other(db_path());
  ASSERT_EQ(other.exec("BEGIN IMMEDIATE"), SQLITE_OK) << other.last_error;
  const auto start = steady_clock::now();
  auto blocked = backend->acquire_or_renew({"m", "bob", 1s, 1s}, soon(10s));
  const auto waited = steady_clock::now() - start;
  EXPECT_EQ(blocked.status().code(), StatusCode::kUnavailable) << blocked.status();
  EXPECT_TRUE(is_retryable(blocked.status()));
  EXPECT_GE(waited, 80ms);
  EXPECT_LT(waited, 3s);
  ASSERT_EQ(other.exec("ROLLBACK"), SQLITE_OK);
}

TEST_F(SqliteBackendTest, WaitsForWriteLockHeldBrieflyElsewhere) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  RawDb other(db_path());
  ASSERT_EQ(other.exec("BEGIN IMMEDIATE"), SQLITE_OK) << other.last_error;
  std::thread releaser([&other] {
    std::this_thread::sleep_for(150ms);
    other.exec("COMMIT");
  });
  const auto start = steady_clock::now();
  auto record = backend->acquire_or_renew({"m", "bob", 1s, 1s}, soon(5s));
  const auto waited = steady_clock::now() - start;
  releaser.join();
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->owner.owner_id, "bob");
  EXPECT_GE(waited, 100ms);
}

TEST_F(SqliteBackendTest, WaitingForBusyConnectionRespectsDeadline) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  RawDb other(db_path());
  ASSERT_EQ(other.exec("BEGIN IMMEDIATE"), SQLITE_OK) << other.last_error;
  // One thread waits for the file lock, holding the backend's connection...
  std::thread waiter([&backend] {
    auto r = backend->acquire_or_renew({"m", "alice", 1s, 1s}, soon(600ms));
    EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status();
  });
  std::this_thread::sleep_for(100ms);
  // ...so a second call on the same backend waits for the connection, but
  // only until its own deadline.
  const auto start = steady_clock::now();
  auto read = backend->read("m", soon(100ms));
  const auto waited = steady_clock::now() - start;
  EXPECT_EQ(read.status().code(), StatusCode::kDeadlineExceeded) << read.status();
  EXPECT_LT(waited, 400ms);
  waiter.join();
  ASSERT_EQ(other.exec("ROLLBACK"), SQLITE_OK);
}

// Contends for `mutex` `iterations` times: acquire, and when it got the
// mutex, check that nobody else believes they hold it and that the token
// grew, then release. Returns "" or what went wrong. `holder` and
// `last_token` may live in memory shared between processes.
std::string contend(Backend& backend, const std::string& mutex, const std::string& id, int tag,
                    int iterations, std::atomic<int>& holder,
                    std::atomic<std::uint64_t>& last_token, int* acquisitions) {
  for (int i = 0; i < iterations; ++i) {
    auto record = backend.acquire_or_renew({mutex, id, 10s, 10s}, soon(30s));
    if (!record.ok()) {
      return id + ": acquire #" + std::to_string(i) + ": " + record.status().to_string();
    }
    if (!record->owner.is_owner(id)) {
      std::this_thread::yield();
      continue;
    }
    int expected = 0;
    if (!holder.compare_exchange_strong(expected, tag)) {
      return id + ": owns the mutex while contender " + std::to_string(expected) + " does";
    }
    const std::uint64_t token = record->owner.fencing_token;
    const std::uint64_t previous = last_token.exchange(token);
    if (token <= previous) {
      return id + ": token " + std::to_string(token) + " after " + std::to_string(previous);
    }
    ++*acquisitions;
    holder.store(0);
    auto released = backend.release(mutex, id, soon(30s));
    if (!released.ok()) {
      return id + ": release #" + std::to_string(i) + ": " + released.status().to_string();
    }
    if (!*released) return id + ": release #" + std::to_string(i) + " returned false";
  }
  return "";
}

// Alice (on `first`) and Bob (on `second`) contend for `mutex` 200 times
// each, at once, in two threads: neither fails, and never both own it.
void contend_in_two_threads(Backend& first, Backend& second, const std::string& mutex) {
  std::atomic<int> holder{0};
  std::atomic<std::uint64_t> last_token{0};
  int acquired[2] = {0, 0};
  std::string errors[2];
  std::thread a([&] {
    errors[0] = contend(first, mutex, "alice", 1, 200, holder, last_token, &acquired[0]);
  });
  std::thread b(
      [&] { errors[1] = contend(second, mutex, "bob", 2, 200, holder, last_token, &acquired[1]); });
  a.join();
  b.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_GT(acquired[0] + acquired[1], 0);
}

TEST_F(SqliteBackendTest, TwoBackendsOnOneFileInTwoThreadsNeverBothOwnNorFail) {
  auto first = open();
  auto second = open();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  contend_in_two_threads(*first, *second, "hammer");
  auto read = first->read("hammer", soon());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->owner, MutexOwner::none());
}

// Shared between a parent and its forked child.
struct SharedState {
  std::atomic<int> holder{0};
  std::atomic<std::uint64_t> last_token{0};
};

TEST_F(SqliteBackendTest, ForkedProcessContendsWithoutErrors) {
  static_assert(
      std::atomic<int>::is_always_lock_free && std::atomic<std::uint64_t>::is_always_lock_free,
      "cross-process atomics must be lock-free");
  void* memory = ::mmap(nullptr, sizeof(SharedState), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(memory, MAP_FAILED);
  auto* shared = new (memory) SharedState();
  const std::string path = db_path();

  // Fork before this process opens the file: an SQLite connection must not
  // cross a fork, and the child opens its own.
  std::fflush(nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0) << "fork failed: " << errno;
  if (child == 0) {
    // The child: no gtest here; report through the exit code and stderr.
    int code = 0;
    {
      auto backend = new_sqlite_backend({.path = path});
      if (!backend.ok()) {
        std::fprintf(stderr, "child: open: %s\n", backend.status().to_string().c_str());
        code = 2;
      } else {
        int acquisitions = 0;
        const std::string error = contend(**backend, "forked", "child", 2, 200, shared->holder,
                                          shared->last_token, &acquisitions);
        if (!error.empty()) {
          std::fprintf(stderr, "child: %s\n", error.c_str());
          code = 3;
        }
      }
    }
    std::fflush(stderr);
    ::_exit(code);
  }

  std::string error;
  int acquisitions = 0;
  {
    auto backend = open({.path = path});
    if (backend != nullptr) {
      error = contend(*backend, "forked", "parent", 1, 200, shared->holder, shared->last_token,
                      &acquisitions);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(error, "");
  ASSERT_TRUE(WIFEXITED(status)) << "child did not exit normally: " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see the child's message on stderr";
  EXPECT_GT(shared->last_token.load(), 0u);
  shared->~SharedState();
  ::munmap(memory, sizeof(SharedState));
}

// ---- push: subscribe -----------------------------------------------------------------

// SQLite's promise the watcher relies on: a connection's data_version moves
// when another connection *of the same process* commits, not only another
// process. (The backend's own calls and its watcher are two connections.)
TEST_F(SqliteBackendTest, DataVersionSeesCommitsOfAnotherConnectionInTheProcess) {
  auto backend = open();  // creates the table, WAL mode
  ASSERT_NE(backend, nullptr);
  RawDb writer(db_path());
  RawDb watcher(db_path());
  const std::vector<std::string> before = watcher.query("PRAGMA data_version");
  EXPECT_EQ(watcher.query("PRAGMA data_version"), before);  // nothing committed
  ASSERT_EQ(writer.exec("INSERT INTO simba_mutex VALUES ('x', 0, 0, 0, '', 1)"), SQLITE_OK)
      << writer.last_error;
  const std::vector<std::string> after_raw = watcher.query("PRAGMA data_version");
  EXPECT_NE(after_raw, before);
  ASSERT_TRUE(acquire(*backend, "m", "alice").ok());  // the backend's own connection
  EXPECT_NE(watcher.query("PRAGMA data_version"), after_raw);
}

// Records the events a listener receives.
class EventLog {
 public:
  std::function<void(const MutexEvent&)> listener() {
    return [this](const MutexEvent& event) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        events_.push_back(event);
      }
      changed_.notify_all();
    };
  }

  // Whether `count` events arrived within `timeout`.
  bool wait_for(std::size_t count, steady_clock::duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, timeout, [&] { return events_.size() >= count; });
  }

  std::vector<MutexEvent> events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_.size();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::vector<MutexEvent> events_;
};

void expect_released(const MutexEvent& event, const std::string& mutex,
                     const std::string& previous_owner) {
  EXPECT_EQ(event.kind, MutexEvent::Kind::kReleased);
  EXPECT_EQ(event.mutex, mutex);
  EXPECT_EQ(event.owner_id, previous_owner);
}

// The watcher only reports held -> free, so before a release a test lets it
// look at the held row. It looks every ~15 ms; this is many ticks, even
// under a sanitizer.
void let_watcher_see_the_owner() { std::this_thread::sleep_for(150ms); }

// The push promise (docs/backends/sqlite.md): a commit by another
// connection is seen at the watcher's next tick (every 15 ms; a release
// through the same backend wakes it at once), then one read of the
// subscribed rows (microseconds in WAL mode: readers never wait for the
// writer) and the listener call. 15 ms for the tick + 185 ms for the read
// and the scheduler of a loaded machine (CI runs test processes in
// parallel on two cores), scaled under sanitizers. Pushes typically arrive
// in ~16 ms; polling would take seconds.
const milliseconds kPushBound = scaled(15ms + 185ms);

// The threads of this process. The first call starts and joins a thread:
// sanitizer runtimes start a helper thread of their own at the first
// pthread_create, which must not be counted as the watcher.
int count_threads() {
  static const bool kWarmedUp = [] {
    std::thread([] {}).join();
    return true;
  }();
  static_cast<void>(kWarmedUp);
  int count = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task")) {
    ++count;
  }
  return count;
}

TEST_F(SqliteBackendTest, SubscriberHearsReleaseByAnotherBackendObject) {
  auto releaser = open();
  auto waiter = open();
  ASSERT_TRUE(releaser && waiter);
  EventLog log;
  auto subscription = waiter->subscribe("m", log.listener());
  ASSERT_TRUE(subscription.ok()) << subscription.status();
  ASSERT_TRUE(acquire(*releaser, "m", "alice").ok());
  let_watcher_see_the_owner();
  EXPECT_EQ(log.size(), 0u) << "an acquisition is not a release";

  const auto released_at = steady_clock::now();
  ASSERT_TRUE(*releaser->release("m", "alice", soon()));
  ASSERT_TRUE(log.wait_for(1, kPushBound)) << "no push within " << kPushBound.count() << " ms";
  RecordProperty(
      "push_ms",
      std::to_string(
          std::chrono::duration_cast<milliseconds>(steady_clock::now() - released_at).count()));
  expect_released(log.events()[0], "m", "alice");
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(log.size(), 1u) << "one release, one event";
}

// Between ticks the kernel's report of a write to the file or its WAL wakes
// the watcher. A watcher whose tick is an hour hears of a release committed
// by another connection (the backend's, which pokes only its own watcher)
// only that way, once its first look is behind it.
TEST_F(SqliteBackendTest, AWriteByAnotherConnectionWakesTheWatcherBeforeItsTick) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  auto first = acquire(*backend, "first", "alice");
  auto held = acquire(*backend, "m", "alice");
  ASSERT_TRUE(first.ok() && held.ok());
  using internal::sql::sqlite::Watcher;
  auto watcher = std::make_shared<Watcher>(
      db_path(), internal::sql::sqlite::watcher_connection(db_path()), std::chrono::hours(1));
  EventLog log;
  watcher->start(log.listener());
  // Both seen held at their acquisitions' versions, so a release is news
  // whenever the next look comes.
  auto seen = [](const Result<OwnerRecord>& record) {
    return Watcher::RowState{"alice", static_cast<std::int64_t>(record->owner.fencing_token)};
  };
  watcher->watch("first", seen(first));
  watcher->watch("m", seen(held));
  // The first release is heard at whichever look comes first (the watch
  // wakes the thread); once heard, that look is over and saw "m" held.
  ASSERT_TRUE(*backend->release("first", "alice", soon()));
  bool heard = log.wait_for(1, scaled(10s));
  if (heard) {
    ASSERT_TRUE(*backend->release("m", "alice", soon()));
    heard = log.wait_for(2, scaled(10s));
  }
  watcher->shutdown();
  ASSERT_TRUE(heard) << "a release was not heard before the tick";
  expect_released(log.events()[0], "first", "alice");
  expect_released(log.events()[1], "m", "alice");
}

TEST_F(SqliteBackendTest, SubscriberHearsReleaseByTheSameBackendObject) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  EventLog log;
  auto subscription = backend->subscribe("m", log.listener());
  ASSERT_TRUE(subscription.ok()) << subscription.status();
  ASSERT_TRUE(acquire(*backend, "m", "alice").ok());
  let_watcher_see_the_owner();
  ASSERT_TRUE(*backend->release("m", "alice", soon()));
  ASSERT_TRUE(log.wait_for(1, kPushBound));
  expect_released(log.events()[0], "m", "alice");

  // And again: the watcher keeps following the mutex.
  ASSERT_TRUE(acquire(*backend, "m", "bob").ok());
  let_watcher_see_the_owner();
  ASSERT_TRUE(*backend->release("m", "bob", soon()));
  ASSERT_TRUE(log.wait_for(2, kPushBound));
  expect_released(log.events()[1], "m", "bob");
}

TEST_F(SqliteBackendTest, SubscriberHearsReleaseByAnotherProcess) {
  int to_child[2];
  int from_child[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(from_child), 0);
  const std::string path = db_path();
  ASSERT_NE(open(), nullptr);  // create the file, then close it again before forking

  // Fork before this process has a connection or a watcher thread: neither
  // may cross a fork.
  std::fflush(nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0) << "fork failed: " << errno;
  if (child == 0) {
    // The child: no gtest here; 'a' = acquired, 'r' = released, 'e' = error.
    ::close(to_child[1]);
    ::close(from_child[0]);
    auto report = [&](char c) { [[maybe_unused]] auto n = ::write(from_child[1], &c, 1); };
    int code = 0;
    {
      auto backend = new_sqlite_backend({.path = path});
      auto acquired = backend.ok() ? (*backend)->acquire_or_renew({"x", "child", 10s, 5s}, soon())
                                   : Result<OwnerRecord>(backend.status());
      if (!acquired.ok() || acquired->owner.owner_id != "child") {
        report('e');
        code = 2;
      } else {
        report('a');
        if (read_byte(to_child[0], 30s) != 'g') code = 3;
        auto released = (*backend)->release("x", "child", soon());
        report(released.ok() && *released ? 'r' : 'e');
      }
    }
    ::_exit(code);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);

  {
    auto backend = open({.path = path});
    ASSERT_NE(backend, nullptr);
    EventLog log;
    auto subscription = backend->subscribe("x", log.listener());
    EXPECT_TRUE(subscription.ok()) << subscription.status();
    EXPECT_EQ(read_byte(from_child[0], 30000ms), 'a');
    let_watcher_see_the_owner();
    const char go = 'g';
    EXPECT_EQ(::write(to_child[1], &go, 1), 1);
    // The bound counts from before the child's release.
    EXPECT_TRUE(log.wait_for(1, kPushBound)) << "no push within " << kPushBound.count() << " ms";
    EXPECT_EQ(read_byte(from_child[0], 30000ms), 'r');
    if (log.size() >= 1) expect_released(log.events()[0], "x", "child");
  }
  ::close(to_child[1]);
  ::close(from_child[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// ---- a holder's death, seen through its kernel lock (host_locks.h) ----------------

// A holder in a child process of its own: it acquires `mutex` (ttl 10 s,
// transition 5 s: a lease far longer than any bound below) and says so
// through a pipe, then waits to be killed. Forked before this process opens
// the file. Returns the child's pid once it holds the mutex, or -1.
pid_t start_holder(const std::string& path, const std::string& mutex) {
  int from_child[2];
  if (::pipe(from_child) != 0) return -1;
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    auto backend = new_sqlite_backend({.path = path});
    auto acquired = backend.ok() ? (*backend)->acquire_or_renew({mutex, "child", 10s, 5s}, soon())
                                 : Result<OwnerRecord>(backend.status());
    const char c = acquired.ok() && acquired->owner.owner_id == "child" ? 'a' : 'e';
    [[maybe_unused]] auto n = ::write(from_child[1], &c, 1);
    while (true) ::pause();
  }
  ::close(from_child[1]);
  const bool holds = child > 0 && read_byte(from_child[0], 30000ms) == 'a';
  ::close(from_child[0]);
  if (child > 0 && !holds) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
  }
  return holds ? child : -1;
}

// The holder's process dies (SIGKILL: nothing of it runs) while its lease
// has 15 s to go. A waiting service takes the mutex at once: the watcher
// finds the dead holder's kernel lock free at its next look (a 15 ms tick),
// and the waiter's attempt takes the lock, which proves the holder gone.
// The bound, 1 s, is that tick and one acquisition with the slack of a
// loaded machine; the lease would take 15 s.
TEST_F(SqliteBackendTest, AHoldersDeathIsSeenAtOnceThroughItsKernelLock) {
  ASSERT_NE(open(), nullptr);  // the file, closed again before the fork
  const pid_t child = start_holder(db_path(), "m");
  ASSERT_GT(child, 0) << "the child did not take the mutex";

  auto backend = open();
  ASSERT_NE(backend, nullptr);
  EXPECT_TRUE(backend->capabilities().ends_with_session);
  auto held = acquire(*backend, "m", "waiter");
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_EQ(held->owner.owner_id, "child");
  FactoryOptions options;
  options.contend.ttl = 10s;
  options.contend.transition = 5s;
  auto factory = MutexContendServiceFactory::create(backend, options);
  ASSERT_TRUE(factory.ok()) << factory.status();
  Recorder waiter;
  auto service = (*factory)->create_contend_service(waiter.contender("m", "waiter")).value();
  ASSERT_TRUE(service->start().ok());
  let_watcher_see_the_owner();
  EXPECT_FALSE(waiter.acquired.is_set()) << "took the mutex of a live holder";
  const auto killed = steady_clock::now();
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(waiter.acquired.wait(scaled(1000ms))) << "the dead holder's lease decided";
  RecordProperty(
      "taken_after_kill_ms",
      static_cast<int>(
          std::chrono::duration_cast<milliseconds>(waiter.acquired_at() - killed).count()));
  EXPECT_GT(waiter.token.load(), held->owner.fencing_token);
  ASSERT_TRUE(service->stop().ok());
}

// The negative control: a holder that is alive but stopped (SIGSTOP, as a
// long pause would) keeps its kernel lock, so nobody takes its mutex before
// its lease ends; killed, it loses it at once.
TEST_F(SqliteBackendTest, APausedHolderKeepsItsMutexAndADeadOneLosesItAtOnce) {
  ASSERT_NE(open(), nullptr);
  const pid_t child = start_holder(db_path(), "m");
  ASSERT_GT(child, 0) << "the child did not take the mutex";
  ASSERT_EQ(::kill(child, SIGSTOP), 0);
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  const auto until = steady_clock::now() + 500ms;
  int attempts = 0;
  while (steady_clock::now() < until) {
    auto attempt = acquire(*backend, "m", "waiter");
    ASSERT_TRUE(attempt.ok()) << attempt.status();
    ASSERT_EQ(attempt->owner.owner_id, "child") << "took the mutex of a paused holder";
    ++attempts;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_GT(attempts, 1);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  auto taken = acquire(*backend, "m", "waiter");
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->owner.owner_id, "waiter");
}

// A record proves a death only when it names the lock the contender takes
// (this kernel's boot, this lock file, the mutex's byte) and the row's
// current tenure. Crafted rows of a holder "ghost" that no process backs:
// another boot's record and an older tenure's are not trusted; the
// control, the same row with a record of this lock, is taken over.
TEST_F(SqliteBackendTest, OnlyARecordOfThisLockAndThisTenureIsTrusted) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  auto locks = internal::sql::sqlite::HostLocks::open(db_path());
  ASSERT_NE(locks, nullptr);
  const std::string lock_id = locks->lock_id("m");
  locks.reset();
  RawDb raw(db_path());
  const std::int64_t far = system_now_ms() + 3'600'000;
  ASSERT_EQ(raw.exec("INSERT INTO simba_mutex VALUES ('m', 0, " + std::to_string(far) + ", " +
                     std::to_string(far) + ", 'ghost', 7)"),
            SQLITE_OK)
      << raw.last_error;
  const std::string other_boot =
      "0123abcd-0000-0000-0000-000000000000" + lock_id.substr(lock_id.find('/'));
  for (const auto& [version, id] : std::vector<std::pair<int, std::string>>{
           {7, other_boot}, {6, lock_id}, {7, lock_id + "0"}}) {
    ASSERT_EQ(raw.exec("INSERT OR REPLACE INTO simba_mutex_host VALUES ('m', " +
                       std::to_string(version) + ", '" + id + "')"),
              SQLITE_OK)
        << raw.last_error;
    auto attempt = acquire(*backend, "m", "c");
    ASSERT_TRUE(attempt.ok()) << attempt.status();
    EXPECT_EQ(attempt->owner.owner_id, "ghost") << "trusted version " << version << " of " << id;
  }
  ASSERT_EQ(raw.exec("INSERT OR REPLACE INTO simba_mutex_host VALUES ('m', 7, '" + lock_id + "')"),
            SQLITE_OK);
  auto taken = acquire(*backend, "m", "c");
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->owner.owner_id, "c");
  EXPECT_EQ(taken->owner.fencing_token, 8u);
  // The new tenure is recorded as backed by this backend's lock.
  EXPECT_EQ(raw.query("SELECT version, lock_id FROM simba_mutex_host WHERE mutex = 'm'"),
            std::vector<std::string>{"8|" + lock_id});
}

// Contenders of one backend share its kernel locks: the lock proves
// nothing between them. Another contender of the same backend never takes
// over a live holder, also when both ask at once, over and over.
TEST_F(SqliteBackendTest, ContendersOfOneBackendNeverTakeOverEachOther) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  ASSERT_EQ(acquire(*backend, "m", "a")->owner.owner_id, "a");
  EXPECT_EQ(acquire(*backend, "m", "b")->owner.owner_id, "a");
  ASSERT_TRUE(*backend->release("m", "a", soon()));
  contend_in_two_threads(*backend, *backend, "shared");
}

// A backend that is gone (its holders with it: a service keeps its backend
// alive) has given its kernel locks back: its mutexes are taken at once.
TEST_F(SqliteBackendTest, AClosedBackendsMutexesAreTakenAtOnce) {
  auto closing = open();
  auto backend = open();
  ASSERT_TRUE(closing && backend);
  ASSERT_EQ(acquire(*closing, "m", "gone")->owner.owner_id, "gone");
  EXPECT_EQ(acquire(*backend, "m", "c")->owner.owner_id, "gone");
  closing.reset();
  EXPECT_EQ(acquire(*backend, "m", "c")->owner.owner_id, "c");
}

// A hand-over can take a millisecond, far less than the watcher's tick: a
// release right after subscribe() returns is delivered although the watcher
// never looked at the held row (subscribe() reads the row it starts from).
TEST_F(SqliteBackendTest, ReleaseRightAfterSubscribeIsDelivered) {
  auto releaser = open();
  auto waiter = open();
  ASSERT_TRUE(releaser && waiter);
  ASSERT_TRUE(acquire(*releaser, "m", "alice").ok());
  EventLog log;
  auto subscription = waiter->subscribe("m", log.listener());
  ASSERT_TRUE(subscription.ok()) << subscription.status();
  ASSERT_TRUE(*releaser->release("m", "alice", soon()));
  ASSERT_TRUE(log.wait_for(1, kPushBound));
  expect_released(log.events()[0], "m", "alice");
}

// A whole hold between two looks: the row's version moved, so the free row
// is news even though the watcher never saw it held.
TEST_F(SqliteBackendTest, HoldBetweenTwoLooksIsStillAReleaseEvent) {
  auto releaser = open();
  auto waiter = open();
  ASSERT_TRUE(releaser && waiter);
  EventLog log;
  auto subscription = waiter->subscribe("m", log.listener());
  ASSERT_TRUE(subscription.ok()) << subscription.status();
  let_watcher_see_the_owner();  // sees the mutex free
  ASSERT_TRUE(acquire(*releaser, "m", "alice").ok());
  ASSERT_TRUE(*releaser->release("m", "alice", soon()));
  ASSERT_TRUE(log.wait_for(1, kPushBound));
  const MutexEvent event = log.events()[0];
  EXPECT_EQ(event.kind, MutexEvent::Kind::kReleased);
  EXPECT_EQ(event.mutex, "m");
  // The holder if a look caught it, else unknown.
  EXPECT_TRUE(event.owner_id == "alice" || event.owner_id.empty()) << event.owner_id;
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(log.size(), 1u);
}

TEST_F(SqliteBackendTest, ForceReleaseNotifiesSubscribers) {
  auto holder = open();
  auto waiter = open();
  ASSERT_TRUE(holder && waiter);
  EventLog remote;
  EventLog local;
  auto remote_sub = waiter->subscribe("m", remote.listener());
  auto local_sub = holder->subscribe("m", local.listener());
  ASSERT_TRUE(remote_sub.ok() && local_sub.ok());
  auto alice = acquire(*holder, "m", "alice");
  ASSERT_TRUE(alice.ok());
  let_watcher_see_the_owner();

  auto forced = holder->force_release("m", soon());
  ASSERT_TRUE(forced.ok()) << forced.status();
  // First alice's loss (so a subscriber that is alice stops at once, not at
  // its next renewal), marked forced, for her tenure; then the release
  // that wakes the waiters.
  for (EventLog* log : {&remote, &local}) {
    ASSERT_TRUE(log->wait_for(2, kPushBound));
    const MutexEvent lost = log->events()[0];
    EXPECT_EQ(lost.kind, MutexEvent::Kind::kLost);
    EXPECT_EQ(lost.mutex, "m");
    EXPECT_EQ(lost.owner_id, "alice");
    EXPECT_EQ(lost.fencing_token, alice->owner.fencing_token);
    EXPECT_TRUE(lost.forced);
    expect_released(log->events()[1], "m", "alice");
  }
}

// Forcing a mutex nobody held since the watcher looked tells nobody of a
// loss (a loss naming nobody would match every owner): only the release.
TEST_F(SqliteBackendTest, ForcingAFreeMutexAnnouncesNoLoss) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(acquire(*backend, "m", "alice").ok());
  ASSERT_TRUE(*backend->release("m", "alice", soon()));
  EventLog log;
  auto subscription = backend->subscribe("m", log.listener());
  ASSERT_TRUE(subscription.ok());
  let_watcher_see_the_owner();
  ASSERT_TRUE(backend->force_release("m", soon()).ok());
  ASSERT_TRUE(log.wait_for(1, kPushBound));
  std::this_thread::sleep_for(100ms);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log.events()[0].kind, MutexEvent::Kind::kReleased);
}

// A plain release is no loss: its owner ended its subscription before it
// released, and nobody else is named.
TEST_F(SqliteBackendTest, PlainReleaseAnnouncesNoLoss) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  EventLog log;
  auto subscription = backend->subscribe("m", log.listener());
  ASSERT_TRUE(subscription.ok());
  ASSERT_TRUE(acquire(*backend, "m", "alice").ok());
  let_watcher_see_the_owner();
  ASSERT_TRUE(*backend->release("m", "alice", soon()));
  ASSERT_TRUE(log.wait_for(1, kPushBound));
  std::this_thread::sleep_for(100ms);
  ASSERT_EQ(log.size(), 1u);
  expect_released(log.events()[0], "m", "alice");
}

// The holder (a service of another backend object, as another process
// would be) stops within a tick of the forced release, not at its renewal
// 20 s later.
TEST_F(SqliteBackendTest, ForceReleasedHolderStopsAtOnce) {
  auto factory = testing::make_factory("sqlite://" + db_path(), 20s, 5s);
  ASSERT_NE(factory, nullptr);
  testing::Recorder a;
  auto holder = factory->create_contend_service(a.contender("m", "a")).value();
  ASSERT_TRUE(holder->start().ok());
  ASSERT_TRUE(a.acquired.wait(5s));
  const std::uint64_t token = holder->fencing_token();
  auto operator_backend = open();
  ASSERT_NE(operator_backend, nullptr);
  // At once after the acquisition: the holder's watcher may not have looked
  // at the row yet (then the loss names nobody, which matches every owner).
  const auto forced_at = steady_clock::now();
  auto forced = operator_backend->force_release("m", soon());
  ASSERT_TRUE(forced.ok()) << forced.status();
  ASSERT_TRUE(a.released.wait(2s));
  EXPECT_LT(steady_clock::now() - forced_at, 2s);
  // It contends again; any new hold is above the floor.
  ASSERT_TRUE(testing::eventually([&] { return holder->is_owner(); }, 5s));
  EXPECT_GT(holder->fencing_token(), forced->fencing_floor);
  EXPECT_GT(holder->fencing_token(), token);
  EXPECT_TRUE(holder->stop().ok());
}

TEST_F(SqliteBackendTest, EverySubscriberOfAMutexHearsAndOnlyOfThatMutex) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  EventLog first;
  EventLog second;
  EventLog other;
  auto a = backend->subscribe("m", first.listener());
  auto b = backend->subscribe("m", second.listener());
  auto c = backend->subscribe("other", other.listener());
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_TRUE(acquire(*backend, "m", "alice").ok());
  ASSERT_TRUE(acquire(*backend, "other", "alice").ok());
  let_watcher_see_the_owner();
  ASSERT_TRUE(*backend->release("m", "alice", soon()));
  ASSERT_TRUE(first.wait_for(1, kPushBound));
  ASSERT_TRUE(second.wait_for(1, kPushBound));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(other.size(), 0u);

  // With one of the two gone, the other still hears.
  a->reset();
  ASSERT_TRUE(acquire(*backend, "m", "bob").ok());
  let_watcher_see_the_owner();
  ASSERT_TRUE(*backend->release("m", "bob", soon()));
  ASSERT_TRUE(second.wait_for(2, kPushBound));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(first.size(), 1u);
}

TEST_F(SqliteBackendTest, HandOverWithoutReleaseIsAnnouncedOnlyAsTheOldOwnersLoss) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  EventLog log;
  auto subscription = backend->subscribe("m", log.listener());
  ASSERT_TRUE(subscription.ok());
  auto alice = acquire(*backend, "m", "alice", 30ms, 30ms);
  ASSERT_TRUE(alice.ok());
  let_watcher_see_the_owner();  // also past alice's lease
  // bob takes over an ended lease: held -> held, nobody can take it now, so
  // no release; but alice (were she still running) learns her hold is gone.
  auto bob = acquire(*backend, "m", "bob");
  ASSERT_TRUE(bob.ok());
  ASSERT_EQ(bob->owner.owner_id, "bob");
  ASSERT_TRUE(log.wait_for(1, kPushBound));
  let_watcher_see_the_owner();
  ASSERT_EQ(log.size(), 1u);
  const MutexEvent lost = log.events()[0];
  EXPECT_EQ(lost.kind, MutexEvent::Kind::kLost);
  EXPECT_EQ(lost.owner_id, "alice");
  EXPECT_EQ(lost.fencing_token, alice->owner.fencing_token);
  EXPECT_FALSE(lost.forced);
}

TEST_F(SqliteBackendTest, NoEventAfterTheSubscriptionIsDestroyed) {
  auto releaser = open();
  auto waiter = open();
  ASSERT_TRUE(releaser && waiter);
  EventLog log;
  auto subscription = waiter->subscribe("m", log.listener());
  ASSERT_TRUE(subscription.ok());
  ASSERT_TRUE(acquire(*releaser, "m", "alice").ok());
  let_watcher_see_the_owner();
  subscription->reset();
  ASSERT_TRUE(*releaser->release("m", "alice", soon()));
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(log.size(), 0u);
}

// The destructor's promise under a race: a listener that is running when the
// Subscription is destroyed finishes before the destructor returns.
TEST_F(SqliteBackendTest, DestroyingASubscriptionWaitsForItsRunningListener) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  std::atomic<bool> entered{false};
  std::atomic<bool> finished{false};
  std::atomic<bool> destroyed{false};
  std::atomic<bool> called_after_destroyed{false};
  auto subscription = backend->subscribe("m", [&](const MutexEvent&) {
    if (destroyed.load()) called_after_destroyed = true;
    entered = true;
    // Blocking is not allowed in real listeners; here it widens the race.
    std::this_thread::sleep_for(200ms);
    finished = true;
  });
  ASSERT_TRUE(subscription.ok());
  ASSERT_TRUE(acquire(*backend, "m", "alice").ok());
  let_watcher_see_the_owner();
  ASSERT_TRUE(*backend->release("m", "alice", soon()));
  const auto until = steady_clock::now() + kPushBound;
  while (!entered.load() && steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(entered.load());
  subscription->reset();
  EXPECT_TRUE(finished.load()) << "the destructor returned while its listener still ran";
  destroyed = true;
  // Later releases reach nobody.
  ASSERT_TRUE(acquire(*backend, "m", "alice").ok());
  let_watcher_see_the_owner();
  ASSERT_TRUE(*backend->release("m", "alice", soon()));
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(called_after_destroyed.load());
}

TEST_F(SqliteBackendTest, ListenerMayDestroyItsOwnSubscription) {
  auto backend = open();
  ASSERT_NE(backend, nullptr);
  std::unique_ptr<Subscription> subscription;
  std::atomic<int> calls{0};
  std::atomic<bool> done{false};
  auto made = backend->subscribe("m", [&](const MutexEvent&) {
    ++calls;
    subscription.reset();  // on the watcher thread, inside this very listener
    done = true;
  });
  ASSERT_TRUE(made.ok());
  subscription = std::move(*made);
  ASSERT_TRUE(acquire(*backend, "m", "alice").ok());
  let_watcher_see_the_owner();
  ASSERT_TRUE(*backend->release("m", "alice", soon()));
  const auto until = steady_clock::now() + kPushBound;
  while (!done.load() && steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(done.load()) << "the listener deadlocked or was never called";
  EXPECT_EQ(subscription, nullptr);
  // The watcher still works for others afterwards.
  EventLog log;
  auto other = backend->subscribe("m", log.listener());
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(acquire(*backend, "m", "bob").ok());
  let_watcher_see_the_owner();
  ASSERT_TRUE(*backend->release("m", "bob", soon()));
  EXPECT_TRUE(log.wait_for(1, kPushBound));
  EXPECT_EQ(calls.load(), 1);
}

TEST_F(SqliteBackendTest, ThousandSubscriptionsShareOneWatcherThread) {
  auto releaser = open();
  auto waiter = open();
  ASSERT_TRUE(releaser && waiter);
  const int before = count_threads();
  constexpr int kMutexes = 1000;
  std::vector<EventLog> logs(kMutexes);
  std::vector<std::unique_ptr<Subscription>> subscriptions;
  for (int i = 0; i < kMutexes; ++i) {
    auto subscription = waiter->subscribe("mutex-" + std::to_string(i), logs[i].listener());
    ASSERT_TRUE(subscription.ok()) << subscription.status();
    subscriptions.push_back(std::move(*subscription));
  }
  EXPECT_EQ(count_threads(), before + 1) << "threads must not grow with subscriptions";
  RecordProperty("threads_added", std::to_string(count_threads() - before));

  // They all work: the first, the last and one in between.
  for (int i : {0, 500, kMutexes - 1}) {
    ASSERT_TRUE(acquire(*releaser, "mutex-" + std::to_string(i), "alice").ok());
  }
  let_watcher_see_the_owner();
  for (int i : {0, 500, kMutexes - 1}) {
    ASSERT_TRUE(*releaser->release("mutex-" + std::to_string(i), "alice", soon()));
  }
  for (int i : {0, 500, kMutexes - 1}) {
    ASSERT_TRUE(logs[i].wait_for(1, kPushBound)) << "mutex-" << i;
    expect_released(logs[i].events()[0], "mutex-" + std::to_string(i), "alice");
  }
  EXPECT_EQ(logs[1].size(), 0u);

  subscriptions.clear();
  EXPECT_LE(count_threads(), before + 1);
  waiter.reset();  // the watcher thread goes with its backend
  // (Joined, a thread may still be listed for a moment while the kernel
  // reaps it.)
  EXPECT_TRUE(eventually([&] { return count_threads() == before; }, 5s));
}

// The watcher thread runs the listener; one that drops the backend stops
// the watcher from that very thread, which then ends by itself, touching
// nothing of the destroyed backend (the ASan stage would see it).
TEST_F(SqliteBackendTest, AListenerMayDestroyTheBackendAndItsOwnSubscription) {
  auto releaser = open();
  ASSERT_TRUE(releaser);
  const int before = count_threads();
  std::mutex mu;
  std::shared_ptr<Backend> backend = open();
  std::unique_ptr<Subscription> subscription;
  testing::Latch destroyed;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto subscribed = backend->subscribe("gone", [&](const MutexEvent&) {
      std::lock_guard<std::mutex> listener_lock(mu);
      if (!backend) return;
      subscription.reset();
      backend.reset();
      destroyed.set();
    });
    ASSERT_TRUE(subscribed.ok()) << subscribed.status();
    subscription = std::move(*subscribed);
  }
  ASSERT_TRUE(acquire(*releaser, "gone", "alice").ok());
  ASSERT_TRUE(*releaser->release("gone", "alice", soon()));
  ASSERT_TRUE(destroyed.wait(kPushBound));
  EXPECT_TRUE(eventually([&] { return count_threads() == before; }, 5s));
}

TEST_F(SqliteBackendTest, DestroyingTheBackendWithLiveSubscriptions) {
  auto releaser = open();
  auto waiter = open();
  ASSERT_TRUE(releaser && waiter);
  const int before_watcher = count_threads();  // the watcher starts at the first subscribe
  EventLog log;
  std::vector<std::unique_ptr<Subscription>> subscriptions;
  for (const char* mutex : {"a", "b", "c"}) {
    auto subscription = waiter->subscribe(mutex, log.listener());
    ASSERT_TRUE(subscription.ok());
    subscriptions.push_back(std::move(*subscription));
    ASSERT_TRUE(acquire(*releaser, mutex, "alice").ok());
  }
  let_watcher_see_the_owner();

  const auto start = steady_clock::now();
  waiter.reset();
  EXPECT_LT(steady_clock::now() - start, 1s) << "destroying the backend hung";
  EXPECT_EQ(count_threads(), before_watcher) << "the watcher thread outlived its backend";

  // The subscriptions are still valid objects; nothing is delivered.
  for (const char* mutex : {"a", "b", "c"}) {
    ASSERT_TRUE(*releaser->release(mutex, "alice", soon()));
  }
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(log.size(), 0u);
  subscriptions.clear();
}

TEST_F(SqliteBackendTest, BackendDestroyedFromInsideAListener) {
  auto releaser = open();
  ASSERT_NE(releaser, nullptr);
  const int before = count_threads();
  std::mutex mu;
  std::shared_ptr<Backend> doomed = open();
  ASSERT_NE(doomed, nullptr);
  std::atomic<bool> done{false};
  auto subscription = doomed->subscribe("m", [&](const MutexEvent&) {
    std::shared_ptr<Backend> last;
    {
      std::lock_guard<std::mutex> lock(mu);
      last = std::move(doomed);
    }
    last.reset();  // the last reference: the backend dies on the watcher thread
    done = true;
  });
  ASSERT_TRUE(subscription.ok());
  ASSERT_TRUE(acquire(*releaser, "m", "alice").ok());
  let_watcher_see_the_owner();
  ASSERT_TRUE(*releaser->release("m", "alice", soon()));
  const auto until = steady_clock::now() + kPushBound;
  while (!done.load() && steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(done.load());
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(doomed, nullptr);
  }
  subscription->reset();
  // The watcher thread, detached because it could not join itself, ends.
  const auto deadline = steady_clock::now() + 5s;
  while (count_threads() > before && steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(count_threads(), before);
}

// ---- opening: paths and URIs ------------------------------------------------------------

TEST_F(SqliteBackendTest, EmptyPathIsInvalidArgument) {
  auto backend = new_sqlite_backend({.path = ""});
  EXPECT_EQ(backend.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(backend.status().message(), "sqlite: path must not be empty");
}

TEST_F(SqliteBackendTest, MissingDirectoryIsNotFound) {
  auto backend = new_sqlite_backend({.path = dir_ + "/no/such/simba.db"});
  EXPECT_EQ(backend.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(backend.status().message(), "sqlite: directory '" + dir_ + "/no/such' does not exist");
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/no"));
}

TEST_F(SqliteBackendTest, ParentThatIsAFileIsNotFound) {
  std::ofstream(dir_ + "/plain") << "x";
  auto backend = new_sqlite_backend({.path = dir_ + "/plain/simba.db"});
  EXPECT_EQ(backend.status().code(), StatusCode::kNotFound) << backend.status();
  EXPECT_NE(backend.status().message().find(dir_ + "/plain"), std::string::npos);
  // Root cannot get around this one.
  auto deeper = new_sqlite_backend({.path = dir_ + "/plain/sub/simba.db"});
  EXPECT_EQ(deeper.status().code(), StatusCode::kNotFound) << deeper.status();
}

TEST_F(SqliteBackendTest, DirectoryAsPathIsInvalidArgument) {
  auto backend = new_sqlite_backend({.path = dir_});
  EXPECT_EQ(backend.status().code(), StatusCode::kInvalidArgument) << backend.status();
  EXPECT_NE(backend.status().message().find(dir_), std::string::npos);
  auto slash = new_sqlite_backend({.path = dir_ + "/"});
  EXPECT_EQ(slash.status().code(), StatusCode::kInvalidArgument) << slash.status();
}

// Opens `path` as an unprivileged user would and returns the outcome.
// Root ignores permission bits, so as root this runs in a forked child that
// first drops to uid/gid 65534 ("nobody"). Sets `*skip` (and returns OK)
// only if that is impossible, e.g. without CAP_SETUID.
Status open_unprivileged(const std::string& path, std::string* skip) {
  if (::geteuid() != 0) return new_sqlite_backend({.path = path}).status();
  constexpr uid_t kNobody = 65534;
  int fds[2];
  if (::pipe(fds) != 0) {
    *skip = "pipe() failed";
    return ok_status();
  }
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    // No gtest here: the outcome goes back through the pipe as
    // "<code> <message>", or "-" when privileges could not be dropped.
    ::close(fds[0]);
    std::string out = "-";
    if (::setgroups(0, nullptr) == 0 && ::setgid(kNobody) == 0 && ::setuid(kNobody) == 0) {
      const Status status = new_sqlite_backend({.path = path}).status();
      out = std::to_string(static_cast<int>(status.code())) + " " + status.message();
    }
    [[maybe_unused]] const ssize_t written = ::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buffer[512];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof(buffer))) > 0;) {
    out.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int wait_status = 0;
  if (child < 0 || ::waitpid(child, &wait_status, 0) != child || out.empty() || out == "-") {
    *skip = "running as root, which ignores permission bits, and could not drop to uid 65534";
    return ok_status();
  }
  const std::size_t space = out.find(' ');
  return Status(static_cast<StatusCode>(std::stoi(out.substr(0, space))),
                space == std::string::npos ? "" : out.substr(space + 1));
}

TEST_F(SqliteBackendTest, ReadOnlyDirectoryIsPermissionDenied) {
  ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);  // reachable for "nobody" too
  const std::string ro = dir_ + "/ro";
  ASSERT_EQ(::mkdir(ro.c_str(), 0555), 0);
  ASSERT_EQ(::chmod(ro.c_str(), 0555), 0);  // whatever the umask
  std::string skip;
  const Status status = open_unprivileged(ro + "/simba.db", &skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status;
  EXPECT_NE(status.message().find(ro), std::string::npos) << status;
  EXPECT_FALSE(std::filesystem::exists(ro + "/simba.db"));
}

TEST_F(SqliteBackendTest, ReadOnlyFileIsPermissionDenied) {
  ASSERT_EQ(::chmod(dir_.c_str(), 0777), 0);  // only the file is read-only
  ASSERT_NE(open(), nullptr);                 // creates the file, then closes it
  ASSERT_EQ(::chmod(db_path().c_str(), 0444), 0);
  std::string skip;
  const Status status = open_unprivileged(db_path(), &skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status;
  EXPECT_NE(status.message().find(db_path()), std::string::npos) << status;
}

TEST_F(SqliteBackendTest, UncreatableFileIsAClearError) {
  // Nobody, root included, can create a file directly under /proc: a
  // read-only place without relying on permission bits. As root the
  // directory checks pass and open() fails with ENOENT (kNotFound);
  // otherwise the directory is not writable (kPermissionDenied).
  const std::string path = "/proc/simba-test.db";
  auto backend = new_sqlite_backend({.path = path});
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(),
            ::geteuid() == 0 ? StatusCode::kNotFound : StatusCode::kPermissionDenied)
      << backend.status();
  EXPECT_NE(backend.status().message().find(path), std::string::npos) << backend.status();
}

TEST_F(SqliteBackendTest, FileThatIsNotADatabaseIsInvalidArgument) {
  {
    std::ofstream file(db_path());
    for (int i = 0; i < 100; ++i) file << "this is not an SQLite database\n";
  }
  auto backend = new_sqlite_backend({.path = db_path()});
  EXPECT_EQ(backend.status().code(), StatusCode::kInvalidArgument) << backend.status();
  EXPECT_NE(backend.status().message().find(db_path()), std::string::npos);
}

TEST_F(SqliteBackendTest, RejectsMemoryDatabaseAndNegativeBusyTimeout) {
  EXPECT_EQ(new_sqlite_backend({.path = ":memory:"}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(new_sqlite_backend({.path = db_path(), .busy_timeout = -1ms}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(SqliteBackendTest, RelativeAndFileColonPathsAreLiteralFiles) {
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir_);
  {
    auto plain = new_sqlite_backend({.path = "relative.db"});
    EXPECT_TRUE(plain.ok()) << plain.status();
    // Debian's SQLite reads "file:..." as a URI unless told otherwise.
    auto colon = new_sqlite_backend({.path = "file:odd.db"});
    EXPECT_TRUE(colon.ok()) << colon.status();
  }
  std::filesystem::current_path(cwd);
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/relative.db"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/file:odd.db"));
}

Result<SqliteOptions> from_uri(std::string_view text) {
  SIMBA_ASSIGN_OR_RETURN(Uri uri, Uri::parse(text));
  return sqlite_options_from_uri(uri);
}

TEST(SqliteOptionsFromUriTest, AbsoluteAndRelativePaths) {
  auto absolute = from_uri("sqlite:///abs/path.db");
  ASSERT_TRUE(absolute.ok()) << absolute.status();
  EXPECT_EQ(absolute->path, "/abs/path.db");
  EXPECT_EQ(absolute->busy_timeout, 5000ms);

  auto relative = from_uri("sqlite://rel/dir/x.db");
  ASSERT_TRUE(relative.ok()) << relative.status();
  EXPECT_EQ(relative->path, "rel/dir/x.db");

  auto bare = from_uri("sqlite://x.db");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->path, "x.db");

  // The same from hand-built values, independent of the parser.
  Uri uri;
  uri.scheme = "sqlite";
  uri.hosts = {UriHost{"rel", std::nullopt}};
  uri.path = "/dir/x.db";
  auto built = sqlite_options_from_uri(uri);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->path, "rel/dir/x.db");
}

TEST(SqliteOptionsFromUriTest, BusyTimeout) {
  auto two = from_uri("sqlite:///abs/path.db?busy_timeout=2s");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->busy_timeout, 2000ms);
  auto ms = from_uri("sqlite://rel.db?busy_timeout=250ms");
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_EQ(ms->busy_timeout, 250ms);
  EXPECT_EQ(from_uri("sqlite:///a.db?busy_timeout=10").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(from_uri("sqlite:///a.db?busy_timeout=soon").status().code(),
            StatusCode::kInvalidArgument);
}

TEST(SqliteOptionsFromUriTest, RejectsWhatDoesNotApply) {
  for (const char* text : {
           "mysql:///abs/path.db",              // wrong scheme
           "sqlite:///abs/path.db?timeout=2s",  // unknown key
           "sqlite://user@rel/path.db",         // user
           "sqlite://user:secret@rel/path.db",  // password
           "sqlite://rel:5000/path.db",         // port
           "sqlite://a,b/path.db",              // host list
           "sqlite:///",                        // no file
           "sqlite://rel/dir/",                 // a directory
       }) {
    auto options = from_uri(text);
    EXPECT_EQ(options.status().code(), StatusCode::kInvalidArgument)
        << text << " -> " << options.status();
  }
  Uri empty;
  empty.scheme = "sqlite";
  EXPECT_EQ(sqlite_options_from_uri(empty).status().code(), StatusCode::kInvalidArgument);
  Uri scheme;
  scheme.scheme = "postgresql";
  scheme.path = "/x.db";
  auto wrong = sqlite_options_from_uri(scheme);
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("postgresql"), std::string::npos);
}

// ---- error translation --------------------------------------------------------------------

TEST(SqliteFailureToStatusTest, Table) {
  struct Row {
    int code;
    int system_errno;
    bool deadline_passed;
    StatusCode expected;
  };
  const Row rows[] = {
      {SQLITE_OK, 0, false, StatusCode::kOk},
      {SQLITE_DONE, 0, false, StatusCode::kOk},
      {SQLITE_BUSY, 0, false, StatusCode::kUnavailable},
      {SQLITE_BUSY, 0, true, StatusCode::kDeadlineExceeded},
      {SQLITE_BUSY_SNAPSHOT, 0, false, StatusCode::kUnavailable},
      {SQLITE_BUSY_RECOVERY, 0, true, StatusCode::kDeadlineExceeded},
      {SQLITE_LOCKED, 0, false, StatusCode::kUnavailable},
      {SQLITE_LOCKED_SHAREDCACHE, 0, true, StatusCode::kDeadlineExceeded},
      {SQLITE_READONLY, 0, false, StatusCode::kPermissionDenied},
      {SQLITE_READONLY_CANTLOCK, 0, false, StatusCode::kPermissionDenied},
      {SQLITE_READONLY_DIRECTORY, 0, false, StatusCode::kPermissionDenied},
      {SQLITE_READONLY_DBMOVED, 0, false, StatusCode::kUnavailable},
      {SQLITE_PERM, 0, false, StatusCode::kPermissionDenied},
      {SQLITE_AUTH, 0, false, StatusCode::kPermissionDenied},
      {SQLITE_CANTOPEN, EACCES, false, StatusCode::kPermissionDenied},
      {SQLITE_CANTOPEN, EROFS, false, StatusCode::kPermissionDenied},
      {SQLITE_CANTOPEN, EPERM, false, StatusCode::kPermissionDenied},
      {SQLITE_CANTOPEN, ENOENT, false, StatusCode::kNotFound},
      {SQLITE_CANTOPEN, ENOTDIR, false, StatusCode::kNotFound},
      {SQLITE_CANTOPEN, EMFILE, false, StatusCode::kUnavailable},
      {SQLITE_CANTOPEN, 0, false, StatusCode::kUnavailable},
      {SQLITE_CANTOPEN_ISDIR, 0, false, StatusCode::kInvalidArgument},
      {SQLITE_NOTADB, 0, false, StatusCode::kInvalidArgument},
      {SQLITE_IOERR, EIO, false, StatusCode::kUnavailable},
      {SQLITE_IOERR_WRITE, EROFS, false, StatusCode::kPermissionDenied},
      {SQLITE_IOERR_FSYNC, 0, false, StatusCode::kUnavailable},
      {SQLITE_FULL, ENOSPC, false, StatusCode::kUnavailable},
      {SQLITE_NOMEM, 0, false, StatusCode::kUnavailable},
      {SQLITE_PROTOCOL, 0, false, StatusCode::kUnavailable},
      {SQLITE_SCHEMA, 0, false, StatusCode::kUnavailable},
      {SQLITE_INTERRUPT, 0, false, StatusCode::kCancelled},
      {SQLITE_INTERRUPT, 0, true, StatusCode::kDeadlineExceeded},
      {SQLITE_CORRUPT, 0, false, StatusCode::kInternal},
      {SQLITE_CORRUPT_INDEX, 0, false, StatusCode::kInternal},
      {SQLITE_ERROR, 0, false, StatusCode::kInternal},
      {SQLITE_MISUSE, 0, false, StatusCode::kInternal},
      {SQLITE_CONSTRAINT_NOTNULL, 0, false, StatusCode::kInternal},
      {SQLITE_RANGE, 0, false, StatusCode::kInternal},
  };
  for (const Row& row : rows) {
    const Status status =
        internal::sqlite_failure_to_status({row.code, row.system_errno, "the sqlite message"},
                                           row.deadline_passed, "sqlite '/x.db': op");
    EXPECT_EQ(status.code(), row.expected)
        << "code " << row.code << " errno " << row.system_errno << " deadline "
        << row.deadline_passed << " -> " << status;
    if (!status.ok()) {
      EXPECT_EQ(status.message().rfind("sqlite '/x.db': op: ", 0), 0u) << status;
      // Contention is described in our words, never as "database is locked".
      EXPECT_EQ(status.message().find("database is locked"), std::string::npos) << status;
    }
  }
}

TEST(SqliteFailureToStatusTest, MessageCarriesSqliteTextCodeAndErrno) {
  const Status status = internal::sqlite_failure_to_status(
      {SQLITE_CANTOPEN, ENOENT, "unable to open database file"}, false, "ctx");
  EXPECT_NE(status.message().find("unable to open database file"), std::string::npos);
  EXPECT_NE(status.message().find("sqlite code 14"), std::string::npos);
  EXPECT_NE(status.message().find("errno 2"), std::string::npos);
  // Without SQLite's message, its generic text for the code stands in.
  const Status generic = internal::sqlite_failure_to_status({SQLITE_FULL, 0, ""}, false, "ctx");
  EXPECT_NE(generic.message().find("database or disk is full"), std::string::npos) << generic;
}

}  // namespace
}  // namespace simba
