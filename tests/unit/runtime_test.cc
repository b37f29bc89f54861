// The shared threads: timers on an injected clock, cancellation, strands.
#include "core/runtime.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "testing/test_util.h"

namespace simba::internal {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using simba::testing::Eventually;

TEST(RuntimeTest, TimersRunInDueOrderOnTheInjectedClock) {
  auto clock = std::make_shared<ManualClock>();
  Runtime runtime(clock, 1, 1);
  std::mutex mu;
  std::vector<int> order;
  auto add = [&](int v) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(v);
  };
  runtime.ScheduleAt(clock->Now() + seconds(3), [&] { add(3); });
  runtime.ScheduleAt(clock->Now() + seconds(1), [&] { add(1); });
  const auto cancelled = runtime.ScheduleAt(clock->Now() + seconds(2), [&] { add(2); });
  runtime.Cancel(cancelled);
  std::this_thread::sleep_for(milliseconds(20));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(order.empty());
  }
  clock->Advance(seconds(5));
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> lock(mu);
    return order.size() == 2;
  }, seconds(5)));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(order, (std::vector<int>{1, 3}));
}

TEST(RuntimeTest, StrandRunsTasksOneAtATimeInOrder) {
  Runtime runtime(Clock::Steady(), 1, 4);
  auto strand = runtime.MakeStrand();
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  std::vector<int> order;
  for (int i = 0; i < 200; ++i) {
    strand->Post([&, i] {
      if (inside.fetch_add(1) != 0) overlapped = true;
      order.push_back(i);
      inside.fetch_sub(1);
    });
  }
  strand->Drain();
  EXPECT_FALSE(overlapped.load());
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
}

TEST(RuntimeTest, ShutdownRunsQueuedWorkAndRefusesNewWork) {
  auto runtime = std::make_unique<Runtime>(Clock::Steady(), 1, 1);
  std::atomic<int> ran{0};
  for (int i = 0; i < 10; ++i) runtime->PostIo([&] { ++ran; });
  runtime->Shutdown();
  EXPECT_EQ(ran.load(), 10);
  EXPECT_FALSE(runtime->PostIo([&] { ++ran; }));
  EXPECT_EQ(runtime->ScheduleAt(Clock::Steady()->Now(), [] {}), 0u);
  EXPECT_TRUE(runtime->closed());
}

}  // namespace
}  // namespace simba::internal
