#include "simba/status.h"

#include <gtest/gtest.h>

#include <chrono>

namespace simba {
namespace {

using std::chrono::milliseconds;

Result<int> FailsWithHint() {
  return UnavailableError("guarded").WithRetryAfter(milliseconds(1500));
}

Result<int> PassesItOn() {
  SIMBA_ASSIGN_OR_RETURN(int value, FailsWithHint());
  return value;
}

TEST(Status, RetryAfterIsKeptThroughContextAndResults) {
  const Status plain = UnavailableError("down");
  EXPECT_FALSE(plain.retry_after().has_value());

  const Status hinted = plain.WithRetryAfter(milliseconds(250));
  ASSERT_TRUE(hinted.retry_after().has_value());
  EXPECT_EQ(*hinted.retry_after(), milliseconds(250));
  // A hint, not part of what the status says or compares.
  EXPECT_EQ(hinted.ToString(), plain.ToString());
  EXPECT_EQ(hinted, plain);

  const Status wrapped = hinted.WithContext("redis at h:1");
  EXPECT_EQ(wrapped.message(), "redis at h:1: down");
  EXPECT_EQ(wrapped.retry_after(), milliseconds(250));

  const Result<int> result = PassesItOn();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().retry_after(), milliseconds(1500));
}

TEST(Status, RetryAfterIsNeverNegativeAndNeverOnOk) {
  EXPECT_EQ(UnavailableError("x").WithRetryAfter(milliseconds(-5)).retry_after(),
            milliseconds(0));
  EXPECT_FALSE(OkStatus().WithRetryAfter(milliseconds(5)).retry_after().has_value());
}

}  // namespace
}  // namespace simba
