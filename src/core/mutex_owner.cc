#include "simba/mutex_owner.h"

namespace simba {

const MutexOwner& MutexOwner::none() {
  static const MutexOwner* const kNone = new MutexOwner();
  return *kNone;
}

const MutexState& MutexState::none() {
  static const MutexState* const kNone = new MutexState();
  return *kNone;
}

std::ostream& operator<<(std::ostream& os, const MutexOwner& owner) {
  if (!owner.has_owner_id()) return os << "MutexOwner{none}";
  return os << "MutexOwner{id=" << owner.owner_id << ", acquired_at=" << owner.acquired_at.count()
            << ", ttl_at=" << owner.ttl_at.count()
            << ", transition_at=" << owner.transition_at.count()
            << ", token=" << owner.fencing_token << "}";
}

std::ostream& operator<<(std::ostream& os, const MutexState& state) {
  return os << "MutexState{before=" << state.before << ", after=" << state.after << "}";
}

}  // namespace simba
