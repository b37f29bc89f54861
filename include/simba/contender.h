// File: simba/contender.h
//
// The listener side of the contention API (Simba's model):
//
//   MutexRetriever  observes who owns a mutex, without contending for it
//   MutexContender  contends for a mutex and is told when it gains or loses it
//   contender ids   HOST (counter:pid@host/random) and UUID generators
//
// Callback contract (what a service promises every retriever/contender):
//   * callbacks of one service never run concurrently with each other and run
//     in the order the updates were decided;
//   * they run on the factory's callback threads (or, for the final release,
//     possibly on the thread that calls stop()), never while Simba holds an
//     internal lock, so a callback may call back into its service, even
//     stop();
//   * a callback that blocks delays later callbacks of the same service (not
//     the renewal of its lease: renewal runs elsewhere); keep them short;
//   * exceptions thrown by a callback are caught and logged.
//   * on_released means "you must stop acting as owner now": it is delivered
//     when the lease is lost (renewal failed until the local lease deadline,
//     the store names another owner) or given up (stop()).
//
// Example:
//   class Leader : public simba::MutexContender {
//    public:
//     Leader() : MutexContender("orders-leader") {}
//     void on_acquired(const simba::MutexState& s) override {
//       std::cout << "leading with token " << s.after.fencing_token << "\n";
//     }
//     void on_released(const simba::MutexState&) override { StopWork(); }
//   };
//
// Thread safety: the accessors are immutable after construction.

#ifndef SIMBA_CONTENDER_H_
#define SIMBA_CONTENDER_H_

#include <functional>
#include <memory>
#include <string>

#include "simba/mutex_owner.h"

namespace simba {

class MutexRetriever {
 public:
  explicit MutexRetriever(std::string mutex);
  virtual ~MutexRetriever() = default;

  const std::string& mutex() const { return mutex_; }

  // Called for every owner update the service applies, including renewals
  // that change nothing but the lease times.
  virtual void on_owner(const MutexState& state);

 private:
  std::string mutex_;
};

class MutexContender : public MutexRetriever {
 public:
  // `contender_id` identifies this contender at the store; by default a fresh
  // HOST id with a random part. Validation (non-empty, length, characters)
  // happens when a service is created for it.
  explicit MutexContender(std::string mutex,
                          std::string contender_id = generate_host_contender_id());

  const std::string& contender_id() const { return contender_id_; }

  // This contender became the owner (state.after is its lease).
  virtual void on_acquired(const MutexState& state);
  // This contender stopped being the owner (state.before was its lease).
  virtual void on_released(const MutexState& state);

  // Dispatches: a release of this contender -> on_released; an acquisition
  // -> on_acquired (both, in that order, when it lost the lease and at once
  // acquired a new one). Other updates are ignored.
  void on_owner(const MutexState& state) override;

  // "<counter>:<pid>@<hostname>/<8 random hex>": Simba's HOST format with a
  // random part, because pid + host alone collide in containers.
  static std::string generate_host_contender_id();
  // 32 lowercase hex characters (a random UUID v4 without dashes).
  static std::string generate_uuid_contender_id();

 private:
  std::string contender_id_;
};

// A contender built from two functions (either may be empty).
std::shared_ptr<MutexContender> make_contender(
    std::string mutex, std::function<void(const MutexState&)> on_acquired,
    std::function<void(const MutexState&)> on_released,
    std::string contender_id = MutexContender::generate_host_contender_id());

// A retriever built from one function.
std::shared_ptr<MutexRetriever> make_retriever(std::string mutex,
                                               std::function<void(const MutexState&)> on_owner);

}  // namespace simba

#endif  // SIMBA_CONTENDER_H_
