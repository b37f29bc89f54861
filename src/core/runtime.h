// The threads a factory owns and shares among all of its services, so that
// threads do not grow with mutexes:
//   * one timer thread, waiting on the injected Clock, that runs short tasks
//     (decide, then hand work off) when they fall due;
//   * an I/O pool that runs store calls (which may block up to their deadline);
//   * a callback pool on which Strands run user callbacks, one at a time per
//     service, in order.
// Nothing here runs a task while holding one of its own locks.
#ifndef SIMBA_CORE_RUNTIME_H_
#define SIMBA_CORE_RUNTIME_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/worker.h"
#include "simba/clock.h"

namespace simba::internal {

using Task = std::function<void()>;

// A fixed set of threads draining one FIFO queue.
class ThreadPool {
 public:
  ThreadPool(std::string name, int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `task`; returns false (and drops it) after shutdown().
  // `urgent` puts the task before every queued one.
  bool post(Task task, bool urgent = false);
  // Runs what is queued, then joins the threads. Idempotent.
  void shutdown();
  bool closed() const;
  // Tasks queued or running (for Runtime::all_idle).
  std::size_t busy() const;

 private:
  struct State;
  // The queue, shared with the threads: a pool shut down (and destroyed)
  // from one of its own tasks leaves that thread only what it owns.
  static void work(const std::shared_ptr<State>& state);

  const std::shared_ptr<State> state_;
  std::vector<std::unique_ptr<Worker>> threads_;
};

// Runs posted tasks one at a time, in order, on a ThreadPool.
class Strand : public std::enable_shared_from_this<Strand> {
 public:
  explicit Strand(std::shared_ptr<ThreadPool> pool);

  void post(Task task);
  // True when called from inside a task of this strand.
  bool running_in_this_thread() const;
  // Blocks until every task posted so far has run (returns at once if the pool
  // is closed). Must not be called from inside a task of this strand.
  void drain();

 private:
  void run();
  // Queues Run() on the pool; a closed pool drops the queue.
  void schedule();

  std::shared_ptr<ThreadPool> pool_;
  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  std::deque<Task> queue_;
  bool scheduled_ = false;
  std::thread::id running_thread_;
};

class Runtime {
 public:
  using TimerId = std::uint64_t;

  Runtime(std::shared_ptr<Clock> clock, int io_threads, int callback_threads);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const std::shared_ptr<Clock>& clock() const { return clock_; }

  // Runs `task` on the timer thread once clock()->now() >= when. Returns 0
  // (and drops the task) after shutdown().
  TimerId schedule_at(Clock::TimePoint when, Task task);
  // Forgets a timer that has not run yet; a no-op otherwise.
  void cancel(TimerId id);

  // `urgent` tasks (an owner's renewal) go before everything queued, so a
  // backlog of acquisitions on a slow store cannot make a lease lapse.
  bool post_io(Task task, bool urgent = false) { return io_->post(std::move(task), urgent); }
  std::shared_ptr<Strand> make_strand() { return std::make_shared<Strand>(callbacks_); }

  // Stops the timer thread (pending timers are dropped), then drains and joins
  // the pools. Idempotent.
  void shutdown();
  bool closed() const;

  // A hook for tests on a ManualClock that must check that something did
  // NOT happen: true when no runtime of this process has work to do — no
  // timer due by its clock or running, nothing queued or running on its
  // pools — except `blocked_io` store calls that block on purpose (a
  // test's injected hang), and nothing was posted while it looked.
  static bool all_idle(std::size_t blocked_io);

 private:
  struct Timers;
  // The timers, shared with the timer thread: a Runtime shut down (and
  // destroyed) from one of its own timers leaves that thread only what it
  // owns.
  static void timer_loop(const std::shared_ptr<Timers>& timers);

  const std::shared_ptr<Clock> clock_;
  std::shared_ptr<ThreadPool> io_;
  std::shared_ptr<ThreadPool> callbacks_;
  const std::shared_ptr<Timers> timers_;
  Worker timer_thread_;
};

}  // namespace simba::internal

#endif  // SIMBA_CORE_RUNTIME_H_
