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
//   the attempt  where the driver lets it (a wait given up ends on the
//                server at once: PostgreSQL's cancel), a waiter's attempt is
//                sent with its lock wait, and runs on the server as the lock
//                is granted: a hand-off costs the release's round trip and
//                the grant, no call of the waiter's
//   barging      a released row stays reserved for the first in line for a
//                short while (the protocol's queue reserve, sql_backend.h):
//                the releaser's next attempt, which would otherwise beat the
//                woken process every time, takes only an unreserved row or
//                one whose line lock it can take itself
//
// The line decides only who tries first. The row still decides who holds,
// by its lease. A process that dies at the head of the line leaves it with
// its session; one that hangs there costs each hand-off a wait: a process
// behind it looks when its lock wait next runs out (every kWaitChunk; where
// releases are not announced, only if it heard one), and takes the row once
// the reserve is over. A release that frees the line lock for a session
// waiting for it is not announced (SqlDriver::LineLock::queued_sql): the
// server wakes that session, and its attempt takes the row.
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
#include <thread>
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
    // The results of `contender`'s attempt (the statements waiting() was
    // given), which ran right after the line lock was granted, in the same
    // round trip; true when it holds `mutex` now. `sent`: when the wait and
    // the attempt were sent, the latest local time the attempt's lease can
    // safely be said to start at (it ran at the grant, somewhere between
    // `sent` and the reply, which may come late). Called before first(), on
    // the line thread, with no lock of the line's held.
    std::function<bool(const std::string& mutex, const std::string& contender,
                       const std::vector<SqlResult>& results,
                       std::chrono::steady_clock::time_point sent)>
        attempted;
    // That contender left before the line heard it held the mutex: its
    // hold must be given back. Called on the line thread, no lock held.
    std::function<void(const std::string& mutex, const std::string& contender)> abandoned;
    // That contender took the mutex by a call of its own before the line
    // heard its attempt's reply (holding()): the attempt found that tenure
    // and renewed it, or began one the contender's next call finds. What
    // attempted() kept of it is dropped; nothing is given back, which
    // would free the contender's live hold. Line thread, no lock held.
    std::function<void(const std::string& mutex, const std::string& contender)> superseded;
    // Whether the results of the wait's statements say the lock was
    // granted; null: their success says so.
    std::function<bool(const std::vector<SqlResult>& wait_results)> granted;
    // Whether the store announces releases (NOTIFY). Without that, only a
    // holder that keeps the line lock wakes the next in line by releasing:
    // a contender that acquired without it (on the pool) gets in line as
    // the holder, and the first in line looks every kFirstLooks while
    // someone without it holds the mutex (a JVM Simba contender, a holder
    // over the budget, or one that has not got its place yet).
    bool releases_announced = true;
    // How long a place joined only for a holder of ours that took the mutex
    // without the line lock (releases not announced) waits before it asks
    // for the line lock: a hold released within it costs no lock wait and
    // no unlock (most holds of an uncontended loop), and one that lasts
    // longer gets in line as before. A waiter of ours asks at once.
    std::chrono::microseconds holder_join_delay{1000};

    // Session-backed tenures (off while `grace` is 0 or `mark` null). A
    // place first in line records the tenure of the contender of ours that
    // holds its mutex as backed by its session's line lock (`mark`, run on
    // that session in one transaction; no statements: not now), then pings
    // that session every grace / 4. The holder believes the tenure only until
    // the last answered ping's send time + grace (bound_for), and a process
    // granted the line lock may take such a tenure over grace + grace / 8
    // after its grant (Loan::first_since), since its grant came after the
    // holder's session ended. Why a grace at all: a server ends sessions
    // whose processes live on (a restart, pg_terminate_backend, a timeout,
    // a reset connection); a dead process's session ends at once.
    std::chrono::milliseconds grace{0};
    std::function<std::vector<Statement>(const std::string& mutex, const std::string& contender,
                                         std::uint64_t token)>
        mark;
    Statement ping{"SELECT 1", {}};
    // A backed tenure's session ended, or went unanswered until its bound:
    // the holder must hear that it lost it. Line thread, no lock held.
    std::function<void(const std::string& mutex, const std::string& contender, std::uint64_t token)>
        lost;
  };

  WaitLine(Hooks hooks, std::string description, int places);
  // stop()s.
  ~WaitLine();
  // Ends every place's wait and joins its thread; no hook runs after it
  // returns. The line does nothing more (its owner calls it before it stops
  // serving the hooks).
  void stop();
  WaitLine(const WaitLine&) = delete;
  WaitLine& operator=(const WaitLine&) = delete;

  // `contender`'s attempt on `mutex` found it taken: it waits, and the
  // process gets in line for `mutex` if it has a free place. `attempt`
  // (statements as run, on the table) is sent after the lock wait, so that
  // when the line lock is granted the attempt runs at once on the server,
  // with no round trip of its own (Hooks::attempted); empty: none.
  void waiting(const std::string& mutex, const std::string& contender,
               std::vector<Statement> attempt = {});
  // `contender` holds `mutex`; `first` when it took it on the line's
  // session. A place that is first (it holds the line lock) keeps the lock
  // while the contender holds, however it took the mutex.
  void holding(const std::string& mutex, const std::string& contender, bool first);
  // `contender` holds tenure `token` of `mutex` (its acquisition's answer,
  // or the line's attempt's): the bound its holder must believe it by
  // (Hooks::grace), unbounded until a place records the tenure as backed.
  // One object per tenure; null when tenures are not backed.
  std::shared_ptr<const HoldBound> bound_for(const std::string& mutex, const std::string& contender,
                                             std::uint64_t token);
  // Whether tenures are backed (Hooks::grace and Hooks::mark set).
  bool backs_tenures() const { return hooks_.grace.count() > 0 && hooks_.mark != nullptr; }
  // How long after its grant a place may take over a backed tenure of
  // another process: grace + grace / 8 (a margin for clock rates).
  std::chrono::milliseconds takeover_after() const { return hooks_.grace + hooks_.grace / 8; }
  // Wakes `mutex`'s waiters (Hooks::first) at `at`, if this process is then
  // still first in line: a backed tenure of another process may be taken
  // over from then.
  void look_at(const std::string& mutex, std::chrono::steady_clock::time_point at);
  // This process is first in line for `mutex`, and the row's tenure `token`
  // (another process's) is not backed: that holder's place may have got in
  // line behind this one's (both asked at about the same time, and this
  // one's session was open already). The place gives up the line lock and
  // asks again, so that a session waiting behind it has it first: the
  // holder's place then backs its tenure. At most kYields times per
  // tenure, kYieldSpacing apart (a holder that never backs its tenure, JVM
  // Simba or one over its budget, costs a few round trips).
  void unbacked(const std::string& mutex, std::uint64_t token);
  static constexpr int kYields = 3;
  static constexpr std::chrono::milliseconds kYieldSpacing{200};

  // `contender` neither waits for nor holds `mutex` any more (it released,
  // left, or stopped listening).
  void gone(const std::string& mutex, const std::string& contender);
  // After a release of ours on the pool: waits, until `deadline` at most,
  // while this process's place for `mutex`, no longer wanted, may hold the
  // line lock (its wait was in flight, or granted; it then unlocks and
  // leaves). The release reserved the row for the first in line, which is
  // that place: until it has left, another process's try is refused (a
  // try_lock() right after an unlock returned false). Costs the wait's
  // reply or its cancel, a few milliseconds, and only then.
  void await_leaving(const std::string& mutex, Deadline deadline);
  // The server_id() of a session of `mutex`'s place that was closed in
  // the last kEndedSessionWindow while its wait may have been granted
  // (SqlDriver::line_lock's `ended_session`); 0 when none.
  std::uint64_t ended_session(const std::string& mutex);
  // How long a closed session is named so: a server notices a closed
  // connection within milliseconds, unless the network between is cut, and
  // then no call of ours reaches it either.
  static constexpr std::chrono::seconds kEndedSessionWindow{5};
  // Nobody in this process listens for `mutex`: it leaves that line (once
  // a holder of it is gone too).
  void forget(const std::string& mutex);

  // Whether `contender`'s attempt sent with the line's wait took `mutex`
  // for it (Hooks::attempted said so while it waited) and nothing it did
  // since (holding(), waiting(), gone()) has overtaken that; true once,
  // and the contender then holds it as after holding().
  // A hold the attempt kept is handed to the contender's next call only
  // then: an older one (the contender took the mutex by its own call
  // meanwhile and has released it since) must never reach a later call,
  // which may be a new service with the same contender id (a clustered
  // lock's next run) that would believe it holds a released tenure.
  bool claim(const std::string& mutex, const std::string& contender);

  // Whether a contender of this process other than `contender` waits for
  // `mutex`.
  bool others_waiting(const std::string& mutex, const std::string& contender) const;

  // Whether a release of `mutex` that another process announced is for a
  // process ahead of this one in line, so its waiters need not hear it now.
  // They then look once when the place's lock wait next runs out, in case
  // the one ahead does not take it (a paused process).
  bool hold_back(const std::string& mutex);

  // How long one lock wait of a place lasts before it is sent again.
  static constexpr std::chrono::milliseconds kWaitChunk{1000};
  // How often the first in line looks when releases are not announced and
  // the holder does not keep the line lock.
  static constexpr std::chrono::milliseconds kFirstLooks{200};

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
    // When this process was granted the line lock it holds (the reply's
    // arrival: no earlier than the grant).
    std::chrono::steady_clock::time_point first_since() const;
    // The tenure this process's session backs (Hooks::mark), 0 for none:
    // its session is alive, so it is never to be taken over.
    std::uint64_t backed_token() const;

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
    // That wait was told to end (the place is not wanted) and its answer,
    // and the unlock (or closing) that follows a failed one, are still to
    // come. The server may have granted the lock just before the cancel
    // came, and a session lock outlives the transaction the cancel aborts:
    // until then the line lock may be this place's, and a call of ours on
    // the pool would find a released row reserved for it (first_session()
    // and await_leaving() wait).
    bool cancelling = false;
    // Its thread is opening its session. A connect is not given up when the
    // place stops being wanted (only when the line stops): it ends within
    // its bound, and the session serves the next wait. Given up, under holds
    // shorter than a connect (a hot mutex), no place ever got a session, and
    // every release woke every waiting process.
    bool connecting = false;
    // A release was announced while it waited there (hold_back).
    bool announced = false;
    // Its thread's id while it runs a hook (which may borrow its session).
    std::thread::id hook_thread;
    // When the first in line looks next (Hooks::releases_announced false).
    std::chrono::steady_clock::time_point next_look{};
    // No lock wait before this while only a holder wants the place
    // (Hooks::holder_join_delay).
    std::chrono::steady_clock::time_point wait_after{};
    // When the place was last granted the line lock (Loan::first_since).
    std::chrono::steady_clock::time_point first_since{};
    // The tenure its session backs (Hooks::mark sent), if any, and when
    // its session is pinged next.
    std::string marked_contender;
    std::uint64_t marked_token = 0;
    std::shared_ptr<HoldBound> marked_bound;
    std::chrono::steady_clock::time_point next_ping{};
    // unbacked(): the tenure it yields for, how often it has, when it
    // yields next (max: not due) and when it last did.
    std::uint64_t yield_for = 0;
    int yields = 0;
    std::chrono::steady_clock::time_point yield_at = std::chrono::steady_clock::time_point::max();
    std::chrono::steady_clock::time_point last_yield{};
    // When the waiters look (look_at); max: no look due.
    std::chrono::steady_clock::time_point look_at = std::chrono::steady_clock::time_point::max();
    std::unique_ptr<SqlSession> session;
    WakeFd wake;  // ends a wait or a connect when the place is no longer wanted
    Worker worker;
  };

  void run(std::size_t index);
  // Whether the process still needs `place` in its line. REQUIRES: mu_.
  bool wanted_locked(const Place& place) const;
  // Whether a contender of this process holds `mutex` (or the line's
  // attempt took it for one). REQUIRES: mu_.
  bool held_here_locked(const std::string& mutex) const;
  // Whether a contender of ours waits for `mutex`. REQUIRES: mu_.
  bool has_waiters_locked(const std::string& mutex) const;
  // Takes a free place for `mutex`, if there is one. REQUIRES: mu_.
  void join_locked(const std::string& mutex);
  // Leaves the line for `mutex` if nobody needs the place. REQUIRES: mu_.
  void maybe_leave_locked(const std::string& mutex);
  Place* place_of_locked(const std::string& mutex);
  // Takes `contender` off `mutex`'s waiters; false when it was not there
  // (it left). REQUIRES: mu_.
  bool drop_waiter_locked(const std::string& mutex, const std::string& contender);
  // `contender` no longer holds `mutex` by what it was told. REQUIRES: mu_.
  void forget_holder_locked(const std::string& mutex, const std::string& contender);
  // Takes `contender` out of `mutex`'s entry of `of`. REQUIRES: mu_.
  static bool erase_locked(std::map<std::string, std::set<std::string>>& of,
                           const std::string& mutex, const std::string& contender);
  bool holds_locked(const std::string& mutex, const std::string& contender) const;
  void give_back(std::size_t index, bool unlocked);
  // The tenure of `mutex` a contender of ours holds by what the line was
  // told (its contender, token and bound); token 0 when none. REQUIRES: mu_.
  struct Held {
    std::string contender;
    std::uint64_t token = 0;
    std::shared_ptr<HoldBound> bound;
  };
  Held held_locked(const std::string& mutex) const;
  // `place` no longer backs its tenure: its bound ends now (no later
  // answer may make it believed again). REQUIRES: mu_.
  static void unmark_locked(Place& place);
  // A session-backed place's work when first in line: record the tenure,
  // ping its session; false when there was none (the caller waits).
  // REQUIRES: lock holds mu_.
  bool back_tenure(Place& place, const std::string& mutex, std::unique_lock<std::mutex>& lock);
  // Runs Hooks::lost with mu_ released. REQUIRES: lock holds mu_.
  // Says on the log why a backed tenure ends (its session ended, or a ping
  // failed or came back past the grace).
  void warn_tenure_ends(const std::string& mutex, std::uint64_t token,
                        const std::string& cause) const;
  void report_lost(Place& place, const std::string& mutex, const std::string& contender,
                   std::uint64_t token, std::unique_lock<std::mutex>& lock);

  const Hooks hooks_;
  const std::string description_;

  mutable std::mutex mu_;
  std::condition_variable changed_;
  bool stopping_ = false;  // guarded by mu_
  // A place's record of a backed tenure was refused (no table, no
  // privilege): tenures are not backed any more; guarded by mu_.
  bool marks_refused_ = false;
  std::vector<std::unique_ptr<Place>> places_;  // guarded by mu_ (fixed size)
  // mutex -> its waiting contenders -> the attempt to send with the lock
  // wait; guarded by mu_.
  std::map<std::string, std::map<std::string, std::vector<Statement>>> waiters_;
  // mutex -> the contenders that hold it by what they were told (holding()
  // until waiting() or gone()); guarded by mu_.
  std::map<std::string, std::set<std::string>> holders_;
  // mutex -> the contenders whose attempt in line took it, not claimed yet
  // (claim()); guarded by mu_.
  std::map<std::string, std::set<std::string>> granted_;
  // (mutex, contender) -> the tenure it holds and its bound (bound_for);
  // guarded by mu_.
  struct Tenure {
    std::uint64_t token = 0;
    std::shared_ptr<HoldBound> bound;
  };
  std::map<std::pair<std::string, std::string>, Tenure> tenures_;
  // mutex -> the server_id() of its place's session closed last while its
  // wait may have been granted, and when (ended_session()); guarded by mu_.
  std::map<std::string, std::pair<std::uint64_t, std::chrono::steady_clock::time_point>>
      ended_sessions_;
};

}  // namespace simba::internal::sql

#endif  // SIMBA_BACKENDS_SQL_WAIT_LINE_H_
