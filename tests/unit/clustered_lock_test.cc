// ClusteredLockManager beyond the conformance suite (testing/
// clustered_conformance.cc): the threads it runs on.
#include "simba/clustered_lock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "simba/registry.h"
#include "testing/fault_injecting_backend.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

namespace simba {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::FaultInjectingBackend;
using testing::StatusIs;

// A manager over a factory runs on the factory's threads (it used to start
// a timer, two I/O and two callback threads of its own), and still frees
// its holds at the store before its destructor returns.
TEST(ClusteredLockManagerTest, RunsOnItsFactorysThreads) {
  auto store = open_backend("memory://clustered-threads").value();
  std::shared_ptr<MutexContendServiceFactory> factory =
      MutexContendServiceFactory::create(store).value();
  const int before = testing::count_threads();
  auto manager = ClusteredLockManager::create(factory).value();
  EXPECT_EQ(testing::count_threads(), before);
  ASSERT_TRUE(manager->define("job").value());
  auto lock = manager->get("job").value();
  ASSERT_THAT(lock->lock().get(), testing::IsOk());
  EXPECT_TRUE(lock->is_held());
  manager.reset();
  EXPECT_FALSE(lock->is_held());
  auto owner = store->read("job", std::chrono::steady_clock::now() + seconds(5));
  ASSERT_THAT(owner, testing::IsOk());
  EXPECT_FALSE(owner->owner.has_owner(owner->store_now)) << "the hold outlived its manager";
}

// A store that cannot be reached is waited for: try_lock(timeout) that runs
// out meanwhile says so (kUnavailable naming the cause), not "held"
// (false); lock() holds once the store is back. A store that refuses us
// fails every waiting call at once (issue #34).
TEST(ClusteredLockManagerTest, AnUnreachableStoreIsWaitedForARefusalFailsTheWaiters) {
  auto faults = std::make_shared<FaultInjectingBackend>(
      open_backend("memory://clustered-unreachable").value());
  faults->set_mode(FaultInjectingBackend::Mode::kFail);
  auto manager = ClusteredLockManager::create(faults).value();
  ASSERT_TRUE(manager->define("job").value());
  auto lock = manager->get("job").value();
  const auto started = std::chrono::steady_clock::now();
  const Result<bool> timed = lock->try_lock(milliseconds(600)).get();
  EXPECT_GE(std::chrono::steady_clock::now() - started, milliseconds(600));
  EXPECT_THAT(timed, StatusIs(StatusCode::kUnavailable,
                              ::testing::AllOf(::testing::HasSubstr("could not be reached"),
                                               ::testing::HasSubstr("injected failure"))));
  std::future<Status> waiting = lock->lock();
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(waiting.wait_for(milliseconds(0)), std::future_status::timeout)
      << "lock() gave up on a store that may come back";
  faults->set_mode(FaultInjectingBackend::Mode::kPass);
  ASSERT_EQ(waiting.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_THAT(waiting.get(), testing::IsOk());
  EXPECT_TRUE(lock->is_held());
  ASSERT_THAT(lock->unlock().get(), testing::IsOk());

  faults->set_failure_status(permission_denied_error("AUTH refused"));
  faults->set_mode(FaultInjectingBackend::Mode::kFail);
  std::future<Status> refused = lock->lock();
  std::future<Result<bool>> refused_timed = lock->try_lock(seconds(30));
  ASSERT_EQ(refused.wait_for(seconds(5)), std::future_status::ready) << "a refusal was waited out";
  EXPECT_THAT(refused.get(),
              StatusIs(StatusCode::kPermissionDenied, ::testing::HasSubstr("AUTH refused")));
  ASSERT_EQ(refused_timed.wait_for(seconds(5)), std::future_status::ready);
  EXPECT_THAT(refused_timed.get(), StatusIs(StatusCode::kPermissionDenied));
}

}  // namespace
}  // namespace simba
