#include "simba/locker.h"

#include <atomic>
#include <mutex>

#include "core/service_core.h"

namespace simba {

// Shared with the contender's callbacks, which may outlive the Locker.
struct Locker::State {
  enum class Phase { kIdle, kAcquiring, kHeld, kLost };

  std::shared_ptr<Clock> clock;
  std::function<void()> on_lost;
  ContendOptions contend;
  std::shared_ptr<internal::ServiceCore> core;

  mutable std::mutex mu;
  Phase phase = Phase::kIdle;
  std::uint64_t token = 0;
  std::stop_source lost_source;
  // Bumped by every acquire/release, so a late loss handler never stops the
  // core of a newer acquisition.
  std::uint64_t lifecycle = 0;
  // Held for the whole of acquire/release; the loss handler only try-locks it.
  std::mutex control_mu;
  // phase == kHeld, readable under the core's lock (which must not take mu:
  // await_hold takes the core's under it): only then is an ended hold news.
  std::shared_ptr<std::atomic<bool>> held = std::make_shared<std::atomic<bool>>(false);

  void on_released() {
    std::uint64_t seen;
    std::function<void()> notify;
    std::stop_source lost;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (phase != Phase::kHeld) return;
      phase = Phase::kLost;
      held->store(false);
      lost = lost_source;
      seen = lifecycle;
      notify = on_lost;
    }
    // Outside the lock: stop_callbacks run here, and one may ask the locker
    // about itself (is_held() and fencing_token() take the lock).
    lost.request_stop();
    if (notify) notify();
    // Stop contending: a lock whose holder was told it lost must not be
    // silently re-acquired. If the holder is releasing or re-acquiring right
    // now, that call stops the core itself.
    std::unique_lock<std::mutex> control(control_mu, std::try_to_lock);
    if (!control.owns_lock()) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (lifecycle != seen || phase != Phase::kLost) return;
    }
    (void)core->stop();
  }
};

Result<std::unique_ptr<Locker>> Locker::create(MutexContendServiceFactory& factory,
                                               std::string mutex, LockerOptions options) {
  auto state = std::make_shared<State>();
  state->clock = factory.clock();
  state->on_lost = std::move(options.on_lost);
  state->contend = options.contend.value_or(factory.contend_options());
  std::string id = options.contender_id.empty() ? MutexContender::generate_host_contender_id()
                                                : std::move(options.contender_id);
  std::weak_ptr<State> weak = state;
  auto contender = make_contender(
      std::move(mutex), nullptr,
      [weak](const MutexState&) {
        if (auto s = weak.lock()) s->on_released();
      },
      std::move(id));
  internal::ServiceHooks hooks;
  // The contender acts only when a hold ends without release(): no callback
  // for the other changes (see ServiceHooks::notify_if).
  hooks.notify_if = internal::ServiceHooks::lost_while(contender->contender_id(), state->held);
  SIMBA_ASSIGN_OR_RETURN(state->core, internal::FactoryAccess::of(factory)->create_contend_core(
                                          std::move(contender), state->contend, std::move(hooks)));
  return std::unique_ptr<Locker>(new Locker(std::move(state)));
}

Locker::Locker(std::shared_ptr<State> state) : state_(std::move(state)) {}

Locker::~Locker() { (void)release(); }

Status Locker::acquire(std::stop_token cancel) { return acquire_until(std::nullopt, cancel); }

Status Locker::acquire(std::chrono::milliseconds timeout, std::stop_token cancel) {
  if (timeout < std::chrono::milliseconds(0)) {
    return invalid_argument_error("timeout must be >= 0");
  }
  return acquire_until(timeout, cancel);
}

Status Locker::begin_acquire(const std::stop_token& cancel, bool once) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->phase == State::Phase::kAcquiring || state_->phase == State::Phase::kHeld) {
      return failed_precondition_error("mutex '" + mutex() +
                                       "' is already held or being acquired by this locker");
    }
  }
  // After a lost lease the core may still be running; start afresh.
  if (state_->core->status() == ServiceStatus::kRunning) (void)state_->core->stop();
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->phase = State::Phase::kAcquiring;
    ++state_->lifecycle;
  }
  // The first attempt on this thread, which would only wait for it (one
  // hop less); on the I/O pool when a cancel may end the wait before the
  // store call does. A try asks once: a backend need not queue it.
  if (Status s = once ? state_->core->start_once() : state_->core->start_for(cancel); !s.ok()) {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->phase = State::Phase::kIdle;
    return s;
  }
  return ok_status();
}

Status Locker::acquire_until(std::optional<std::chrono::milliseconds> timeout,
                             std::stop_token cancel) {
  std::lock_guard<std::mutex> control(state_->control_mu);
  const Clock::TimePoint deadline =
      timeout ? state_->clock->now() + *timeout : Clock::TimePoint::max();
  SIMBA_RETURN_IF_ERROR(begin_acquire(cancel, false));
  Status awaited = await_hold(deadline, cancel);
  if (awaited.code() == StatusCode::kDeadlineExceeded && timeout) {
    return deadline_exceeded_error("could not acquire mutex '" + mutex() + "' within " +
                                   std::to_string(timeout->count()) + "ms");
  }
  if (awaited.code() == StatusCode::kUnavailable) {
    // The deadline passed while the store could not be reached.
    return unavailable_error("could not acquire mutex '" + mutex() + "'" +
                             (timeout ? " within " + std::to_string(timeout->count()) + "ms" : "") +
                             ": " + awaited.message());
  }
  return awaited;
}

Status Locker::await_hold(Clock::TimePoint deadline, const std::stop_token& cancel) {
  for (;;) {
    const Status awaited = state_->core->await_owner(deadline, cancel);
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      // Checked under mu, which the loss handler takes: a loss after this
      // check finds the hold recorded and reports it.
      if (awaited.ok() && state_->core->is_owner()) {
        state_->phase = State::Phase::kHeld;
        state_->held->store(true);
        state_->token = state_->core->fencing_token();
        state_->lost_source = std::stop_source();
        return ok_status();
      }
      if (awaited.ok()) continue;  // lost as it was granted: wait on
      state_->phase = State::Phase::kIdle;
      ++state_->lifecycle;
    }
    // Give up our place: releases the mutex if an attempt got it meanwhile.
    (void)state_->core->stop();
    return awaited;
  }
}

Result<bool> Locker::try_acquire() {
  std::lock_guard<std::mutex> control(state_->control_mu);
  SIMBA_RETURN_IF_ERROR(begin_acquire({}, true));
  // A deadline already past: the answer of the first attempt.
  const Status awaited = await_hold(Clock::TimePoint::min(), {});
  if (awaited.ok()) return true;
  if (awaited.code() != StatusCode::kDeadlineExceeded) return awaited;
  const std::optional<Status> attempt = state_->core->last_attempt();
  if (!attempt)
    return deadline_exceeded_error("no answer from the store for mutex '" + mutex() + "'");
  if (!attempt->ok()) return *attempt;
  return false;  // another owner has it
}

Status Locker::release() {
  std::lock_guard<std::mutex> control(state_->control_mu);
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->phase = State::Phase::kIdle;
    state_->held->store(false);
    state_->token = 0;
    ++state_->lifecycle;
  }
  if (state_->core->status() != ServiceStatus::kRunning) return ok_status();
  return state_->core->stop();
}

bool Locker::is_held() const {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->phase != State::Phase::kHeld) return false;
  }
  return state_->core->is_owner();
}

std::uint64_t Locker::fencing_token() const {
  if (!is_held()) return 0;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->token;
}

std::stop_token Locker::lost_token() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->lost_source.get_token();
}

const std::string& Locker::mutex() const { return state_->core->mutex(); }
const std::string& Locker::contender_id() const { return state_->core->contender_id(); }

}  // namespace simba
