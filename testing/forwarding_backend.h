// A Backend decorator for tests that forwards every call to a target store:
// a test derives from it and overrides only the calls it counts or alters.
#ifndef SIMBA_TESTING_FORWARDING_BACKEND_H_
#define SIMBA_TESTING_FORWARDING_BACKEND_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "simba/backend.h"

namespace simba::testing {

class ForwardingBackend : public Backend {
 public:
  // Without `pushes`, subscribe() is refused as by a store without push:
  // the core then polls, and every change comes through acquire_or_renew.
  explicit ForwardingBackend(std::shared_ptr<Backend> target, bool pushes = true)
      : target_(std::move(target)), pushes_(pushes) {}

  std::string_view scheme() const override { return target_->scheme(); }
  const Capabilities& capabilities() const override { return target_->capabilities(); }

 protected:
  // Public calls run on this decorator, which checks the inputs by the
  // target's rules and forwards to the target's public calls.
  Status validate_store_mutex(std::string_view mutex) const override {
    return target_->validate_mutex(mutex);
  }
  Status validate_store_contender_id(std::string_view id) const override {
    return target_->validate_contender_id(id);
  }
  Result<OwnerRecord> do_acquire_or_renew(const AcquireRequest& request,
                                          Deadline deadline) override {
    return target_->acquire_or_renew(request, deadline);
  }
  Result<bool> do_release(std::string_view mutex, std::string_view contender_id,
                          std::uint64_t fencing_token, Deadline deadline) override {
    return target_->release(mutex, contender_id, fencing_token, deadline);
  }
  Result<std::vector<OwnerRecord>> do_renew(const std::vector<AcquireRequest>& requests,
                                            Deadline deadline) override {
    return target_->renew(requests, deadline);
  }
  Status do_leave(std::string_view mutex, std::string_view contender_id,
                  Deadline deadline) override {
    return target_->leave(mutex, contender_id, deadline);
  }
  Result<OwnerRecord> do_read(std::string_view mutex, Deadline deadline) override {
    return target_->read(mutex, deadline);
  }
  Result<std::unique_ptr<Subscription>> do_subscribe(
      std::string_view mutex, std::string_view contender_id,
      std::function<void(const MutexEvent&)> listener) override {
    if (!pushes_) return Backend::do_subscribe(mutex, contender_id, std::move(listener));
    return target_->subscribe(mutex, contender_id, std::move(listener));
  }
  Result<std::vector<ListedMutex>> do_list(Deadline deadline) override {
    return target_->list(deadline);
  }
  Result<std::vector<std::string>> do_waiters(std::string_view mutex, Deadline deadline) override {
    return target_->waiters(mutex, deadline);
  }
  Result<ForcedRelease> do_force_release(std::string_view mutex, Deadline deadline) override {
    return target_->force_release(mutex, deadline);
  }

  const std::shared_ptr<Backend> target_;
  const bool pushes_;
};

}  // namespace simba::testing

#endif  // SIMBA_TESTING_FORWARDING_BACKEND_H_
