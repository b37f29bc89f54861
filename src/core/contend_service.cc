#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>
#include <utility>

#include "core/log.h"
#include "core/service_core.h"
#include "core/store_errors.h"

namespace simba::internal {
namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

// Renewal retries inside the transition window: often enough to get several
// tries in before the lease deadline, never busier than every 10 ms.
constexpr milliseconds kMinRenewRetry{10};
constexpr milliseconds kMaxRenewRetry{1000};
// A contender's retry after a store error starts here and doubles up to
// ttl, but never past kMaxErrorRetry: a process waiting through a store's
// failover (a new primary within a second or two) should find it soon after
// it is back, not up to a ttl later.
constexpr milliseconds kFirstErrorRetry{100};
constexpr milliseconds kMaxErrorRetry{2000};
// Upper bound of the safety margin taken off the local lease deadline.
constexpr milliseconds kMaxLeaseMargin{200};

// The contend cores running in this process, by backend, mutex and
// contender id. Keyed leases and clustered locks run each hold on a core of
// its own under one contender id, so a stopped core's attempt can still be
// in flight when the next core of that contender starts: the store then
// answers both as the same owner (a grant and its renewal, one token). The
// stopped core must not give that grant back: the running core holds it.
class RunningContenders {
 public:
  static RunningContenders& instance() {
    static auto* const kRegistry = new RunningContenders;  // never destroyed: cores outlive statics
    return *kRegistry;
  }
  void add(const Backend* backend, const std::string& mutex, const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    ++running_[{backend, mutex, id}];
  }
  void remove(const Backend* backend, const std::string& mutex, const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = running_.find({backend, mutex, id});
    if (it != running_.end() && --it->second == 0) running_.erase(it);
  }
  bool any(const Backend* backend, const std::string& mutex, const std::string& id) const {
    std::lock_guard<std::mutex> lock(mu_);
    return running_.count({backend, mutex, id}) != 0;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::tuple<const Backend*, std::string, std::string>, int> running_;
};

}  // namespace

ServiceCore::ServiceCore(Mode mode, std::shared_ptr<MutexRetriever> retriever,
                         std::shared_ptr<MutexContender> contender, ContendOptions options,
                         milliseconds poll_interval, std::shared_ptr<Runtime> runtime,
                         std::shared_ptr<Backend> backend, std::shared_ptr<Random> random,
                         ServiceHooks hooks, Observers observers,
                         std::shared_ptr<RenewalBatcher> batcher)
    : mode_(mode),
      retriever_(std::move(retriever)),
      contender_(std::move(contender)),
      mutex_(retriever_->mutex()),
      contender_id_(contender_ ? contender_->contender_id() : std::string()),
      options_(options),
      poll_interval_(poll_interval),
      runtime_(std::move(runtime)),
      clock_(runtime_->clock()),
      backend_(std::move(backend)),
      random_(std::move(random)),
      period_(contender_id_, random_),
      strand_(runtime_->make_strand()),
      hooks_(std::move(hooks)),
      observers_(std::move(observers)),
      batcher_(std::move(batcher)) {}

ServiceCore::~ServiceCore() {
  // Dropped while running (its factory went first): no longer a holder.
  if (mode_ == Mode::kContend && status_ == ServiceStatus::kRunning) {
    RunningContenders::instance().remove(backend_.get(), mutex_, contender_id_);
  }
}

Status ServiceCore::start() { return start(false, false); }

Status ServiceCore::start_and_attempt() { return start(true, false); }

Status ServiceCore::start_once() { return start(true, true); }

Status ServiceCore::start_for(const std::stop_token& cancel) {
  return cancel.stop_possible() ? start() : start_and_attempt();
}

Status ServiceCore::start(bool attempt_here, bool once) {
  Generation gen;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_ != ServiceStatus::kInitial) {
      return failed_precondition_error("cannot start the service of mutex '" + mutex_ +
                                       "' from state " + std::string(service_status_name(status_)) +
                                       "; expected INITIAL");
    }
    if (runtime_->closed()) {
      return failed_precondition_error("cannot start the service of mutex '" + mutex_ +
                                       "': its factory was destroyed");
    }
    status_ = ServiceStatus::kStarting;
    gen = ++generation_;
    once_ = once;
    state_ = MutexState::none();
    lease_deadline_ = {};
    bound_.reset();
    failures_ = 0;
    attempts_ = 0;
    last_attempt_ = ok_status();
    rerun_ = false;
  }
  std::unique_ptr<Subscription> subscription;
  if (!hooks_.subscribe_only_while_waiting) {
    Status error;
    subscription = open_subscription(gen, &error);
    if (!error.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = ServiceStatus::kInitial;
      return error;
    }
  }
  std::uint64_t losses = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    subscription_ = std::move(subscription);
    status_ = ServiceStatus::kRunning;
    if (mode_ == Mode::kContend) {
      RunningContenders::instance().add(backend_.get(), mutex_, contender_id_);
      wait_began_ = clock_->now();
      busy_seen_ = false;
      free_known_at_.reset();
      set_waiting_locked(true);
    }
    const milliseconds delay = mode_ == Mode::kContend ? options_.initial_delay : milliseconds(0);
    // A push heard since subscribing may have started an attempt already.
    attempt_here = attempt_here && delay <= milliseconds(0) && !in_flight_;
    if (!attempt_here) {
      schedule_attempt_locked(delay);
      return ok_status();
    }
    in_flight_ = true;
    losses = losses_;
  }
  run_attempt(gen, losses);
  return ok_status();
}

std::unique_ptr<Subscription> ServiceCore::open_subscription(Generation gen, Status* error) {
  if (!backend_->capabilities().push_release) return nullptr;
  std::weak_ptr<ServiceCore> weak = weak_from_this();
  auto sub = backend_->subscribe(mutex_, contender_id_, [weak, gen](const MutexEvent& event) {
    if (auto self = weak.lock()) self->on_event(gen, event);
  });
  if (!sub.ok() && sub.status().code() != StatusCode::kUnimplemented) {
    *error = sub.status().with_context("subscribing to mutex '" + mutex_ + "'");
    return nullptr;
  }
  return sub.ok() ? std::move(*sub) : nullptr;
}

Status ServiceCore::stop() {
  std::unique_ptr<Subscription> subscription;
  // The token of the ownership given up, or 0 when none is known here.
  std::uint64_t released_token = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_ != ServiceStatus::kRunning) {
      return failed_precondition_error("cannot stop the service of mutex '" + mutex_ +
                                       "' from state " + std::string(service_status_name(status_)) +
                                       "; expected RUNNING");
    }
    status_ = ServiceStatus::kStopping;
    if (mode_ == Mode::kContend) {
      RunningContenders::instance().remove(backend_.get(), mutex_, contender_id_);
    }
    ++generation_;
    runtime_->cancel(attempt_timer_);
    runtime_->cancel(deadline_timer_);
    attempt_timer_ = deadline_timer_ = 0;
    subscription = std::move(subscription_);
    // The owner hears on_released before anybody else can hear that the
    // mutex is free: revoke locally first, release at the store after. (The
    // other order let a new owner start while the old one, its release
    // answer delayed, still worked; the fault runs caught it.)
    if (mode_ == Mode::kContend && state_.after.is_owner(contender_id_)) {
      released_token = state_.after.fencing_token;
      if (observers_.any()) {
        report_locked(make_event_locked(LockEvent::Kind::kReleased, released_token));
      }
      apply_locked(MutexOwner::none());
    }
    set_waiting_locked(false);
    set_retrying_locked(false);
  }
  // Unsubscribing may wait for the backend; never under our lock.
  subscription.reset();
  // on_released has run before the release leaves, unless stop() is called
  // from one of this service's callbacks (it runs right after that one).
  const bool wait_for_callbacks =
      hooks_.stop_waits_for_callbacks && !strand_->running_in_this_thread();
  if (wait_for_callbacks) strand_->drain();
  Status result;
  if (mode_ == Mode::kContend && released_token != 0) {
    // An ownership we know is released by its token, so that this request,
    // should it reach the store late, cannot end a later ownership of ours.
    auto released = backend_->release(mutex_, contender_id_, released_token, store_deadline());
    if (!released.ok()) {
      result = released.status().with_context("releasing mutex '" + mutex_ + "' on stop");
      SIMBA_LOG(kWarn, result << " (the lease will expire at the store)");
    }
  } else if (mode_ == Mode::kContend) {
    // Owning nothing we know of, we leave the store's wait queue, or a store
    // that queues its waiters (etcd) grants our entry the mutex when the
    // holder lets go and it is held for a whole lease. Never a release
    // naming no token: sent by a waiter that gave up during a partition, it
    // can reach the store after the heal, when this contender id has
    // acquired again (a clustered lock's next hold), and end that ownership
    // (the clustered fault runs on PostgreSQL caught it). An attempt of ours
    // still in flight that acquires is given back by run_attempt, by its
    // token, when its answer comes (the compensating release).
    Status left = backend_->leave(mutex_, contender_id_, store_deadline());
    if (!left.ok()) {
      result = left.with_context("leaving the wait for mutex '" + mutex_ + "' on stop");
      // A store that cannot be reached has nothing of ours it would keep:
      // a queue entry or a key of a waiter ends with its lease or when
      // nobody listens for it (what a waiter giving up during an outage
      // meets, and was told already).
      if (is_retryable(left)) {
        SIMBA_LOG(kInfo, result);
      } else {
        SIMBA_LOG(kWarn, result);
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    apply_locked(MutexOwner::none());
    status_ = ServiceStatus::kInitial;
  }
  // stop() returns after the final on_released has run, unless it is being
  // called from one of this service's callbacks (waiting would deadlock).
  if (wait_for_callbacks) strand_->drain();
  return result;
}

ServiceStatus ServiceCore::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

MutexState ServiceCore::mutex_state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

bool ServiceCore::has_owner() const {
  std::lock_guard<std::mutex> lock(mu_);
  // An owner whose times the store could not tell holds until it says so.
  return state_.after.has_owner_id() &&
         (owner_times_unknown_ ||
          state_.after.has_owner(estimated_store_now_locked(clock_->now())));
}

bool ServiceCore::is_owner() const {
  std::lock_guard<std::mutex> lock(mu_);
  return is_owner_locked(clock_->now());
}

bool ServiceCore::is_in_ttl() const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = clock_->now();
  return is_owner_locked(now) && state_.after.is_in_ttl(estimated_store_now_locked(now));
}

std::uint64_t ServiceCore::fencing_token() const {
  std::lock_guard<std::mutex> lock(mu_);
  return is_owner_locked(clock_->now()) ? state_.after.fencing_token : 0;
}

std::optional<Clock::TimePoint> ServiceCore::lease_deadline() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!is_owner_locked(clock_->now())) return std::nullopt;
  return lease_deadline_;
}

Status ServiceCore::await_owner(Clock::TimePoint deadline, const std::stop_token& cancel) {
  // Registered before taking mu_: a stop already requested runs it here.
  std::stop_callback wake(cancel, [this] {
    std::lock_guard<std::mutex> lock(mu_);
    answered_.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu_);
  // The first attempt ends within its store call's deadline (after the
  // initial delay); this bound only guards against a bug turning "try once"
  // into a hang. Real time, as the store's answer is.
  const auto give_up = std::chrono::steady_clock::now() + options_.initial_delay +
                       options_.operation_timeout + std::chrono::seconds(5);
  for (;;) {
    const Clock::TimePoint now = clock_->now();
    if (is_owner_locked(now)) return ok_status();
    if (cancel.stop_requested()) {
      return cancelled_error("acquiring mutex '" + mutex_ + "' was cancelled");
    }
    // A store that refused the call (credentials, TLS verification, a
    // missing table it may not create, a bad database) refuses the next one
    // too: fail now instead of at the deadline. Transient failures (the
    // store unreachable, failing over, without a primary yet) are retried.
    if (attempts_ > 0 && !last_attempt_.ok() && !is_retryable(last_attempt_)) {
      return Status(last_attempt_.code(), "mutex '" + mutex_ + "': " + last_attempt_.message());
    }
    if (now >= deadline) {
      if (attempts_ > 0 && !last_attempt_.ok()) {
        // Still failing when the time ran out: the caller learns why (the
        // store's message names the hosts tried and what each said), not
        // that somebody holds the mutex.
        return unreachable_after(failures_, last_attempt_);
      }
      if (attempts_ > 0 || std::chrono::steady_clock::now() >= give_up) {
        return deadline_exceeded_error("mutex '" + mutex_ + "' is held elsewhere");
      }
      answered_.wait_for(lock, milliseconds(10));
      continue;
    }
    // No deadline still wakes now and then, in case a notification raced.
    clock_->wait_until(
        answered_, lock,
        deadline == Clock::TimePoint::max() ? now + std::chrono::seconds(1) : deadline);
  }
}

std::optional<Status> ServiceCore::last_attempt() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (attempts_ == 0) return std::nullopt;
  return last_attempt_;
}

std::shared_ptr<const HoldBound> ServiceCore::bound_of_locked(const OwnerRecord& reply) const {
  const bool same_tenure = state_.after.is_owner(contender_id_) &&
                           state_.after.fencing_token == reply.owner.fencing_token;
  // A tenure whose bound has passed is over, whatever a later answer brings.
  if (same_tenure && bound_ != nullptr && bound_->passed(std::chrono::steady_clock::now())) {
    return bound_;
  }
  if (reply.bound) return reply.bound;
  // A renewal answered without one (a batched renewal) keeps its tenure's.
  return same_tenure ? bound_ : nullptr;
}

bool ServiceCore::is_owner_locked(Clock::TimePoint now) const {
  return mode_ == Mode::kContend && status_ == ServiceStatus::kRunning &&
         state_.after.is_owner(contender_id_) && now < lease_deadline_ &&
         (bound_ == nullptr || !bound_->passed(std::chrono::steady_clock::now()));
}

StoreTime ServiceCore::estimated_store_now_locked(Clock::TimePoint now) const {
  return anchor_store_ + duration_cast<milliseconds>(now - anchor_local_);
}

Deadline ServiceCore::store_deadline() const {
  // Store calls talk to real servers, so their deadline is on the real clock
  // even when the service's own clock is a test clock.
  return std::chrono::steady_clock::now() + options_.operation_timeout;
}

void ServiceCore::schedule_attempt_locked(milliseconds delay) {
  if (status_ != ServiceStatus::kRunning) return;
  runtime_->cancel(attempt_timer_);
  attempt_timer_ = 0;
  const Generation gen = generation_;
  if (delay <= milliseconds(0)) {
    // "Now" (a push wake-up, a first attempt, a retry after a release)
    // skips the timer thread: one thread hop less on the hand-off path.
    start_attempt_locked(gen);
    return;
  }
  std::weak_ptr<ServiceCore> weak = weak_from_this();
  attempt_timer_ =
      runtime_->schedule_at(clock_->now() + std::max(delay, milliseconds(0)), [weak, gen] {
        if (auto self = weak.lock()) self->on_attempt_timer(gen);
      });
}

void ServiceCore::on_attempt_timer(Generation gen) {
  std::lock_guard<std::mutex> lock(mu_);
  if (gen != generation_ || status_ != ServiceStatus::kRunning) return;
  attempt_timer_ = 0;
  start_attempt_locked(gen);
}

void ServiceCore::start_attempt_locked(Generation gen) {
  if (in_flight_) {
    rerun_ = true;
    return;
  }
  in_flight_ = true;
  std::weak_ptr<ServiceCore> weak = weak_from_this();
  const Clock::TimePoint now = clock_->now();
  if (batcher_ && mode_ == Mode::kContend && is_owner_locked(now) && !owner_times_unknown_) {
    // A renewal, with the factory's others that meet now (one store
    // call). The batch never acquires: the service answers as usual.
    if (!batcher_->submit(
            mutex_, contender_id_, options_.ttl, options_.transition, store_deadline(),
            [weak, gen, losses = losses_](Result<OwnerRecord> reply, Clock::TimePoint sent) {
              if (auto self = weak.lock()) {
                self->apply_answer(gen, losses, sent, std::move(reply));
              }
            })) {
      in_flight_ = false;
    }
    return;
  }
  // Posting never waits for the pool, so holding mu_ here is fine. An
  // owner's renewal goes first: its lease is running out.
  if (!runtime_->post_io(
          [weak, gen, losses = losses_] {
            if (auto self = weak.lock()) self->run_attempt(gen, losses);
          },
          is_owner_locked(now))) {
    in_flight_ = false;
  }
}

void ServiceCore::run_attempt(Generation gen, std::uint64_t losses_seen) {
  bool once = false;
  {
    // Posted before a stop() that ran first: its lifecycle is over, and its
    // call would only queue again at the store, after stop() left the wait,
    // an entry nobody waits on (etcd's conformance run caught one in line).
    std::lock_guard<std::mutex> lock(mu_);
    if (gen != generation_) {
      in_flight_ = false;
      if (status_ == ServiceStatus::kRunning && rerun_) {
        rerun_ = false;
        schedule_attempt_locked(milliseconds(0));
      }
      return;
    }
    // Only the attempt whose answer the try takes: a hold it got renews,
    // and a later loss contends, as any other.
    once = std::exchange(once_, false);
  }
  // The lease is measured from when the request left, so the local deadline
  // can only be earlier than the store's.
  const Clock::TimePoint sent = clock_->now();
  Result<OwnerRecord> reply =
      mode_ == Mode::kContend
          ? backend_->acquire_or_renew(
                AcquireRequest{mutex_, contender_id_, options_.ttl, options_.transition, once},
                store_deadline())
          : backend_->read(mutex_, store_deadline());
  apply_answer(gen, losses_seen, sent, std::move(reply));
}

void ServiceCore::apply_answer(Generation gen, std::uint64_t losses_seen, Clock::TimePoint sent,
                               Result<OwnerRecord> reply) {
  bool compensate = false;
  bool leave_again = false;
  bool current = false;
  // A grant of a hold of ours that already ended here, to give back.
  std::uint64_t stale_token = 0;
  // subscribe_only_while_waiting: a subscription to drop (we own the mutex)
  // or to take out (another owner has it).
  std::unique_ptr<Subscription> dropped;
  bool subscribe = false;
  // When to ask next if subscribing fails.
  milliseconds unsubscribed_next{0};
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_ = false;
    if (gen != generation_) {
      // A result from a finished lifecycle: never applied. If it made us the
      // owner and no newer lifecycle is running (which would own that lease
      // itself), give the mutex back. Nor when another core of this
      // contender runs (RunningContenders): it owns that lease.
      const bool nobody_runs =
          mode_ == Mode::kContend && status_ != ServiceStatus::kRunning &&
          !RunningContenders::instance().any(backend_.get(), mutex_, contender_id_);
      compensate = nobody_runs && reply.ok() && reply->owner.is_owner(contender_id_);
      // Otherwise it may have queued us again after stop() left the wait
      // (its store call began after that leave: an entry nobody waits on,
      // which a store that queues would grant the mutex; etcd's
      // conformance run under ASan caught one): leave again.
      leave_again = nobody_runs && !compensate;
      // A newer lifecycle whose first attempt found this one in flight is
      // waiting for it to finish.
      if (status_ == ServiceStatus::kRunning && rerun_) {
        rerun_ = false;
        schedule_attempt_locked(milliseconds(0));
      }
    } else if (status_ == ServiceStatus::kRunning) {
      current = true;
      const Clock::TimePoint now = clock_->now();
      milliseconds next;
      if (reply.ok()) {
        failures_ = 0;
        set_retrying_locked(false);
        anchor_store_ = reply->store_now;
        anchor_local_ = now;
        owner_times_unknown_ = reply->owner_times_unknown();
        const MutexOwner& owner = reply->owner;
        if (mode_ == Mode::kContend && owner.is_owner(contender_id_) && losses_ != losses_seen) {
          // The store told us of a loss while this call was out: the reply
          // may predate it (a renewal answered from a client's cache, an
          // acquire that raced a dropped connection). Ask again rather than
          // hold on its word.
          if (state_.after.is_owner(contender_id_)) {
            report_loss_locked(LossCause::kOtherOwner,
                               "the store reported a loss while a renewal was out");
            apply_locked(MutexOwner::none());
          }
          next = milliseconds(0);
        } else if (mode_ == Mode::kContend && owner.is_owner(contender_id_) &&
                   bound_of_locked(*reply) != nullptr &&
                   bound_of_locked(*reply)->passed(std::chrono::steady_clock::now())) {
          // The store session that let others take this tenure over before
          // its lease ends went quiet past its bound (HoldBound): somebody
          // may have it now, whatever this answer says. That tenure is over
          // for good; give it back and ask anew, for a new token.
          if (state_.after.is_owner(contender_id_)) {
            report_loss_locked(LossCause::kDeadlinePassed,
                               "the store session backing the hold went unanswered past its bound");
            apply_locked(MutexOwner::none());
          }
          ended_token_ = std::max(ended_token_, owner.fencing_token);
          stale_token = owner.fencing_token;
          next = milliseconds(0);
        } else if (mode_ == Mode::kContend && owner.is_owner(contender_id_) &&
                   !state_.after.is_owner(contender_id_) && owner.fencing_token != 0 &&
                   owner.fencing_token <= ended_token_) {
          // A hold of ours that ended here (its deadline passed, a loss was
          // reported) can outlive that end at the store by the lease margin,
          // or longer where the store restarts leases (etcd on a leader
          // change, a ZooKeeper session that reconnected). Taking it back
          // would be a new acquisition under an old token (DESIGN §2: each
          // acquisition's token is above every earlier one): give it back
          // and ask anew, which the store answers with a new token.
          stale_token = owner.fencing_token;
          next = milliseconds(0);
        } else if (mode_ == Mode::kContend && owner.is_owner(contender_id_)) {
          // What the store granted, measured from when we asked, minus a
          // small margin so a late timer or a slightly fast store clock
          // cannot leave us believing in a lease the store already ended.
          const milliseconds granted = owner.transition_at - reply->store_now;
          const milliseconds margin = std::min(granted / 20, kMaxLeaseMargin);
          const Clock::TimePoint deadline = sent + duration_cast<Clock::Duration>(granted - margin);
          if (deadline <= now) {
            // The reply took longer than the lease it grants: it cannot be
            // trusted locally. Drop ownership now and ask again at once.
            if (state_.after.is_owner(contender_id_)) {
              report_loss_locked(LossCause::kDeadlinePassed,
                                 "the renewal's answer came back after the lease it granted");
              apply_locked(MutexOwner::none());
            }
            next = milliseconds(0);
          } else {
            if (observers_.any()) report_hold_locked(owner, now, deadline);
            bound_ = bound_of_locked(*reply);
            lease_deadline_ = deadline;
            runtime_->cancel(deadline_timer_);
            std::weak_ptr<ServiceCore> weak = weak_from_this();
            deadline_timer_ = runtime_->schedule_at(deadline, [weak, gen] {
              if (auto self = weak.lock()) self->on_lease_deadline(gen);
            });
            apply_locked(owner);
            next = period_.ensure_next_delay(*reply);
            // Where renewals go together, at the meeting point before it.
            if (batcher_) next = batcher_->meeting_delay(now, next, options_.ttl);
          }
        } else {
          if (mode_ == Mode::kContend && observers_.any()) {
            if (state_.after.is_owner(contender_id_)) {
              report_loss_locked(LossCause::kOtherOwner,
                                 owner.has_owner_id()
                                     ? "the store names " + owner.owner_id + " as the owner"
                                     : std::string("the store says nobody owns it"));
            }
            if (reply->owner_times_unknown() && owner.has_owner_id()) {
              // Another owner, until a pushed release or a later answer.
              busy_seen_ = true;
              free_known_at_.reset();
            } else if (owner.has_owner(reply->store_now)) {
              // Another owner: the mutex is free at the end of its lease at
              // the latest (a pushed release may tell us earlier).
              busy_seen_ = true;
              free_known_at_ = now + duration_cast<Clock::Duration>(std::max(
                                         owner.transition_at - reply->store_now, milliseconds(0)));
            }
          }
          apply_locked(owner);
          // A retriever has no lease to time: it re-reads at its poll
          // interval (and at once when the store pushes a change).
          next = mode_ == Mode::kRetrieve ? poll_interval_ : period_.ensure_next_delay(*reply);
        }
      } else {
        ++failures_;
        next = failure_delay_locked(now, reply.status());
        const bool transient = is_retryable(reply.status());
        if (mode_ == Mode::kContend && observers_.any()) {
          const bool renewal = is_owner_locked(now);
          LockEvent event = make_event_locked(LockEvent::Kind::kStoreError,
                                              renewal ? state_.after.fencing_token : 0);
          event.error = reply.status();
          event.retry_in = next;
          report_locked(std::move(event), renewal);
          set_retrying_locked(true);
        }
        // An event listener hears of every failure (the CLI prints each
        // new cause once): the log line is then only for those who ask. So
        // is a retry the store itself scheduled (retry_after: a restart
        // guard, an election that changed under the call): expected, not a
        // fault to warn about.
        const LogLevel level =
            observers_.events || reply.status().retry_after() ? LogLevel::kInfo : LogLevel::kWarn;
        if ((failures_ == 1 || failures_ % 10 == 0) && log_enabled(level)) {
          std::ostringstream line;
          line << "mutex '" << mutex_
               << "': " << (transient ? "store unreachable" : "store refused the call")
               << ", retrying in " << next.count() << " ms (" << failures_
               << " in a row): " << reply.status();
          log_line(level, line.str());
        }
      }
      if (stale_token != 0) {
        // The release below is this attempt's second store call: it stays
        // in flight, and the attempt is answered by the one after it.
        in_flight_ = true;
        current = false;
      } else if (rerun_) {
        rerun_ = false;
        if (!is_owner_locked(now)) next = milliseconds(0);
      }
      if (stale_token == 0 && hooks_.subscribe_only_while_waiting && mode_ == Mode::kContend) {
        if (is_owner_locked(now)) {
          dropped = std::move(subscription_);
        } else if (reply.ok() && subscription_ == nullptr &&
                   backend_->capabilities().push_release && reply->held()) {
          // Waiting from now: subscribe first (below, outside the lock),
          // then ask again, so a release in between is not missed.
          subscribe = true;
          unsubscribed_next = next;
        }
      }
      if (stale_token == 0) {
        if (!subscribe) schedule_attempt_locked(next);
        ++attempts_;
        last_attempt_ = reply.status();
        answered_.notify_all();
      }
    }
  }
  if (stale_token != 0) give_back(gen, stale_token);
  if (compensate) {
    auto released =
        backend_->release(mutex_, contender_id_, reply->owner.fencing_token, store_deadline());
    if (!released.ok()) {
      SIMBA_LOG(kWarn, "mutex '" << mutex_ << "': compensating release after stop failed: "
                                 << released.status());
    }
  }
  if (leave_again) {
    const Status left = backend_->leave(mutex_, contender_id_, store_deadline());
    if (!left.ok()) {
      SIMBA_LOG(kInfo, "mutex '" << mutex_ << "': leaving the wait again after stop failed: "
                                 << left << " (an entry left behind ends with its lease)");
    }
  }
  if (current && hooks_.attempt_done) hooks_.attempt_done(reply.status());
  // After the hook, which a new owner is waiting for. Unsubscribing (and
  // subscribing) may wait for the backend; never under our lock.
  dropped.reset();
  if (subscribe) {
    Status error;
    std::unique_ptr<Subscription> subscription = open_subscription(gen, &error);
    if (!error.ok()) SIMBA_LOG(kWarn, error << " (waiting by polling)");
    std::lock_guard<std::mutex> lock(mu_);
    if (gen == generation_ && status_ == ServiceStatus::kRunning && subscription_ == nullptr) {
      subscription_ = std::move(subscription);
      // Ask again now that a release would be pushed (when the contend
      // period says, as without pushes, if subscribing failed).
      schedule_attempt_locked(subscription_ != nullptr ? milliseconds(0) : unsubscribed_next);
    } else {
      // Stopped, restarted, or another attempt (started by a push while
      // this one subscribed) has subscribed already. Never replace a
      // subscription here: destroying one waits for its listener, which
      // may be waiting for our lock (a deadlock the contended bench hit).
      dropped = std::move(subscription);
    }
  }
  dropped.reset();
}

milliseconds ServiceCore::failure_delay_locked(Clock::TimePoint now, const Status& error) {
  if (is_owner_locked(now)) {
    // Keep retrying the renewal inside what is left of the lease (JVM Simba
    // retried once per ttl, i.e. usually after the lease had ended).
    const auto left = duration_cast<milliseconds>(lease_deadline_ - now);
    return std::clamp(left / 4, kMinRenewRetry, kMaxRenewRetry);
  }
  if (const auto after = error.retry_after()) {
    // The store said when trying can succeed again: be there then (with a
    // jitter so the contenders it turned away do not arrive together),
    // rather than where the doubling backoff happens to land, up to a ttl
    // later.
    return *after + milliseconds(random_->uniform(0, 100));
  }
  const int shift = std::min(failures_ - 1, 16);
  const milliseconds backoff =
      std::min<milliseconds>({options_.ttl, kMaxErrorRetry, kFirstErrorRetry * (1LL << shift)});
  // Jitter of a quarter of the backoff (at least 100 ms): processes that
  // found the store down together do not all come back together.
  return backoff +
         milliseconds(random_->uniform(0, std::max<std::int64_t>(100, backoff.count() / 4)));
}

void ServiceCore::on_lease_deadline(Generation gen) {
  std::lock_guard<std::mutex> lock(mu_);
  if (gen != generation_ || status_ != ServiceStatus::kRunning) return;
  deadline_timer_ = 0;
  if (!state_.after.is_owner(contender_id_) || clock_->now() < lease_deadline_) return;
  SIMBA_LOG(kWarn, "mutex '" << mutex_ << "': lease lost (no successful renewal before its "
                             << "deadline); revoking locally");
  if (observers_.any()) {
    report_loss_locked(
        failures_ > 0 ? LossCause::kRenewalFailed : LossCause::kDeadlinePassed,
        failures_ > 0 ? std::to_string(failures_) + " renewal(s) failed before the lease deadline"
                      : std::string("no renewal came back before the lease deadline"));
  }
  apply_locked(MutexOwner::none());
  if (in_flight_) {
    rerun_ = true;
  } else {
    schedule_attempt_locked(milliseconds(0));
  }
}

void ServiceCore::on_event(Generation gen, const MutexEvent& event) {
  std::uint64_t losses = 0;
  if (!on_event_locked(gen, event, &losses)) return;
  // The backend has the answer at hand: ask here, no hop to the I/O pool.
  run_attempt(gen, losses);
}

bool ServiceCore::on_event_locked(Generation gen, const MutexEvent& event, std::uint64_t* losses) {
  std::lock_guard<std::mutex> lock(mu_);
  if (gen != generation_ || status_ != ServiceStatus::kRunning) return false;
  if (mode_ == Mode::kContend) {
    const bool owner = is_owner_locked(clock_->now());
    if (event.kind == MutexEvent::Kind::kLost) {
      if (!event.owner_id.empty() && event.owner_id != contender_id_) return false;
      // A loss of an older tenure is no news to the owner of this one.
      if (owner && event.fencing_token != 0 && event.fencing_token != state_.after.fencing_token) {
        return false;
      }
      // An attempt in flight cannot tell whether its answer predates this.
      ++losses_;
      // A waiter has nothing to revoke.
      if (!owner) return false;
      SIMBA_LOG(kWarn, "mutex '" << mutex_ << "': the store ended our hold (token "
                                 << state_.after.fencing_token << "); revoking locally");
      report_loss_locked(event.forced ? LossCause::kForcedRelease : LossCause::kOtherOwner,
                         event.forced ? "the store says our hold was taken away"
                                      : "the store says our hold ended");
      apply_locked(MutexOwner::none());
    } else if (event.kind != MutexEvent::Kind::kReleased) {
      return false;
    } else if (owner) {
      // A release naming someone is no news to the owner. One naming nobody
      // is the store saying "look again": its push channel has just come up
      // (a LISTEN or SUBSCRIBE confirmed, a reconnect) or a key expired, and
      // whatever happened before may have gone unheard, a forced release of
      // this very hold included. The owner renews at once, which finds out
      // (a hold that ended at the store comes back with a new token or
      // another owner) instead of at its next renewal.
      if (!event.owner_id.empty()) return false;
    } else if (busy_seen_) {
      // For the hand-off latency: the mutex is free from now.
      const auto now = clock_->now();
      if (!free_known_at_ || now < *free_known_at_) free_known_at_ = now;
    }
  }
  if (in_flight_) {
    rerun_ = true;
    return false;
  }
  if (mode_ == Mode::kContend && event.kind == MutexEvent::Kind::kReleased &&
      !event.answered_for.empty() && event.answered_for == contender_id_) {
    in_flight_ = true;
    *losses = losses_;
    return true;
  }
  schedule_attempt_locked(milliseconds(0));
  return false;
}

void ServiceCore::give_back(Generation gen, std::uint64_t token) {
  auto released = backend_->release(mutex_, contender_id_, token, store_deadline());
  if (!released.ok()) {
    SIMBA_LOG(kWarn, "mutex '" << mutex_ << "': giving back a grant under the ended token " << token
                               << " failed: " << released.status());
  }
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_ = false;
  if (status_ != ServiceStatus::kRunning) return;
  // A newer lifecycle may be waiting for this call to finish (rerun_).
  if (gen != generation_ && !rerun_) return;
  rerun_ = false;
  milliseconds next{0};
  if (gen == generation_ && !released.ok()) {
    ++failures_;
    next = failure_delay_locked(clock_->now(), released.status());
  }
  schedule_attempt_locked(next);
}

void ServiceCore::apply_locked(const MutexOwner& owner) {
  // A hold of ours ends here (given up, lost, or past its deadline): no
  // later grant may carry its token (see run_attempt).
  if (mode_ == Mode::kContend && state_.after.is_owner(contender_id_) &&
      !(owner.is_owner(contender_id_) && owner.fencing_token == state_.after.fencing_token)) {
    ended_token_ = std::max(ended_token_, state_.after.fencing_token);
  }
  MutexState state{state_.after, owner};
  state_ = state;
  if (mode_ == Mode::kContend && !owner.is_owner(contender_id_)) {
    runtime_->cancel(deadline_timer_);
    deadline_timer_ = 0;
  }
  // Callbacks run on the strand: in order, one at a time, outside our lock.
  if (hooks_.notify_if && !hooks_.notify_if(state)) return;
  strand_->post([retriever = retriever_, state] { retriever->on_owner(state); });
}

void ServiceCore::report_hold_locked(const MutexOwner& owner, Clock::TimePoint now,
                                     Clock::TimePoint deadline) {
  const auto micros = [](Clock::Duration d) {
    return duration_cast<std::chrono::microseconds>(std::max(d, Clock::Duration(0)));
  };
  const bool renewed =
      state_.after.is_owner(contender_id_) && state_.after.fencing_token == owner.fencing_token;
  if (!renewed && state_.after.is_owner(contender_id_)) {
    // Our tenure ended at the store and this call began a new one.
    report_loss_locked(LossCause::kOtherOwner,
                       "the store gave us a new token: our previous hold had ended there");
  }
  LockEvent event = make_event_locked(
      renewed ? LockEvent::Kind::kRenewed : LockEvent::Kind::kAcquired, owner.fencing_token);
  event.lease_left = duration_cast<milliseconds>(deadline - now);
  if (renewed) {
    event.margin = micros(lease_deadline_ - now);
  } else {
    event.waited = micros(now - wait_began_);
    if (busy_seen_ && free_known_at_) event.handoff = micros(now - *free_known_at_);
    busy_seen_ = false;
    free_known_at_.reset();
  }
  report_locked(std::move(event));
  if (!renewed) set_waiting_locked(false);
}

void ServiceCore::report_loss_locked(LossCause cause, std::string why) {
  if (!observers_.any()) return;
  LockEvent event = make_event_locked(LockEvent::Kind::kLost, state_.after.fencing_token);
  event.cause = cause;
  event.error = aborted_error(std::move(why));
  report_locked(std::move(event));
  wait_began_ = clock_->now();
  busy_seen_ = false;
  free_known_at_.reset();
  set_waiting_locked(status_ == ServiceStatus::kRunning);
}

LockEvent ServiceCore::make_event_locked(LockEvent::Kind kind, std::uint64_t token) const {
  return make_lock_event(kind, std::string(backend_->scheme()), mutex_, contender_id_, token,
                         *clock_);
}

LockEvent make_lock_event(LockEvent::Kind kind, std::string store, std::string mutex,
                          std::string contender_id, std::uint64_t token, const Clock& clock) {
  LockEvent event;
  event.kind = kind;
  event.store = std::move(store);
  event.mutex = std::move(mutex);
  event.contender_id = std::move(contender_id);
  event.fencing_token = token;
  event.time = std::chrono::system_clock::now();
  event.monotonic = clock.now().time_since_epoch();
  return event;
}

void ServiceCore::report_locked(LockEvent event, bool renewal) {
  if (!observers_.any()) return;
  strand_->post([observers = observers_, event = std::move(event), renewal] {
    observers.deliver(event, renewal);
  });
}

void Observers::deliver(const LockEvent& event, bool renewal) const {
  if (metrics) {
    const MetricLabels labels{event.store, event.mutex};
    switch (event.kind) {
      case LockEvent::Kind::kAcquired:
        metrics->acquired(labels, event.waited.value_or(std::chrono::microseconds(0)),
                          event.handoff);
        break;
      case LockEvent::Kind::kRenewed:
        metrics->renewed(labels, event.margin.value_or(std::chrono::microseconds(0)));
        break;
      case LockEvent::Kind::kLost:
        metrics->lost(labels, event.cause.value_or(LossCause::kOtherOwner));
        break;
      case LockEvent::Kind::kReleased:
        metrics->released(labels);
        break;
      case LockEvent::Kind::kStoreError:
        metrics->store_error(labels, renewal);
        break;
    }
  }
  if (events) events->on_event(event);
}

void ServiceCore::set_retrying_locked(bool retrying) {
  if (!observers_.metrics || retrying == counted_retrying_) return;
  counted_retrying_ = retrying;
  strand_->post([metrics = observers_.metrics, store = std::string(backend_->scheme()),
                 mutex = mutex_, retrying] {
    metrics->retrying_changed(MetricLabels{store, mutex}, retrying ? 1 : -1);
  });
}

void ServiceCore::set_waiting_locked(bool waiting) {
  if (!observers_.metrics || waiting == counted_waiting_) return;
  counted_waiting_ = waiting;
  strand_->post([metrics = observers_.metrics, store = std::string(backend_->scheme()),
                 mutex = mutex_, waiting] {
    metrics->waiting_changed(MetricLabels{store, mutex}, waiting ? 1 : -1);
  });
}

}  // namespace simba::internal
