#include "simba/contend_period.h"

#include <algorithm>
#include <mutex>
#include <random>

namespace simba {
namespace {

class DefaultRandom final : public Random {
 public:
  DefaultRandom() : engine_(std::random_device{}()) {}
  std::int64_t uniform(std::int64_t lo, std::int64_t hi) override {
    std::lock_guard<std::mutex> lock(mu_);
    return std::uniform_int_distribution<std::int64_t>(lo, hi - 1)(engine_);
  }

 private:
  std::mutex mu_;
  std::mt19937_64 engine_;
};

}  // namespace

std::shared_ptr<Random> Random::standard() {
  static const std::shared_ptr<Random> kDefault = std::make_shared<DefaultRandom>();
  return kDefault;
}

ContendPeriod::ContendPeriod(std::string contender_id, std::shared_ptr<Random> random)
    : contender_id_(std::move(contender_id)),
      random_(random ? std::move(random) : Random::standard()) {}

std::chrono::milliseconds ContendPeriod::next_delay(const MutexOwner& owner, StoreTime now) const {
  if (owner.is_owner(contender_id_)) {
    // The owner renews exactly when its soft lease ends.
    return owner.ttl_at - now;
  }
  // A zero transition gives no window in which early attempts are harmless,
  // so the jitter only spreads contenders out after the lease end. Nor does
  // a lease that ends within |kJitterMin|: an attempt before its end would
  // only be told the same end again (see the header).
  const bool zero_transition = owner.transition_at == owner.ttl_at;
  const bool ends_soon = owner.transition_at - now <= std::chrono::milliseconds(-kJitterMin);
  const std::int64_t jitter =
      random_->uniform(zero_transition || ends_soon ? 0 : kJitterMin, kJitterMax);
  return owner.transition_at - now + std::chrono::milliseconds(jitter);
}

std::chrono::milliseconds ContendPeriod::ensure_next_delay(const MutexOwner& owner,
                                                           StoreTime now) const {
  const auto delay = next_delay(owner, now);
  return delay < std::chrono::milliseconds::zero() ? std::chrono::milliseconds::zero() : delay;
}

std::chrono::milliseconds ContendPeriod::ensure_next_delay(const OwnerRecord& record) const {
  if (!record.ask_again_at) return ensure_next_delay(record.owner, record.store_now);
  using std::chrono::milliseconds;
  const milliseconds left = *record.ask_again_at - record.store_now;
  if (left <= milliseconds::zero()) return milliseconds::zero();
  const milliseconds quarter = left / 4;
  const milliseconds margin = std::min(quarter, kAskAgainMargin);
  const std::int64_t spread = std::min<std::int64_t>(quarter.count(), kJitterMax);
  const std::int64_t jitter = spread > 0 ? random_->uniform(0, spread) : 0;
  return left - margin - milliseconds(jitter);
}

}  // namespace simba
