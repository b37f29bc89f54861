// A one-way event for tests: Set() once, wait(timeout) from any thread.
#ifndef SIMBA_TESTING_LATCH_H_
#define SIMBA_TESTING_LATCH_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "testing/test_util.h"

namespace simba::testing {

class Latch {
 public:
  // Notifies under the lock: a waiter may destroy the Latch as soon as it
  // sees set_, which it can only do once Set() has let go of the lock.
  void set() {
    std::lock_guard<std::mutex> lock(mu_);
    set_ = true;
    cv_.notify_all();
  }
  bool is_set() const {
    std::lock_guard<std::mutex> lock(mu_);
    return set_;
  }
  // True if Set() happens within `timeout` (scaled by SIMBA_TEST_TIME_SCALE).
  bool wait(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, scaled(timeout), [this] { return set_; });
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool set_ = false;
};

}  // namespace simba::testing

#endif  // SIMBA_TESTING_LATCH_H_
