// Scheduler on virtual time (memory store + ManualClock).
#include "simba/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "simba/backends/memory.h"
#include "testing/fault_injecting_backend.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"
#include "testing/virtual_time_test.h"

namespace simba {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::eventually;
using testing::FaultInjectingBackend;

class SchedulerTest : public testing::VirtualTimeTest {
 protected:
  void SetUp() override {
    VirtualTimeTest::SetUp();
    factory_ = make_factory(faults_);
  }

  std::unique_ptr<MutexContendServiceFactory> factory_;  // through faults_
};

TEST_F(SchedulerTest, FixedRateRunsAfterTheInitialDelayThenEveryPeriod) {
  std::atomic<int> runs{0};
  std::atomic<std::uint64_t> token{0};
  auto scheduler =
      Scheduler::create(*factory_, "job", ScheduleConfig::fixed_rate(seconds(2), seconds(3)),
                        [&](const WorkContext& ctx) {
                          token = ctx.fencing_token;
                          ++runs;
                        })
          .value();
  SIMBA_ASSERT_OK(scheduler->start());
  ASSERT_TRUE(eventually([&] { return scheduler->is_leader(); }, seconds(5)));
  ASSERT_TRUE(waiting(seconds(2)));
  EXPECT_EQ(runs.load(), 0);
  clock_->advance(seconds(2));
  ASSERT_TRUE(eventually([&] { return runs.load() == 1; }, seconds(5)));
  EXPECT_GT(token.load(), 0u);
  ASSERT_TRUE(waiting(seconds(3)));
  clock_->advance(seconds(2));
  settle();
  EXPECT_EQ(runs.load(), 1);
  clock_->advance(seconds(1));
  ASSERT_TRUE(eventually([&] { return runs.load() == 2; }, seconds(5)));
  ASSERT_TRUE(waiting(seconds(3)));
  clock_->advance(seconds(3));
  ASSERT_TRUE(eventually([&] { return runs.load() == 3; }, seconds(5)));
  SIMBA_ASSERT_OK(scheduler->stop());
  EXPECT_FALSE(scheduler->running());
  clock_->advance(seconds(10));
  settle();
  EXPECT_EQ(runs.load(), 3);
}

TEST_F(SchedulerTest, LosingLeadershipStopsTheRunAndTheSchedule) {
  std::atomic<int> runs{0};
  std::atomic<bool> saw_stop{false};
  std::atomic<bool> in_run{false};
  auto scheduler =
      Scheduler::create(*factory_, "job", ScheduleConfig::fixed_delay(seconds(0), seconds(1)),
                        [&](const WorkContext& ctx) {
                          ++runs;
                          in_run = true;
                          // A long run that honours its stop token.
                          while (!ctx.stop_token.stop_requested()) {
                            std::this_thread::sleep_for(milliseconds(1));
                          }
                          saw_stop = true;
                          in_run = false;
                        })
          .value();
  SIMBA_ASSERT_OK(scheduler->start());
  ASSERT_TRUE(eventually([&] { return in_run.load(); }, seconds(5)));
  faults_->set_mode(FaultInjectingBackend::Mode::kFail);
  clock_->advance(seconds(16));
  ASSERT_TRUE(eventually([&] { return saw_stop.load(); }, seconds(5)));
  EXPECT_FALSE(scheduler->is_leader());
  const int after_loss = runs.load();
  clock_->advance(seconds(5));
  settle();
  EXPECT_EQ(runs.load(), after_loss) << "work ran without leadership";
  faults_->set_mode(FaultInjectingBackend::Mode::kPass);
  SIMBA_ASSERT_OK(scheduler->stop());
}

TEST_F(SchedulerTest, FixedDelayCountsFromTheEndOfARun) {
  std::atomic<int> runs{0};
  auto scheduler =
      Scheduler::create(*factory_, "job", ScheduleConfig::fixed_delay(seconds(0), seconds(4)),
                        [&](const WorkContext&) {
                          ++runs;
                          // The run itself takes 3 s of virtual time.
                          clock_->advance(seconds(3));
                        })
          .value();
  SIMBA_ASSERT_OK(scheduler->start());
  ASSERT_TRUE(eventually([&] { return runs.load() == 1; }, seconds(5)));
  ASSERT_TRUE(waiting(seconds(4)));
  clock_->advance(seconds(3));  // 3 s after the run ended: not yet
  settle();
  EXPECT_EQ(runs.load(), 1);
  clock_->advance(seconds(1));
  ASSERT_TRUE(eventually([&] { return runs.load() == 2; }, seconds(5)));
  SIMBA_ASSERT_OK(scheduler->stop());
}

TEST_F(SchedulerTest, WorkExceptionsDoNotStopTheSchedule) {
  std::atomic<int> runs{0};
  auto scheduler =
      Scheduler::create(*factory_, "job", ScheduleConfig::fixed_rate(seconds(0), seconds(1)),
                        [&](const WorkContext&) {
                          ++runs;
                          throw std::runtime_error("boom");
                        })
          .value();
  SIMBA_ASSERT_OK(scheduler->start());
  ASSERT_TRUE(eventually([&] { return runs.load() == 1; }, seconds(5)));
  ASSERT_TRUE(waiting(seconds(1)));
  clock_->advance(seconds(1));
  ASSERT_TRUE(eventually([&] { return runs.load() == 2; }, seconds(5)));
  SIMBA_ASSERT_OK(scheduler->stop());
}

TEST_F(SchedulerTest, MisuseIsRejected) {
  auto scheduler =
      Scheduler::create(*factory_, "job", ScheduleConfig::fixed_rate(seconds(0), seconds(1)),
                        [](const WorkContext&) {})
          .value();
  EXPECT_THAT(scheduler->stop(), testing::StatusIs(StatusCode::kFailedPrecondition));
  SIMBA_ASSERT_OK(scheduler->start());
  EXPECT_THAT(scheduler->start(), testing::StatusIs(StatusCode::kFailedPrecondition));
  SIMBA_ASSERT_OK(scheduler->stop());
  EXPECT_THAT(
      Scheduler::create(*factory_, "job", ScheduleConfig::fixed_rate(seconds(-1), seconds(1)),
                        [](const WorkContext&) {})
          .status(),
      testing::StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("initial_delay")));
  EXPECT_THAT(Scheduler::create(*factory_, "job", ScheduleConfig{}, nullptr).status(),
              testing::StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("work")));
}

}  // namespace
}  // namespace simba
