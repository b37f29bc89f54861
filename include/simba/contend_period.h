// File: simba/contend_period.h
//
// When a contend service makes its next attempt: Simba's ContendPeriod, with
// its exact formulas, and the injectable random source it draws jitter from.
//
//   owner:      delay = ttl_at - now                          (renew at ttl_at)
//   contender:  delay = transition_at - now + J,
//               J uniform in [-200, 1000) ms, or [0, 1000) ms when
//               transition_at == ttl_at (a zero transition)
//   both:       clamped at 0 (ensure_next_delay)
//
// `now` is the store's time (the same clock as the owner's timestamps).
//
// Thread safety: ContendPeriod is immutable; Random implementations must be
// safe to call from several threads.

#ifndef SIMBA_CONTEND_PERIOD_H_
#define SIMBA_CONTEND_PERIOD_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "simba/mutex_owner.h"

namespace simba {

// A source of uniform random integers, injected so tests can fix the jitter.
class Random {
 public:
  virtual ~Random() = default;
  // A uniformly drawn integer in [lo, hi). Requires lo < hi.
  virtual std::int64_t Uniform(std::int64_t lo, std::int64_t hi) = 0;
  // A thread-safe generator seeded from std::random_device.
  static std::shared_ptr<Random> Default();
};

class ContendPeriod {
 public:
  ContendPeriod(std::string contender_id, std::shared_ptr<Random> random);

  // The raw delay before the next attempt (may be negative).
  std::chrono::milliseconds next_delay(const MutexOwner& owner, StoreTime now) const;
  // next_delay clamped at zero.
  std::chrono::milliseconds ensure_next_delay(const MutexOwner& owner,
                                              StoreTime now) const;

  // Jitter bounds, in milliseconds.
  static constexpr std::int64_t kJitterMin = -200;
  static constexpr std::int64_t kJitterMax = 1000;

 private:
  std::string contender_id_;
  std::shared_ptr<Random> random_;
};

}  // namespace simba

#endif  // SIMBA_CONTEND_PERIOD_H_
