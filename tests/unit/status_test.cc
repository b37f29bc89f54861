#include "simba/status.h"

#include <gtest/gtest.h>

#include <chrono>

namespace simba {
namespace {

using std::chrono::milliseconds;

Result<int> fails_with_hint() {
  return unavailable_error("guarded").with_retry_after(milliseconds(1500));
}

Result<int> passes_it_on() {
  SIMBA_ASSIGN_OR_RETURN(int value, fails_with_hint());
  return value;
}

TEST(Status, RetryAfterIsKeptThroughContextAndResults) {
  const Status plain = unavailable_error("down");
  EXPECT_FALSE(plain.retry_after().has_value());

  const Status hinted = plain.with_retry_after(milliseconds(250));
  ASSERT_TRUE(hinted.retry_after().has_value());
  EXPECT_EQ(*hinted.retry_after(), milliseconds(250));
  // A hint, not part of what the status says or compares.
  EXPECT_EQ(hinted.to_string(), plain.to_string());
  EXPECT_EQ(hinted, plain);

  const Status wrapped = hinted.with_context("redis at h:1");
  EXPECT_EQ(wrapped.message(), "redis at h:1: down");
  EXPECT_EQ(wrapped.retry_after(), milliseconds(250));

  const Result<int> result = passes_it_on();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().retry_after(), milliseconds(1500));
}

TEST(Status, RetryAfterIsNeverNegativeAndNeverOnOk) {
  EXPECT_EQ(unavailable_error("x").with_retry_after(milliseconds(-5)).retry_after(),
            milliseconds(0));
  EXPECT_FALSE(ok_status().with_retry_after(milliseconds(5)).retry_after().has_value());
}

}  // namespace
}  // namespace simba
