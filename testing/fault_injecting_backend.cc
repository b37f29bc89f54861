#include "testing/fault_injecting_backend.h"

#include <atomic>
#include <map>
#include <utility>
#include <vector>

namespace simba::testing {

struct FaultListeners {
  std::mutex mu;
  std::uint64_t next_id = 0;
  std::map<std::uint64_t, std::pair<std::string, std::function<void(const MutexEvent&)>>> by_id;
  std::atomic<bool> store_pushes_lost{false};
};

namespace {

// The target's subscription plus our entry for push().
class FaultSubscription final : public Subscription {
 public:
  FaultSubscription(std::shared_ptr<FaultListeners> listeners, std::uint64_t id,
                    std::unique_ptr<Subscription> target)
      : listeners_(std::move(listeners)), id_(id), target_(std::move(target)) {}
  ~FaultSubscription() override {
    target_.reset();
    std::lock_guard<std::mutex> lock(listeners_->mu);
    listeners_->by_id.erase(id_);
  }

 private:
  std::shared_ptr<FaultListeners> listeners_;
  std::uint64_t id_;
  std::unique_ptr<Subscription> target_;
};

}  // namespace

FaultInjectingBackend::FaultInjectingBackend(std::shared_ptr<Backend> target)
    : target_(std::move(target)), listeners_(std::make_shared<FaultListeners>()) {}

Result<std::unique_ptr<Subscription>> FaultInjectingBackend::do_subscribe(
    std::string_view mutex, std::string_view contender_id,
    std::function<void(const MutexEvent&)> listener) {
  auto target = target_->subscribe(mutex, contender_id,
                                   [listeners = listeners_, listener](const MutexEvent& event) {
                                     if (!listeners->store_pushes_lost.load()) listener(event);
                                   });
  if (!target.ok() && target.status().code() != StatusCode::kUnimplemented) {
    return target.status();
  }
  std::uint64_t id;
  {
    std::lock_guard<std::mutex> lock(listeners_->mu);
    id = ++listeners_->next_id;
    listeners_->by_id.emplace(id, std::make_pair(std::string(mutex), std::move(listener)));
  }
  return std::unique_ptr<Subscription>(std::make_unique<FaultSubscription>(
      listeners_, id, target.ok() ? std::move(*target) : nullptr));
}

void FaultInjectingBackend::set_store_pushes_lost(bool lost) {
  listeners_->store_pushes_lost = lost;
}

void FaultInjectingBackend::push(const MutexEvent& event) {
  std::vector<std::function<void(const MutexEvent&)>> targets;
  {
    std::lock_guard<std::mutex> lock(listeners_->mu);
    for (const auto& [id, entry] : listeners_->by_id) {
      if (entry.first == event.mutex) targets.push_back(entry.second);
    }
  }
  for (const auto& listener : targets) listener(event);
}

void FaultInjectingBackend::set_mode(Mode mode) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    mode_ = mode;
    acquire_mode_ = mode;
  }
  cv_.notify_all();
}

void FaultInjectingBackend::set_acquire_mode(Mode mode) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    acquire_mode_ = mode;
  }
  cv_.notify_all();
}

Status FaultInjectingBackend::gate(Mode FaultInjectingBackend::*which, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto failure = [&] {
    Status status = failure_status_;
    return failure_retry_after_ ? status.with_retry_after(*failure_retry_after_) : status;
  };
  if (this->*which == Mode::kFail) return failure();
  if (this->*which == Mode::kHang) {
    hanging_calls_.fetch_add(1);
    const bool ended = cv_.wait_until(lock, deadline, [&] { return this->*which != Mode::kHang; });
    hanging_calls_.fetch_sub(1);
    if (!ended) return deadline_exceeded_error("injected hang reached the call's deadline");
    if (this->*which == Mode::kFail) return failure();
  }
  return ok_status();
}

void FaultInjectingBackend::set_failure_status(Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  failure_status_ = std::move(status);
}

void FaultInjectingBackend::set_failure_retry_after(
    std::optional<std::chrono::milliseconds> delay) {
  std::lock_guard<std::mutex> lock(mu_);
  failure_retry_after_ = delay;
}

Result<OwnerRecord> FaultInjectingBackend::do_acquire_or_renew(const AcquireRequest& request,
                                                               Deadline deadline) {
  ++acquire_calls_;
  if (request.once) ++once_acquire_calls_;
  SIMBA_RETURN_IF_ERROR(gate(&FaultInjectingBackend::acquire_mode_, deadline));
  auto reply = target_->acquire_or_renew(request, deadline);
  const std::chrono::milliseconds stretch = after_acquire_reply();
  if (reply.ok() && stretch.count() > 0 && reply->owner.is_owner(request.contender_id)) {
    reply->owner.ttl_at += stretch;
    reply->owner.transition_at += stretch;
  }
  if (reply.ok() && reply->owner.is_owner(request.contender_id)) {
    std::lock_guard<std::mutex> lock(mu_);
    if (hold_bound_) reply->bound = hold_bound_;
  }
  return reply;
}

void FaultInjectingBackend::set_hold_bound(std::shared_ptr<const HoldBound> bound) {
  std::lock_guard<std::mutex> lock(mu_);
  hold_bound_ = std::move(bound);
}

std::chrono::milliseconds FaultInjectingBackend::after_acquire_reply() {
  std::function<void()> action;
  std::chrono::milliseconds stretch{0};
  {
    std::lock_guard<std::mutex> lock(mu_);
    action.swap(before_next_acquire_reply_);
    stretch = lease_stretch_;
  }
  if (action) action();
  return stretch;
}

// A batched renewal is an acquire_or_renew call for the faults: the same
// mode, the same count (one per batch), the same reply hook and stretch.
Result<std::vector<OwnerRecord>> FaultInjectingBackend::do_renew(
    const std::vector<AcquireRequest>& requests, Deadline deadline) {
  ++acquire_calls_;
  SIMBA_RETURN_IF_ERROR(gate(&FaultInjectingBackend::acquire_mode_, deadline));
  auto replies = target_->renew(requests, deadline);
  const std::chrono::milliseconds stretch = after_acquire_reply();
  if (replies.ok() && stretch.count() > 0) {
    for (std::size_t i = 0; i < replies->size(); ++i) {
      OwnerRecord& reply = (*replies)[i];
      if (!reply.owner.is_owner(requests[i].contender_id)) continue;
      reply.owner.ttl_at += stretch;
      reply.owner.transition_at += stretch;
    }
  }
  return replies;
}

void FaultInjectingBackend::set_lease_stretch(std::chrono::milliseconds stretch) {
  std::lock_guard<std::mutex> lock(mu_);
  lease_stretch_ = stretch;
}

void FaultInjectingBackend::set_before_next_acquire_reply(std::function<void()> action) {
  std::lock_guard<std::mutex> lock(mu_);
  before_next_acquire_reply_ = std::move(action);
}

void FaultInjectingBackend::set_releases_held_back(bool held_back) {
  std::lock_guard<std::mutex> lock(mu_);
  releases_held_back_ = held_back;
}

bool FaultInjectingBackend::hold_back(std::function<void()> call) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!releases_held_back_) return false;
  held_back_.push_back(std::move(call));
  return true;
}

int FaultInjectingBackend::deliver_held_back() {
  std::vector<std::function<void()>> calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls.swap(held_back_);
  }
  for (auto& call : calls) call();
  return static_cast<int>(calls.size());
}

namespace {
Status held_back_error() {
  return deadline_exceeded_error("injected: held up in the network past the call's deadline");
}
Deadline late_deadline() { return std::chrono::steady_clock::now() + std::chrono::seconds(10); }
}  // namespace

Result<bool> FaultInjectingBackend::do_release(std::string_view mutex,
                                               std::string_view contender_id,
                                               std::uint64_t fencing_token, Deadline deadline) {
  ++release_calls_;
  last_release_token_ = fencing_token;
  if (hold_back(
          [target = target_, mutex = std::string(mutex), id = std::string(contender_id),
           fencing_token] { (void)target->release(mutex, id, fencing_token, late_deadline()); })) {
    return held_back_error();
  }
  SIMBA_RETURN_IF_ERROR(gate(&FaultInjectingBackend::mode_, deadline));
  return target_->release(mutex, contender_id, fencing_token, deadline);
}

Status FaultInjectingBackend::do_leave(std::string_view mutex, std::string_view contender_id,
                                       Deadline deadline) {
  ++leave_calls_;
  if (hold_back([target = target_, mutex = std::string(mutex), id = std::string(contender_id)] {
        (void)target->leave(mutex, id, late_deadline());
      })) {
    return held_back_error();
  }
  SIMBA_RETURN_IF_ERROR(gate(&FaultInjectingBackend::mode_, deadline));
  return target_->leave(mutex, contender_id, deadline);
}

Result<ForcedRelease> FaultInjectingBackend::do_force_release(std::string_view mutex,
                                                              Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(gate(&FaultInjectingBackend::mode_, deadline));
  return target_->force_release(mutex, deadline);
}

Result<OwnerRecord> FaultInjectingBackend::do_read(std::string_view mutex, Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(gate(&FaultInjectingBackend::mode_, deadline));
  return target_->read(mutex, deadline);
}

Result<std::vector<ListedMutex>> FaultInjectingBackend::do_list(Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(gate(&FaultInjectingBackend::mode_, deadline));
  return target_->list(deadline);
}

Result<std::vector<std::string>> FaultInjectingBackend::do_waiters(std::string_view mutex,
                                                                   Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(gate(&FaultInjectingBackend::mode_, deadline));
  return target_->waiters(mutex, deadline);
}

}  // namespace simba::testing
