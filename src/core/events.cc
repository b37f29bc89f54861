// Lock events as names, JSON lines and human one-liners (simba/events.h).
#include "simba/events.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "core/json.h"

namespace simba {
namespace {

using internal::append_json_string;
using std::chrono::microseconds;

// "2026-11-21T21:40:13.123Z": UTC, milliseconds, the time truncated toward
// the past (so a time never prints later than it was).
std::string rfc3339_millis(std::chrono::system_clock::time_point time) {
  using namespace std::chrono;
  const auto ms = floor<milliseconds>(time.time_since_epoch());
  const auto day = floor<days>(ms);
  const year_month_day ymd{sys_days{day}};
  const hh_mm_ss<milliseconds> hms{ms - day};
  char buf[40];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02uT%02d:%02d:%02d.%03dZ",
                static_cast<int>(ymd.year()), static_cast<unsigned>(ymd.month()),
                static_cast<unsigned>(ymd.day()), static_cast<int>(hms.hours().count()),
                static_cast<int>(hms.minutes().count()), static_cast<int>(hms.seconds().count()),
                static_cast<int>(hms.subseconds().count()));
  return buf;
}

// `us` in milliseconds with up to 3 decimals and no trailing zeros:
// 12345us -> "12.345", 12300us -> "12.3", 12000us -> "12".
std::string millis_from_micros(microseconds us) { return internal::fixed_point(us.count(), 3); }

// A duration for people: "250us" is not a unit anyone reads in a log, so
// below 1 ms it is "0.25ms"; below 1 s whole milliseconds ("312ms"); else
// seconds with one decimal ("15.8s").
std::string human_duration(microseconds us) {
  const std::int64_t v = us.count();
  if (v < 0) return "-" + human_duration(microseconds(v == INT64_MIN ? INT64_MAX : -v));
  if (v < 1000) return millis_from_micros(us) + "ms";
  const std::int64_t ms = (v + 500) / 1000;
  if (ms < 1000) return std::to_string(ms) + "ms";
  const std::int64_t tenths = (v + 50'000) / 100'000;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + "s";
}

// A mutex name between single quotes on one line: quote, backslash and
// control characters escaped so an odd name cannot break or fake a log line.
std::string log_quoted(std::string_view s) {
  std::string out;
  internal::append_quoted(out, s, internal::kLogQuoting);
  return out;
}

}  // namespace

std::string_view loss_cause_name(LossCause cause) {
  switch (cause) {
    case LossCause::kRenewalFailed:
      return "renewal_failed";
    case LossCause::kDeadlinePassed:
      return "deadline_passed";
    case LossCause::kOtherOwner:
      return "other_owner";
    case LossCause::kForcedRelease:
      return "forced_release";
  }
  return "unknown";
}

std::string_view lock_event_kind_name(LockEvent::Kind kind) {
  switch (kind) {
    case LockEvent::Kind::kAcquired:
      return "acquired";
    case LockEvent::Kind::kRenewed:
      return "renewed";
    case LockEvent::Kind::kLost:
      return "lost";
    case LockEvent::Kind::kReleased:
      return "released";
    case LockEvent::Kind::kStoreError:
      return "store_error";
  }
  return "unknown";
}

std::string lock_event_json(const LockEvent& event) {
  std::string out = "{\"event\":";
  append_json_string(out, lock_event_kind_name(event.kind));
  out += ",\"time\":";
  append_json_string(out, rfc3339_millis(event.time));
  out += ",\"store\":";
  append_json_string(out, event.store);
  out += ",\"mutex\":";
  append_json_string(out, event.mutex);
  out += ",\"contender\":";
  append_json_string(out, event.contender_id);
  out += ",\"token\":";
  out += std::to_string(event.fencing_token);
  const auto add_ms = [&out](std::string_view key, microseconds us) {
    out += ",\"";
    out += key;
    out += "\":";
    out += millis_from_micros(us);
  };
  if (event.lease_left) add_ms("lease_left_ms", *event.lease_left);
  if (event.waited) add_ms("waited_ms", *event.waited);
  if (event.handoff) add_ms("handoff_ms", *event.handoff);
  if (event.margin) add_ms("margin_ms", *event.margin);
  if (event.retry_in) add_ms("retry_in_ms", *event.retry_in);
  if (event.cause) {
    out += ",\"cause\":";
    append_json_string(out, loss_cause_name(*event.cause));
  }
  if (!event.error.ok()) {
    out += ",\"error\":";
    append_json_string(out, event.error.to_string());
  }
  out += '}';
  return out;
}

std::string lock_event_text(const LockEvent& event) {
  const std::string mutex = log_quoted(event.mutex);
  const std::string token = "token " + std::to_string(event.fencing_token);
  std::string out;
  switch (event.kind) {
    case LockEvent::Kind::kAcquired:
      out = "acquired mutex " + mutex + " as " + event.contender_id + " (" + token;
      if (event.lease_left) out += ", lease " + human_duration(*event.lease_left) + " left";
      if (event.waited) out += ", waited " + human_duration(*event.waited);
      if (event.handoff) out += ", hand-off " + human_duration(*event.handoff);
      out += ')';
      break;
    case LockEvent::Kind::kRenewed:
      out = "renewed mutex " + mutex + " (" + token;
      if (event.margin) out += ", " + human_duration(*event.margin) + " of the lease was left";
      if (event.lease_left) out += ", now " + human_duration(*event.lease_left) + " left";
      out += ')';
      break;
    case LockEvent::Kind::kLost:
      out = "lost mutex " + mutex + " (" + token + ")";
      if (event.cause) {
        out += ": ";
        out += loss_cause_name(*event.cause);
        if (!event.error.ok()) out += " - " + event.error.message();
      } else if (!event.error.ok()) {
        out += ": " + event.error.message();
      }
      break;
    case LockEvent::Kind::kReleased:
      out = "released mutex " + mutex + " (" + token + ")";
      break;
    case LockEvent::Kind::kStoreError:
      // "store unreachable for mutex 'm', retrying in 400ms (UNAVAILABLE:
      // ...)": what a waiting process says while a store fails over.
      out =
          std::string(is_retryable(event.error) ? "store unreachable" : "store refused the call") +
          " for mutex " + mutex;
      if (event.fencing_token != 0) out += " (" + token + ")";
      if (event.retry_in) out += ", retrying in " + human_duration(*event.retry_in);
      out += " (" + event.error.to_string() + ")";
      break;
  }
  return out;
}

}  // namespace simba
