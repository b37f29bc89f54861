// The line beside the row: a first-come, wake-one hand-off for the SQL
// protocol on a store with session locks that queue (PostgreSQL's advisory
// locks). Without it every release wakes every waiting process at once
// (NOTIFY), and 16 processes on one mutex cut the hand-off rate to a fifth
// of one process's.
//
//   the line     per mutex, a session lock (the "line lock") that processes
//                queue on, one session each: the server grants it to them
//                one at a time, in the order they asked
//   first        the process whose session holds it. Its waiters are woken
//                when it is granted and hear announced releases; a process
//                behind it does not (its waiters would only find the mutex
//                taken). The first takes the mutex on that session, and keeps
//                the line lock while it holds the mutex
//   the release  of a holder that took the mutex on its line session frees
//                the line lock in the same round trip: the next process is
//                woken by the server, not by a broadcast
//   barging      a released row stays reserved for the first in line for a
//                short while (the protocol's queue reserve, sql_backend.h):
//                the releaser's next attempt, which would otherwise beat the
//                woken process every time, takes only an unreserved row or
//                one whose line lock it can take itself
//
// The line decides only who tries first. The row still decides who holds,
// by its lease. A process that dies at the head of the line leaves it with
// its session; one that hangs there costs each hand-off a wait: a process
// behind it that heard releases announced looks once when its lock wait
// next runs out (every kWaitChunk), and takes the row once the reserve is
// over.
//
// Sessions: at most `places` (a process waits in line for that many mutexes
// at once; the others' waiters hear every release, as before), each with a
// thread, opened when first needed.
#ifndef SIMBA_BACKENDS_SQL_WAIT_LINE_H_
#define SIMBA_BACKENDS_SQL_WAIT_LINE_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backends/sql/sql_backend.h"
#include "core/net/stream.h"
#include "core/worker.h"

namespace simba::internal::sql {

class WaitLine {
 public:
  struct Hooks {
    // A session of the line's own (apart from the call pool); `wake_fd`
    // readable gives up.
    std::function<Result<std::unique_ptr<SqlSession>>(Deadline deadline, int wake_fd)> connect;
    // Statements after which the session holds `mutex`'s line lock, having
    // waited at most `wait` (then they fail with SqlFailure::kLockTimeout).
    std::function<std::vector<Statement>(const std::string& mutex, std::chrono::milliseconds wait)>
        wait;
    // The statement that frees it.
    std::function<Statement(const std::string& mutex)> unlock;
    // This process is first in line for `mutex` now, or its place was lost
    // (anything may have been missed): its waiters look again. Called on a
    // line thread with no lock of the line's held.
    std::function<void(const std::string& mutex)> first;
  };

  WaitLine(Hooks hooks, std::string description, int places);
  ~WaitLine();
  WaitLine(const WaitLine&) = delete;
  WaitLine& operator=(const WaitLine&) = delete;

  // `contender`'s attempt on `mutex` found it taken: it waits, and the
  // process gets in line for `mutex` if it has a free place.
  void waiting(const std::string& mutex, const std::string& contender);
  // `contender` holds `mutex`; `first` when it took it on the line's session
  // (which then keeps the line lock while it holds).
  void holding(const std::string& mutex, const std::string& contender, bool first);
  // `contender` neither waits for nor holds `mutex` any more (it released,
  // left, or stopped listening).
  void gone(const std::string& mutex, const std::string& contender);
  // Nobody in this process listens for `mutex`: it leaves that line (once
  // a holder of it is gone too).
  void forget(const std::string& mutex);

  // Whether a release of `mutex` that another process announced is for a
  // process ahead of this one in line, so its waiters need not hear it now.
  // They then look once when the place's lock wait next runs out, in case
  // the one ahead does not take it (a paused process).
  bool hold_back(const std::string& mutex);

  // How long one lock wait of a place lasts before it is sent again.
  static constexpr std::chrono::milliseconds kWaitChunk{1000};

  // The session that holds `mutex`'s line lock, lent for one call, while
  // this process is first in line; nullopt when it is not (the call then
  // runs on the pool), or when the session is busy past `deadline`.
  class Loan {
   public:
    Loan(WaitLine* line, std::size_t place) : line_(line), place_(place) {}
    Loan(Loan&& other) noexcept
        : line_(std::exchange(other.line_, nullptr)), place_(other.place_) {}
    Loan& operator=(Loan&&) = delete;
    ~Loan();
    SqlSession& session() const;
    // The call freed the line lock (a release that ran the unlock statement).
    void unlocked() { unlocked_ = true; }

   private:
    WaitLine* line_;
    std::size_t place_;
    bool unlocked_ = false;
  };
  std::optional<Loan> first_session(const std::string& mutex, Deadline deadline);

 private:
  enum class State { kFree, kJoining, kFirst };
  struct Place {
    std::string mutex;  // "" when free
    State state = State::kFree;
    // In use by a call (a Loan) or by the thread's own statement.
    bool busy = false;
    // A contender of ours holds the mutex through this place's line lock.
    bool holder = false;
    // Its session is waiting in the server's queue for the line lock.
    bool queued = false;
    // A release was announced while it waited there (hold_back).
    bool announced = false;
    std::unique_ptr<SqlSession> session;
    WakeFd wake;  // ends a wait or a connect when the place is no longer wanted
    Worker worker;
  };

  void run(std::size_t index);
  // Whether the process still needs `place` in its line. REQUIRES: mu_.
  bool wanted_locked(const Place& place) const;
  // Takes a free place for `mutex`, if there is one. REQUIRES: mu_.
  void join_locked(const std::string& mutex);
  // Leaves the line for `mutex` if nobody needs the place. REQUIRES: mu_.
  void maybe_leave_locked(const std::string& mutex);
  Place* place_of_locked(const std::string& mutex);
  void give_back(std::size_t index, bool unlocked);

  const Hooks hooks_;
  const std::string description_;

  mutable std::mutex mu_;
  std::condition_variable changed_;
  bool stopping_ = false;                                 // guarded by mu_
  std::vector<std::unique_ptr<Place>> places_;            // guarded by mu_ (fixed size)
  std::map<std::string, std::set<std::string>> waiters_;  // mutex -> contenders; mu_
};

}  // namespace simba::internal::sql

#endif  // SIMBA_BACKENDS_SQL_WAIT_LINE_H_
