// A base fixture for tests of the core on virtual time: a ManualClock, a
// memory store driven by it, a FaultInjectingBackend in front of the store,
// and helpers to advance time only once the code under test waits.
#ifndef SIMBA_TESTING_VIRTUAL_TIME_TEST_H_
#define SIMBA_TESTING_VIRTUAL_TIME_TEST_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "core/runtime.h"
#include "simba/backends/memory.h"
#include "simba/contend_service.h"
#include "testing/fault_injecting_backend.h"
#include "testing/fixed_random.h"
#include "testing/test_util.h"

namespace simba::testing {

class VirtualTimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    store_ = new_memory_backend({std::string(info->test_suite_name()) + "." + info->name(), clock_})
                 .value();
    faults_ = std::make_shared<FaultInjectingBackend>(store_);
  }

  // A factory over `backend` on the virtual clock: ttl 10 s, transition 6 s
  // (JVM Simba's defaults), then whatever `adjust` changes.
  template <typename Adjust = void (*)(FactoryOptions&)>
  std::unique_ptr<MutexContendServiceFactory> make_factory(
      std::shared_ptr<Backend> backend, Adjust adjust = [](FactoryOptions&) {}) {
    FactoryOptions options;
    options.clock = clock_;
    options.contend.ttl = std::chrono::seconds(10);
    options.contend.transition = std::chrono::seconds(6);
    adjust(options);
    return MutexContendServiceFactory::create(std::move(backend), options).value();
  }

  // Lets the factory's threads react to what the test just did, when the test
  // wants to check that something did NOT happen: returns once every thread
  // waiting on the virtual clock has seen it move (a Scheduler's worker
  // too) and no runtime of the process has work left (no timer due, nothing
  // queued or running on its threads but the store calls hanging in faults_
  // on purpose). What is still to come then waits for the clock to move.
  void settle() {
    EXPECT_TRUE(eventually(
        [&] {
          return !clock_->has_due_waiter() &&
                 internal::Runtime::all_idle(static_cast<std::size_t>(faults_->hanging_calls()));
        },
        std::chrono::seconds(5)))
        << "the factory's threads never went idle";
  }

  // True once some thread waits for the virtual instant `from_now` ahead:
  // advancing before that would move the very deadline being tested.
  bool waiting(Clock::Duration from_now) {
    const auto at = clock_->now() + from_now;
    return eventually([&] { return clock_->has_waiter_until(at); }, std::chrono::seconds(5));
  }

  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>();
  std::shared_ptr<Backend> store_;                 // the memory store
  std::shared_ptr<FaultInjectingBackend> faults_;  // in front of store_
};

}  // namespace simba::testing

#endif  // SIMBA_TESTING_VIRTUAL_TIME_TEST_H_
