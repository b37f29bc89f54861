// A factory's lease renewals, sent together (Backend::renew) on a store that
// can: renewing N held leases costs a few store calls per renewal period
// instead of N.
//
//   meeting points  an owner renews at the latest point at or before its
//                   renewal time on a grid of ttl / 8 (on the runtime's
//                   clock, from its epoch): every lease of the factory with
//                   that ttl that is due in one step of the grid renews at
//                   the same instant, at most an eighth of the ttl early.
//                   Leases acquired at scattered times fall into step after
//                   their first renewal, and stay in step.
//   a batch         what is submitted within kGather of the first
//                   submission goes out in one call (kMaxBatch requests at
//                   most; more are split), on an I/O thread, before queued
//                   acquisitions (as a single renewal is).
//
// The batcher only carries the call: each service applies its answer as if
// it had made the call itself (the lease is measured from when the batch was
// sent). A batched renewal never acquires, so one that reaches the store
// after its service stopped and released changes nothing.
#ifndef SIMBA_CORE_RENEWAL_BATCHER_H_
#define SIMBA_CORE_RENEWAL_BATCHER_H_

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/runtime.h"
#include "simba/backend.h"

namespace simba::internal {

class RenewalBatcher : public std::enable_shared_from_this<RenewalBatcher> {
 public:
  // A service's answer: called once, on an I/O thread, with no lock of the
  // batcher held; `sent` is when the call that carried it left (runtime
  // clock).
  using Answer = std::function<void(Result<OwnerRecord> reply, Clock::TimePoint sent)>;

  RenewalBatcher(std::shared_ptr<Runtime> runtime, std::shared_ptr<Backend> backend);

  // How long an owner that would renew in `delay` (from `now`) waits
  // instead: to the meeting point at or before it, and never less than
  // three quarters of `delay` (a renewal due soon is not pulled to now).
  std::chrono::milliseconds meeting_delay(Clock::TimePoint now, std::chrono::milliseconds delay,
                                          std::chrono::milliseconds ttl) const;

  // Queues a renewal of `mutex` for `contender_id`, to be answered by
  // `answer`. False (and `answer` dropped) when the runtime has shut down.
  bool submit(std::string mutex, std::string contender_id, std::chrono::milliseconds ttl,
              std::chrono::milliseconds transition, Deadline deadline, Answer answer);

  // How long a batch waits for more renewals after its first.
  static constexpr std::chrono::milliseconds kGather{2};
  // The most requests one store call carries.
  static constexpr std::size_t kMaxBatch = 1000;

 private:
  struct Entry {
    std::string mutex;
    std::string contender_id;
    std::chrono::milliseconds ttl;
    std::chrono::milliseconds transition;
    Deadline deadline;
    Answer answer;
  };

  // Sends what is pending (on an I/O thread), in chunks of kMaxBatch.
  void flush();
  // One store call for `chunk`, and its answers.
  void send(std::vector<Entry>& chunk);
  // Forgets what is pending: the runtime has shut down, nothing will send it.
  void drop_pending();

  const std::shared_ptr<Runtime> runtime_;
  const std::shared_ptr<Backend> backend_;
  std::mutex mu_;
  std::vector<Entry> pending_;  // guarded by mu_
  bool flush_due_ = false;      // guarded by mu_: a flush is scheduled
};

}  // namespace simba::internal

#endif  // SIMBA_CORE_RENEWAL_BATCHER_H_
