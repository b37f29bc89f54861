#include "simba/status.h"

#include <algorithm>
#include <cstdio>

namespace simba {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kCancelled:
      return "CANCELLED";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case StatusCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kAborted:
      return "ABORTED";
    case StatusCode::kUnimplemented:
      return "UNIMPLEMENTED";
    case StatusCode::kInternal:
      return "INTERNAL";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
  }
  return "UNKNOWN";
}

Status::Status(StatusCode code, std::string message)
    : code_(code), message_(code == StatusCode::kOk ? std::string() : std::move(message)) {}

std::string Status::to_string() const {
  if (ok()) return "OK";
  std::string out(status_code_name(code_));
  out += ": ";
  out += message_;
  return out;
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  std::string message(context);
  message += ": ";
  message += message_;
  Status out(code_, std::move(message));
  out.retry_after_ = retry_after_;
  return out;
}

Status Status::with_retry_after(std::chrono::milliseconds delay) const {
  Status out = *this;
  if (!ok()) out.retry_after_ = std::max(delay, std::chrono::milliseconds(0));
  return out;
}

std::ostream& operator<<(std::ostream& os, const Status& status) {
  return os << status.to_string();
}

Status cancelled_error(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
Status invalid_argument_error(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
Status deadline_exceeded_error(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
Status not_found_error(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
Status already_exists_error(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
Status permission_denied_error(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}
Status failed_precondition_error(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
Status aborted_error(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
Status unimplemented_error(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
Status unavailable_error(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }

bool is_retryable(const Status& status) {
  switch (status.code()) {
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kAborted:
      return true;
    default:
      return false;
  }
}

namespace internal {
void die_because_of_status(const Status& status, const char* what) {
  std::fprintf(stderr, "simba: %s called on an error: %s\n", what, status.to_string().c_str());
  std::abort();
}
}  // namespace internal

}  // namespace simba
