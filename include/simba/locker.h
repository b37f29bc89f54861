// File: simba/locker.h
//
// A blocking, RAII distributed lock over one mutex (JVM Simba's SimbaLocker),
// which, unlike SimbaLocker, tells its holder when the lease is lost.
//
//   acquire()           wait until held (or cancelled through a stop token)
//   acquire(timeout)    wait at most `timeout`: kDeadlineExceeded otherwise
//                       (kUnavailable if the store could not be reached)
//   try_acquire()       one attempt: true if held, false if somebody else has it
//   release()           give the lock back (idempotent); the destructor calls it
//   is_held()           held at the store and the local lease deadline not passed
//   fencing_token()     the acquisition's token, to pass to protected resources
//   lost_token()        a std::stop_token that is stopped when the lease is lost
//
// While held, the lease is renewed in the background. If it is lost anyway
// (store unreachable past the lease deadline, the store names another owner),
// is_held() turns false at once, lost_token() is stopped, `on_lost` runs
// (on a callback thread), and the Locker stops contending; call release()
// or acquire() again.
//
// Example:
//   auto locker = simba::Locker::create(*factory, "nightly-report").value();
//   if (simba::Status s = locker->acquire(std::chrono::seconds(30)); !s.ok()) {
//     return s;  // kDeadlineExceeded: somebody else is running it
//   }
//   run_report(locker->fencing_token(), locker->lost_token());
//   // ~Locker releases.
//
// Thread safety: acquire/try_acquire/release are meant for one thread at a
// time (a second concurrent acquire gets kFailedPrecondition); is_held,
// fencing_token and lost_token may be called from any thread.

#ifndef SIMBA_LOCKER_H_
#define SIMBA_LOCKER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>

#include "simba/contend_service.h"
#include "simba/status.h"

namespace simba {

struct LockerOptions {
  // Lease settings. Default: the factory's ContendOptions.
  std::optional<ContendOptions> contend;
  // The id this locker holds the mutex under. Default: a fresh HOST id.
  std::string contender_id;
  // Runs when a held lease is lost (not on release()). Default: nothing.
  std::function<void()> on_lost;
};

class Locker {
 public:
  // Errors: kInvalidArgument for a mutex name or contender id the store cannot
  // hold, or bad options.
  static Result<std::unique_ptr<Locker>> create(MutexContendServiceFactory& factory,
                                                std::string mutex, LockerOptions options = {});
  ~Locker();
  Locker(const Locker&) = delete;
  Locker& operator=(const Locker&) = delete;

  // Blocks until held. kCancelled if `cancel` is stopped first;
  // kFailedPrecondition if already held or acquiring. A store that cannot
  // be reached (down, failing over, no primary yet) is waited for; a store
  // that refuses the call (credentials, TLS verification, a missing table
  // it may not create: an error that is not is_retryable) fails it at once
  // with that error.
  Status acquire(std::stop_token cancel = {});
  // Blocks at most `timeout` (>= 0), but always waits for the answer of the
  // first attempt (so a zero timeout means "try once"; a hanging store can
  // stretch that to ContendOptions::operation_timeout). kDeadlineExceeded
  // naming the mutex and the timeout when it runs out while another owner
  // holds it; kUnavailable naming the hosts tried and the last cause of
  // each when it runs out while the store cannot be reached (retried with
  // a jittered backoff until then); a refusing store's error at once, as
  // acquire(); kCancelled; kFailedPrecondition.
  Status acquire(std::chrono::milliseconds timeout, std::stop_token cancel = {});
  // One attempt at the store. true: held; false: another owner holds it.
  // A store error is returned as the error.
  Result<bool> try_acquire();
  // Releases the mutex at the store. OK when not held (idempotent). Returns
  // the store's error if the release failed (the lease then expires).
  Status release();

  bool is_held() const;
  // The token of the current acquisition; 0 when not held.
  std::uint64_t fencing_token() const;
  // Stopped when the lease of the current acquisition is lost. A fresh token
  // comes with every acquisition.
  std::stop_token lost_token() const;

  const std::string& mutex() const;
  const std::string& contender_id() const;

 private:
  struct State;
  explicit Locker(std::shared_ptr<State> state);
  Status acquire_until(std::optional<std::chrono::milliseconds> timeout, std::stop_token cancel);
  // Checks the locker is idle and starts contending. Requires control_mu.
  // Starts contending, the first attempt on this thread unless `cancel`
  // may end the wait first (ServiceCore::start_for).
  // `once`: try_acquire(), which takes the first answer and stops.
  Status begin_acquire(const std::stop_token& cancel, bool once);
  // Waits for the core to own the mutex and records the hold; on failure
  // gives up its place. Requires control_mu.
  Status await_hold(Clock::TimePoint deadline, const std::stop_token& cancel);

  std::shared_ptr<State> state_;
};

}  // namespace simba

#endif  // SIMBA_LOCKER_H_
