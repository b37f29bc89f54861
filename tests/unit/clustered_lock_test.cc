// ClusteredLockManager beyond the conformance suite (testing/
// clustered_conformance.cc): the threads it runs on.
#include "simba/clustered_lock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "simba/registry.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

namespace simba {
namespace {

using std::chrono::seconds;

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

}  // namespace
}  // namespace simba
