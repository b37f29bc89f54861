// gtest helpers that name the status code a test expects (there is
// deliberately no "expect not OK": a test says which error it wants).
#ifndef SIMBA_TESTING_STATUS_MATCHERS_H_
#define SIMBA_TESTING_STATUS_MATCHERS_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "simba/status.h"

namespace simba {
// Readable failure messages: "UNAVAILABLE: ..." instead of a byte dump.
inline void PrintTo(const Status& status, std::ostream* os) { *os << status.to_string(); }
template <typename T>
void PrintTo(const Result<T>& result, std::ostream* os) {
  *os << (result.ok() ? std::string("OK (a value)") : result.status().to_string());
}
}  // namespace simba

namespace simba::testing {

inline const Status& get_status(const Status& s) { return s; }
template <typename T>
Status get_status(const Result<T>& r) {
  return r.status();
}

MATCHER(IsOk, "is OK") {
  const Status s = ::simba::testing::get_status(arg);
  if (!s.ok()) *result_listener << "which is " << s.to_string();
  return s.ok();
}

MATCHER_P(StatusIs, code, "has code " + std::string(::simba::status_code_name(code))) {
  const Status s = ::simba::testing::get_status(arg);
  *result_listener << "which is " << s.to_string();
  return s.code() == code;
}

MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + std::string(::simba::status_code_name(code)) + " and a message that " +
               ::testing::DescribeMatcher<std::string>(message_matcher)) {
  const Status s = ::simba::testing::get_status(arg);
  *result_listener << "whose status is " << s.to_string();
  return s.code() == code &&
         ::testing::ExplainMatchResult(message_matcher, s.message(), result_listener);
}

// A Result that is OK and whose value matches `value_matcher`.
MATCHER_P(IsOkAndHolds, value_matcher, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "which is " << arg.status().to_string();
    return false;
  }
  return ::testing::ExplainMatchResult(value_matcher, *arg, result_listener);
}

}  // namespace simba::testing

#define SIMBA_EXPECT_OK(expr) EXPECT_THAT((expr), ::simba::testing::IsOk())
#define SIMBA_ASSERT_OK(expr) ASSERT_THAT((expr), ::simba::testing::IsOk())

#endif  // SIMBA_TESTING_STATUS_MATCHERS_H_
