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

bool WaitLine::held_here_locked(const std::string& mutex) const {
  const auto holds = [&](const std::map<std::string, std::set<std::string>>& of) {
    auto it = of.find(mutex);
    return it != of.end() && !it->second.empty();
  };
  return holds(holders_) || holds(granted_);
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
    place.look_at = steady_clock::time_point::max();
    place.yield_at = steady_clock::time_point::max();
    place.yield_for = 0;
    place.yields = 0;
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
  if (!place->connecting) {
    place->wake.post();
    if (place->queued) place->cancelling = true;
  }
  changed_.notify_all();
}

std::uint64_t WaitLine::ended_session(const std::string& mutex) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = ended_sessions_.find(mutex);
  if (it == ended_sessions_.end()) return 0;
  if (steady_clock::now() - it->second.second >= kEndedSessionWindow) {
    ended_sessions_.erase(it);
    return 0;
  }
  return it->second.first;
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
  } else if (!first && (!hooks_.releases_announced || backs_tenures())) {
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
  // lock it kept is given up. Not when another contender of this process
  // still holds the mutex: a waiter of this process that leaves (a
  // try_acquire or a timed acquire giving up) must not take the place from
  // under its holder, whose tenure the place backs (leaving would end it:
  // the conformance suite's Locker test under ASan caught it on MySQL).
  if (Place* place = place_of_locked(mutex); place != nullptr && !held_here_locked(mutex)) {
    place->holder = false;
  }
  maybe_leave_locked(mutex);
}

void WaitLine::await_leaving(const std::string& mutex, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_until(lock, deadline, [&] {
    const Place* place = place_of_locked(mutex);
    return stopping_ || place == nullptr || wanted_locked(*place) ||
           place->hook_thread == std::this_thread::get_id() ||
           (!place->queued && !place->cancelling && place->state != State::kFirst);
  });
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
  // Its tenure is over (released, or answered as another's): a bound given
  // for it ends, and its place stops backing it.
  if (auto it = tenures_.find({mutex, contender}); it != tenures_.end()) {
    const auto now = steady_clock::now();
    if (it->second.bound->until() > now) it->second.bound->set_until(now);
    tenures_.erase(it);
  }
  if (Place* place = place_of_locked(mutex);
      place != nullptr && place->marked_token != 0 && place->marked_contender == contender) {
    unmark_locked(*place);
  }
}

std::shared_ptr<const HoldBound> WaitLine::bound_for(const std::string& mutex,
                                                     const std::string& contender,
                                                     std::uint64_t token) {
  if (!backs_tenures() || token == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  Tenure& tenure = tenures_[{mutex, contender}];
  if (tenure.token != token || !tenure.bound) {
    // A new tenure: an older one's bound ends (its holder moved on).
    if (tenure.bound) {
      const auto now = steady_clock::now();
      if (tenure.bound->until() > now) tenure.bound->set_until(now);
    }
    tenure = Tenure{token, std::make_shared<HoldBound>()};
    changed_.notify_all();  // a place first in line may back it now
  }
  return tenure.bound;
}

void WaitLine::look_at(const std::string& mutex, steady_clock::time_point at) {
  std::lock_guard<std::mutex> lock(mu_);
  Place* place = place_of_locked(mutex);
  if (place == nullptr || place->state != State::kFirst) return;
  place->look_at = std::min(place->look_at, at);
  changed_.notify_all();
}

void WaitLine::unbacked(const std::string& mutex, std::uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  Place* place = place_of_locked(mutex);
  if (place == nullptr || place->state != State::kFirst || place->holder) return;
  if (place->yield_for != token) {
    place->yield_for = token;
    place->yields = 0;
  }
  if (place->yields >= kYields || place->yield_at != steady_clock::time_point::max()) return;
  place->yield_at = std::max(steady_clock::now(), place->last_yield + kYieldSpacing);
  changed_.notify_all();
}

WaitLine::Held WaitLine::held_locked(const std::string& mutex) const {
  Held held;
  auto consider = [&](const std::map<std::string, std::set<std::string>>& of) {
    auto it = of.find(mutex);
    if (it == of.end()) return;
    for (const std::string& contender : it->second) {
      auto t = tenures_.find({mutex, contender});
      if (t != tenures_.end() && t->second.token > held.token) {
        held = Held{contender, t->second.token, t->second.bound};
      }
    }
  };
  consider(holders_);
  consider(granted_);
  return held;
}

void WaitLine::unmark_locked(Place& place) {
  if (place.marked_bound) {
    const auto now = steady_clock::now();
    if (place.marked_bound->until() > now) place.marked_bound->set_until(now);
  }
  place.marked_contender.clear();
  place.marked_token = 0;
  place.marked_bound.reset();
}

bool WaitLine::back_tenure(Place& place, const std::string& mutex,
                           std::unique_lock<std::mutex>& lock) {
  if (!backs_tenures() || marks_refused_) return false;
  const Held held = place.holder ? held_locked(mutex) : Held{};
  if (held.token == 0 || held.token != place.marked_token ||
      held.contender != place.marked_contender) {
    if (place.marked_token != 0) unmark_locked(place);
  }
  const auto now = steady_clock::now();
  // A tenure whose bound has passed is over; its holder gives it back.
  if (held.token == 0 || held.bound->passed(now)) return false;
  const bool marking = place.marked_token == 0;
  if (!marking && now < place.next_ping) return false;
  std::vector<Statement> statements;
  if (marking) {
    statements = hooks_.mark(mutex, held.contender, held.token);
    if (statements.empty()) return false;  // not now (the driver is not ready)
    // Bounded before it is sent: it may commit though its answer never comes.
    if (held.bound->until() > now + hooks_.grace) held.bound->set_until(now + hooks_.grace);
    place.marked_contender = held.contender;
    place.marked_token = held.token;
    place.marked_bound = held.bound;
  } else {
    statements = {hooks_.ping};
  }
  SqlSession* session = place.session.get();
  // Unanswered by the bound, the session proves nothing more.
  const auto deadline = held.bound->until();
  Result<std::vector<SqlResult>> ran = unavailable_error("not run");
  place.busy = true;
  lock.unlock();
  ran = session->run(statements, marking, deadline);
  lock.lock();
  place.busy = false;
  changed_.notify_all();
  const auto answered = steady_clock::now();
  if (place.marked_bound != held.bound) return true;  // moved on meanwhile
  if (ran.ok() && !held.bound->passed(answered)) {
    held.bound->set_until(now + hooks_.grace);
    place.next_ping = now + hooks_.grace / 4;
    return true;
  }
  if (!ran.ok() && marking && session->healthy()) {
    // Refused (no table, no privilege): nothing was written, so nobody can
    // take the tenure over by it; it is held by its lease alone, as before.
    SIMBA_LOG(kWarn, description_ << ": recording a tenure of mutex " << in_quotes(mutex)
                                  << " as backed by its session failed (" << ran.status()
                                  << "); a dead holder's mutexes are taken over when their "
                                     "leases end");
    marks_refused_ = true;
    held.bound->set_until(steady_clock::time_point::max());
    place.marked_bound.reset();
    unmark_locked(place);
    return true;
  }
  // Unanswered, failed or too late: the tenure may be taken over from its
  // bound on. Its holder hears it now, and the log says why (a grace too
  // short for this server or machine shows here first).
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(answered - now);
  const std::string grace = "session_grace (" + std::to_string(hooks_.grace.count()) + " ms)";
  if (ran.ok()) {
    warn_tenure_ends(mutex, held.token,
                     "answered only after " + std::to_string(took.count()) + " ms, past " + grace);
  } else if (ran.status().code() == StatusCode::kDeadlineExceeded) {
    warn_tenure_ends(mutex, held.token, "did not answer within " + grace);
  } else {
    warn_tenure_ends(mutex, held.token, "failed: " + ran.status().to_string());
  }
  if (ran.ok() || session->healthy()) session->set_broken();
  unmark_locked(place);
  report_lost(place, mutex, held.contender, held.token, lock);
  return true;
}

void WaitLine::warn_tenure_ends(const std::string& mutex, std::uint64_t token,
                                const std::string& cause) const {
  SIMBA_LOG(kWarn, description_ << ": the session backing the hold of mutex " << in_quotes(mutex)
                                << " (token " << token << ") " << cause
                                << "; the holder is told it lost the hold, which another "
                                   "process may take over from now");
}

void WaitLine::report_lost(Place& place, const std::string& mutex, const std::string& contender,
                           std::uint64_t token, std::unique_lock<std::mutex>& lock) {
  if (!hooks_.lost) return;
  place.hook_thread = std::this_thread::get_id();
  lock.unlock();
  hooks_.lost(mutex, contender, token);
  lock.lock();
  place.hook_thread = {};
  changed_.notify_all();
}

bool WaitLine::claim(const std::string& mutex, const std::string& contender) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!erase_locked(granted_, mutex, contender)) return false;
  // It holds by what it is told now, as after holding(): the place goes on
  // backing its tenure. Dropped from both, the place found no tenure of
  // ours and ended the bound of a live hold (MultiContend, PostgreSQL).
  holders_[mutex].insert(contender);
  return true;
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
    // A wait being cancelled may have been granted (Place::cancelling): the
    // call waits for its answer, which takes a few milliseconds (a cancel
    // request goes on a connection of its own), and for the unlock on that
    // session (or its closing). Granted and wanted again, the place is
    // first and lends its session; otherwise the line lock is free for the
    // pool.
    if (!stopping_ && place != nullptr && place->cancelling &&
        place->hook_thread != std::this_thread::get_id()) {
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) return std::nullopt;
      continue;
    }
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

std::chrono::steady_clock::time_point WaitLine::Loan::first_since() const {
  std::lock_guard<std::mutex> lock(line_->mu_);
  return line_->places_[place_]->first_since;
}

std::uint64_t WaitLine::Loan::backed_token() const {
  std::lock_guard<std::mutex> lock(line_->mu_);
  return line_->places_[place_]->marked_token;
}

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
    // A release that freed the line lock ended the tenure; a broken session
    // is the thread's to report (it tells the holder).
    if (unlocked) unmark_locked(place);
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
      if (place.marked_token != 0) {
        // The session that backed a tenure of ours is gone: from its bound
        // on another process may take the tenure over.
        const std::string contender = place.marked_contender;
        const std::uint64_t token = place.marked_token;
        warn_tenure_ends(mutex, token, "was lost (the server ended it or the connection broke)");
        unmark_locked(place);
        report_lost(place, mutex, contender, token, lock);
        continue;
      }
      // Closed outside the lock; its end frees its lock on the server.
      std::unique_ptr<SqlSession> broken = std::move(place.session);
      if (place.state == State::kFirst) place.state = State::kJoining;
      place.look_at = steady_clock::time_point::max();
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
      unmark_locked(place);
      place.mutex.clear();
      place.state = State::kFree;
      place.holder = false;
      place.announced = false;
      changed_.notify_all();  // first_session() may wait for it to leave
      continue;
    }
    if (place.state == State::kFirst) {
      if (back_tenure(place, mutex, lock)) continue;
      const auto now = steady_clock::now();
      if (place.yield_at <= now) {
        place.yield_at = steady_clock::time_point::max();
        if (!place.holder && has_waiters_locked(mutex)) {
          // Behind the line again (unbacked()): the unlock lets a session
          // queued behind this one have the line lock first.
          ++place.yields;
          place.last_yield = now;
          SqlSession* session = place.session.get();
          outside([&] {
            if (!session->run({hooks_.unlock(mutex)}, false, steady_clock::now() + kCallBound)
                     .ok()) {
              session->set_broken();
            }
          });
          if (place.state == State::kFirst) place.state = State::kJoining;
          continue;
        }
      }
      if (now >= place.look_at) {
        // A backed tenure of another process may be taken over now.
        place.look_at = steady_clock::time_point::max();
        in_hook([&] { hooks_.first(mutex); });
        continue;
      }
      steady_clock::time_point wake = std::min(place.look_at, place.yield_at);
      if (place.marked_token != 0) wake = std::min(wake, place.next_ping);
      if (hooks_.releases_announced || place.holder) {
        if (wake == steady_clock::time_point::max()) {
          changed_.wait(lock);
        } else {
          changed_.wait_until(lock, wake);
        }
        continue;
      }
      // First behind a holder that would not wake us: look now and then.
      if (now < place.next_look) {
        changed_.wait_until(lock, std::min(place.next_look, wake));
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
    if (waited.ok() || failure == SqlFailure::kLockTimeout) place.cancelling = false;
    bool look = false;
    if (waited.ok()) {
      const std::size_t waits = std::min(wait_size, results->size());
      const bool granted =
          !hooks_.granted || hooks_.granted(std::vector<SqlResult>(
                                 results->begin(), results->begin() + static_cast<long>(waits)));
      if (granted) {
        place.state = State::kFirst;
        place.first_since = steady_clock::now();
        place.look_at = steady_clock::time_point::max();
        place.yield_at = steady_clock::time_point::max();
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
      // A wait cancelled just after its grant leaves the session holding
      // the line lock (a session lock outlives the transaction the cancel
      // aborts), and the row a release reserved for the first in line is
      // refused to everyone else until it is free: a try_lock() of ours
      // found a released mutex taken (clustered conformance). Given up on
      // the same session, the lock is free once the answer is here; a
      // closed session frees it only when the server's backend has exited,
      // a moment later. Otherwise the session is closed before anyone
      // looks, and named to our tries meanwhile (ended_session(): MySQL
      // ends a wait only so). (The place was waiting, not first: a holder
      // of ours that wanted it still does.)
      bool freed = false;
      if (place.cancelling && session->healthy()) {
        outside([&] {
          freed =
              session->run({hooks_.unlock(mutex)}, false, steady_clock::now() + kCallBound).ok();
        });
      }
      if (!freed) {
        if (const std::uint64_t id = session->server_id(); id != 0) {
          const steady_clock::time_point now = steady_clock::now();
          std::erase_if(ended_sessions_, [&](const auto& entry) {
            return now - entry.second.second >= kEndedSessionWindow;
          });
          ended_sessions_[mutex] = {id, now};
        }
        session->set_broken();
        if (place.marked_token == 0) {
          std::unique_ptr<SqlSession> broken = std::move(place.session);
          outside([&] { broken.reset(); });
        }
      }
      place.cancelling = false;
      changed_.notify_all();
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
