// File: simba/clock.h
//
// The time source of the core, injected so that tests can drive time.
//
// Core code never calls std::chrono::steady_clock or sleeps directly: it asks
// a `Clock` for the time and waits through it. Production uses
// `Clock::steady()`; tests use `ManualClock`, whose time moves only when the
// test calls `advance()`, so lease arithmetic, renewal and jitter can be
// tested without sleeping.
//
// Clock time is monotonic local time. Lease expiry at the store is judged by
// the store's own clock (see MutexOwner); the two are never compared
// directly, only durations measured on each.
//
// Example (a test):
//   auto clock = std::make_shared<simba::ManualClock>();
//   simba::FactoryOptions options;
//   options.clock = clock;
//   ...
//   clock->advance(std::chrono::seconds(10));  // renewals due now run
//
// Thread safety: all methods are safe to call from any thread.

#ifndef SIMBA_CLOCK_H_
#define SIMBA_CLOCK_H_

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>

namespace simba {

class Clock {
 public:
  using Duration = std::chrono::nanoseconds;
  using TimePoint = std::chrono::steady_clock::time_point;

  virtual ~Clock() = default;

  // The current monotonic time.
  virtual TimePoint now() const = 0;

  // Blocks on `cv` (whose mutex `lock` holds) until it is notified, or until
  // this clock's time may have reached `deadline`. May return spuriously:
  // callers re-check their condition and the time in a loop.
  virtual void wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                          TimePoint deadline) const = 0;

  // The process-wide real monotonic clock (std::chrono::steady_clock).
  static std::shared_ptr<Clock> steady();
};

// A clock for tests: time starts at an arbitrary point and moves only through
// advance(). Waiters notice an advance() within about a millisecond of real
// time (they poll the virtual time; no test sleeps in virtual time).
class ManualClock final : public Clock {
 public:
  ManualClock();

  TimePoint now() const override;
  void wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                  TimePoint deadline) const override;

  // Moves time forward by `d` (negative durations are ignored: the clock is
  // monotonic).
  void advance(Duration d);

  // True while some thread waits on this clock for exactly `deadline`. Tests
  // use it to advance time only once the code under test is waiting for the
  // instant they mean to reach (advancing earlier would move the very
  // deadline they are testing).
  bool has_waiter_until(TimePoint deadline) const;
  // True while some thread waits on this clock for an instant already
  // reached: it has not yet noticed that the clock moved.
  bool has_due_waiter() const;

 private:
  mutable std::mutex mu_;
  TimePoint now_;
  mutable std::multiset<TimePoint> waiting_;
};

}  // namespace simba

#endif  // SIMBA_CLOCK_H_
