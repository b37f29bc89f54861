// File: simba/events.h
//
// Lock events: what happened to a contender's hold of a mutex, one value per
// happening, for users to log through their own logger (the `simba` CLI
// prints them with --verbose, and as JSON lines with --log-format json).
//
//   LockEvent          acquired / renewed / lost / released / store error,
//                      with the store, mutex, contender, fencing token, times
//                      and (for a loss) its cause
//   LockEventListener  the hook: set FactoryOptions::events
//   LockEventJson      one event as a single-line JSON object
//
// Delivery: events of one service are delivered in order, one at a time, on
// the factory's callback threads (the same strand as its contender's
// callbacks), never under an internal lock. A listener shared by several
// services may be called from several threads at once: make it thread-safe.
// A slow listener delays that service's callbacks, never its renewals.
//
// Example:
//   class Log : public simba::LockEventListener {
//     void on_event(const simba::LockEvent& e) override {
//       spdlog::info("{}", simba::lock_event_json(e));
//     }
//   };
//   simba::FactoryOptions options;
//   options.events = std::make_shared<Log>();
//
// Thread safety: LockEvent is a value; see "Delivery" for the listener.

#ifndef SIMBA_EVENTS_H_
#define SIMBA_EVENTS_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "simba/status.h"

namespace simba {

// Why a contender stopped owning a mutex it did not give up.
enum class LossCause {
  // Renewals failed (the store could not be reached or answered with an
  // error) until the local lease deadline passed.
  kRenewalFailed,
  // The local lease deadline passed with no renewal failed: the renewal was
  // still out, or this process was paused or starved past its lease.
  kDeadlinePassed,
  // The store said our hold had ended: it answered a renewal with another
  // owner, no owner or a new tenure, or pushed that our session or hold was
  // gone.
  kOtherOwner,
  // The store pushed that our hold was taken away before its lease ended
  // (an operator's `simba release --force`, a deleted key or node). A store
  // that cannot tell (MySQL) reports a forced release as kOtherOwner, at the
  // owner's next renewal.
  kForcedRelease,
};

// "renewal_failed", "deadline_passed", "other_owner", "forced_release".
std::string_view loss_cause_name(LossCause cause);

struct LockEvent {
  enum class Kind {
    kAcquired,    // this contender became the owner
    kRenewed,     // the owner renewed its lease
    kLost,        // the owner stopped owning without giving it up (`cause`)
    kReleased,    // the owner gave it up (stop(), release())
    kStoreError,  // a store call failed (`error`); the service retries
                  // (with a listener, the library's own warning line for
                  // it drops to SIMBA_LOG=info: the listener reports it)
  };
  Kind kind = Kind::kAcquired;
  // The backend's scheme ("redis", "sqlite", ...).
  std::string store;
  std::string mutex;
  std::string contender_id;
  // The token of the hold the event is about (0 for a store error of a
  // contender that owns nothing).
  std::uint64_t fencing_token = 0;
  // When it happened: wall clock for logs, and the factory's clock.
  std::chrono::system_clock::time_point time;
  std::chrono::steady_clock::duration monotonic{0};
  // acquired, renewed: when the hold ends locally unless renewed, as time
  // left from `monotonic`.
  std::optional<std::chrono::milliseconds> lease_left;
  // acquired: how long this contender waited (from start() or from its last
  // loss) until it owned the mutex.
  std::optional<std::chrono::microseconds> waited;
  // acquired: from the moment the mutex was known to be free (a release
  // pushed by the store, or the previous owner's lease ending) to owning it;
  // absent when the mutex was free at the first attempt.
  std::optional<std::chrono::microseconds> handoff;
  // renewed: how much of the previous lease was left when the renewal came
  // back (how close the hold came to being lost).
  std::optional<std::chrono::microseconds> margin;
  // lost: why.
  std::optional<LossCause> cause;
  // store error: when the service tries again (a transient error, the
  // store unreachable or failing over, is_retryable(error); a permanent
  // one, refused credentials or TLS verification, is retried by a running
  // service too, but a waiting acquire gives up on it at once).
  std::optional<std::chrono::milliseconds> retry_in;
  // store error: what the store said; lost: a human explanation.
  Status error;
};

// "acquired", "renewed", "lost", "released", "store_error".
std::string_view lock_event_kind_name(LockEvent::Kind kind);

// {"event":"acquired","time":"2026-11-21T21:40:13.123Z","store":"redis",
//  "mutex":"report","contender":"1:42@host/ab12cd34","token":7,...} on one
// line, fields absent when unset.
std::string lock_event_json(const LockEvent& event);
// "acquired mutex 'report' as 1:42@host/ab12cd34 (token 7, lease 15.8s left)".
std::string lock_event_text(const LockEvent& event);

class LockEventListener {
 public:
  virtual ~LockEventListener() = default;
  virtual void on_event(const LockEvent& event) = 0;
};

}  // namespace simba

#endif  // SIMBA_EVENTS_H_
