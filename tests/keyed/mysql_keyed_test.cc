// The MySQL/MariaDB keyed-lock backend (GET_LOCK) through its SPI and
// through KeyedLockProvider, against a real MariaDB server: lock names and
// their hashing, exclusion, waits and their deadlines, cancellation, lost
// sessions (KILL, restart), the connection budget and bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mysql.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <random>
#include <stop_token>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include <unistd.h>

#include "backends/mysql/mysql_lock_name.h"
#include "simba/backends/mysql_keyed.h"
#include "simba/keyed_lock.h"
#include "testing/status_matchers.h"
#include "testing/test_servers.h"
#include "testing/test_util.h"

namespace simba::testing {
namespace {

using internal::sql::mysql::lock_name_of;
using internal::sql::mysql::LockNameCompare;
using internal::sql::mysql::sha256_hex;
using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;
using ::testing::HasSubstr;
using ::testing::Not;

// Plain, blocking libmariadb for what the test itself asks the server.
class RawMysql {
 public:
  // As the user of `uri` over TCP.
  explicit RawMysql(const std::string& uri) : m_(mysql_init(nullptr)) {
    auto parsed = Uri::parse(uri.substr(0, uri.find('?')));
    if (!parsed.ok() || parsed->hosts.size() != 1) return;
    const unsigned int timeout = 5;
    mysql_options(m_, MYSQL_OPT_CONNECT_TIMEOUT, &timeout);
    mysql_options(m_, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    ok_ = mysql_real_connect(m_, parsed->hosts[0].host.c_str(), parsed->user.value_or("").c_str(),
                             parsed->password.value_or("").c_str(), parsed->path.substr(1).c_str(),
                             parsed->hosts[0].port.value_or(3306), nullptr, 0) != nullptr;
  }
  // As root over the Unix socket of a private server.
  static std::unique_ptr<RawMysql> root(const TestServer& server) {
    auto raw = std::unique_ptr<RawMysql>(new RawMysql());
    mysql_options(raw->m_, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    raw->ok_ = mysql_real_connect(raw->m_, "localhost", "root", nullptr, "simba", 0,
                                  (server.dir() + "/mysqld.sock").c_str(), 0) != nullptr;
    return raw;
  }
  ~RawMysql() { mysql_close(m_); }
  RawMysql(const RawMysql&) = delete;
  RawMysql& operator=(const RawMysql&) = delete;

  bool ok() const { return ok_; }
  std::string error() { return mysql_error(m_); }

  // The first column of the first row ("NULL" for NULL, "" for no row), or
  // "ERROR: ..." text.
  std::string exec(const std::string& sql) {
    if (mysql_real_query(m_, sql.data(), sql.size()) != 0) return "ERROR: " + error();
    MYSQL_RES* result = mysql_store_result(m_);
    if (result == nullptr) return "";
    std::string value;
    if (MYSQL_ROW row = mysql_fetch_row(result)) value = row[0] != nullptr ? row[0] : "NULL";
    mysql_free_result(result);
    return value;
  }
  std::string literal(const std::string& text) {
    std::string out(text.size() * 2 + 1, '\0');
    out.resize(mysql_real_escape_string(m_, out.data(), text.data(), text.size()));
    return "'" + out + "'";
  }
  // The connection holding lock `name`, or "NULL".
  std::string holder(const std::string& name) {
    return exec("SELECT IS_USED_LOCK(" + literal(name) + ")");
  }

 private:
  RawMysql() : m_(mysql_init(nullptr)) {}
  MYSQL* m_;
  bool ok_ = false;
};

// The backend `uri` names, through both doors: the URI's options, then the
// backend from them.
Result<std::shared_ptr<KeyedLockBackend>> open_from_uri(const Uri& uri) {
  SIMBA_ASSIGN_OR_RETURN(MysqlKeyedOptions options, mysql_keyed_options_from_uri(uri));
  return new_mysql_keyed_lock_backend(std::move(options));
}

std::shared_ptr<KeyedLockBackend> open_keyed(const std::string& uri) {
  auto parsed = Uri::parse(uri);
  EXPECT_THAT(parsed, IsOk());
  if (!parsed.ok()) return nullptr;
  auto backend = open_from_uri(*parsed);
  EXPECT_THAT(backend, IsOk());
  return backend.ok() ? *backend : nullptr;
}

std::string shared_uri() { return shared_server_uri("mysql"); }

// A key of this test's own, so runs and tests never share one.
std::string unique_key(const std::string& what) {
  static std::atomic<int> counter{0};
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(info->name()).substr(0, 24) + "-" + what + "-" + std::to_string(::getpid()) +
         "-" + std::to_string(counter++);
}

Deadline in(milliseconds d) { return steady_clock::now() + d; }
Deadline past() { return steady_clock::now() - seconds(1); }

KeyAcquireRequest request_for(const std::string& key, Deadline wait_deadline,
                              std::function<void()> on_lost = {}) {
  KeyAcquireRequest request;
  request.key = key;
  request.max_hold = seconds(60);
  request.wait_deadline = wait_deadline;
  request.on_lost = std::move(on_lost);
  return request;
}

// Acquires `key` (free) or fails the test.
std::unique_ptr<KeyHold> hold_key(KeyedLockBackend& backend, const std::string& key,
                                  std::function<void()> on_lost = {}) {
  auto hold = backend.acquire(request_for(key, in(seconds(5)), std::move(on_lost)));
  EXPECT_THAT(hold, IsOk());
  if (!hold.ok()) return nullptr;
  EXPECT_NE(*hold, nullptr) << key;
  return std::move(*hold);
}

// True when another backend can take `key` at once (and then frees it).
bool is_free(KeyedLockBackend& other, const std::string& key) {
  auto hold = other.acquire(request_for(key, past()));
  EXPECT_THAT(hold, IsOk());
  if (!hold.ok() || *hold == nullptr) return false;
  SIMBA_EXPECT_OK((*hold)->release(in(seconds(5))));
  return true;
}

std::string hashed_name(const std::string& key) {
  return "#sha256:" + sha256_hex(key).substr(0, 56);
}

// ---- lock names -------------------------------------------------------------------

TEST(MysqlKeyedNames, ShortKeysAreTheirOwnNamesLongOnesAreHashed) {
  const std::string at_limit(64, 'k');
  EXPECT_EQ(lock_name_of(at_limit, LockNameCompare::kExact), at_limit);
  EXPECT_EQ(lock_name_of(at_limit + "k", LockNameCompare::kExact), hashed_name(at_limit + "k"));
  EXPECT_EQ(hashed_name(at_limit + "k").size(), 64u);
  // 64 characters but more than MariaDB's 192 bytes.
  std::string emoji;
  for (int i = 0; i < 49; ++i) emoji += "\xF0\x9F\x98\x80";
  EXPECT_EQ(lock_name_of(emoji, LockNameCompare::kExact), hashed_name(emoji));
  // A key that looks like a hashed name is hashed too.
  const std::string lookalike = hashed_name("x");
  EXPECT_EQ(lock_name_of(lookalike, LockNameCompare::kExact), hashed_name(lookalike));
  // A server that folds case: only fold-proof keys stay as they are.
  EXPECT_EQ(lock_name_of("orders:42", LockNameCompare::kFolded), "orders:42");
  EXPECT_EQ(lock_name_of("Orders:42", LockNameCompare::kFolded), hashed_name("Orders:42"));
  EXPECT_EQ(lock_name_of("caf\xC3\xA9", LockNameCompare::kFolded), hashed_name("caf\xC3\xA9"));
  EXPECT_EQ(lock_name_of("a b", LockNameCompare::kFolded), hashed_name("a b"));
}

// The hash is part of the protocol: every process and version must agree.
// Expected values from coreutils' sha256sum.
TEST(MysqlKeyedNames, HashedNamesAreStable) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(std::string(119, 'b')),
            "68297a9eb141ce16bbc0847da1c0c48e2858704feaa13993bde29f87a198a6e1");
  EXPECT_EQ(sha256_hex(std::string(1000, 'c')),
            "efeea944a76157a88d281091b6a79608653bc1f14a11d0357431c197701b6155");
  EXPECT_EQ(lock_name_of(std::string(65, 'a'), LockNameCompare::kExact),
            "#sha256:" + sha256_hex(std::string(65, 'a')).substr(0, 56));
}

TEST(MysqlKeyedNames, AMillionLongKeysGetDistinctNames) {
  std::unordered_set<std::string> names;
  names.reserve(1000000);
  const std::string stem(80, 'w');
  for (int i = 0; i < 1000000; ++i) {
    names.insert(lock_name_of(stem + std::to_string(i), LockNameCompare::kExact));
  }
  EXPECT_EQ(names.size(), 1000000u);
}

TEST(MysqlKeyedNames, AtTheServerShortKeysAreUsedAsTheyAreLongOnesHashed) {
  auto backend = open_keyed(shared_uri());
  ASSERT_TRUE(backend);
  RawMysql raw(shared_uri());
  ASSERT_TRUE(raw.ok()) << raw.error();
  std::string at_limit = unique_key("k");
  at_limit += std::string(64 - at_limit.size(), 'k');
  const std::string over_limit = at_limit + "x";
  auto short_hold = hold_key(*backend, at_limit);
  auto long_hold = hold_key(*backend, over_limit);
  ASSERT_TRUE(short_hold && long_hold);
  EXPECT_NE(raw.holder(at_limit), "NULL");
  EXPECT_NE(raw.holder(hashed_name(over_limit)), "NULL");
  EXPECT_EQ(raw.holder(over_limit.substr(0, 64)), raw.holder(at_limit));  // not a truncation
  SIMBA_EXPECT_OK(short_hold->release(in(seconds(5))));
  SIMBA_EXPECT_OK(long_hold->release(in(seconds(5))));
  EXPECT_EQ(raw.holder(at_limit), "NULL");
  EXPECT_EQ(raw.holder(hashed_name(over_limit)), "NULL");
}

// MariaDB 10.11 compares lock names byte for byte (the backend probes it):
// keys that differ in case, accents, trailing spaces or any multi-byte
// character are distinct locks.
TEST(MysqlKeyedNames, CaseAccentsAndMultiByteKeysAreDistinct) {
  auto holder = open_keyed(shared_uri());
  auto other = open_keyed(shared_uri());
  ASSERT_TRUE(holder && other);
  const std::string base = unique_key("n");
  const std::vector<std::string> keys = {base + "A",
                                         base + "a",
                                         base + "\xC3\xA9" /* é */,
                                         base + "\xC3\x89" /* É */,
                                         base + "e",
                                         base + "a ",
                                         base + "\xC3\x9F" /* ß */,
                                         base + "ss",
                                         base + "\xF0\x9F\x98\x80" /* 😀 */,
                                         base + "\xF0\x9F\x98\x81" /* 😁 */};
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto hold = hold_key(*holder, keys[i]);
    ASSERT_TRUE(hold) << keys[i];
    for (std::size_t j = 0; j < keys.size(); ++j) {
      if (i == j) continue;
      EXPECT_TRUE(is_free(*other, keys[j])) << "'" << keys[i] << "' blocks '" << keys[j] << "'";
    }
    EXPECT_FALSE(is_free(*other, keys[i])) << keys[i];
    SIMBA_EXPECT_OK(hold->release(in(seconds(5))));
  }
}

// ---- exclusion and waits ------------------------------------------------------------

TEST(MysqlKeyedLocks, TwoBackendsExcludeEachOtherAndKeysAreIndependent) {
  auto a = open_keyed(shared_uri());
  auto b = open_keyed(shared_uri());
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->scheme(), "mysql");
  const std::string key = unique_key("k");
  auto held = hold_key(*a, key);
  ASSERT_TRUE(held);
  EXPECT_EQ(held->fencing_token(), 0u);
  auto busy = b->acquire(request_for(key, past()));
  ASSERT_THAT(busy, IsOk());
  EXPECT_EQ(*busy, nullptr);
  EXPECT_TRUE(is_free(*b, unique_key("other")));
  SIMBA_EXPECT_OK(held->release(in(seconds(5))));
  EXPECT_TRUE(is_free(*b, key));
}

TEST(MysqlKeyedLocks, AWaiterGetsTheKeyWhenItIsReleased) {
  auto a = open_keyed(shared_uri());
  auto b = open_keyed(shared_uri());
  ASSERT_TRUE(a && b);
  const std::string key = unique_key("k");
  auto held = hold_key(*a, key);
  ASSERT_TRUE(held);
  auto waiter =
      std::async(std::launch::async, [&] { return b->acquire(request_for(key, in(seconds(10)))); });
  std::this_thread::sleep_for(milliseconds(300));
  const auto released_at = steady_clock::now();
  SIMBA_EXPECT_OK(held->release(in(seconds(5))));
  auto got = waiter.get();
  ASSERT_THAT(got, IsOk());
  ASSERT_NE(*got, nullptr);
  // Pushed by the server, not polled.
  EXPECT_LT(steady_clock::now() - released_at, milliseconds(500));
  SIMBA_EXPECT_OK((*got)->release(in(seconds(5))));
}

TEST(MysqlKeyedLocks, AWaitEndsOnItsDeadline) {
  auto a = open_keyed(shared_uri());
  auto b = open_keyed(shared_uri());
  ASSERT_TRUE(a && b);
  const std::string key = unique_key("k");
  auto held = hold_key(*a, key);
  ASSERT_TRUE(held);
  for (int round = 0; round < 3; ++round) {
    const auto start = steady_clock::now();
    auto got = b->acquire(request_for(key, start + milliseconds(300)));
    const auto took = steady_clock::now() - start;
    ASSERT_THAT(got, IsOk());
    EXPECT_EQ(*got, nullptr);
    EXPECT_GE(took, milliseconds(300));
    EXPECT_LT(took, milliseconds(1300));
  }
  SIMBA_EXPECT_OK(held->release(in(seconds(5))));
}

TEST(MysqlKeyedLocks, ADeadlineInThePastStillTakesAFreeKey) {
  auto backend = open_keyed(shared_uri());
  ASSERT_TRUE(backend);
  auto got = backend->acquire(request_for(unique_key("k"), past()));
  ASSERT_THAT(got, IsOk());
  ASSERT_NE(*got, nullptr);
  SIMBA_EXPECT_OK((*got)->release(in(seconds(5))));
}

TEST(MysqlKeyedLocks, CancellingAWaitIsPromptAndLeavesNothingHeld) {
  auto a = open_keyed(shared_uri());
  auto b = open_keyed(shared_uri());
  ASSERT_TRUE(a && b);
  const std::string key = unique_key("k");
  auto held = hold_key(*a, key);
  ASSERT_TRUE(held);
  std::stop_source cancel;
  auto waiter = std::async(std::launch::async, [&] {
    KeyAcquireRequest request = request_for(key, Deadline::max());
    request.cancel = cancel.get_token();
    return b->acquire(request);
  });
  std::this_thread::sleep_for(milliseconds(300));
  const auto cancelled_at = steady_clock::now();
  cancel.request_stop();
  auto got = waiter.get();
  EXPECT_LT(steady_clock::now() - cancelled_at, milliseconds(200));
  EXPECT_THAT(got, StatusIs(StatusCode::kCancelled));
  SIMBA_EXPECT_OK(held->release(in(seconds(5))));
  // The cancelled waiter's session is gone: nobody holds the key, and b
  // works on (it reconnects).
  RawMysql raw(shared_uri());
  ASSERT_TRUE(raw.ok()) << raw.error();
  EXPECT_TRUE(eventually([&] { return raw.holder(key) == "NULL"; }, seconds(2)));
  EXPECT_TRUE(is_free(*b, key));
  // Cancelled before asking: no wait at all.
  KeyAcquireRequest request = request_for(key, Deadline::max());
  request.cancel = cancel.get_token();
  EXPECT_THAT(b->acquire(request), StatusIs(StatusCode::kCancelled));
}

// ---- lost sessions ------------------------------------------------------------------

TEST(MysqlKeyedLosses, AKilledHolderConnectionIsReportedAndFreesTheKey) {
  auto a = open_keyed(shared_uri());
  auto b = open_keyed(shared_uri());
  ASSERT_TRUE(a && b);
  const std::string key = unique_key("k");
  std::atomic<int> lost{0};
  auto held = hold_key(*a, key, [&] { ++lost; });
  ASSERT_TRUE(held);
  RawMysql raw(shared_uri());
  ASSERT_TRUE(raw.ok()) << raw.error();
  const std::string holder = raw.holder(key);
  ASSERT_NE(holder, "NULL");
  const auto killed_at = steady_clock::now();
  ASSERT_EQ(raw.exec("KILL " + holder), "");
  ASSERT_TRUE(eventually([&] { return lost.load() > 0; }, seconds(2)));
  EXPECT_LT(steady_clock::now() - killed_at, seconds(1));
  auto got = b->acquire(request_for(key, in(seconds(2))));
  ASSERT_THAT(got, IsOk());
  ASSERT_NE(*got, nullptr);
  // Releasing a lost hold is fine: the session's end freed the key (an error
  // would mean the store may still hold it).
  SIMBA_EXPECT_OK(held->release(in(seconds(5))));
  EXPECT_EQ(lost.load(), 1);
  SIMBA_EXPECT_OK((*got)->release(in(seconds(5))));
  // a works on with a fresh connection.
  auto again = hold_key(*a, key);
  ASSERT_TRUE(again);
  SIMBA_EXPECT_OK(again->release(in(seconds(5))));
}

TEST(MysqlKeyedLosses, AHoldDestroyedWithoutReleaseFreesTheKey) {
  auto a = open_keyed(shared_uri());
  auto b = open_keyed(shared_uri());
  ASSERT_TRUE(a && b);
  const std::string key = unique_key("k");
  auto held = hold_key(*a, key);
  ASSERT_TRUE(held);
  EXPECT_FALSE(is_free(*b, key));
  held.reset();
  EXPECT_TRUE(is_free(*b, key));
}

TEST(MysqlKeyedLosses, AHoldMayOutliveItsBackend) {
  auto a = open_keyed(shared_uri());
  auto b = open_keyed(shared_uri());
  ASSERT_TRUE(a && b);
  const std::string key = unique_key("k");
  auto held = hold_key(*a, key);
  ASSERT_TRUE(held);
  a.reset();
  EXPECT_FALSE(is_free(*b, key));
  SIMBA_EXPECT_OK(held->release(in(seconds(5))));
  EXPECT_TRUE(is_free(*b, key));
}

TEST(MysqlKeyedLosses, AServerRestartIsReportedAndTheBackendRecovers) {
  auto server = TestServer::start("mysql");
  ASSERT_THAT(server, IsOk());
  auto backend = open_keyed((*server)->uri());
  ASSERT_TRUE(backend);
  const std::string key = unique_key("k");
  std::atomic<int> lost{0};
  auto held = hold_key(*backend, key, [&] { ++lost; });
  ASSERT_TRUE(held);
  SIMBA_ASSERT_OK((*server)->restart());
  EXPECT_TRUE(eventually([&] { return lost.load() > 0; }, seconds(2)));
  SIMBA_EXPECT_OK(held->release(in(seconds(5))));  // the restart freed the key
  auto again = backend->acquire(request_for(key, in(seconds(10))));
  ASSERT_THAT(again, IsOk());
  ASSERT_NE(*again, nullptr);
  SIMBA_EXPECT_OK((*again)->release(in(seconds(5))));
}

// ---- the connection budget ----------------------------------------------------------

TEST(MysqlKeyedBudget, AcquiresWaitForAConnectionAndNeverOpenMore) {
  auto server = TestServer::start("mysql");
  ASSERT_THAT(server, IsOk());
  auto root = RawMysql::root(**server);
  ASSERT_TRUE(root->ok()) << root->error();
  // Only this backend connects as the URI's user.
  auto connections = [&] {
    return std::stoi(
        root->exec("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'simba'"));
  };
  auto backend = open_keyed((*server)->uri() + "?lock_connections=2");
  ASSERT_TRUE(backend);
  EXPECT_EQ(connections(), 0);  // lazily opened
  auto first = hold_key(*backend, "first");
  auto second = hold_key(*backend, "second");
  ASSERT_TRUE(first && second);
  EXPECT_EQ(connections(), 2);
  // No connection frees up in time: not held.
  const auto start = steady_clock::now();
  auto timed_out = backend->acquire(request_for("third", start + milliseconds(200)));
  ASSERT_THAT(timed_out, IsOk());
  EXPECT_EQ(*timed_out, nullptr);
  EXPECT_GE(steady_clock::now() - start, milliseconds(200));
  // One does: held.
  auto third = std::async(std::launch::async,
                          [&] { return backend->acquire(request_for("third", in(seconds(10)))); });
  EXPECT_EQ(third.wait_for(milliseconds(300)), std::future_status::timeout);
  EXPECT_EQ(connections(), 2);
  SIMBA_EXPECT_OK(first->release(in(seconds(5))));
  auto got = third.get();
  ASSERT_THAT(got, IsOk());
  ASSERT_NE(*got, nullptr);
  EXPECT_EQ(connections(), 2);
  EXPECT_NE(root->holder("third"), "NULL");
  // Waiting for a connection is cancellable.
  std::stop_source cancel;
  const std::string fourth = "fourth";  // request.key is a view of it
  auto waiter = std::async(std::launch::async, [&] {
    KeyAcquireRequest request = request_for(fourth, Deadline::max());
    request.cancel = cancel.get_token();
    return backend->acquire(request);
  });
  std::this_thread::sleep_for(milliseconds(200));
  cancel.request_stop();
  ASSERT_EQ(waiter.wait_for(milliseconds(200)), std::future_status::ready);
  EXPECT_THAT(waiter.get(), StatusIs(StatusCode::kCancelled));
  SIMBA_EXPECT_OK(second->release(in(seconds(5))));
  SIMBA_EXPECT_OK((*got)->release(in(seconds(5))));
  EXPECT_LE(connections(), 2);
}

// ---- through KeyedLockProvider ------------------------------------------------------

TEST(MysqlKeyedProvider, LeasesExcludeAndReleaseThroughTheCore) {
  auto a = KeyedLockProvider::create(open_keyed(shared_uri()));
  auto b = KeyedLockProvider::create(open_keyed(shared_uri()));
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_TRUE((*a)->capabilities().freed_with_session);
  EXPECT_FALSE((*a)->capabilities().fencing_tokens);
  const std::string key = unique_key("k");
  auto lease = (*a)->try_acquire(key, milliseconds(0), seconds(30));
  ASSERT_THAT(lease, IsOk());
  ASSERT_TRUE(lease->has_value());
  EXPECT_TRUE((*lease)->is_held());
  auto busy = (*b)->try_acquire(key, milliseconds(200), seconds(30));
  ASSERT_THAT(busy, IsOk());
  EXPECT_FALSE(busy->has_value());
  SIMBA_EXPECT_OK((*lease)->release());
  auto next = (*b)->try_acquire(key, seconds(2), seconds(30));
  ASSERT_THAT(next, IsOk());
  ASSERT_TRUE(next->has_value());
  SIMBA_EXPECT_OK((*next)->release());
}

// ---- bad input ----------------------------------------------------------------------

TEST(MysqlKeyedInput, BadKeysAreInvalidArguments) {
  auto backend = open_keyed(shared_uri());
  ASSERT_TRUE(backend);
  for (const std::string& key : {std::string(), std::string("bad\xC3"), std::string("tab\there"),
                                 std::string("nul\0x", 5), std::string(65537, 'k')}) {
    EXPECT_THAT(backend->validate_key(key), StatusIs(StatusCode::kInvalidArgument)) << key.size();
    EXPECT_THAT(backend->acquire(request_for(key, past())),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("key")));
  }
  SIMBA_EXPECT_OK(backend->validate_key(std::string(65536, 'k')));
  EXPECT_EQ(backend->capabilities().max_key_length, 65536u);
}

TEST(MysqlKeyedInput, BadUrisAreInvalidArguments) {
  const std::string base = "mysql://u:secret@127.0.0.1:3306/db";
  for (const std::string& uri :
       {base + "?lock_connections=0", base + "?lock_connections=abc",
        base + "?lock_connections=2000", base + "?op_timeout=0ms", base + "?op_timeout=5",
        base + "?no_such_key=1", std::string("mysql://u@127.0.0.1:3306/"),
        std::string("postgresql://u@127.0.0.1/db")}) {
    auto parsed = Uri::parse(uri);
    ASSERT_THAT(parsed, IsOk()) << uri;
    auto backend = open_from_uri(*parsed);
    EXPECT_THAT(backend, StatusIs(StatusCode::kInvalidArgument)) << uri;
    if (!backend.ok()) {
      EXPECT_THAT(backend.status().message(), Not(HasSubstr("secret")));
    }
  }
  // The contention backend's keys are accepted (and the table ones ignored).
  auto parsed = Uri::parse(base +
                           "?lock_connections=3&op_timeout=2s&connections=4&table=t&"
                           "create_table=off&connect_timeout=1s");
  ASSERT_THAT(parsed, IsOk());
  EXPECT_THAT(open_from_uri(*parsed), IsOk());
}

TEST(MysqlKeyedInput, AnUnreachableServerIsUnavailable) {
  auto backend = open_keyed("mysql://u:p@127.0.0.1:1/db?connect_timeout=1s");
  ASSERT_TRUE(backend);
  EXPECT_THAT(backend->acquire(request_for("k", in(seconds(2)))),
              StatusIs(StatusCode::kUnavailable, Not(HasSubstr(":p@"))));
}

}  // namespace
}  // namespace simba::testing
