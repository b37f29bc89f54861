#include "simba/clock.h"

namespace simba {
namespace {

class SteadyClock final : public Clock {
 public:
  TimePoint now() const override { return std::chrono::steady_clock::now(); }
  void wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                  TimePoint deadline) const override {
    cv.wait_until(lock, deadline);
  }
};

// How often a waiter on a ManualClock re-reads the virtual time. Polling keeps
// the clock free of waiter registration (and of its lost-wakeup and lifetime
// traps); the cost is a millisecond of real latency after each advance().
constexpr auto kManualClockPoll = std::chrono::milliseconds(1);

}  // namespace

std::shared_ptr<Clock> Clock::steady() {
  static const std::shared_ptr<Clock> kSteady = std::make_shared<SteadyClock>();
  return kSteady;
}

// Start far from the steady clock's epoch so that "now - 1h" is still a valid
// time point in tests.
ManualClock::ManualClock() : now_(TimePoint() + std::chrono::hours(24 * 365)) {}

Clock::TimePoint ManualClock::now() const {
  std::lock_guard<std::mutex> lock(mu_);
  return now_;
}

void ManualClock::wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                             TimePoint deadline) const {
  std::multiset<TimePoint>::iterator entry;
  {
    std::lock_guard<std::mutex> guard(mu_);
    if (now_ >= deadline) return;
    entry = waiting_.insert(deadline);
  }
  cv.wait_for(lock, kManualClockPoll);
  std::lock_guard<std::mutex> guard(mu_);
  waiting_.erase(entry);
}

bool ManualClock::has_waiter_until(TimePoint deadline) const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_.count(deadline) > 0;
}

bool ManualClock::has_due_waiter() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !waiting_.empty() && *waiting_.begin() <= now_;
}

void ManualClock::advance(Duration d) {
  if (d <= Duration::zero()) return;
  std::lock_guard<std::mutex> lock(mu_);
  now_ += d;
}

}  // namespace simba
