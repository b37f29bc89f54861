// The SQL wait line's own logic (src/backends/sql/wait_line.h) with a
// session that answers at once and records what it was sent: when a place
// that only a holder of ours wants asks for the line lock. The line's work
// against real servers is tested in tests/mysql and tests/postgres.
#include "backends/sql/wait_line.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace simba::internal::sql {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// What the line's sessions were sent, statement by statement, and when.
struct SentLog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<std::string, steady_clock::time_point>> sent;

  bool wait_for(const std::string& sql, milliseconds within, int times = 1) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, within, [&] { return count_locked(sql) >= times; });
  }
  int count(const std::string& sql) {
    std::lock_guard<std::mutex> lock(mu);
    return count_locked(sql);
  }
  steady_clock::time_point first(const std::string& sql) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [what, at] : sent) {
      if (what == sql) return at;
    }
    return {};
  }

 private:
  int count_locked(const std::string& sql) const {
    int n = 0;
    for (const auto& entry : sent) n += entry.first == sql ? 1 : 0;
    return n;
  }
};

// Grants every lock wait at once.
class RecordingSession : public SqlSession {
 public:
  explicit RecordingSession(SentLog* log) : log_(log) {}
  Result<std::vector<SqlResult>> run(const std::vector<Statement>& statements, bool, Deadline,
                                     SqlFailure*) override {
    {
      std::lock_guard<std::mutex> lock(log_->mu);
      for (const Statement& statement : statements) {
        log_->sent.emplace_back(statement.sql, steady_clock::now());
      }
    }
    log_->cv.notify_all();
    return std::vector<SqlResult>(statements.size());
  }

 private:
  SentLog* log_;
};

// A line as MySQL's: releases are not announced, so a holder that took the
// mutex on the pool gets in line to wake the next process by its release.
WaitLine::Hooks hooks(SentLog* log, std::chrono::microseconds holder_join_delay) {
  WaitLine::Hooks h;
  h.connect = [log](Deadline, int) -> Result<std::unique_ptr<SqlSession>> {
    return std::unique_ptr<SqlSession>(std::make_unique<RecordingSession>(log));
  };
  h.wait = [](const std::string&, milliseconds) { return std::vector<Statement>{{"WAIT", {}}}; };
  h.unlock = [](const std::string&) { return Statement{"UNLOCK", {}}; };
  h.first = [](const std::string&) {};
  h.attempted = [](const std::string&, const std::string&, const std::vector<SqlResult>&,
                   steady_clock::time_point) { return false; };
  h.abandoned = [](const std::string&, const std::string&) {};
  h.superseded = [](const std::string&, const std::string&) {};
  h.releases_announced = false;
  h.holder_join_delay = holder_join_delay;
  return h;
}

// A hold released before the delay is over never waits in line: an
// uncontended acquire + release costs no lock wait and no unlock. (The
// delay here is an hour; the hold lasts 50 ms, in which the line used to
// send its lock wait.)
TEST(WaitLine, AHolderReleasedWithinTheDelayNeverWaitsInLine) {
  SentLog log;
  WaitLine line(hooks(&log, std::chrono::hours(1)), "test", 1);
  line.holding("m", "a", /*first=*/false);
  EXPECT_FALSE(log.wait_for("WAIT", milliseconds(50)));
  line.gone("m", "a");
  line.stop();
  EXPECT_EQ(log.count("WAIT"), 0);
  EXPECT_EQ(log.count("UNLOCK"), 0);
}

// A hold that lasts gets in line once the delay is over, not before, and
// gives the line lock up when it ends.
TEST(WaitLine, AHolderThatKeepsTheMutexGetsInLineAfterTheDelay) {
  SentLog log;
  const milliseconds delay(30);
  WaitLine line(hooks(&log, delay), "test", 1);
  const auto held_at = steady_clock::now();
  line.holding("m", "a", /*first=*/false);
  ASSERT_TRUE(log.wait_for("WAIT", milliseconds(5000)));
  EXPECT_GE(log.first("WAIT") - held_at, delay);
  line.gone("m", "a");
  EXPECT_TRUE(log.wait_for("UNLOCK", milliseconds(5000)));
  line.stop();
}

// A waiter of ours does not wait for a holder's delay: it asks at once.
TEST(WaitLine, AWaiterOfOursGetsInLineAtOnce) {
  SentLog log;
  WaitLine line(hooks(&log, std::chrono::hours(1)), "test", 1);
  line.holding("m", "a", /*first=*/false);
  line.waiting("m", "b");
  EXPECT_TRUE(log.wait_for("WAIT", milliseconds(5000)));
  line.stop();
}

// A connect that takes as long as the test says: it ends when `open()` is
// called (a session) or when the line's wake fd is posted (cancelled, as a
// real connect does).
struct SlowConnect {
  std::mutex mu;
  std::condition_variable cv;
  bool opened = false;
  int started = 0;

  void open() {
    {
      std::lock_guard<std::mutex> lock(mu);
      opened = true;
    }
    cv.notify_all();
  }
  bool wait_started(int n, milliseconds within) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, within, [&] { return started >= n; });
  }
  Result<std::unique_ptr<SqlSession>> connect(SentLog* log, int wake_fd) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++started;
    }
    cv.notify_all();
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (opened) return std::unique_ptr<SqlSession>(std::make_unique<RecordingSession>(log));
      }
      pollfd woken{wake_fd, POLLIN, 0};
      if (::poll(&woken, 1, 5) > 0) return cancelled_error("cancelled while connecting");
    }
  }
};

// A waiter that gets the mutex before the line's session is open (a hot
// mutex: holds shorter than a connect) does not cancel the connect: the
// session serves the next wait. Cancelled, the place backed off and was
// cancelled again at every hand-off, never had a session, and every
// waiting process heard every release (16 processes on one PostgreSQL
// mutex: a fifth of the rate).
TEST(WaitLine, AConnectOutlivesTheWaiterThatAskedForIt) {
  SentLog log;
  SlowConnect slow;
  WaitLine::Hooks h = hooks(&log, milliseconds(0));
  h.releases_announced = true;
  h.connect = [&](Deadline, int wake_fd) { return slow.connect(&log, wake_fd); };
  WaitLine line(std::move(h), "test", 1);
  line.waiting("m", "a");
  ASSERT_TRUE(slow.wait_started(1, milliseconds(5000)));
  line.holding("m", "a", /*first=*/false);  // took it on the pool meanwhile
  line.gone("m", "a");                      // and released it
  std::this_thread::sleep_for(milliseconds(20));
  slow.open();
  line.waiting("m", "b");
  EXPECT_TRUE(log.wait_for("WAIT", milliseconds(5000)));
  line.stop();
  std::lock_guard<std::mutex> lock(slow.mu);
  EXPECT_EQ(slow.started, 1);
}

// A session whose lock waits are granted only when the test opens the gate.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  bool waiting = false;

  void let_through() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
  }
  bool wait_until_waiting(milliseconds within) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, within, [&] { return waiting; });
  }
};

class GatedSession : public RecordingSession {
 public:
  GatedSession(SentLog* log, Gate* gate) : RecordingSession(log), gate_(gate) {}
  Result<std::vector<SqlResult>> run(const std::vector<Statement>& statements, bool transaction,
                                     Deadline deadline, SqlFailure* failure) override {
    if (!statements.empty() && statements.front().sql == "WAIT") {
      std::unique_lock<std::mutex> lock(gate_->mu);
      gate_->waiting = true;
      gate_->cv.notify_all();
      // Bounded: a test that fails before it opens the gate still stops.
      gate_->cv.wait_for(lock, std::chrono::seconds(10), [&] { return gate_->open; });
    }
    return RecordingSession::run(statements, transaction, deadline, failure);
  }

 private:
  Gate* gate_;
};

// A waiter whose own call took the mutex while the attempt sent with its
// wait was on the way back (the same tenure: the store's row names it
// either way) holds the mutex through the line lock its place was just
// granted: the place keeps it, and the holder's release goes on that
// session and wakes the next in line. The place used to leave at once
// (nobody of ours waited, and the hold was not the line's), so another
// process's wait was granted behind a live holder (a CI failure).
TEST(WaitLine, AHoldTakenByItsOwnCallWhileTheLineWasGrantedKeepsTheLineLock) {
  SentLog log;
  Gate gate;
  std::mutex mu;
  std::condition_variable cv;
  bool superseded = false;
  WaitLine::Hooks h = hooks(&log, milliseconds(0));
  h.releases_announced = true;
  h.connect = [&](Deadline, int) -> Result<std::unique_ptr<SqlSession>> {
    return std::unique_ptr<SqlSession>(std::make_unique<GatedSession>(&log, &gate));
  };
  h.attempted = [](const std::string&, const std::string& contender, const std::vector<SqlResult>&,
                   steady_clock::time_point) { return contender == "b"; };
  h.superseded = [&](const std::string&, const std::string&) {
    {
      std::lock_guard<std::mutex> lock(mu);
      superseded = true;
    }
    cv.notify_all();
  };
  WaitLine line(std::move(h), "test", 1);
  line.waiting("m", "b", {{"ATTEMPT", {}}});
  ASSERT_TRUE(gate.wait_until_waiting(milliseconds(5000)));
  line.holding("m", "b", /*first=*/false);  // its own call's reply came first
  gate.let_through();
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, milliseconds(5000), [&] { return superseded; }));
  }
  {
    std::optional<WaitLine::Loan> first = line.first_session("m", steady_clock::now());
    EXPECT_TRUE(first.has_value()) << "the holder's release would not go on the line's session";
  }
  EXPECT_EQ(log.count("UNLOCK"), 0) << "the line lock was given up under a live hold";
  line.gone("m", "b");
  EXPECT_TRUE(log.wait_for("UNLOCK", milliseconds(5000)));
  line.stop();
}

// A waiter whose place was granted the line lock, but whose attempt found
// the row still taken, takes the mutex by a call of its own on the pool
// (the line's session was busy): the place keeps the line lock for that
// hold, as for one taken on the line's session, so the release goes on
// that session and wakes the next in line. The place used to give the lock
// up at once (nobody of ours waited any more, and the hold was not taken
// "first"), and the release then had to be announced.
TEST(WaitLine, AHoldTakenOnThePoolWhileThePlaceIsFirstKeepsTheLineLock) {
  SentLog log;
  Gate gate;
  std::mutex mu;
  std::condition_variable cv;
  bool first = false;
  WaitLine::Hooks h = hooks(&log, milliseconds(0));
  h.releases_announced = true;
  h.connect = [&](Deadline, int) -> Result<std::unique_ptr<SqlSession>> {
    return std::unique_ptr<SqlSession>(std::make_unique<GatedSession>(&log, &gate));
  };
  h.first = [&](const std::string&) {
    {
      std::lock_guard<std::mutex> lock(mu);
      first = true;
    }
    cv.notify_all();
  };
  WaitLine line(std::move(h), "test", 1);
  line.waiting("m", "b", {{"ATTEMPT", {}}});  // its attempt will find the row taken
  ASSERT_TRUE(gate.wait_until_waiting(milliseconds(5000)));
  gate.let_through();
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, milliseconds(5000), [&] { return first; }));
  }
  line.holding("m", "b", /*first=*/false);  // taken by a call on the pool
  {
    std::optional<WaitLine::Loan> loan = line.first_session("m", steady_clock::now());
    EXPECT_TRUE(loan.has_value()) << "the holder's release would not go on the line's session";
  }
  EXPECT_EQ(log.count("UNLOCK"), 0) << "the line lock was given up under a live hold";
  line.gone("m", "b");
  EXPECT_TRUE(log.wait_for("UNLOCK", milliseconds(5000)));
  line.stop();
}

// A hold that the line's attempt took, backed by the place's session, and
// then claimed by its contender's next call, stays backed: the pings go on
// and its bound keeps moving. The claim used to drop the contender from
// what the line knew it held, and the place then ended the bound of a live
// hold (the core told the holder it lost: MultiContend on PostgreSQL).
TEST(WaitLine, AHoldTheLineTookStaysBackedOnceItsContenderClaimsIt) {
  SentLog log;
  const milliseconds grace(100);
  std::mutex mu;
  std::shared_ptr<const HoldBound> bound;
  bool lost = false;
  WaitLine* line_of_hooks = nullptr;
  WaitLine::Hooks h = hooks(&log, milliseconds(0));
  h.releases_announced = true;
  h.grace = grace;
  h.mark = [](const std::string&, const std::string&, std::uint64_t) {
    return std::vector<Statement>{{"MARK", {}}};
  };
  h.ping = Statement{"PING", {}};
  h.attempted = [&](const std::string& mutex, const std::string& contender,
                    const std::vector<SqlResult>&, steady_clock::time_point) {
    auto taken = line_of_hooks->bound_for(mutex, contender, 7);
    std::lock_guard<std::mutex> lock(mu);
    bound = std::move(taken);
    return true;
  };
  h.lost = [&](const std::string&, const std::string&, std::uint64_t) {
    std::lock_guard<std::mutex> lock(mu);
    lost = true;
  };
  WaitLine line(std::move(h), "test", 1);
  line_of_hooks = &line;
  line.waiting("m", "a", {{"ATTEMPT", {}}});
  ASSERT_TRUE(log.wait_for("MARK", milliseconds(5000)));
  ASSERT_TRUE(line.claim("m", "a"));
  // Several ping periods (grace / 4) after the claim.
  ASSERT_TRUE(log.wait_for("PING", milliseconds(5000)));
  EXPECT_TRUE(log.wait_for("PING", milliseconds(5000), log.count("PING") + 4))
      << "the place stopped pinging the claimed hold";
  std::shared_ptr<const HoldBound> held;
  {
    std::lock_guard<std::mutex> lock(mu);
    held = bound;
    EXPECT_FALSE(lost);
  }
  ASSERT_TRUE(held);
  EXPECT_FALSE(held->passed(steady_clock::now())) << "a claimed live hold's bound ended";
  line.gone("m", "a");
  EXPECT_TRUE(held->passed(steady_clock::now())) << "a released hold's bound lives on";
  line.stop();
}

// A holder of ours released on the pool while its place's lock wait was
// on the way (granted: the line lock was free). The place is then first,
// for nobody, until it unlocks; the release had reserved the row for the
// first in line, so another process's try_lock() right after the unlock
// found the mutex taken (clustered conformance on PostgreSQL). The release
// now returns only once the place has given the line lock up.
TEST(WaitLine, AReleaseOnThePoolReturnsOnceItsPlaceHasLeft) {
  SentLog log;
  Gate gate;
  WaitLine::Hooks h = hooks(&log, milliseconds(0));
  h.releases_announced = true;
  h.grace = milliseconds(1000);  // the holder's place asks for the line lock
  h.mark = [](const std::string&, const std::string&, std::uint64_t) {
    return std::vector<Statement>{{"MARK", {}}};
  };
  h.connect = [&](Deadline, int) -> Result<std::unique_ptr<SqlSession>> {
    return std::unique_ptr<SqlSession>(std::make_unique<GatedSession>(&log, &gate));
  };
  WaitLine line(std::move(h), "test", 1);
  line.holding("m", "a", /*first=*/false);  // taken on the pool
  ASSERT_TRUE(gate.wait_until_waiting(milliseconds(5000)));
  line.gone("m", "a");  // released on the pool
  std::thread grant([&] {
    std::this_thread::sleep_for(milliseconds(50));
    gate.let_through();  // the cancel came too late: granted
  });
  line.await_leaving("m", steady_clock::now() + milliseconds(5000));
  EXPECT_EQ(log.count("UNLOCK"), 1) << "returned while the place held the line lock";
  grant.join();
  line.stop();
}

// A session whose lock wait ends only when it is cancelled (the line's wake
// fd), with an error, as PostgreSQL's does; the server may have granted the
// lock just before the cancel came.
class CancelledSession : public RecordingSession {
 public:
  using RecordingSession::RecordingSession;
  void set_wake_fd(int fd) override { wake_fd_ = fd; }
  Result<std::vector<SqlResult>> run(const std::vector<Statement>& statements, bool transaction,
                                     Deadline deadline, SqlFailure* failure) override {
    Result<std::vector<SqlResult>> ran =
        RecordingSession::run(statements, transaction, deadline, failure);
    if (statements.empty() || statements.front().sql != "WAIT") return ran;
    pollfd woken{wake_fd_, POLLIN, 0};
    if (::poll(&woken, 1, 10000) > 0) return cancelled_error("canceling statement");
    return ran;
  }

 private:
  int wake_fd_ = -1;
};

// A wait cancelled because its contender left (a failed try_lock) may hold
// the line lock the server granted just before; a session lock outlives
// the aborted transaction. The place gives it up on the same session (the
// lock is free once the answer comes), where closing the session freed it
// only when the server had cleaned up, a moment later; and a call of ours
// asking for the line's session meanwhile waits for that (the next
// try_lock() found the released mutex taken, clustered conformance on
// PostgreSQL).
TEST(WaitLine, ACancelledWaitGivesTheLineLockUpOnItsSessionBeforeOurNextCall) {
  SentLog log;
  int connects = 0;
  WaitLine::Hooks h = hooks(&log, milliseconds(0));
  h.releases_announced = true;
  h.connect = [&](Deadline, int) -> Result<std::unique_ptr<SqlSession>> {
    ++connects;  // (the line's thread only)
    return std::unique_ptr<SqlSession>(std::make_unique<CancelledSession>(&log));
  };
  WaitLine line(std::move(h), "test", 1);
  line.waiting("m", "b", {{"ATTEMPT", {}}});
  ASSERT_TRUE(log.wait_for("WAIT", milliseconds(5000)));
  line.gone("m", "b");     // the try gave up: the wait is cancelled
  line.waiting("m", "b");  // and the next one is refused in its turn
  EXPECT_FALSE(line.first_session("m", steady_clock::now() + milliseconds(5000)).has_value());
  EXPECT_EQ(log.count("UNLOCK"), 1) << "our next call came before the line lock was given up";
  line.gone("m", "b");
  line.stop();
  EXPECT_EQ(connects, 1) << "the session was closed, not used to give the lock up";
}

// Stopping the line still ends a connect at once.
TEST(WaitLine, StopEndsAConnect) {
  SentLog log;
  SlowConnect slow;
  WaitLine::Hooks h = hooks(&log, milliseconds(0));
  h.connect = [&](Deadline, int wake_fd) { return slow.connect(&log, wake_fd); };
  WaitLine line(std::move(h), "test", 1);
  line.waiting("m", "a");
  ASSERT_TRUE(slow.wait_started(1, milliseconds(5000)));
  const auto stopping = steady_clock::now();
  line.stop();
  EXPECT_LT(steady_clock::now() - stopping, milliseconds(2000));
  EXPECT_EQ(log.count("WAIT"), 0);
}

}  // namespace
}  // namespace simba::internal::sql
