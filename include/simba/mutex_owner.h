// File: simba/mutex_owner.h
//
// The data model of a mutex, as JVM Simba defines it, plus a fencing token.
//
//   MutexOwner  who owns a mutex and until when (store clock, epoch ms)
//   MutexState  the owner before and after one update, as given to callbacks
//
// Lease timeline of one ownership (all times by the store's clock):
//
//   acquired_at ........ ttl_at ............... transition_at
//   |  ttl: the owner renews by here  | transition: grace for a late renewal |
//
// Other contenders are excluded until `transition_at`; after it the mutex is
// free for anyone. The owner is scheduled to renew at `ttl_at`. A store that
// cannot know another owner's times reports them as 0 ("unknown"; see
// OwnerRecord::ask_again_at in simba/backend.h): that owner holds the mutex
// until the store says otherwise, whatever has_owner(now) says.
//
// Fencing: every acquisition carries a `fencing_token` strictly greater than
// the token of every earlier acquisition of the same mutex, on every backend.
// A renewal keeps the token. A protected resource that remembers the highest
// token it has seen can reject writes from a stale owner.
//
// Thread safety: plain values.

#ifndef SIMBA_MUTEX_OWNER_H_
#define SIMBA_MUTEX_OWNER_H_

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace simba {

// Milliseconds since the Unix epoch, by the clock of the store that judged
// the lease (database time, Redis time, ...). Never compared with local time.
using StoreTime = std::chrono::milliseconds;

struct MutexOwner {
  // The contender id of the owner; empty means nobody.
  std::string owner_id;
  // When the lease was last acquired or renewed (store clock; 0 when free).
  StoreTime acquired_at{0};
  // End of the soft lease: the owner renews by now.
  StoreTime ttl_at{0};
  // End of the hard lease: others may take over after this instant.
  StoreTime transition_at{0};
  // Token of the acquisition this lease belongs to; 0 means "no owner".
  std::uint64_t fencing_token = 0;

  // The owner of a free mutex: empty id, all times 0.
  static const MutexOwner& none();

  bool has_owner_id() const { return !owner_id.empty(); }
  // Pure id comparison, no time check (Simba's MutexOwner.isOwner).
  bool is_owner(std::string_view contender_id) const {
    return !owner_id.empty() && owner_id == contender_id;
  }
  // ttl_at > now (strict, as in Simba).
  bool is_in_ttl(StoreTime now) const { return ttl_at > now; }
  bool is_in_ttl(std::string_view contender_id, StoreTime now) const {
    return is_owner(contender_id) && is_in_ttl(now);
  }
  // transition_at >= now (inclusive, as in Simba).
  bool is_in_transition(StoreTime now) const { return transition_at >= now; }
  // Time-based, like Simba: somebody's hard lease has not ended at `now`.
  bool has_owner(StoreTime now) const { return has_owner_id() && transition_at >= now; }

  friend bool operator==(const MutexOwner&, const MutexOwner&) = default;
};

std::ostream& operator<<(std::ostream& os, const MutexOwner& owner);

// One owner update: the owner known before it and after it.
struct MutexState {
  MutexOwner before;
  MutexOwner after;

  static const MutexState& none();

  // The owner changed: a different id, or the same id holding a new
  // acquisition (a different fencing token) - the second happens when an
  // owner lost its lease and acquired the mutex again.
  bool is_changed() const {
    return before.owner_id != after.owner_id ||
           (after.has_owner_id() && before.fencing_token != after.fencing_token);
  }
  // `contender_id` became the owner with this update.
  bool is_acquired(std::string_view contender_id) const {
    return is_changed() && after.is_owner(contender_id);
  }
  // `contender_id` stopped being the owner with this update.
  bool is_released(std::string_view contender_id) const {
    return is_changed() && before.is_owner(contender_id);
  }
  bool is_owner(std::string_view contender_id) const { return after.is_owner(contender_id); }

  friend bool operator==(const MutexState&, const MutexState&) = default;
};

std::ostream& operator<<(std::ostream& os, const MutexState& state);

}  // namespace simba

#endif  // SIMBA_MUTEX_OWNER_H_
