// File: simba/contend_period.h
//
// When a contend service makes its next attempt: Simba's ContendPeriod, with
// its exact formulas, and the injectable random source it draws jitter from.
//
//   owner:      delay = ttl_at - now                          (renew at ttl_at)
//   contender:  delay = transition_at - now + J,
//               J uniform in [-200, 1000) ms, or [0, 1000) ms when
//               transition_at == ttl_at (a zero transition) or when the
//               lease ends within 200 ms (see below)
//   unknown:    the store could not say when the owner's hold ends and
//               asked to be called again by ask_again_at (OwnerRecord):
//               left = ask_again_at - now,
//               delay = left - min(left / 4, 750 ms) - J',
//               J' uniform in [0, min(left / 4, 1000 ms))
//   all:        clamped at 0 (ensure_next_delay)
//
// `now` is the store's time (the same clock as the owner's timestamps).
//
// The lease end within 200 ms: an attempt before transition_at only finds
// the lease still running (a release is pushed or seen at the next answer
// anyway), and the answer names the same transition_at; drawing the
// negative jitter again could land before it again, and again. Drawing it
// non-negative then makes at most one attempt per lease land early.
//
// Ask-again: the attempt must reach the store before ask_again_at (an etcd
// waiter's own lease ends then), so it comes up to a quarter of what is
// left early, by at most 750 ms (a slow round trip, a late timer) plus up to
// 1 s of jitter that spreads the contenders the store turned away; a short
// time left shrinks both, so the attempt never lands at once.
//
// Thread safety: ContendPeriod is immutable; Random implementations must be
// safe to call from several threads.

#ifndef SIMBA_CONTEND_PERIOD_H_
#define SIMBA_CONTEND_PERIOD_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "simba/backend.h"
#include "simba/mutex_owner.h"

namespace simba {

// A source of uniform random integers, injected so tests can fix the jitter.
class Random {
 public:
  virtual ~Random() = default;
  // A uniformly drawn integer in [lo, hi). Requires lo < hi.
  virtual std::int64_t uniform(std::int64_t lo, std::int64_t hi) = 0;
  // A thread-safe generator seeded from std::random_device.
  static std::shared_ptr<Random> standard();
};

class ContendPeriod {
 public:
  ContendPeriod(std::string contender_id, std::shared_ptr<Random> random);

  // The raw delay before the next attempt (may be negative).
  std::chrono::milliseconds next_delay(const MutexOwner& owner, StoreTime now) const;
  // next_delay clamped at zero.
  std::chrono::milliseconds ensure_next_delay(const MutexOwner& owner, StoreTime now) const;
  // The delay after a store's answer: by its ask_again_at when it set one
  // (the owner's times unknown), else ensure_next_delay(owner, store_now).
  // Never negative.
  std::chrono::milliseconds ensure_next_delay(const OwnerRecord& record) const;

  // Jitter bounds, in milliseconds.
  static constexpr std::int64_t kJitterMin = -200;
  static constexpr std::int64_t kJitterMax = 1000;
  // The most an ask-again attempt comes early besides its jitter.
  static constexpr std::chrono::milliseconds kAskAgainMargin{750};

 private:
  std::string contender_id_;
  std::shared_ptr<Random> random_;
};

}  // namespace simba

#endif  // SIMBA_CONTEND_PERIOD_H_
