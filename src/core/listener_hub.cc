#include "core/listener_hub.h"

#include <algorithm>

namespace simba::internal {

class ListenerHub::Handle final : public Subscription {
 public:
  Handle(std::shared_ptr<ListenerHub> hub, SlotPtr slot, std::function<void(const Slot&)> on_close)
      : hub_(std::move(hub)), slot_(std::move(slot)), on_close_(std::move(on_close)) {}
  ~Handle() override {
    hub_->close(slot_);
    if (on_close_) on_close_(*slot_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

 private:
  const std::shared_ptr<ListenerHub> hub_;
  const SlotPtr slot_;
  const std::function<void(const Slot&)> on_close_;
};

std::unique_ptr<Subscription> ListenerHub::subscribe(std::string mutex, std::string contender_id,
                                                     Listener listener,
                                                     std::function<void(const Slot&)> on_close,
                                                     SlotPtr* slot) {
  auto made =
      std::make_shared<Slot>(Slot{std::move(mutex), std::move(contender_id), std::move(listener)});
  {
    std::lock_guard<std::mutex> lock(mu_);
    slots_[made->mutex].push_back(made);
  }
  if (slot != nullptr) *slot = made;
  return std::make_unique<Handle>(shared_from_this(), std::move(made), std::move(on_close));
}

void ListenerHub::close(const SlotPtr& slot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(slot->mutex);
    if (it != slots_.end()) {
      std::erase(it->second, slot);
      if (it->second.empty()) slots_.erase(it);
    }
  }
  // Waits for a delivery in progress on another thread; on the delivering
  // thread itself (a listener closing a subscription) it does not block.
  std::lock_guard<std::recursive_mutex> deliver(deliver_mu_);
  slot->open = false;
}

void ListenerHub::collect(const MutexEvent& event, Work* work,
                          const std::function<bool(const Slot&)>& match) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(event.mutex);
  if (it == slots_.end()) return;
  for (const SlotPtr& slot : it->second) {
    if (!match || match(*slot)) work->emplace_back(slot, event);
  }
}

void ListenerHub::collect_all(MutexEvent event, Work* work,
                              const std::function<bool(const Slot&)>& match) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [mutex, list] : slots_) {
    event.mutex = mutex;
    for (const SlotPtr& slot : list) {
      if (!match || match(*slot)) work->emplace_back(slot, event);
    }
  }
}

void ListenerHub::deliver(const Work& work) {
  if (work.empty()) return;
  std::lock_guard<std::recursive_mutex> deliver(deliver_mu_);
  for (const auto& [slot, event] : work) {
    if (slot->open) slot->listener(event);
  }
}

void ListenerHub::publish(const MutexEvent& event, const std::function<bool(const Slot&)>& match) {
  Work work;
  collect(event, &work, match);
  deliver(work);
}

bool ListenerHub::any(const std::string& mutex,
                      const std::function<bool(const Slot&)>& match) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(mutex);
  if (it == slots_.end()) return false;
  return !match || std::any_of(it->second.begin(), it->second.end(),
                               [&](const SlotPtr& slot) { return match(*slot); });
}

bool ListenerHub::empty() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.empty();
}

}  // namespace simba::internal
