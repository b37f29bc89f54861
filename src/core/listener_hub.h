// The listeners of a backend's subscriptions, and the one proof that a
// listener is never called after its subscription is destroyed.
//
// A backend keeps one hub (in a shared_ptr: subscriptions may outlive the
// backend), gives out hub->subscribe(...) from Backend::subscribe, and
// delivers what its store pushes with collect() + deliver() (or publish()).
//
//   auto hub = std::make_shared<ListenerHub>();
//   std::unique_ptr<Subscription> sub = hub->subscribe("m", "c1", listener);
//   hub->publish({MutexEvent::Kind::kReleased, "m"});   // calls `listener`
//   sub.reset();   // from here on `listener` is never called again
//
// The guarantee: once a Subscription's destructor has returned, its listener
// is not running on another thread and will not be called again. The
// destructor waits for a call in progress on another thread; called from
// inside a listener of this hub (on the delivering thread) it does not wait,
// so a listener may end its own or another subscription. Deliveries of one
// hub run one at a time (a listener must not block on another delivery).
//
// Thread safety: every method may be called from any thread.
#ifndef SIMBA_CORE_LISTENER_HUB_H_
#define SIMBA_CORE_LISTENER_HUB_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "simba/backend.h"

namespace simba::internal {

class ListenerHub : public std::enable_shared_from_this<ListenerHub> {
 public:
  using Listener = std::function<void(const MutexEvent&)>;

  struct Slot {
    std::string mutex;
    std::string contender_id;  // empty: a retriever
    Listener listener;
    bool open = true;  // guarded by the hub's delivery lock
  };
  using SlotPtr = std::shared_ptr<Slot>;
  using Work = std::vector<std::pair<SlotPtr, MutexEvent>>;

  // A subscription for (mutex, contender_id). `on_close` (optional) runs in
  // the subscription's destructor once the listener can no longer be
  // called, e.g. to stop listening on the store; `slot` (optional) receives
  // the slot, for a backend that keeps state per subscription.
  std::unique_ptr<Subscription> subscribe(std::string mutex, std::string contender_id,
                                          Listener listener,
                                          std::function<void(const Slot&)> on_close = {},
                                          SlotPtr* slot = nullptr);

  // Appends (slot, event) for each subscription to event.mutex that `match`
  // accepts (every one when `match` is empty). Takes only the hub's index
  // lock: may be called under the backend's own lock.
  void collect(const MutexEvent& event, Work* work,
               const std::function<bool(const Slot&)>& match = {}) const;
  // The same for every subscribed mutex, with event.mutex set to each.
  void collect_all(MutexEvent event, Work* work,
                   const std::function<bool(const Slot&)>& match = {}) const;
  // Calls the listeners in order, skipping closed subscriptions. Never call
  // it under a lock a listener may take.
  void deliver(const Work& work);
  // collect() + deliver().
  void publish(const MutexEvent& event, const std::function<bool(const Slot&)>& match = {});

  // Whether some subscription to `mutex` is accepted by `match` (any, when
  // empty).
  bool any(const std::string& mutex, const std::function<bool(const Slot&)>& match = {}) const;
  bool empty() const;

 private:
  class Handle;
  void close(const SlotPtr& slot);

  mutable std::mutex mu_;  // the index
  std::map<std::string, std::vector<SlotPtr>> slots_;
  // Held while listeners run. Recursive: a listener may close a slot.
  std::recursive_mutex deliver_mu_;
};

}  // namespace simba::internal

#endif  // SIMBA_CORE_LISTENER_HUB_H_
