// The budget of server sessions (connections) of an SQL backend, written
// once for the SQL protocol's calls (sql_backend.cc) and the session-lock
// engine's holds (session_lock.cc): at most `budget` sessions exist at once
// (idle, lent and being opened), opened on demand and kept for reuse.
// Borrowers wait for one in arrival order, within their deadline and
// cancellable. A session whose state is unknown is closed, never reused.
#ifndef SIMBA_BACKENDS_SQL_SESSION_POOL_H_
#define SIMBA_BACKENDS_SQL_SESSION_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "core/worker.h"
#include "simba/backend.h"
#include "simba/status.h"

namespace simba::internal::sql {

// What a pool keeps. Used by one thread at a time.
class PooledSession {
 public:
  virtual ~PooledSession() = default;

  // The driver marks a session whose state is unknown (a call broke, was
  // abandoned, or may have left a key held): it is then closed instead of
  // reused.
  void set_broken() { broken_ = true; }
  // False once broken (a driver may know more, e.g. a dropped connection).
  virtual bool healthy() const { return !broken_; }
  // Whether an idle session may have ended while it waited (it is then
  // replaced rather than lent). The default: no.
  virtual bool ended_while_idle() const { return false; }
  // Ends the session without waiting for the server, before it is destroyed
  // as broken. The default does nothing (destroying it is enough).
  virtual void abandon() {}

 private:
  bool broken_ = false;
};

// Thread-safe; loans keep it alive.
template <typename Session>
class SessionPool : public std::enable_shared_from_this<SessionPool<Session>> {
 public:
  using SessionPtr = std::unique_ptr<Session>;
  // Opens a session by `deadline` (a driver may bound it itself instead);
  // `wake_fd` (-1: none) readable gives up with kCancelled.
  using Connect = std::function<Result<SessionPtr>(Deadline deadline, int wake_fd)>;

  // One session on loan: given back when destroyed, or closed if broken
  // (freeing its place in the budget). Move-only.
  class Loan {
   public:
    Loan(std::shared_ptr<SessionPool> pool, SessionPtr session)
        : pool_(std::move(pool)), session_(std::move(session)) {}
    Loan(Loan&&) noexcept = default;
    Loan& operator=(Loan&&) = delete;
    Loan(const Loan&) = delete;
    Loan& operator=(const Loan&) = delete;
    ~Loan() { give_back(); }

    Session& operator*() const { return *session_; }
    Session* operator->() const { return session_.get(); }
    // Back to the pool now, for the next borrower (closed if broken).
    void give_back() {
      if (session_) pool_->give_back(std::move(session_));
    }
    // Closes the session now: it ends, and with it everything it held (at
    // once when the server is reachable, else when it notices).
    void discard() {
      if (session_) session_->set_broken();
      give_back();
    }

   private:
    std::shared_ptr<SessionPool> pool_;
    SessionPtr session_;
  };

  // With `backoff`, a failed connect delays the next (core/worker.h's
  // Backoff): until then borrowers who need a new session get its error.
  SessionPool(Connect connect, std::string description, int budget, bool backoff = false)
      : connect_(std::move(connect)), description_(std::move(description)), budget_(budget) {
    if (backoff) backoff_.emplace();
  }

  // A session: an idle one that is still alive, or a new one when fewer than
  // the budget exist. An empty optional when none came free by
  // `wait_deadline` (a deadline already past gets one look); kCancelled when
  // `cancel` is stopped first (`wake_fd`, readable once it is, also ends
  // connecting); otherwise the error of connecting.
  Result<std::optional<Loan>> borrow(Deadline wait_deadline, const std::stop_token& cancel = {},
                                     int wake_fd = -1) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto ticket = line_.insert(line_.end(), next_ticket_++);
    auto leave_line = [&] {
      line_.erase(ticket);
      changed_.notify_all();  // the next in line may be able to go now
    };
    auto my_turn = [&] { return line_.front() == *ticket && (!idle_.empty() || open_ < budget_); };
    for (;;) {
      if (!my_turn()) {
        const bool ready = wait_deadline == Deadline::max()
                               ? changed_.wait(lock, cancel, my_turn)
                               : changed_.wait_until(lock, cancel, wait_deadline, my_turn);
        if (!ready) {
          leave_line();
          if (cancel.stop_requested()) {
            return cancelled_error(description_ + ": cancelled while waiting for a connection");
          }
          return std::optional<Loan>();
        }
      }
      if (idle_.empty()) break;
      SessionPtr session = std::move(idle_.back());
      idle_.pop_back();
      // An idle session the server ended (terminated, a restart) is
      // replaced here rather than failing the caller's call.
      if (!session->ended_while_idle()) {
        leave_line();
        return std::optional<Loan>(std::in_place, this->shared_from_this(), std::move(session));
      }
      --open_;
      lock.unlock();
      session->abandon();
      session.reset();  // closed outside the lock
      lock.lock();
    }
    if (backoff_) {
      if (Status ready = backoff_->ready(); !ready.ok()) {
        leave_line();
        return ready;
      }
    }
    ++open_;
    leave_line();
    lock.unlock();
    Result<SessionPtr> session = connect_(wait_deadline, wake_fd);
    lock.lock();
    if (backoff_) {
      if (session.ok()) {
        backoff_->reset();
      } else {
        backoff_->failed(session.status());
      }
    }
    if (!session.ok()) {
      --open_;
      changed_.notify_all();
      return session.status();
    }
    return std::optional<Loan>(std::in_place, this->shared_from_this(), std::move(*session));
  }

 private:
  void give_back(SessionPtr session) {
    const bool broken = !session->healthy();
    if (broken) {
      session->abandon();
      session.reset();  // closed outside the lock
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (broken) {
      --open_;
    } else {
      idle_.push_back(std::move(session));
    }
    changed_.notify_all();
  }

  const Connect connect_;
  const std::string description_;
  const int budget_;

  std::mutex mu_;
  std::condition_variable_any changed_;
  std::vector<SessionPtr> idle_;    // guarded by mu_
  int open_ = 0;                    // idle, lent, being opened; guarded by mu_
  std::list<std::uint64_t> line_;   // borrowers waiting, in arrival order; guarded by mu_
  std::uint64_t next_ticket_ = 0;   // guarded by mu_
  std::optional<Backoff> backoff_;  // guarded by mu_
};

}  // namespace simba::internal::sql

#endif  // SIMBA_BACKENDS_SQL_SESSION_POOL_H_
