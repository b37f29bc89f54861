// LockEvent names, JSON lines and text forms (simba/events.h).
#include "simba/events.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "simba/status.h"

namespace simba {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// 2026-11-21T21:40:13.123Z
const std::chrono::system_clock::time_point kTime{milliseconds(1795297213123)};

LockEvent event(LockEvent::Kind kind) {
  LockEvent e;
  e.kind = kind;
  e.store = "redis";
  e.mutex = "report";
  e.contender_id = "1:42@host/ab12cd34";
  e.fencing_token = 7;
  e.time = kTime;
  return e;
}

LockEvent acquired() {
  LockEvent e = event(LockEvent::Kind::kAcquired);
  e.lease_left = milliseconds(15800);
  e.waited = microseconds(1234567);
  e.handoff = microseconds(3000);
  return e;
}

LockEvent renewed() {
  LockEvent e = event(LockEvent::Kind::kRenewed);
  e.lease_left = milliseconds(16000);
  e.margin = microseconds(9600500);
  return e;
}

LockEvent lost() {
  LockEvent e = event(LockEvent::Kind::kLost);
  e.cause = LossCause::kOtherOwner;
  e.error = aborted_error("the store names another owner");
  return e;
}

LockEvent store_error() {
  LockEvent e = event(LockEvent::Kind::kStoreError);
  e.fencing_token = 0;
  e.error = unavailable_error("connection refused");
  return e;
}

constexpr char kBase[] =
    R"({"event":"%s","time":"2026-11-21T21:40:13.123Z","store":"redis","mutex":"report",)"
    R"("contender":"1:42@host/ab12cd34","token":)";

std::string base(const std::string& kind) {
  std::string base = kBase;
  return base.replace(base.find("%s"), 2, kind);
}

TEST(LockEventNamesTest, LossCauses) {
  EXPECT_EQ(loss_cause_name(LossCause::kRenewalFailed), "renewal_failed");
  EXPECT_EQ(loss_cause_name(LossCause::kDeadlinePassed), "deadline_passed");
  EXPECT_EQ(loss_cause_name(LossCause::kOtherOwner), "other_owner");
  EXPECT_EQ(loss_cause_name(LossCause::kForcedRelease), "forced_release");
}

TEST(LockEventNamesTest, Kinds) {
  EXPECT_EQ(lock_event_kind_name(LockEvent::Kind::kAcquired), "acquired");
  EXPECT_EQ(lock_event_kind_name(LockEvent::Kind::kRenewed), "renewed");
  EXPECT_EQ(lock_event_kind_name(LockEvent::Kind::kLost), "lost");
  EXPECT_EQ(lock_event_kind_name(LockEvent::Kind::kReleased), "released");
  EXPECT_EQ(lock_event_kind_name(LockEvent::Kind::kStoreError), "store_error");
}

TEST(LockEventJsonTest, Acquired) {
  EXPECT_EQ(lock_event_json(acquired()),
            base("acquired") + R"(7,"lease_left_ms":15800,"waited_ms":1234.567,"handoff_ms":3})");
}

TEST(LockEventJsonTest, Renewed) {
  EXPECT_EQ(lock_event_json(renewed()),
            base("renewed") + R"(7,"lease_left_ms":16000,"margin_ms":9600.5})");
}

TEST(LockEventJsonTest, Lost) {
  EXPECT_EQ(lock_event_json(lost()),
            base("lost") +
                R"(7,"cause":"other_owner","error":"ABORTED: the store names another owner"})");
}

TEST(LockEventJsonTest, Released) {
  EXPECT_EQ(lock_event_json(event(LockEvent::Kind::kReleased)), base("released") + "7}");
}

TEST(LockEventJsonTest, StoreError) {
  EXPECT_EQ(lock_event_json(store_error()),
            base("store_error") + R"(0,"error":"UNAVAILABLE: connection refused"})");
  LockEvent e = store_error();
  e.retry_in = std::chrono::milliseconds(250);
  EXPECT_EQ(
      lock_event_json(e),
      base("store_error") + R"(0,"retry_in_ms":250,"error":"UNAVAILABLE: connection refused"})");
}

TEST(LockEventJsonTest, UnsetFieldsAreOmitted) {
  LockEvent e = event(LockEvent::Kind::kAcquired);
  e.waited = microseconds(0);  // set, though zero
  const std::string json = lock_event_json(e);
  EXPECT_EQ(json, base("acquired") + R"(7,"waited_ms":0})");
  for (const char* key : {"lease_left_ms", "handoff_ms", "margin_ms", "cause", "error"}) {
    EXPECT_EQ(json.find(key), std::string::npos) << key;
  }
}

TEST(LockEventJsonTest, MillisecondsKeepUpToThreeDecimals) {
  LockEvent e = event(LockEvent::Kind::kRenewed);
  e.margin = microseconds(12300);
  EXPECT_NE(lock_event_json(e).find(R"("margin_ms":12.3})"), std::string::npos);
  e.margin = microseconds(1);
  EXPECT_NE(lock_event_json(e).find(R"("margin_ms":0.001})"), std::string::npos);
  e.margin = microseconds(-2500);
  EXPECT_NE(lock_event_json(e).find(R"("margin_ms":-2.5})"), std::string::npos);
}

TEST(LockEventJsonTest, EscapesStrings) {
  LockEvent e = event(LockEvent::Kind::kReleased);
  e.mutex =
      "a\"b\\c\nd\te\x01"
      "f/\xc3\xa9\x7f";
  e.store = "st\rore";
  e.contender_id = "c\x1f";
  EXPECT_EQ(lock_event_json(e),
            R"({"event":"released","time":"2026-11-21T21:40:13.123Z","store":"st\rore",)"
            R"("mutex":"a\"b\\c\nd\te\u0001f/)"
            "\xc3\xa9"
            R"(\u007f","contender":"c\u001f","token":7})");
}

TEST(LockEventJsonTest, ErrorMessageIsEscaped) {
  LockEvent e = store_error();
  e.error = unavailable_error("said \"no\"\n");
  EXPECT_NE(lock_event_json(e).find(R"("error":"UNAVAILABLE: said \"no\"\n"})"), std::string::npos);
}

TEST(LockEventJsonTest, TimeIsUtcWithMillisecondsTruncated) {
  LockEvent e = event(LockEvent::Kind::kReleased);
  e.time = std::chrono::system_clock::time_point{microseconds(1795297213123999)};
  EXPECT_NE(lock_event_json(e).find(R"("time":"2026-11-21T21:40:13.123Z")"), std::string::npos);
  e.time = std::chrono::system_clock::time_point{};
  EXPECT_NE(lock_event_json(e).find(R"("time":"1970-01-01T00:00:00.000Z")"), std::string::npos);
  // Leap day, last millisecond of the day.
  e.time = std::chrono::system_clock::time_point{milliseconds(1709251199999)};
  EXPECT_NE(lock_event_json(e).find(R"("time":"2024-02-29T23:59:59.999Z")"), std::string::npos);
}

TEST(LockEventJsonTest, IsOneLine) {
  for (const LockEvent& e : {acquired(), renewed(), lost(), store_error()}) {
    const std::string json = lock_event_json(e);
    EXPECT_EQ(json.find('\n'), std::string::npos) << json;
    EXPECT_EQ(json.front(), '{');
    EXPECT_EQ(json.back(), '}');
  }
}

TEST(LockEventTextTest, Acquired) {
  LockEvent e = acquired();
  e.contender_id = "C";
  EXPECT_EQ(lock_event_text(e),
            "acquired mutex 'report' as C (token 7, lease 15.8s left, waited 1.2s, hand-off 3ms)");
  e.lease_left.reset();
  e.waited.reset();
  e.handoff.reset();
  EXPECT_EQ(lock_event_text(e), "acquired mutex 'report' as C (token 7)");
}

TEST(LockEventTextTest, Renewed) {
  EXPECT_EQ(lock_event_text(renewed()),
            "renewed mutex 'report' (token 7, 9.6s of the lease was left, now 16.0s left)");
}

TEST(LockEventTextTest, Lost) {
  EXPECT_EQ(lock_event_text(lost()),
            "lost mutex 'report' (token 7): other_owner - the store names another owner");
  LockEvent e = lost();
  e.error = Status();
  EXPECT_EQ(lock_event_text(e), "lost mutex 'report' (token 7): other_owner");
}

TEST(LockEventTextTest, Released) {
  EXPECT_EQ(lock_event_text(event(LockEvent::Kind::kReleased)),
            "released mutex 'report' (token 7)");
}

TEST(LockEventTextTest, StoreError) {
  EXPECT_EQ(lock_event_text(store_error()),
            "store unreachable for mutex 'report' (UNAVAILABLE: connection refused)");
  LockEvent e = store_error();
  e.fencing_token = 9;
  e.retry_in = std::chrono::milliseconds(400);
  EXPECT_EQ(lock_event_text(e),
            "store unreachable for mutex 'report' (token 9), retrying in 400ms (UNAVAILABLE: "
            "connection refused)");
  // A store that refuses the call (it is retried by a running service too,
  // but a waiting acquire gives up at once).
  e.fencing_token = 0;
  e.error = permission_denied_error("AUTH refused");
  EXPECT_EQ(lock_event_text(e),
            "store refused the call for mutex 'report', retrying in 400ms (PERMISSION_DENIED: AUTH "
            "refused)");
}

TEST(LockEventTextTest, Durations) {
  LockEvent e = event(LockEvent::Kind::kAcquired);
  e.contender_id = "C";
  const auto waited = [&e](microseconds us) {
    e.waited = us;
    const std::string text = lock_event_text(e);
    const auto start = text.find("waited ") + 7;
    return text.substr(start, text.find(')', start) - start);
  };
  EXPECT_EQ(waited(microseconds(250)), "0.25ms");
  EXPECT_EQ(waited(microseconds(0)), "0ms");
  EXPECT_EQ(waited(microseconds(3000)), "3ms");
  EXPECT_EQ(waited(microseconds(999400)), "999ms");
  EXPECT_EQ(waited(microseconds(999600)), "1.0s");
  EXPECT_EQ(waited(microseconds(15'840'000)), "15.8s");
  EXPECT_EQ(waited(microseconds(125'000'000)), "125.0s");
}

TEST(LockEventTextTest, OddMutexNameStaysOnOneLine) {
  LockEvent e = event(LockEvent::Kind::kReleased);
  e.mutex = "it's\na\\b";
  EXPECT_EQ(lock_event_text(e), "released mutex 'it\\'s\\x0aa\\\\b' (token 7)");
}

TEST(LockEventTextTest, IsPlainAscii) {
  for (const LockEvent& e : {acquired(), renewed(), lost(), store_error()}) {
    for (const char c : lock_event_text(e)) {
      EXPECT_TRUE(static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f)
          << lock_event_text(e);
    }
  }
}

}  // namespace
}  // namespace simba
