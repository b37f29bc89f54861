#include "simba/locker.h"

#include <condition_variable>
#include <mutex>

#include "core/service_core.h"

namespace simba {

// Shared with the contender's callbacks, which may outlive the Locker.
struct Locker::State {
  enum class Phase { kIdle, kAcquiring, kHeld, kLost };

  std::shared_ptr<Clock> clock;
  std::function<void()> on_lost;
  ContendOptions contend;

  mutable std::mutex mu;
  std::condition_variable cv;
  Phase phase = Phase::kIdle;
  std::uint64_t token = 0;
  std::stop_source lost_source;
  // Attempts of the service's current run (generation) and the last one's
  // outcome; hooks of an earlier run are ignored.
  int attempts_done = 0;
  Status last_attempt;
  std::uint64_t run = 0;
  // Bumped by every acquire/release, so a late loss handler never stops the
  // service of a newer acquisition.
  std::uint64_t lifecycle = 0;
  // Held for the whole of acquire/release; the loss handler only try-locks it.
  std::mutex control_mu;
  MutexContendService* service = nullptr;  // owned by the Locker

  void OnReleased() {
    std::uint64_t seen;
    std::function<void()> notify;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (phase != Phase::kHeld) return;
      phase = Phase::kLost;
      lost_source.request_stop();
      seen = lifecycle;
      notify = on_lost;
      cv.notify_all();
    }
    if (notify) notify();
    // Stop contending: a lock whose holder was told it lost must not be
    // silently re-acquired. If the holder is releasing or re-acquiring right
    // now, that call stops the service itself.
    std::unique_lock<std::mutex> control(control_mu, std::try_to_lock);
    if (!control.owns_lock()) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (lifecycle != seen || phase != Phase::kLost || service == nullptr) return;
    }
    (void)service->stop();
  }
};

namespace {

class LockerContender final : public MutexContender {
 public:
  LockerContender(std::string mutex, std::string id, std::weak_ptr<void> state,
                  std::function<void()> on_acquired, std::function<void()> on_released)
      : MutexContender(std::move(mutex), std::move(id)),
        state_(std::move(state)),
        on_acquired_(std::move(on_acquired)),
        on_released_(std::move(on_released)) {}
  void on_acquired(const MutexState&) override {
    if (auto alive = state_.lock()) on_acquired_();
  }
  void on_released(const MutexState&) override {
    if (auto alive = state_.lock()) on_released_();
  }

 private:
  std::weak_ptr<void> state_;
  std::function<void()> on_acquired_;
  std::function<void()> on_released_;
};

}  // namespace

Result<std::unique_ptr<Locker>> Locker::create(MutexContendServiceFactory& factory,
                                               std::string mutex, LockerOptions options) {
  internal::FactoryImpl& impl = *internal::FactoryAccess::Of(factory);
  auto state = std::make_shared<State>();
  state->clock = factory.clock();
  state->on_lost = std::move(options.on_lost);
  state->contend = options.contend.value_or(factory.contend_options());
  std::string id = options.contender_id.empty() ? MutexContender::GenerateHostContenderId()
                                                : std::move(options.contender_id);
  std::weak_ptr<State> weak = state;
  auto contender = std::make_shared<LockerContender>(
      std::move(mutex), std::move(id), weak,
      [weak] {
        if (auto s = weak.lock()) s->cv.notify_all();
      },
      [weak] {
        if (auto s = weak.lock()) s->OnReleased();
      });
  internal::ServiceHooks hooks;
  hooks.started = [weak](std::uint64_t run) {
    if (auto s = weak.lock()) {
      std::lock_guard<std::mutex> lock(s->mu);
      s->run = run;
      s->attempts_done = 0;
      s->last_attempt = OkStatus();
    }
  };
  hooks.attempt_done = [weak](const Status& status, std::uint64_t run) {
    if (auto s = weak.lock()) {
      std::lock_guard<std::mutex> lock(s->mu);
      // A late attempt of the previous run (its hook raced with this
      // start()) says nothing about this one.
      if (run != s->run) return;
      ++s->attempts_done;
      s->last_attempt = status;
      s->cv.notify_all();
    }
  };
  SIMBA_ASSIGN_OR_RETURN(
      auto service,
      impl.CreateContendService(contender, state->contend, std::move(hooks)));
  state->service = service.get();
  return std::unique_ptr<Locker>(new Locker(std::move(state), std::move(service)));
}

Locker::Locker(std::shared_ptr<State> state, std::unique_ptr<MutexContendService> service)
    : state_(std::move(state)), service_(std::move(service)) {}

Locker::~Locker() {
  (void)release();
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->service = nullptr;
  }
  // Wait out a loss handler that may be using the service right now.
  std::lock_guard<std::mutex> control(state_->control_mu);
}

Status Locker::acquire(std::stop_token cancel) { return AcquireUntil(std::nullopt, cancel); }

Status Locker::acquire(std::chrono::milliseconds timeout, std::stop_token cancel) {
  if (timeout < std::chrono::milliseconds(0)) {
    return InvalidArgumentError("timeout must be >= 0");
  }
  return AcquireUntil(timeout, cancel);
}

Status Locker::BeginAcquire() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->phase == State::Phase::kAcquiring || state_->phase == State::Phase::kHeld) {
      return FailedPreconditionError("mutex '" + mutex() +
                                     "' is already held or being acquired by this locker");
    }
  }
  // After a lost lease the service may still be running; start afresh.
  if (service_->running()) (void)service_->stop();
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->phase = State::Phase::kAcquiring;
    state_->attempts_done = 0;
    ++state_->lifecycle;
  }
  if (Status s = service_->start(); !s.ok()) {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->phase = State::Phase::kIdle;
    return s;
  }
  return OkStatus();
}

Status Locker::AcquireUntil(std::optional<std::chrono::milliseconds> timeout,
                            std::stop_token cancel) {
  std::lock_guard<std::mutex> control(state_->control_mu);
  const Clock::TimePoint start = state_->clock->Now();
  SIMBA_RETURN_IF_ERROR(BeginAcquire());
  std::stop_callback wake(cancel, [this] {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(state_->mu);
  Status failure;
  for (;;) {
    if (service_->is_owner()) {
      MarkHeldLocked();
      return OkStatus();
    }
    if (cancel.stop_requested()) {
      failure = CancelledError("acquiring mutex '" + mutex() + "' was cancelled");
      break;
    }
    const Clock::TimePoint now = state_->clock->Now();
    if (timeout && now >= start + *timeout) {
      // Even a zero timeout gets the answer of one attempt: "try once" must
      // not fail on a free mutex just because the store had not replied yet.
      if (state_->attempts_done == 0) {
        state_->cv.wait_for(lock, std::chrono::milliseconds(10));
        continue;
      }
      failure = DeadlineExceededError("could not acquire mutex '" + mutex() + "' within " +
                                      std::to_string(timeout->count()) + "ms");
      break;
    }
    // No deadline still wakes now and then, in case a notification raced.
    const Clock::TimePoint wake_at =
        timeout ? start + *timeout : now + std::chrono::seconds(1);
    state_->clock->WaitUntil(state_->cv, lock, wake_at);
  }
  state_->phase = State::Phase::kIdle;
  ++state_->lifecycle;
  lock.unlock();
  // Give up our place: releases the mutex if an attempt got it meanwhile.
  (void)service_->stop();
  return failure;
}

void Locker::MarkHeldLocked() {
  state_->phase = State::Phase::kHeld;
  state_->token = service_->fencing_token();
  state_->lost_source = std::stop_source();
}

Result<bool> Locker::try_acquire() {
  std::lock_guard<std::mutex> control(state_->control_mu);
  SIMBA_RETURN_IF_ERROR(BeginAcquire());
  std::unique_lock<std::mutex> lock(state_->mu);
  // The first attempt ends within the store call's deadline (after the
  // initial delay); this bound only guards against a bug turning try_acquire
  // into a hang.
  const auto give_up = std::chrono::steady_clock::now() + state_->contend.initial_delay +
                       state_->contend.operation_timeout + std::chrono::seconds(5);
  while (state_->attempts_done == 0 && !service_->is_owner() &&
         std::chrono::steady_clock::now() < give_up) {
    state_->cv.wait_until(lock, std::min(give_up, std::chrono::steady_clock::now() +
                                                      std::chrono::milliseconds(50)));
  }
  if (service_->is_owner()) {
    MarkHeldLocked();
    return true;
  }
  Status attempt = state_->attempts_done == 0
                       ? DeadlineExceededError("no answer from the store for mutex '" + mutex() + "'")
                       : state_->last_attempt;
  state_->phase = State::Phase::kIdle;
  ++state_->lifecycle;
  lock.unlock();
  (void)service_->stop();
  if (!attempt.ok()) return attempt;
  return false;
}

Status Locker::release() {
  std::lock_guard<std::mutex> control(state_->control_mu);
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->phase = State::Phase::kIdle;
    state_->token = 0;
    ++state_->lifecycle;
  }
  if (!service_->running()) return OkStatus();
  return service_->stop();
}

bool Locker::is_held() const {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->phase != State::Phase::kHeld) return false;
  }
  return service_->is_owner();
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

const std::string& Locker::mutex() const { return service_->mutex(); }
const std::string& Locker::contender_id() const { return service_->contender_id(); }

}  // namespace simba
