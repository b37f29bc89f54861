#include "backends/sql/wait_line.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "core/log.h"

namespace simba::internal::sql {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// Bounds on a place's own calls beyond their lock wait: connecting, and the
// round trip of a wait or an unlock.
constexpr milliseconds kConnectBound{5000};
constexpr milliseconds kCallBound{5000};

}  // namespace

WaitLine::WaitLine(Hooks hooks, std::string description, int places)
    : hooks_(std::move(hooks)), description_(std::move(description)) {
  for (int i = 0; i < places; ++i) places_.push_back(std::make_unique<Place>());
}

WaitLine::~WaitLine() { stop(); }

void WaitLine::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& place : places_) place->wake.post();
  }
  changed_.notify_all();
  // Each thread ends its wait (the wake fd) and returns; closing a session
  // ends whatever lock it held or waited for.
  for (auto& place : places_) place->worker.join();
}

bool WaitLine::wanted_locked(const Place& place) const {
  if (stopping_ || place.mutex.empty()) return false;
  return place.holder || has_waiters_locked(place.mutex);
}

bool WaitLine::has_waiters_locked(const std::string& mutex) const {
  auto it = waiters_.find(mutex);
  return it != waiters_.end() && !it->second.empty();
}

WaitLine::Place* WaitLine::place_of_locked(const std::string& mutex) {
  for (auto& place : places_) {
    if (place->mutex == mutex) return place.get();
  }
  return nullptr;
}

void WaitLine::join_locked(const std::string& mutex) {
  if (stopping_ || place_of_locked(mutex) != nullptr) return;
  for (std::size_t i = 0; i < places_.size(); ++i) {
    Place& place = *places_[i];
    // A place still busy leaving its last line is not free yet.
    if (!place.mutex.empty() || place.busy) continue;
    place.mutex = mutex;
    place.state = State::kJoining;
    place.holder = false;
    place.announced = false;
    place.wait_after = {};
    place.worker.start("sql-line", [this, i] { run(i); });
    changed_.notify_all();
    return;
  }
}

void WaitLine::maybe_leave_locked(const std::string& mutex) {
  Place* place = place_of_locked(mutex);
  if (place == nullptr || wanted_locked(*place)) return;
  // A lock wait in progress ends at once (cancelled, or its session
  // closed, which takes this process out of the server's queue). A connect
  // runs on (Place::connecting); the wake is drained before each use.
  if (!place->connecting) place->wake.post();
  changed_.notify_all();
}

void WaitLine::waiting(const std::string& mutex, const std::string& contender,
                       std::vector<Statement> attempt) {
  std::lock_guard<std::mutex> lock(mu_);
  waiters_[mutex][contender] = std::move(attempt);
  forget_holder_locked(mutex, contender);
  join_locked(mutex);
  // A place waiting out a holder's join delay asks at once now.
  changed_.notify_all();
}

void WaitLine::holding(const std::string& mutex, const std::string& contender, bool first) {
  std::lock_guard<std::mutex> lock(mu_);
  drop_waiter_locked(mutex, contender);
  erase_locked(granted_, mutex, contender);
  holders_[mutex].insert(contender);
  Place* place = place_of_locked(mutex);
  if (place != nullptr && place->state == State::kFirst) {
    // Taken on the line's session, or on the pool while the place was
    // first (its session busy): either way the place holds the line lock,
    // and keeps it for this hold, whose release then wakes the next in line.
    place->holder = true;
  } else if (!first && !hooks_.releases_announced) {
    // Its release wakes the next in line only if it holds the line lock:
    // a new place asks for it once the hold has lasted holder_join_delay.
    if (place == nullptr) {
      join_locked(mutex);
      place = place_of_locked(mutex);
      if (place != nullptr) place->wait_after = steady_clock::now() + hooks_.holder_join_delay;
    }
    if (place != nullptr) place->holder = true;
  }
  maybe_leave_locked(mutex);
}

void WaitLine::gone(const std::string& mutex, const std::string& contender) {
  std::lock_guard<std::mutex> lock(mu_);
  drop_waiter_locked(mutex, contender);
  forget_holder_locked(mutex, contender);
  // The holder released (or stopped) without the line's session: the line
  // lock it kept is given up.
  if (Place* place = place_of_locked(mutex); place != nullptr) place->holder = false;
  maybe_leave_locked(mutex);
}

void WaitLine::forget(const std::string& mutex) {
  std::lock_guard<std::mutex> lock(mu_);
  waiters_.erase(mutex);
  // A holder keeps its place: its release, which follows, frees the line lock
  // with the row.
  maybe_leave_locked(mutex);
}

bool WaitLine::drop_waiter_locked(const std::string& mutex, const std::string& contender) {
  auto it = waiters_.find(mutex);
  if (it == waiters_.end() || it->second.erase(contender) == 0) return false;
  if (it->second.empty()) waiters_.erase(it);
  return true;
}

bool WaitLine::erase_locked(std::map<std::string, std::set<std::string>>& of,
                            const std::string& mutex, const std::string& contender) {
  auto it = of.find(mutex);
  if (it == of.end() || it->second.erase(contender) == 0) return false;
  if (it->second.empty()) of.erase(it);
  return true;
}

void WaitLine::forget_holder_locked(const std::string& mutex, const std::string& contender) {
  erase_locked(holders_, mutex, contender);
  // Whatever the line's attempt took before is overtaken.
  erase_locked(granted_, mutex, contender);
}

bool WaitLine::claim(const std::string& mutex, const std::string& contender) {
  std::lock_guard<std::mutex> lock(mu_);
  return erase_locked(granted_, mutex, contender);
}

bool WaitLine::holds_locked(const std::string& mutex, const std::string& contender) const {
  auto it = holders_.find(mutex);
  return it != holders_.end() && it->second.count(contender) != 0;
}

bool WaitLine::others_waiting(const std::string& mutex, const std::string& contender) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = waiters_.find(mutex);
  if (it == waiters_.end()) return false;
  return it->second.size() > it->second.count(contender);
}

bool WaitLine::hold_back(const std::string& mutex) {
  std::lock_guard<std::mutex> lock(mu_);
  Place* place = place_of_locked(mutex);
  // Only a place waiting in the server's queue is behind someone; one
  // still connecting has not asked yet, and is told when it has.
  if (place == nullptr || !place->queued) return false;
  place->announced = true;
  return true;
}

std::optional<WaitLine::Loan> WaitLine::first_session(const std::string& mutex, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    Place* place = place_of_locked(mutex);
    // A place leaving the line may still hold the line lock, and a reserved
    // row would then be refused to this process's call on the pool: the
    // call waits until it has left (an unlock, or a cancel, away).
    if (place != nullptr && place->hook_thread != std::this_thread::get_id() &&
        !wanted_locked(*place) && (place->busy || place->state == State::kFirst)) {
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) return std::nullopt;
      continue;
    }
    if (place == nullptr || place->state != State::kFirst || !place->session) return std::nullopt;
    if (!place->busy) {
      // A session the server ended while it held the line lock (killed, a
      // restart) holds nothing any more: the call goes on the pool, and the
      // place's thread replaces the session. (Renewals, which go together
      // on the pool, no longer find it first.)
      if (!place->session->healthy() || place->session->ended_while_idle()) {
        place->session->set_broken();
        changed_.notify_all();
        return std::nullopt;
      }
      place->busy = true;
      for (std::size_t i = 0; i < places_.size(); ++i) {
        if (places_[i].get() == place) return Loan(this, i);
      }
    }
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) return std::nullopt;
  }
}

SqlSession& WaitLine::Loan::session() const { return *line_->places_[place_]->session; }

WaitLine::Loan::~Loan() {
  if (line_ != nullptr) line_->give_back(place_, unlocked_);
}

void WaitLine::give_back(std::size_t index, bool unlocked) {
  std::lock_guard<std::mutex> lock(mu_);
  Place& place = *places_[index];
  place.busy = false;
  // A broken session is closed by the thread, which frees whatever lock it
  // held; either way the place must wait in line again.
  if (unlocked || !place.session->healthy()) {
    place.state = State::kJoining;
    place.holder = false;
  }
  changed_.notify_all();
}

void WaitLine::run(std::size_t index) {
  Backoff backoff;
  std::unique_lock<std::mutex> lock(mu_);
  Place& place = *places_[index];
  // Runs `body` with the place marked busy and mu_ released.
  auto outside = [&](auto&& body) {
    place.busy = true;
    lock.unlock();
    body();
    lock.lock();
    place.busy = false;
    changed_.notify_all();
  };
  // Runs a hook with mu_ released. What it calls may ask for the place's
  // session (first_session), which must not wait for the place to leave:
  // the place's thread is the one that would make it leave.
  auto in_hook = [&](auto&& hook) {
    place.hook_thread = std::this_thread::get_id();
    lock.unlock();
    hook();
    lock.lock();
    place.hook_thread = {};
    changed_.notify_all();
  };
  while (!stopping_) {
    if (place.mutex.empty() || place.busy) {
      changed_.wait(lock);
      continue;
    }
    const std::string mutex = place.mutex;
    if (place.session && !place.session->healthy()) {
      // Closed outside the lock; its end frees its lock on the server.
      std::unique_ptr<SqlSession> broken = std::move(place.session);
      if (place.state == State::kFirst) place.state = State::kJoining;
      place.holder = false;
      outside([&] { broken.reset(); });
      continue;
    }
    if (!wanted_locked(place)) {
      if (place.state == State::kFirst) {
        SqlSession* session = place.session.get();
        outside([&] {
          const Statement unlock = hooks_.unlock(mutex);
          if (!session->run({unlock}, false, steady_clock::now() + kCallBound).ok()) {
            session->set_broken();
          }
        });
      }
      place.mutex.clear();
      place.state = State::kFree;
      place.holder = false;
      place.announced = false;
      changed_.notify_all();  // first_session() may wait for it to leave
      continue;
    }
    if (place.state == State::kFirst) {
      if (hooks_.releases_announced || place.holder) {
        changed_.wait(lock);
        continue;
      }
      // First behind a holder that would not wake us: look now and then.
      const auto now = steady_clock::now();
      if (now < place.next_look) {
        changed_.wait_until(lock, place.next_look);
        continue;
      }
      place.next_look = now + kFirstLooks;
      in_hook([&] { hooks_.first(mutex); });
      continue;
    }
    if (!place.session) {
      if (steady_clock::now() < backoff.ready_at()) {
        changed_.wait_until(lock, backoff.ready_at());
        continue;
      }
      place.wake.drain();
      Result<std::unique_ptr<SqlSession>> session = unavailable_error("not connected");
      place.connecting = true;
      outside(
          [&] { session = hooks_.connect(steady_clock::now() + kConnectBound, place.wake.fd()); });
      place.connecting = false;
      if (!session.ok()) {
        const milliseconds delay = backoff.failed(session.status());
        SIMBA_LOG(kDebug, description_ << ": wait line of mutex " << in_quotes(mutex) << ": "
                                       << session.status() << "; again in "
                                       << format_duration(delay));
      } else {
        backoff.reset();
        place.session = std::move(*session);
      }
      continue;
    }
    if (place.holder && !has_waiters_locked(mutex) && steady_clock::now() < place.wait_after) {
      // Only a holder wants it, for less than holder_join_delay yet: its
      // release (or a waiter of ours) may come first.
      changed_.wait_until(lock, place.wait_after);
      continue;
    }
    // In line: wait for the line lock, a chunk at a time, and with it a
    // waiter's attempt, which then runs as soon as it is granted.
    place.wake.drain();
    SqlSession* session = place.session.get();
    std::vector<Statement> statements = hooks_.wait(mutex, kWaitChunk);
    const std::size_t wait_size = statements.size();
    std::string attempter;
    if (auto it = waiters_.find(mutex); it != waiters_.end() && !it->second.empty()) {
      const auto& [contender, attempt] = *it->second.begin();
      attempter = contender;
      statements.insert(statements.end(), attempt.begin(), attempt.end());
    }
    Result<std::vector<SqlResult>> results = unavailable_error("not run");
    SqlFailure failure = SqlFailure::kOther;
    place.queued = true;
    const steady_clock::time_point sent = steady_clock::now();
    outside([&] {
      session->set_wake_fd(place.wake.fd());
      results = session->run(statements, true, sent + kWaitChunk + kCallBound, &failure);
      session->set_wake_fd(-1);
    });
    place.queued = false;
    const Status waited = results.status();
    bool look = false;
    if (waited.ok()) {
      const std::size_t waits = std::min(wait_size, results->size());
      const bool granted =
          !hooks_.granted || hooks_.granted(std::vector<SqlResult>(
                                 results->begin(), results->begin() + static_cast<long>(waits)));
      if (granted) {
        place.state = State::kFirst;
        place.next_look = steady_clock::now() + kFirstLooks;
        look = true;
      }
      if (statements.size() > wait_size && results->size() > wait_size) {
        // The attempt ran as the lock was granted (or, where a wait that
        // runs out is no error, after it): the contender may hold the
        // mutex now, and must hear it.
        std::vector<SqlResult> attempt(results->begin() + static_cast<long>(wait_size),
                                       results->end());
        bool holds = false;
        in_hook([&] { holds = hooks_.attempted(mutex, attempter, attempt, sent); });
        if (holds && holds_locked(mutex, attempter)) {
          // Its own call took the mutex meanwhile (its reply came first):
          // the same tenure, or one its next call finds. Never given back.
          // The place keeps the line lock it was just granted while the
          // contender holds, as for a hold taken here: its release frees it
          // and wakes the next in line. Left, the next process's wait was
          // granted at once behind a holder that had to announce its
          // release (seen in CI: the third process found first in line).
          place.holder = true;
          in_hook([&] { hooks_.superseded(mutex, attempter); });
        } else if (holds && (!drop_waiter_locked(mutex, attempter) || stopping_)) {
          // It left meanwhile (gone()), or the line stops, and nobody would
          // hand it the hold: whichever of its leave and this finds the
          // hold first gives it back.
          in_hook([&] { hooks_.abandoned(mutex, attempter); });
        } else if (holds) {
          granted_[mutex].insert(attempter);
          place.holder = true;
          look = true;
        }
      }
      if (!granted && std::exchange(place.announced, false)) look = true;
    } else if (failure == SqlFailure::kLockTimeout) {
      // Still behind someone. A release announced meanwhile may be one the
      // process ahead does not take (it is paused): look once. Where
      // releases are announced, one that freed the line lock for a waiting
      // session is not (LineLock::queued_sql): look at every chunk's end.
      look = std::exchange(place.announced, false) || hooks_.releases_announced;
    } else {
      session->set_broken();
      if (!wanted_locked(place)) continue;
      backoff.failed(waited);
      SIMBA_LOG(kDebug,
                description_ << ": wait line of mutex " << in_quotes(mutex) << ": " << waited);
      look = true;
    }
    if (waited.ok()) place.announced = false;
    // First in line, or the place was lost (anything may have been missed),
    // or a look is due: the waiters look.
    if (!look || !wanted_locked(place)) continue;
    in_hook([&] { hooks_.first(mutex); });
  }
  std::unique_ptr<SqlSession> session = std::move(place.session);
  lock.unlock();
}

}  // namespace simba::internal::sql
