// A Random (simba/contend_period.h) that always draws the same value, so a
// test can pin the contender's jitter (or any draw) to a known point.
#ifndef SIMBA_TESTING_FIXED_RANDOM_H_
#define SIMBA_TESTING_FIXED_RANDOM_H_

#include <algorithm>
#include <cstdint>

#include "simba/contend_period.h"

namespace simba::testing {

// Returns `value` clamped into the requested range [lo, hi), and remembers
// the last range asked for.
class FixedRandom final : public Random {
 public:
  explicit FixedRandom(std::int64_t value) : value_(value) {}
  std::int64_t uniform(std::int64_t lo, std::int64_t hi) override {
    last_lo = lo;
    last_hi = hi;
    return std::clamp(value_, lo, hi - 1);
  }
  std::int64_t last_lo = 0, last_hi = 0;

 private:
  std::int64_t value_;
};

}  // namespace simba::testing

#endif  // SIMBA_TESTING_FIXED_RANDOM_H_
