// The fault runs' protected resource (testing/fault_worker.h): it must turn
// away every token below the highest it accepted, in process and over its
// socket, or the checker would judge the store by a broken fence.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "simba/backends/memory.h"
#include "simba/clock.h"
#include "simba/contend_service.h"
#include "testing/fault_worker.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

namespace simba::testing {
namespace {

TEST(FencedRegister, AcceptsEqualOrHigherTokensAndRejectsLowerOnes) {
  auto clock = std::make_shared<ManualClock>();
  FencedRegister fence(clock);
  EXPECT_TRUE(*fence.write(1, 5, 0));
  EXPECT_TRUE(*fence.write(1, 5, 1)) << "the owner writes many times with one token";
  EXPECT_FALSE(*fence.write(2, 4, 0)) << "a stale token";
  clock->advance(std::chrono::milliseconds(3));
  EXPECT_TRUE(*fence.write(2, 7, 1));
  EXPECT_FALSE(*fence.write(1, 5, 2)) << "the old owner, after a newer one wrote";

  const auto decisions = fence.decisions();
  ASSERT_EQ(decisions.size(), 5u);
  EXPECT_FALSE(decisions[2].accepted);
  EXPECT_EQ(decisions[2].worker, 2);
  EXPECT_EQ(decisions[3].t - decisions[2].t, 3'000'000) << "decisions carry the clock's time";
  ASSERT_TRUE(fence.last_accepted().has_value());
  EXPECT_EQ(fence.last_accepted()->token, 7u);
}

TEST(FencedRegister, ServesWorkersOverAUnixSocket) {
  TempDir dir;
  FencedRegister fence(Clock::steady());
  auto server = FencedRegisterServer::start(dir.path() + "/fence.sock", &fence);
  SIMBA_ASSERT_OK(server.status());
  FencedRegisterClient a(dir.path() + "/fence.sock");
  FencedRegisterClient b(dir.path() + "/fence.sock");
  EXPECT_TRUE(*a.write(1, 10, 0));
  EXPECT_TRUE(*b.write(2, 11, 0));
  EXPECT_FALSE(*a.write(1, 10, 1));
  EXPECT_EQ(fence.decisions().size(), 3u);
}

TEST(FencedRegister, AClientWithoutAServerGetsAnErrorNotAHang) {
  TempDir dir;
  FencedRegisterClient client(dir.path() + "/nobody.sock");
  const Result<bool> r = client.write(1, 1, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
}

// A clock that notes, each time the watching thread reads it, which token
// the worker had published to its writing loop by then (reads by the
// service's own threads are not noted).
class SpyClock final : public Clock {
 public:
  explicit SpyClock(std::shared_ptr<ManualClock> base) : base_(std::move(base)) {}
  TimePoint now() const override {
    const FaultWorker* worker = worker_.load();
    if (worker != nullptr && std::this_thread::get_id() == watcher_) {
      seen_.push_back(worker->published_token());
    }
    return base_->now();
  }
  void wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                  TimePoint deadline) const override {
    base_->wait_until(cv, lock, deadline);
  }
  // Call before any thread of the service can read the clock's worker_.
  void watch(const FaultWorker* worker) {
    watcher_ = std::this_thread::get_id();
    worker_ = worker;
  }
  const std::vector<std::uint64_t>& seen() const { return seen_; }

 private:
  std::shared_ptr<ManualClock> base_;
  std::atomic<const FaultWorker*> worker_{nullptr};
  std::thread::id watcher_;
  mutable std::vector<std::uint64_t> seen_;
};

// on_acquired stamps its ev=acquired before the writing loop can see the
// token: the loop reads the clock for its ownership check after it read the
// token, so every write is no earlier than the acquisition it belongs to. The
// other order let a write's check fall before its tenure's logged start (a
// false write-outside-tenure).
TEST(FaultWorker, OnAcquiredReadsTheClockBeforeItPublishesTheToken) {
  auto base = std::make_shared<ManualClock>();
  auto spy = std::make_shared<SpyClock>(base);
  FactoryOptions options;
  options.clock = spy;
  auto factory =
      MutexContendServiceFactory::create(new_memory_backend({"spy", spy}).value(), options);
  SIMBA_ASSERT_OK(factory.status());
  FencedRegister fence(base);
  FaultWorker worker(
      factory->get(), &fence, [](const std::string&) {}, FaultWorkerOptions{});
  spy->watch(&worker);
  base->advance(std::chrono::milliseconds(7));
  const WorkerEvent e = worker.publish_acquired(*spy, 42);
  EXPECT_EQ(e.kind, WorkerEvent::Kind::kAcquired);
  EXPECT_EQ(e.token, 42u);
  EXPECT_EQ(e.t, now_nanos(*base));
  EXPECT_EQ(worker.published_token(), 42u);
  ASSERT_EQ(spy->seen().size(), 1u) << "one clock read, for the event's time";
  EXPECT_EQ(spy->seen()[0], 0u) << "the time was read after the token was published";
}

}  // namespace
}  // namespace simba::testing
