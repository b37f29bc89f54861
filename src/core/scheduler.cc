#include "simba/scheduler.h"

#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "core/log.h"
#include "core/service_core.h"

namespace simba {

// Shared with the contender's callbacks and the worker thread.
struct Scheduler::State {
  std::string mutex;
  ScheduleConfig config;
  std::function<void(const WorkContext&)> work;
  std::shared_ptr<Clock> clock;

  std::mutex mu;
  std::condition_variable cv;
  bool running = false;
  // Bumped on every gain or loss of leadership; a run loop belongs to one.
  std::uint64_t leadership = 0;
  bool leading = false;
  std::stop_source run_stop;  // stopped when the current leadership ends
  std::jthread worker;
  std::mutex control_mu;  // serializes start/stop

  void on_acquired() {
    std::lock_guard<std::mutex> lock(mu);
    ++leadership;
    leading = true;
    run_stop = std::stop_source();
    cv.notify_all();
  }
  void on_released() {
    std::lock_guard<std::mutex> lock(mu);
    ++leadership;
    leading = false;
    run_stop.request_stop();
    cv.notify_all();
  }

  void loop(const std::stop_token& stop, MutexContendService* service) {
    // Registered before taking `mu`: if stop was already requested, the
    // callback runs right here and needs the lock itself.
    std::stop_callback wake(stop, [this] {
      std::lock_guard<std::mutex> guard(mu);
      cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu);
    while (!stop.stop_requested()) {
      if (!leading) {
        cv.wait(lock, [&] { return stop.stop_requested() || leading; });
        continue;
      }
      const std::uint64_t epoch = leadership;
      Clock::TimePoint next = clock->now() + config.initial_delay;
      while (!stop.stop_requested() && leadership == epoch) {
        if (clock->now() < next) {
          clock->wait_until(cv, lock, next);
          continue;
        }
        std::stop_source run = run_stop;
        lock.unlock();
        // The lease is checked before every run, not just the cached owner.
        const std::uint64_t token = service->fencing_token();
        const Clock::TimePoint started = clock->now();
        if (token != 0 && !run.stop_requested()) {
          try {
            work(WorkContext{mutex, token, run.get_token()});
          } catch (const std::exception& e) {
            SIMBA_LOG(kWarn, "scheduler '" << mutex << "': work threw: " << e.what());
          } catch (...) {
            SIMBA_LOG(kWarn, "scheduler '" << mutex << "': work threw a non-standard exception");
          }
        }
        lock.lock();
        if (config.strategy == ScheduleConfig::Strategy::kFixedRate) {
          next = started + config.period;
        } else {
          next = clock->now() + config.period;
        }
      }
    }
  }
};

namespace {

class SchedulerContender final : public MutexContender {
 public:
  SchedulerContender(std::string mutex, std::string id, std::function<void()> on_acquired,
                     std::function<void()> on_released)
      : MutexContender(std::move(mutex), std::move(id)),
        on_acquired_(std::move(on_acquired)),
        on_released_(std::move(on_released)) {}
  void on_acquired(const MutexState&) override { on_acquired_(); }
  void on_released(const MutexState&) override { on_released_(); }

 private:
  std::function<void()> on_acquired_;
  std::function<void()> on_released_;
};

}  // namespace

Result<std::unique_ptr<Scheduler>> Scheduler::create(MutexContendServiceFactory& factory,
                                                     std::string mutex, ScheduleConfig config,
                                                     std::function<void(const WorkContext&)> work,
                                                     SchedulerOptions options) {
  if (!work) return invalid_argument_error("work must not be empty");
  if (config.period <= std::chrono::milliseconds(0)) {
    return invalid_argument_error("period must be > 0");
  }
  if (config.initial_delay < std::chrono::milliseconds(0)) {
    return invalid_argument_error("initial_delay must be >= 0");
  }
  auto state = std::make_shared<State>();
  state->mutex = mutex;
  state->config = config;
  state->work = std::move(work);
  state->clock = factory.clock();
  std::weak_ptr<State> weak = state;
  std::string id = options.contender_id.empty() ? MutexContender::generate_host_contender_id()
                                                : std::move(options.contender_id);
  auto contender = std::make_shared<SchedulerContender>(
      std::move(mutex), std::move(id),
      [weak] {
        if (auto s = weak.lock()) s->on_acquired();
      },
      [weak] {
        if (auto s = weak.lock()) s->on_released();
      });
  SIMBA_ASSIGN_OR_RETURN(auto service,
                         factory.create_contend_service(
                             contender, options.contend.value_or(factory.contend_options())));
  return std::unique_ptr<Scheduler>(new Scheduler(std::move(state), std::move(service)));
}

Scheduler::Scheduler(std::shared_ptr<State> state, std::unique_ptr<MutexContendService> service)
    : state_(std::move(state)), service_(std::move(service)) {}

Scheduler::~Scheduler() {
  if (running()) (void)stop();
}

Status Scheduler::start() {
  std::lock_guard<std::mutex> control(state_->control_mu);
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->running) {
      return failed_precondition_error("scheduler '" + state_->mutex + "' is already running");
    }
    state_->leading = false;
  }
  SIMBA_RETURN_IF_ERROR(service_->start());
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->running = true;
  MutexContendService* service = service_.get();
  state_->worker = std::jthread(
      [state = state_.get(), service](std::stop_token stop) { state->loop(stop, service); });
  return ok_status();
}

Status Scheduler::stop() {
  std::lock_guard<std::mutex> control(state_->control_mu);
  std::jthread worker;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->running) {
      return failed_precondition_error("scheduler '" + state_->mutex + "' is not running");
    }
    state_->running = false;
    state_->run_stop.request_stop();
    worker = std::move(state_->worker);
  }
  // Ask the run in progress to stop and wait for it before giving up the
  // lease, so no run outlives leadership.
  worker.request_stop();
  if (worker.joinable()) worker.join();
  return service_->stop();
}

bool Scheduler::running() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->running;
}

bool Scheduler::is_leader() const { return service_->is_owner(); }

}  // namespace simba
