// File: simba/status.h
//
// Status and Result<T>: how every fallible call in Simba reports its outcome.
// Simba throws no exceptions of its own across its API; a call that can fail
// returns a `Status` (no value) or a `Result<T>` (a value or a non-OK Status).
//
// Which code to pick (abseil's vocabulary, narrowed to what a lock needs):
//   kInvalidArgument    the caller passed something that can never work
//                       (empty mutex name, ttl <= 0, malformed URI).
//   kDeadlineExceeded   a blocking call ran out of time (acquire(timeout)).
//   kUnavailable        the store could not be reached or answered with a
//                       transient failure; retrying may succeed.
//   kAborted            a lease was lost while it was being used.
//   kFailedPrecondition the object is in the wrong state for the call
//                       (start() twice, stop() when not running).
//   kPermissionDenied   the store refused us (read-only file, bad password).
//   kUnimplemented      not supported by this build or backend (unknown URI
//                       scheme, a capability the backend lacks).
//   kCancelled          the caller cancelled a wait (stop token).
//   kInternal           a bug or an invariant the store broke.
//
// Example:
//   simba::Result<int> parse_port(std::string_view s);
//   SIMBA_ASSIGN_OR_RETURN(int port, parse_port(text));
//   if (simba::Status s = service->start(); !s.ok()) std::cerr << s << "\n";
//
// Thread safety: Status and Result are values; distinct objects may be used
// from different threads freely.

#ifndef SIMBA_STATUS_H_
#define SIMBA_STATUS_H_

#include <chrono>
#include <cstdlib>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace simba {

enum class StatusCode {
  kOk = 0,
  kCancelled = 1,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kFailedPrecondition = 9,
  kAborted = 10,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
};

// The code's name without the `k`, e.g. "DEADLINE_EXCEEDED".
std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  // An OK status.
  Status() = default;
  // A status with `code` and a message meant for a human. An OK code ignores
  // the message.
  Status(StatusCode code, std::string message);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "OK", or "<CODE_NAME>: <message>".
  std::string to_string() const;

  // Prepends context ("opening sqlite:///x.db: ") to a non-OK status. Keeps
  // retry_after().
  Status with_context(std::string_view context) const;

  // A store's word that trying again sooner than `delay` cannot succeed
  // (Redis's restart guard knows when it will grant leases again). The
  // contend loop then waits that long instead of its doubling backoff, which
  // would overshoot. Ignored on an OK status; not part of to_string() or ==.
  Status with_retry_after(std::chrono::milliseconds delay) const;
  std::optional<std::chrono::milliseconds> retry_after() const { return retry_after_; }

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  std::optional<std::chrono::milliseconds> retry_after_;
};

std::ostream& operator<<(std::ostream& os, const Status& status);

inline Status ok_status() { return Status(); }
Status cancelled_error(std::string message);
Status invalid_argument_error(std::string message);
Status deadline_exceeded_error(std::string message);
Status not_found_error(std::string message);
Status already_exists_error(std::string message);
Status permission_denied_error(std::string message);
Status failed_precondition_error(std::string message);
Status aborted_error(std::string message);
Status unimplemented_error(std::string message);
Status internal_error(std::string message);
Status unavailable_error(std::string message);

// True for failures that may go away on their own (kUnavailable,
// kDeadlineExceeded, kAborted): the contend loop retries these.
bool is_retryable(const Status& status);

namespace internal {
[[noreturn]] void die_because_of_status(const Status& status, const char* what);
}  // namespace internal

// A value of type T, or the non-OK Status that explains why there is none.
//
// Accessing the value of an error Result terminates the process with the
// status printed: check ok() first (or use SIMBA_ASSIGN_OR_RETURN).
template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::decay_t<T>, Status>, "Result<Status> is not allowed");

 public:
  // From a value.
  Result(const T& value) : data_(value) {}        // NOLINT(google-explicit-constructor)
  Result(T&& value) : data_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  // From a non-OK status. An OK status here is a bug and becomes kInternal.
  Result(Status status)  // NOLINT(google-explicit-constructor)
      : data_(status.ok() ? internal_error("Result constructed from an OK status")
                          : std::move(status)) {}
  // Converting from a Result of a compatible value type (e.g. derived
  // unique_ptr to base unique_ptr).
  template <typename U,
            typename = std::enable_if_t<!std::is_same_v<U, T> && std::is_constructible_v<T, U&&>>>
  Result(Result<U>&& other)  // NOLINT(google-explicit-constructor)
      : data_(other.ok() ? std::variant<Status, T>(std::in_place_index<1>, std::move(*other))
                         : std::variant<Status, T>(std::in_place_index<0>, other.status())) {}

  bool ok() const { return data_.index() == 1; }

  // OK when a value is present.
  Status status() const { return ok() ? Status() : std::get<0>(data_); }

  const T& value() const& {
    check();
    return std::get<1>(data_);
  }
  T& value() & {
    check();
    return std::get<1>(data_);
  }
  T&& value() && {
    check();
    return std::get<1>(std::move(data_));
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

  // The value, or `fallback` when this is an error.
  template <typename U>
  T value_or(U&& fallback) const& {
    return ok() ? std::get<1>(data_) : static_cast<T>(std::forward<U>(fallback));
  }

 private:
  void check() const {
    if (!ok()) internal::die_because_of_status(std::get<0>(data_), "Result::value()");
  }
  std::variant<Status, T> data_;
};

}  // namespace simba

#define SIMBA_STATUS_CONCAT_INNER_(a, b) a##b
#define SIMBA_STATUS_CONCAT_(a, b) SIMBA_STATUS_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function when it is not OK.
#define SIMBA_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::simba::Status simba_status_ = (expr);        \
    if (!simba_status_.ok()) return simba_status_; \
  } while (false)

// Evaluates `rexpr` (a Result<T>); on error returns its status, otherwise
// moves the value into `lhs` (which may be a declaration).
#define SIMBA_ASSIGN_OR_RETURN(lhs, rexpr) \
  SIMBA_ASSIGN_OR_RETURN_IMPL_(SIMBA_STATUS_CONCAT_(simba_result_, __LINE__), lhs, rexpr)
#define SIMBA_ASSIGN_OR_RETURN_IMPL_(result, lhs, rexpr) \
  auto result = (rexpr);                                 \
  if (!result.ok()) return result.status();              \
  lhs = std::move(result).value()

#endif  // SIMBA_STATUS_H_
