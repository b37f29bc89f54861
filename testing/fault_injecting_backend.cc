#include "testing/fault_injecting_backend.h"

namespace simba::testing {

FaultInjectingBackend::FaultInjectingBackend(std::shared_ptr<Backend> target)
    : target_(std::move(target)) {}

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

Status FaultInjectingBackend::Gate(Mode FaultInjectingBackend::*which, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (this->*which == Mode::kFail) return UnavailableError("injected failure");
  if (this->*which == Mode::kHang) {
    if (!cv_.wait_until(lock, deadline, [&] { return this->*which != Mode::kHang; })) {
      return DeadlineExceededError("injected hang reached the call's deadline");
    }
    if (this->*which == Mode::kFail) return UnavailableError("injected failure");
  }
  return OkStatus();
}

Result<OwnerRecord> FaultInjectingBackend::acquire_or_renew(const AcquireRequest& request,
                                                            Deadline deadline) {
  ++acquire_calls_;
  SIMBA_RETURN_IF_ERROR(Gate(&FaultInjectingBackend::acquire_mode_, deadline));
  return target_->acquire_or_renew(request, deadline);
}

Result<bool> FaultInjectingBackend::release(std::string_view mutex, std::string_view contender_id,
                                            Deadline deadline) {
  ++release_calls_;
  SIMBA_RETURN_IF_ERROR(Gate(&FaultInjectingBackend::mode_, deadline));
  return target_->release(mutex, contender_id, deadline);
}

Result<ForcedRelease> FaultInjectingBackend::force_release(std::string_view mutex,
                                                           Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(Gate(&FaultInjectingBackend::mode_, deadline));
  return target_->force_release(mutex, deadline);
}

Result<OwnerRecord> FaultInjectingBackend::read(std::string_view mutex, Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(Gate(&FaultInjectingBackend::mode_, deadline));
  return target_->read(mutex, deadline);
}

Result<std::vector<ListedMutex>> FaultInjectingBackend::list(Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(Gate(&FaultInjectingBackend::mode_, deadline));
  return target_->list(deadline);
}

}  // namespace simba::testing
