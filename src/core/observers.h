// Where a hold's happenings are reported (FactoryOptions::metrics and
// ::events, KeyedLockOptions::metrics and ::events), and the one mapping from
// a LockEvent to the Metrics calls, shared by contend services
// (ServiceCore) and the keyed-lock provider.
#ifndef SIMBA_CORE_OBSERVERS_H_
#define SIMBA_CORE_OBSERVERS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "simba/clock.h"
#include "simba/events.h"
#include "simba/metrics.h"

namespace simba::internal {

// Either may be null.
struct Observers {
  std::shared_ptr<Metrics> metrics;
  std::shared_ptr<LockEventListener> events;

  bool any() const { return metrics != nullptr || events != nullptr; }
  // Counts `event` in the metrics (a store error as a renewal's when
  // `renewal`), then hands it to the listener. On the caller's thread.
  void deliver(const LockEvent& event, bool renewal = false) const;
};

// A LockEvent stamped now: system time, and `clock`'s for `monotonic`.
LockEvent make_lock_event(LockEvent::Kind kind, std::string store, std::string mutex,
                          std::string contender_id, std::uint64_t token, const Clock& clock);

}  // namespace simba::internal

#endif  // SIMBA_CORE_OBSERVERS_H_
