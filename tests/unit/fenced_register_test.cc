// The fault runs' protected resource (testing/fault_worker.h): it must turn
// away every token below the highest it accepted, in process and over its
// socket, or the checker would judge the store by a broken fence.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "simba/clock.h"
#include "testing/fault_worker.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

namespace simba::testing {
namespace {

TEST(FencedRegister, AcceptsEqualOrHigherTokensAndRejectsLowerOnes) {
  auto clock = std::make_shared<ManualClock>();
  FencedRegister fence(clock);
  EXPECT_TRUE(*fence.Write(1, 5, 0));
  EXPECT_TRUE(*fence.Write(1, 5, 1)) << "the owner writes many times with one token";
  EXPECT_FALSE(*fence.Write(2, 4, 0)) << "a stale token";
  clock->Advance(std::chrono::milliseconds(3));
  EXPECT_TRUE(*fence.Write(2, 7, 1));
  EXPECT_FALSE(*fence.Write(1, 5, 2)) << "the old owner, after a newer one wrote";

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
  FencedRegister fence(Clock::Steady());
  auto server = FencedRegisterServer::Start(dir.path() + "/fence.sock", &fence);
  SIMBA_ASSERT_OK(server.status());
  FencedRegisterClient a(dir.path() + "/fence.sock");
  FencedRegisterClient b(dir.path() + "/fence.sock");
  EXPECT_TRUE(*a.Write(1, 10, 0));
  EXPECT_TRUE(*b.Write(2, 11, 0));
  EXPECT_FALSE(*a.Write(1, 10, 1));
  EXPECT_EQ(fence.decisions().size(), 3u);
}

TEST(FencedRegister, AClientWithoutAServerGetsAnErrorNotAHang) {
  TempDir dir;
  FencedRegisterClient client(dir.path() + "/nobody.sock");
  const Result<bool> r = client.Write(1, 1, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace simba::testing
