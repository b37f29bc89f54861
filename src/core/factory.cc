#include <algorithm>

#include "core/service_core.h"

namespace simba {

std::string_view service_status_name(ServiceStatus status) {
  switch (status) {
    case ServiceStatus::kInitial:
      return "INITIAL";
    case ServiceStatus::kStarting:
      return "STARTING";
    case ServiceStatus::kRunning:
      return "RUNNING";
    case ServiceStatus::kStopping:
      return "STOPPING";
  }
  return "UNKNOWN";
}

Status ContendOptions::validate() const {
  using std::chrono::milliseconds;
  // Leases are added to epoch milliseconds at the store; a year keeps every
  // sum far from overflow and is longer than any sane lease.
  constexpr milliseconds kMax = std::chrono::hours(24 * 365);
  if (ttl <= milliseconds(0)) {
    return invalid_argument_error("ttl must be > 0 (got " + std::to_string(ttl.count()) + "ms)");
  }
  if (ttl > kMax) return invalid_argument_error("ttl must be at most 365 days");
  if (transition < milliseconds(0)) {
    return invalid_argument_error("transition must be >= 0 (got " +
                                  std::to_string(transition.count()) + "ms)");
  }
  if (transition > kMax) return invalid_argument_error("transition must be at most 365 days");
  if (initial_delay < milliseconds(0)) {
    return invalid_argument_error("initial_delay must be >= 0 (got " +
                                  std::to_string(initial_delay.count()) + "ms)");
  }
  if (operation_timeout <= milliseconds(0)) {
    return invalid_argument_error("operation_timeout must be > 0 (got " +
                                  std::to_string(operation_timeout.count()) + "ms)");
  }
  return ok_status();
}

namespace internal {
namespace {

// What both kinds of service answer from their ServiceCore.
template <class Service>
class ServiceHandle : public Service {
 public:
  explicit ServiceHandle(std::shared_ptr<ServiceCore> core) : core_(std::move(core)) {}
  ~ServiceHandle() override {
    // Destroying a running service releases its mutex, like stop().
    if (core_->status() == ServiceStatus::kRunning) (void)core_->stop();
  }
  Status start() override { return core_->start(); }
  Status stop() override { return core_->stop(); }
  ServiceStatus status() const override { return core_->status(); }
  const std::string& mutex() const override { return core_->mutex(); }
  MutexState mutex_state() const override { return core_->mutex_state(); }
  bool has_owner() const override { return core_->has_owner(); }

 protected:
  std::shared_ptr<ServiceCore> core_;
};

using RetrievalServiceHandle = ServiceHandle<MutexRetrievalService>;

class ContendServiceHandle final : public ServiceHandle<MutexContendService> {
 public:
  ContendServiceHandle(std::shared_ptr<ServiceCore> core, std::shared_ptr<MutexContender> contender)
      : ServiceHandle(std::move(core)), contender_(std::move(contender)) {}
  const std::string& contender_id() const override { return core_->contender_id(); }
  const std::shared_ptr<MutexContender>& contender() const override { return contender_; }
  bool is_owner() const override { return core_->is_owner(); }
  bool is_in_ttl() const override { return core_->is_in_ttl(); }
  std::uint64_t fencing_token() const override { return core_->fencing_token(); }
  std::optional<Clock::TimePoint> lease_deadline() const override {
    return core_->lease_deadline();
  }

 private:
  std::shared_ptr<MutexContender> contender_;
};

}  // namespace

FactoryImpl::FactoryImpl(std::shared_ptr<Backend> backend, FactoryOptions options)
    : backend_(std::move(backend)), options_(std::move(options)) {
  if (!options_.clock) options_.clock = Clock::steady();
  if (!options_.random) options_.random = Random::standard();
  runtime_ =
      std::make_shared<Runtime>(options_.clock, options_.io_threads, options_.callback_threads);
  observers_ = Observers{options_.metrics, options_.events};
  if (backend_->capabilities().batch_renewals) {
    batcher_ = std::make_shared<RenewalBatcher>(runtime_, backend_);
  }
}

FactoryImpl::~FactoryImpl() {
  std::vector<std::shared_ptr<ServiceCore>> alive;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& weak : services_) {
      if (auto core = weak.lock()) alive.push_back(std::move(core));
    }
    services_.clear();
  }
  // Services that outlive their factory are stopped (their mutexes released)
  // while the threads still exist to deliver their last callbacks.
  for (auto& core : alive) {
    if (core->status() == ServiceStatus::kRunning) (void)core->stop();
  }
  runtime_->shutdown();
}

Status FactoryImpl::validate(const FactoryOptions& options) {
  SIMBA_RETURN_IF_ERROR(options.contend.validate());
  if (options.io_threads < 1 || options.io_threads > 64) {
    return invalid_argument_error("io_threads must be in [1, 64]");
  }
  if (options.callback_threads < 1 || options.callback_threads > 64) {
    return invalid_argument_error("callback_threads must be in [1, 64]");
  }
  return ok_status();
}

void FactoryImpl::track(const std::shared_ptr<ServiceCore>& core) {
  std::lock_guard<std::mutex> lock(mu_);
  // Prune dead entries now and then so the list stays proportional to the
  // live services.
  if (services_.size() >= 64 && services_.size() == services_.capacity()) {
    services_.erase(std::remove_if(services_.begin(), services_.end(),
                                   [](const auto& w) { return w.expired(); }),
                    services_.end());
  }
  services_.push_back(core);
}

Result<std::shared_ptr<ServiceCore>> FactoryImpl::create_contend_core(
    std::shared_ptr<MutexContender> contender, const ContendOptions& options, ServiceHooks hooks) {
  if (!contender) return invalid_argument_error("contender must not be null");
  SIMBA_RETURN_IF_ERROR(options.validate());
  SIMBA_RETURN_IF_ERROR(backend_->validate_mutex(contender->mutex()));
  SIMBA_RETURN_IF_ERROR(backend_->validate_contender_id(contender->contender_id()));
  auto core = std::make_shared<ServiceCore>(
      ServiceCore::Mode::kContend, contender, contender, options, options_.retrieval_poll_interval,
      runtime_, backend_, options_.random, std::move(hooks), observers_, batcher_);
  track(core);
  return core;
}

Result<std::unique_ptr<MutexContendService>> FactoryImpl::create_contend_service(
    std::shared_ptr<MutexContender> contender, const ContendOptions& options, ServiceHooks hooks) {
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<ServiceCore> core,
                         create_contend_core(contender, options, std::move(hooks)));
  return std::unique_ptr<MutexContendService>(
      std::make_unique<ContendServiceHandle>(std::move(core), std::move(contender)));
}

Result<std::unique_ptr<MutexRetrievalService>> FactoryImpl::create_retrieval_service(
    std::shared_ptr<MutexRetriever> retriever) {
  if (!retriever) return invalid_argument_error("retriever must not be null");
  SIMBA_RETURN_IF_ERROR(backend_->validate_mutex(retriever->mutex()));
  if (options_.retrieval_poll_interval <= std::chrono::milliseconds(0)) {
    return invalid_argument_error("retrieval_poll_interval must be > 0");
  }
  auto core = std::make_shared<ServiceCore>(ServiceCore::Mode::kRetrieve, retriever, nullptr,
                                            options_.contend, options_.retrieval_poll_interval,
                                            runtime_, backend_, options_.random, ServiceHooks{});
  track(core);
  return std::unique_ptr<MutexRetrievalService>(
      std::make_unique<RetrievalServiceHandle>(std::move(core)));
}

}  // namespace internal

// ---- MutexContendServiceFactory: a handle on its FactoryImpl ----

Result<std::unique_ptr<MutexContendServiceFactory>> MutexContendServiceFactory::create(
    std::shared_ptr<Backend> backend, FactoryOptions options) {
  if (!backend) return invalid_argument_error("backend must not be null");
  SIMBA_RETURN_IF_ERROR(internal::FactoryImpl::validate(options));
  return internal::FactoryAccess::wrap(
      std::make_shared<internal::FactoryImpl>(std::move(backend), std::move(options)));
}

MutexContendServiceFactory::MutexContendServiceFactory(std::shared_ptr<internal::FactoryImpl> impl)
    : impl_(std::move(impl)) {}

MutexContendServiceFactory::~MutexContendServiceFactory() = default;

Result<std::unique_ptr<MutexContendService>> MutexContendServiceFactory::create_contend_service(
    std::shared_ptr<MutexContender> contender) {
  return impl_->create_contend_service(std::move(contender), impl_->contend_options(), {});
}

Result<std::unique_ptr<MutexContendService>> MutexContendServiceFactory::create_contend_service(
    std::shared_ptr<MutexContender> contender, const ContendOptions& options) {
  return impl_->create_contend_service(std::move(contender), options, {});
}

Result<std::unique_ptr<MutexRetrievalService>> MutexContendServiceFactory::create_retrieval_service(
    std::shared_ptr<MutexRetriever> retriever) {
  return impl_->create_retrieval_service(std::move(retriever));
}

const std::shared_ptr<Backend>& MutexContendServiceFactory::backend() const {
  return impl_->backend();
}
const std::shared_ptr<Clock>& MutexContendServiceFactory::clock() const { return impl_->clock(); }
const ContendOptions& MutexContendServiceFactory::contend_options() const {
  return impl_->contend_options();
}

}  // namespace simba
