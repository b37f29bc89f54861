// The shared threads: timers on an injected clock, cancellation, strands.
#include "core/runtime.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "testing/latch.h"
#include "testing/test_util.h"

namespace simba::internal {
namespace {

using simba::testing::eventually;
using simba::testing::Latch;
using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(RuntimeTest, TimersRunInDueOrderOnTheInjectedClock) {
  auto clock = std::make_shared<ManualClock>();
  Runtime runtime(clock, 1, 1);
  std::mutex mu;
  std::vector<int> order;
  auto add = [&](int v) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(v);
  };
  runtime.schedule_at(clock->now() + seconds(3), [&] { add(3); });
  runtime.schedule_at(clock->now() + seconds(1), [&] { add(1); });
  const auto cancelled = runtime.schedule_at(clock->now() + seconds(2), [&] { add(2); });
  runtime.cancel(cancelled);
  std::this_thread::sleep_for(milliseconds(20));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(order.empty());
  }
  clock->advance(seconds(5));
  ASSERT_TRUE(eventually(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return order.size() == 2;
      },
      seconds(5)));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(order, (std::vector<int>{1, 3}));
}

// The timer thread is woken only by a timer due before the one it sleeps
// for; a later one, or one after a cancelled one, is still found in time.
TEST(RuntimeTest, ATimerDueSoonerWakesTheTimerThreadAndLaterOnesStillRun) {
  Runtime runtime(Clock::steady(), 1, 1);
  Latch late_ran;
  Latch soon_ran;
  Latch after_cancel_ran;
  runtime.schedule_at(std::chrono::steady_clock::now() + seconds(60), [] {});
  // The timer thread asleep until then.
  std::this_thread::sleep_for(milliseconds(50));
  const auto now = std::chrono::steady_clock::now();
  runtime.schedule_at(now + milliseconds(60), [&] { late_ran.set(); });
  runtime.schedule_at(now + milliseconds(20), [&] { soon_ran.set(); });
  const auto cancelled = runtime.schedule_at(now + milliseconds(80), [] {});
  runtime.cancel(cancelled);
  runtime.schedule_at(now + milliseconds(100), [&] { after_cancel_ran.set(); });
  EXPECT_TRUE(soon_ran.wait(seconds(5)));
  EXPECT_TRUE(late_ran.wait(seconds(5)));
  EXPECT_TRUE(after_cancel_ran.wait(seconds(5)));
}

TEST(RuntimeTest, StrandRunsTasksOneAtATimeInOrder) {
  Runtime runtime(Clock::steady(), 1, 4);
  auto strand = runtime.make_strand();
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  std::vector<int> order;
  for (int i = 0; i < 200; ++i) {
    strand->post([&, i] {
      if (inside.fetch_add(1) != 0) overlapped = true;
      order.push_back(i);
      inside.fetch_sub(1);
    });
  }
  strand->drain();
  EXPECT_FALSE(overlapped.load());
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
}

TEST(RuntimeTest, ShutdownRunsQueuedWorkAndRefusesNewWork) {
  auto runtime = std::make_unique<Runtime>(Clock::steady(), 1, 1);
  std::atomic<int> ran{0};
  for (int i = 0; i < 10; ++i) runtime->post_io([&] { ++ran; });
  runtime->shutdown();
  EXPECT_EQ(ran.load(), 10);
  EXPECT_FALSE(runtime->post_io([&] { ++ran; }));
  EXPECT_EQ(runtime->schedule_at(Clock::steady()->now(), [] {}), 0u);
  EXPECT_TRUE(runtime->closed());
}

// The last owner may drop a Runtime from one of its own timers (a factory
// closed by a callback on the timer thread). Shutdown cannot join that
// thread: it must end by itself without touching the freed Runtime (ASan
// reports a use after free if the timer loop returns into it).
TEST(RuntimeTest, ARuntimeDestroyedFromItsOwnTimerLetsThatThreadEndCleanly) {
  auto clock = std::make_shared<ManualClock>();
  auto runtime = std::make_shared<Runtime>(clock, 1, 1);
  const int threads = simba::testing::count_threads();
  Latch io_ran;
  Latch destroyed;
  std::atomic<bool> late_timer_ran{false};
  // Due after the Runtime is gone: dropped by Shutdown, never run.
  runtime->schedule_at(clock->now() + seconds(1), [&] { late_timer_ran = true; });
  // Due once the clock moves, after ScheduleAt has returned: its caller
  // holds the Runtime until then.
  runtime->schedule_at(clock->now() + milliseconds(500), [&] {
    // Queued before the Runtime goes: it still runs (Shutdown drains).
    ASSERT_TRUE(runtime->post_io([&] { io_ran.set(); }));
    std::shared_ptr<Runtime> last = std::move(runtime);
    last.reset();
    destroyed.set();
  });
  clock->advance(milliseconds(500));
  ASSERT_TRUE(destroyed.wait(milliseconds(10000)));
  EXPECT_TRUE(io_ran.wait(milliseconds(10000)));
  // The timer thread and both pools' threads end.
  EXPECT_TRUE(eventually([&] { return simba::testing::count_threads() <= threads - 3; },
                         milliseconds(10000)));
  clock->advance(seconds(2));
  EXPECT_FALSE(late_timer_ran.load());
}

}  // namespace
}  // namespace simba::internal
