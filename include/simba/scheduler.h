// File: simba/scheduler.h
//
// Leader-gated periodic work (JVM Simba's AbstractScheduler): a job runs at a
// fixed rate or with a fixed delay, but only in the process that currently
// owns the mutex.
//
//   * On becoming leader the first run comes after `initial_delay`, then every
//     `period` (FIXED_RATE: period between starts; FIXED_DELAY: period between
//     the end of one run and the start of the next).
//   * Before each run the lease is checked (not the cached owner id); a run
//     gets a WorkContext with the acquisition's fencing token and a stop token
//     that is stopped when leadership is lost or the scheduler stops.
//   * Runs never overlap. An exception from the work is logged and the
//     schedule goes on.
//   * stop() releases leadership and waits for a run in progress to return.
//
// Example:
//   auto scheduler = simba::Scheduler::create(*factory, "compaction",
//       simba::ScheduleConfig::fixed_delay(std::chrono::seconds(0), std::chrono::minutes(5)),
//       [](const simba::WorkContext& ctx) { compact(ctx.fencing_token, ctx.stop_token); })
//       .value();
//   scheduler->start();
//
// Thread safety: start/stop/running may be called from any thread. Each
// scheduler runs its work on one thread of its own.

#ifndef SIMBA_SCHEDULER_H_
#define SIMBA_SCHEDULER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>

#include "simba/contend_service.h"
#include "simba/status.h"

namespace simba {

struct ScheduleConfig {
  enum class Strategy { kFixedRate, kFixedDelay };
  Strategy strategy = Strategy::kFixedDelay;
  std::chrono::milliseconds initial_delay{0};
  std::chrono::milliseconds period{1000};

  static ScheduleConfig fixed_rate(std::chrono::milliseconds initial_delay,
                                   std::chrono::milliseconds period) {
    return {Strategy::kFixedRate, initial_delay, period};
  }
  static ScheduleConfig fixed_delay(std::chrono::milliseconds initial_delay,
                                    std::chrono::milliseconds period) {
    return {Strategy::kFixedDelay, initial_delay, period};
  }
};

struct WorkContext {
  const std::string& mutex;
  // The acquisition this run belongs to.
  std::uint64_t fencing_token;
  // Stopped when leadership is lost or the scheduler stops: long work should
  // check it and return.
  std::stop_token stop_token;
};

struct SchedulerOptions {
  // Lease settings. Default: the factory's ContendOptions.
  std::optional<ContendOptions> contend;
  // Default: a fresh HOST id.
  std::string contender_id;
};

class Scheduler {
 public:
  // Errors: kInvalidArgument for a bad mutex name, period <= 0,
  // initial_delay < 0, an empty work function or bad options.
  static Result<std::unique_ptr<Scheduler>> create(MutexContendServiceFactory& factory,
                                                   std::string mutex, ScheduleConfig config,
                                                   std::function<void(const WorkContext&)> work,
                                                   SchedulerOptions options = {});
  ~Scheduler();  // stop() if running
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // kFailedPrecondition unless stopped.
  Status start();
  // kFailedPrecondition unless running. Returns after any run in progress.
  Status stop();
  bool running() const;
  // Leading now (the lease is held).
  bool is_leader() const;

 private:
  struct State;
  Scheduler(std::shared_ptr<State> state, std::unique_ptr<MutexContendService> service);
  std::shared_ptr<State> state_;
  std::unique_ptr<MutexContendService> service_;
};

}  // namespace simba

#endif  // SIMBA_SCHEDULER_H_
