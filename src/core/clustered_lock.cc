// Clustered locks (simba/clustered_lock.h) on the contention machinery.
//
// Each defined lock is a ClusteredLockCore: a FIFO of this node's waiting
// calls, the node's current hold, and at most one MutexContendService
// contending for the lock under the node id. The service runs only while the
// node holds the lock or has calls waiting for it; a "reconcile" task on the
// manager's I/O threads (one at a time per lock) starts and stops it to match.
// Every run of the service gets a fresh contender carrying the run's number,
// so a callback of a stopped run can never be mistaken for the live one.
//
// Nothing waits on a caller's behalf: calls are queued, and are completed by
// the service's callbacks and attempt hooks, by timers (try_lock(timeout))
// and by the reconcile task. Futures are made ready inline from those library
// threads; user callbacks and loss listeners go through one strand per lock
// on the manager's callback threads, never under a lock of ours.
//
// Lock order: ClusteredLockCore::mu_ may be held while calling into a
// ServiceCore (is_owner, fencing_token), the Runtime (timers, posting) or the
// factory (creating a service); none of those calls back into us while
// holding their own locks.
#include "simba/clustered_lock.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/log.h"
#include "core/runtime.h"
#include "core/service_core.h"

namespace simba {
namespace internal {
namespace {

using std::chrono::milliseconds;

// Threads running store calls and service start/stop for all locks of a
// manager: enough for one slow store call not to hold up every other lock.
constexpr int kIoThreads = 2;
// Backoff of a service start that failed (store unreachable while
// subscribing): doubles from the first to the last.
constexpr milliseconds kFirstStartRetry{100};
constexpr milliseconds kMaxStartRetry{2000};

// Where the outcome of one call goes: a promise (made ready inline) or a user
// callback (run on the lock's callback strand).
struct Completion {
  std::function<void(Result<bool>)> fn;
  bool user = false;
};

// A call's outcome as the caller asked for it: the answer, or only whether
// it failed (lock()).
template <class T>
T As(Result<bool> r) {
  if constexpr (std::is_same_v<T, Status>) {
    return r.ok() ? OkStatus() : r.status();
  } else {
    return r;
  }
}

template <class T>
Completion ForPromise(const std::shared_ptr<std::promise<T>>& promise) {
  return {[promise](Result<bool> r) { promise->set_value(As<T>(std::move(r))); }, false};
}
template <class T>
Completion ForCallback(std::function<void(T)> done) {
  return {[done = std::move(done)](Result<bool> r) {
            if (done) done(As<T>(std::move(r)));
          },
          true};
}

// Makes the call with a promise and returns its future.
template <class T, class Call>
std::future<T> Promised(Call call) {
  auto promise = std::make_shared<std::promise<T>>();
  auto future = promise->get_future();
  call(ForPromise(promise));
  return future;
}

Status ManagerGone(const std::string& name) {
  return FailedPreconditionError("clustered lock '" + name +
                                 "': the ClusteredLockManager was destroyed");
}

}  // namespace

// What a manager shares with its locks (which may outlive it).
struct ClusteredShared {
  std::shared_ptr<MutexContendServiceFactory> factory;
  std::shared_ptr<FactoryImpl> impl;
  std::shared_ptr<Clock> clock;
  // The factory's, unless the manager has a clock of its own.
  std::shared_ptr<Runtime> runtime;
  bool owns_runtime = false;
  std::string node_id;
  ContendOptions lease;

  // The manager's store calls on the I/O threads: false (and the task
  // dropped) once the manager is closed.
  bool PostIo(Task task) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (closed) return false;
      ++pending;
    }
    if (runtime->PostIo([this_shared = this, task = std::move(task)] {
          task();
          this_shared->Done();
        })) {
      return true;
    }
    Done();
    return false;
  }
  // Whether the manager is gone (its callbacks then run where they are
  // completed).
  bool Closed() {
    std::lock_guard<std::mutex> lock(mu);
    return closed || runtime->closed();
  }
  // The manager's end: waits for its store calls (which release every hold)
  // to finish, then takes no more. On threads of its own, Runtime::Shutdown
  // does that.
  void Close() {
    if (owns_runtime) {
      runtime->Shutdown();
      return;
    }
    std::unique_lock<std::mutex> lock(mu);
    idle.wait(lock, [&] { return pending == 0; });
    closed = true;
  }
  void Done() {
    std::lock_guard<std::mutex> lock(mu);
    if (--pending == 0) idle.notify_all();
  }

  std::mutex mu;
  std::condition_variable idle;
  int pending = 0;
  bool closed = false;
};

class ClusteredLockCore : public std::enable_shared_from_this<ClusteredLockCore> {
 public:
  ClusteredLockCore(std::shared_ptr<ClusteredShared> shared, std::string name, ContendOptions lease)
      : shared_(std::move(shared)),
        name_(std::move(name)),
        lease_(lease),
        strand_(shared_->runtime->MakeStrand()) {}

  const std::string& name() const { return name_; }
  const std::string& node_id() const { return shared_->node_id; }
  // Waits for the callbacks queued so far (not from one of them).
  void Drain() {
    if (!strand_->RunningInThisThread()) strand_->Drain();
  }

  void Lock(Completion done);
  void TryLock(Completion done);
  void TryLockFor(milliseconds timeout, Completion done);
  void Unlock(Completion done);
  void IsLocked(Completion done);
  void IsLockedByMe(Completion done);
  std::uint64_t FencingToken() const;
  std::stop_token LostToken() const;
  ClusteredLock::ListenerId AddLossListener(ClusteredLock::LossListener listener);
  void RemoveLossListener(ClusteredLock::ListenerId id);

  // Ends this lock's life in the manager (remove() or the manager's
  // destruction): pending calls fail with `pending`, a hold is ended (its
  // holder told, with `hold_ended` as the reason), later calls fail with
  // `later`, and `released` (if set) completes once the store has released.
  void Close(Status pending, const Status& hold_ended, Status later,
             std::optional<Completion> released);

 private:
  enum class Kind {
    kLock,   // lock(): waits until granted
    kTimed,  // try_lock(timeout): waits until granted or its timer fires
    kOnce,   // try_lock(): resolved by one store attempt
  };
  struct Waiter {
    std::uint64_t id = 0;
    Kind kind = Kind::kLock;
    Completion done;
    Runtime::TimerId timer = 0;
    // kOnce: the first service run whose attempt may answer it.
    std::uint64_t min_run = 0;
  };
  // Work decided under mu_ and done after it is released, in order.
  struct Outbox {
    struct Item {
      std::function<void()> run;
      bool user = false;
    };
    std::vector<Item> items;
    void Complete(Completion done, Result<bool> result) {
      items.push_back(
          {[fn = std::move(done.fn), r = std::move(result)]() mutable { fn(std::move(r)); },
           done.user});
    }
  };

  void Flush(Outbox& out);
  // Runs `decide` under mu_, then does what it left in the outbox.
  template <class Fn>
  void Locked(Fn decide) {
    Outbox out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      decide(out);
    }
    Flush(out);
  }
  // Queues a call that waits for the lock.
  void WaitLocked(Waiter waiter, Outbox& out);
  // Error for a call on a closed lock, or OK.
  Status UsableLocked() const;
  // Brings the hold in line with the live service: detects a lost hold and
  // grants the lock to the first waiter when the service owns it.
  void SyncLocked(Outbox& out);
  void LoseHoldLocked(const Status& reason, Outbox& out);
  // Answers the kOnce waiters that `run`'s attempt covers (not granted).
  void ResolveOnceLocked(std::uint64_t up_to_run, const Result<bool>& answer, Outbox& out);
  bool NeedFreshRunLocked() const;
  void RequestReconcileLocked();
  void Reconcile();
  void OnServiceEvent(std::uint64_t run);
  void OnAttemptDone(std::uint64_t run, const Status& status);
  void OnTimeout(std::uint64_t waiter_id);
  void OnRetryTimer();
  // Answers `done` on the I/O threads from the store's record of the lock.
  void ReadStore(Completion done, Outbox& out,
                 std::function<bool(ClusteredLockCore&, const OwnerRecord&)> answer);
  Deadline StoreDeadline() const {
    // Store calls talk to real servers: their deadline is on the real clock.
    return std::chrono::steady_clock::now() + lease_.operation_timeout;
  }

  const std::shared_ptr<ClusteredShared> shared_;
  const std::string name_;
  const ContendOptions lease_;
  const std::shared_ptr<Strand> strand_;

  mutable std::mutex mu_;
  bool closed_ = false;
  Status closed_status_;
  std::deque<Waiter> waiters_;
  std::uint64_t next_waiter_id_ = 1;
  // The node's hold: granted to a call and not yet unlocked or lost.
  bool held_ = false;
  std::uint64_t hold_token_ = 0;
  std::stop_source lost_source_;
  // An unlock()/remove() owes a release at the store: the service must be
  // stopped before the lock is granted again.
  bool must_release_ = false;
  std::vector<Completion> after_release_;
  // The live run of the service (null when not running).
  std::shared_ptr<MutexContendService> service_;
  std::uint64_t live_run_ = 0;
  std::uint64_t runs_ = 0;
  int attempts_in_run_ = 0;
  bool reconcile_active_ = false;
  int start_failures_ = 0;
  Clock::TimePoint retry_at_{};
  Runtime::TimerId retry_timer_ = 0;
  std::map<ClusteredLock::ListenerId, ClusteredLock::LossListener> listeners_;
  ClusteredLock::ListenerId next_listener_ = 1;
};

void ClusteredLockCore::Flush(Outbox& out) {
  for (auto& item : out.items) {
    if (item.user && !shared_->Closed()) {
      strand_->Post(std::move(item.run));
    } else if (!item.user) {
      item.run();  // makes a future ready: no user code runs
    } else {
      // The manager's threads are gone: run the callback here, guarded as
      // the strand would.
      try {
        item.run();
      } catch (...) {
        SIMBA_LOG(kError, "clustered lock '" << name_ << "': a callback threw");
      }
    }
  }
  out.items.clear();
}

Status ClusteredLockCore::UsableLocked() const { return closed_ ? closed_status_ : OkStatus(); }

void ClusteredLockCore::LoseHoldLocked(const Status& reason, Outbox& out) {
  // A lost lease is news; a removal or a closing manager was asked for.
  if (reason.code() == StatusCode::kAborted) {
    SIMBA_LOG(kWarn, "clustered lock '" << name_ << "': " << reason);
  } else {
    SIMBA_LOG(kInfo, "clustered lock '" << name_ << "': hold (token " << hold_token_
                                        << ") ended: " << reason);
  }
  held_ = false;
  hold_token_ = 0;
  // request_stop runs the holder's stop_callbacks: outside our lock.
  out.items.push_back({[source = lost_source_]() mutable { source.request_stop(); }, false});
  for (const auto& [id, listener] : listeners_) {
    out.items.push_back({[listener, reason] { listener(reason); }, true});
  }
}

void ClusteredLockCore::SyncLocked(Outbox& out) {
  // 0 unless the service owns the lock and its lease deadline has not passed.
  const std::uint64_t token = service_ ? service_->fencing_token() : 0;
  if (held_ && token != hold_token_) {
    LoseHoldLocked(AbortedError("clustered lock '" + name_ + "': this node lost its hold (token " +
                                std::to_string(hold_token_) +
                                "): the lease was not renewed in time or the store ended it"),
                   out);
  }
  if (held_ || token == 0 || must_release_ || waiters_.empty()) return;
  Waiter granted = std::move(waiters_.front());
  waiters_.pop_front();
  shared_->runtime->Cancel(granted.timer);
  held_ = true;
  hold_token_ = token;
  lost_source_ = std::stop_source();
  out.Complete(std::move(granted.done), true);
  // Other single attempts lost to this grant: the node holds the lock now.
  ResolveOnceLocked(~std::uint64_t{0}, false, out);
}

void ClusteredLockCore::ResolveOnceLocked(std::uint64_t up_to_run, const Result<bool>& answer,
                                          Outbox& out) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->kind == Kind::kOnce && it->min_run <= up_to_run) {
      out.Complete(std::move(it->done), answer);
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

bool ClusteredLockCore::NeedFreshRunLocked() const {
  // A try_lock() that came after the live run's attempts began needs an
  // attempt of its own; restart the run (it holds nothing for anybody).
  if (!service_ || held_) return false;
  return std::any_of(waiters_.begin(), waiters_.end(), [this](const Waiter& w) {
    return w.kind == Kind::kOnce && w.min_run > live_run_;
  });
}

void ClusteredLockCore::RequestReconcileLocked() {
  if (reconcile_active_) return;  // the running task re-reads the state
  reconcile_active_ = true;
  std::weak_ptr<ClusteredLockCore> weak = weak_from_this();
  if (!shared_->PostIo([weak] {
        if (auto self = weak.lock()) self->Reconcile();
      })) {
    reconcile_active_ = false;
    SIMBA_LOG(kWarn, "clustered lock '" << name_ << "': the manager is closed; not reconciling");
  }
}

void ClusteredLockCore::Reconcile() {
  for (;;) {
    Outbox out;
    std::shared_ptr<MutexContendService> to_stop;
    std::shared_ptr<MutexContendService> to_start;
    std::vector<Completion> released;
    std::uint64_t run = 0;
    bool converged = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const bool want = !closed_ && (held_ || !waiters_.empty());
      if (service_ && (!want || must_release_ || NeedFreshRunLocked())) {
        // Stopping releases at the store (and wakes the next node).
        to_stop = std::move(service_);
        live_run_ = 0;
        attempts_in_run_ = 0;
        must_release_ = false;
        released = std::move(after_release_);
        after_release_.clear();
      } else if (!service_ && want) {
        const Clock::TimePoint now = shared_->clock->Now();
        if (now < retry_at_) {
          if (retry_timer_ == 0) {
            std::weak_ptr<ClusteredLockCore> weak = weak_from_this();
            retry_timer_ = shared_->runtime->ScheduleAt(retry_at_, [weak] {
              if (auto self = weak.lock()) self->OnRetryTimer();
            });
          }
          reconcile_active_ = false;
          return;
        }
        run = ++runs_;
        std::weak_ptr<ClusteredLockCore> weak = weak_from_this();
        auto on_event = [weak, run](const MutexState&) {
          if (auto self = weak.lock()) self->OnServiceEvent(run);
        };
        ServiceHooks hooks;
        hooks.attempt_done = [weak, run](const Status& status) {
          if (auto self = weak.lock()) self->OnAttemptDone(run, status);
        };
        auto service = shared_->impl->CreateContendService(
            MakeContender(name_, on_event, on_event, shared_->node_id), lease_, std::move(hooks));
        if (!service.ok()) {
          // Names and options were checked by define(): this cannot get
          // better by waiting, so nobody waits for it.
          const Status error = service.status().WithContext("clustered lock '" + name_ + "'");
          for (auto& w : waiters_) {
            shared_->runtime->Cancel(w.timer);
            out.Complete(std::move(w.done), error);
          }
          waiters_.clear();
        } else {
          service_ = std::move(*service);
          live_run_ = run;
          attempts_in_run_ = 0;
          to_start = service_;
        }
      } else {
        // Converged: whatever an unlock owed is settled (no service, nothing
        // held at the store).
        must_release_ = false;
        released = std::move(after_release_);
        after_release_.clear();
        reconcile_active_ = false;
        converged = true;
      }
    }
    if (to_stop) {
      Status stopped = to_stop->stop();
      to_stop.reset();
      if (!stopped.ok()) {
        SIMBA_LOG(kWarn, "clustered lock '" << name_ << "': " << stopped);
      }
      for (auto& done : released) {
        out.Complete(std::move(done), stopped.ok() ? Result<bool>(true) : Result<bool>(stopped));
      }
    } else if (to_start) {
      if (Status started = to_start->start(); !started.ok()) {
        const Status error = started.WithContext("clustered lock '" + name_ + "'");
        std::lock_guard<std::mutex> lock(mu_);
        if (service_ == to_start) {
          service_.reset();
          live_run_ = 0;
        }
        ++start_failures_;
        const int shift = std::min(start_failures_ - 1, 5);
        retry_at_ =
            shared_->clock->Now() + std::min(kMaxStartRetry, kFirstStartRetry * (1 << shift));
        // A single attempt gets this failure as its answer; lock() and
        // try_lock(timeout) keep waiting for a later start.
        ResolveOnceLocked(run, error, out);
      } else {
        std::lock_guard<std::mutex> lock(mu_);
        start_failures_ = 0;
      }
    } else {
      for (auto& done : released) out.Complete(std::move(done), true);
    }
    Flush(out);
    if (converged) return;
  }
}

void ClusteredLockCore::OnRetryTimer() {
  std::lock_guard<std::mutex> lock(mu_);
  retry_timer_ = 0;
  RequestReconcileLocked();
}

void ClusteredLockCore::OnServiceEvent(std::uint64_t run) {
  Locked([&](Outbox& out) {
    if (run != live_run_) return;  // a stopped run's last words
    SyncLocked(out);
    RequestReconcileLocked();
  });
}

void ClusteredLockCore::OnAttemptDone(std::uint64_t run, const Status& status) {
  Locked([&](Outbox& out) {
    if (run != live_run_) return;
    ++attempts_in_run_;
    // Most attempts are renewals that change nothing: reconcile only when
    // the hold or the queue changed.
    const bool held_before = held_;
    const std::size_t waiting_before = waiters_.size();
    SyncLocked(out);
    ResolveOnceLocked(run,
                      status.ok()
                          ? Result<bool>(false)
                          : Result<bool>(status.WithContext("clustered lock '" + name_ + "'")),
                      out);
    if (held_ != held_before || waiters_.size() != waiting_before) RequestReconcileLocked();
  });
}

void ClusteredLockCore::OnTimeout(std::uint64_t waiter_id) {
  Locked([&](Outbox& out) {
    auto it = std::find_if(waiters_.begin(), waiters_.end(),
                           [waiter_id](const Waiter& w) { return w.id == waiter_id; });
    if (it == waiters_.end()) return;  // granted or failed meanwhile
    out.Complete(std::move(it->done), false);
    waiters_.erase(it);
    RequestReconcileLocked();
  });
}

void ClusteredLockCore::Lock(Completion done) {
  Locked([&](Outbox& out) {
    if (Status usable = UsableLocked(); !usable.ok()) {
      out.Complete(std::move(done), usable);
    } else {
      WaitLocked(Waiter{next_waiter_id_++, Kind::kLock, std::move(done), 0, 0}, out);
    }
  });
}

void ClusteredLockCore::WaitLocked(Waiter waiter, Outbox& out) {
  waiters_.push_back(std::move(waiter));
  SyncLocked(out);
  RequestReconcileLocked();
}

void ClusteredLockCore::TryLock(Completion done) {
  Locked([&](Outbox& out) {
    SyncLocked(out);
    if (Status usable = UsableLocked(); !usable.ok()) {
      out.Complete(std::move(done), usable);
    } else if (held_ || std::any_of(waiters_.begin(), waiters_.end(),
                                    [](const Waiter& w) { return w.kind != Kind::kOnce; })) {
      // Held by this node (non-reentrant), or a call of this node is
      // waiting ahead: not available to this call.
      out.Complete(std::move(done), false);
    } else {
      // The attempt that answers it: the live run's first one if none has
      // finished yet, otherwise a fresh run's (the node holds nothing).
      std::uint64_t min_run = runs_ + 1;
      if (service_) min_run = attempts_in_run_ == 0 ? live_run_ : live_run_ + 1;
      WaitLocked(Waiter{next_waiter_id_++, Kind::kOnce, std::move(done), 0, min_run}, out);
    }
  });
}

void ClusteredLockCore::TryLockFor(milliseconds timeout, Completion done) {
  if (timeout == milliseconds(0)) return TryLock(std::move(done));
  Locked([&](Outbox& out) {
    if (timeout < milliseconds(0)) {
      out.Complete(std::move(done), InvalidArgumentError("timeout must be >= 0 (got " +
                                                         std::to_string(timeout.count()) + "ms)"));
    } else if (Status usable = UsableLocked(); !usable.ok()) {
      out.Complete(std::move(done), usable);
    } else {
      const std::uint64_t id = next_waiter_id_++;
      std::weak_ptr<ClusteredLockCore> weak = weak_from_this();
      const Runtime::TimerId timer =
          shared_->runtime->ScheduleAt(shared_->clock->Now() + timeout, [weak, id] {
            if (auto self = weak.lock()) self->OnTimeout(id);
          });
      if (timer == 0) {
        out.Complete(std::move(done), ManagerGone(name_));
      } else {
        WaitLocked(Waiter{id, Kind::kTimed, std::move(done), timer, 0}, out);
      }
    }
  });
}

void ClusteredLockCore::Unlock(Completion done) {
  Locked([&](Outbox& out) {
    // A hold lost a moment ago is not this node's to unlock any more.
    SyncLocked(out);
    if (Status usable = UsableLocked(); !usable.ok()) {
      out.Complete(std::move(done), usable);
    } else if (!held_) {
      out.Complete(std::move(done), false);
    } else {
      held_ = false;
      hold_token_ = 0;
      must_release_ = true;
      after_release_.push_back(std::move(done));
      RequestReconcileLocked();
    }
  });
}

void ClusteredLockCore::IsLocked(Completion done) {
  Locked([&](Outbox& out) {
    if (Status usable = UsableLocked(); !usable.ok()) {
      out.Complete(std::move(done), usable);
    } else {
      ReadStore(std::move(done), out, [](ClusteredLockCore&, const OwnerRecord& record) {
        return record.held();
      });
    }
  });
}

void ClusteredLockCore::IsLockedByMe(Completion done) {
  Locked([&](Outbox& out) {
    SyncLocked(out);
    if (Status usable = UsableLocked(); !usable.ok()) {
      out.Complete(std::move(done), usable);
    } else if (!held_) {
      out.Complete(std::move(done), false);
    } else {
      // Held here: confirm with the store (an operator's forced release
      // shows there before the next renewal tells us).
      ReadStore(std::move(done), out,
                [token = hold_token_](ClusteredLockCore& self, const OwnerRecord& record) {
                  return record.owner.is_owner(self.shared_->node_id) &&
                         record.owner.fencing_token == token && record.held() &&
                         self.FencingToken() == token;
                });
    }
  });
}

void ClusteredLockCore::ReadStore(
    Completion done, Outbox& out,
    std::function<bool(ClusteredLockCore&, const OwnerRecord&)> answer) {
  auto shared = std::make_shared<Completion>(std::move(done));
  std::weak_ptr<ClusteredLockCore> weak = weak_from_this();
  if (!shared_->PostIo([weak, shared, answer = std::move(answer)] {
        auto self = weak.lock();
        if (!self) return;
        Outbox reply;
        auto record = self->shared_->factory->backend()->read(self->name_, self->StoreDeadline());
        if (!record.ok()) {
          reply.Complete(std::move(*shared),
                         record.status().WithContext("clustered lock '" + self->name_ + "'"));
        } else {
          reply.Complete(std::move(*shared), answer(*self, *record));
        }
        self->Flush(reply);
      })) {
    out.Complete(std::move(*shared), ManagerGone(name_));
  }
}

std::uint64_t ClusteredLockCore::FencingToken() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!held_ || !service_) return 0;
  return service_->fencing_token() == hold_token_ ? hold_token_ : 0;
}

std::stop_token ClusteredLockCore::LostToken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lost_source_.get_token();
}

ClusteredLock::ListenerId ClusteredLockCore::AddLossListener(ClusteredLock::LossListener listener) {
  std::lock_guard<std::mutex> lock(mu_);
  const ClusteredLock::ListenerId id = next_listener_++;
  if (listener) listeners_.emplace(id, std::move(listener));
  return id;
}

void ClusteredLockCore::RemoveLossListener(ClusteredLock::ListenerId id) {
  std::lock_guard<std::mutex> lock(mu_);
  listeners_.erase(id);
}

void ClusteredLockCore::Close(Status pending, const Status& hold_ended, Status later,
                              std::optional<Completion> released) {
  Locked([&](Outbox& out) {
    if (closed_) {
      if (released) out.Complete(std::move(*released), false);
    } else {
      closed_ = true;
      closed_status_ = std::move(later);
      for (auto& w : waiters_) {
        shared_->runtime->Cancel(w.timer);
        out.Complete(std::move(w.done), pending);
      }
      waiters_.clear();
      if (held_) LoseHoldLocked(hold_ended, out);
      if (released) after_release_.push_back(std::move(*released));
      shared_->runtime->Cancel(retry_timer_);
      retry_timer_ = 0;
      retry_at_ = {};
      RequestReconcileLocked();
    }
  });
}

}  // namespace internal

// ---- ClusteredLock ---------------------------------------------------------------

using internal::Completion;
using internal::ForCallback;
using internal::Promised;

ClusteredLock::ClusteredLock(std::shared_ptr<internal::ClusteredLockCore> core)
    : core_(std::move(core)) {}
ClusteredLock::~ClusteredLock() = default;

const std::string& ClusteredLock::name() const { return core_->name(); }
const std::string& ClusteredLock::node_id() const { return core_->node_id(); }

std::future<Status> ClusteredLock::lock() {
  return Promised<Status>([&](Completion done) { core_->Lock(std::move(done)); });
}
void ClusteredLock::lock(StatusCallback done) { core_->Lock(ForCallback(std::move(done))); }

std::future<Result<bool>> ClusteredLock::try_lock() {
  return Promised<Result<bool>>([&](Completion done) { core_->TryLock(std::move(done)); });
}
void ClusteredLock::try_lock(BoolCallback done) { core_->TryLock(ForCallback(std::move(done))); }

std::future<Result<bool>> ClusteredLock::try_lock(std::chrono::milliseconds timeout) {
  return Promised<Result<bool>>(
      [&](Completion done) { core_->TryLockFor(timeout, std::move(done)); });
}
void ClusteredLock::try_lock(std::chrono::milliseconds timeout, BoolCallback done) {
  core_->TryLockFor(timeout, ForCallback(std::move(done)));
}

std::future<Result<bool>> ClusteredLock::unlock() {
  return Promised<Result<bool>>([&](Completion done) { core_->Unlock(std::move(done)); });
}
void ClusteredLock::unlock(BoolCallback done) { core_->Unlock(ForCallback(std::move(done))); }

std::future<Result<bool>> ClusteredLock::is_locked() {
  return Promised<Result<bool>>([&](Completion done) { core_->IsLocked(std::move(done)); });
}
void ClusteredLock::is_locked(BoolCallback done) { core_->IsLocked(ForCallback(std::move(done))); }

std::future<Result<bool>> ClusteredLock::is_locked_by_me() {
  return Promised<Result<bool>>([&](Completion done) { core_->IsLockedByMe(std::move(done)); });
}
void ClusteredLock::is_locked_by_me(BoolCallback done) {
  core_->IsLockedByMe(ForCallback(std::move(done)));
}

bool ClusteredLock::is_held() const { return core_->FencingToken() != 0; }
std::uint64_t ClusteredLock::fencing_token() const { return core_->FencingToken(); }
std::stop_token ClusteredLock::lost_token() const { return core_->LostToken(); }

ClusteredLock::ListenerId ClusteredLock::add_loss_listener(LossListener listener) {
  return core_->AddLossListener(std::move(listener));
}
void ClusteredLock::remove_loss_listener(ListenerId id) { core_->RemoveLossListener(id); }

// ---- ClusteredLockManager ----------------------------------------------------------

Result<std::unique_ptr<ClusteredLockManager>> ClusteredLockManager::create(
    std::shared_ptr<MutexContendServiceFactory> factory, ClusteredLockOptions options) {
  if (!factory) return InvalidArgumentError("factory must not be null");
  if (options.callback_threads < 1 || options.callback_threads > 64) {
    return InvalidArgumentError("callback_threads must be in [1, 64] (got " +
                                std::to_string(options.callback_threads) + ")");
  }
  const ContendOptions lease = options.lease.value_or(factory->contend_options());
  if (Status s = lease.Validate(); !s.ok()) return s.WithContext("lease");
  std::string node_id = options.node_id.empty() ? MutexContender::GenerateHostContenderId()
                                                : std::move(options.node_id);
  if (Status s = factory->backend()->validate_contender_id(node_id); !s.ok()) {
    return s.WithContext("node_id");
  }
  auto shared = std::make_shared<internal::ClusteredShared>();
  shared->impl = internal::FactoryAccess::Of(*factory);
  shared->clock = options.clock ? options.clock : factory->clock();
  shared->factory = std::move(factory);
  shared->node_id = std::move(node_id);
  shared->lease = lease;
  // One set of threads with the factory, unless timers must follow a clock
  // of the manager's own.
  if (shared->clock == shared->impl->clock()) {
    shared->runtime = shared->impl->runtime();
  } else {
    shared->runtime = std::make_shared<internal::Runtime>(shared->clock, internal::kIoThreads,
                                                          options.callback_threads);
    shared->owns_runtime = true;
  }
  return std::unique_ptr<ClusteredLockManager>(new ClusteredLockManager(std::move(shared)));
}

Result<std::unique_ptr<ClusteredLockManager>> ClusteredLockManager::create(
    std::shared_ptr<Backend> backend, ClusteredLockOptions options) {
  FactoryOptions factory_options;
  if (options.lease) factory_options.contend = *options.lease;
  factory_options.clock = options.clock;
  // The manager runs on the factory's threads.
  factory_options.callback_threads = options.callback_threads;
  factory_options.metrics = options.metrics;
  factory_options.events = options.events;
  SIMBA_ASSIGN_OR_RETURN(std::unique_ptr<MutexContendServiceFactory> factory,
                         MutexContendServiceFactory::create(std::move(backend), factory_options));
  return create(std::shared_ptr<MutexContendServiceFactory>(std::move(factory)),
                std::move(options));
}

ClusteredLockManager::ClusteredLockManager(std::shared_ptr<internal::ClusteredShared> shared)
    : shared_(std::move(shared)) {}

ClusteredLockManager::~ClusteredLockManager() {
  std::map<std::string, std::shared_ptr<ClusteredLock>, std::less<>> locks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    locks.swap(locks_);
  }
  for (auto& [name, lock] : locks) {
    lock->core_->Close(
        CancelledError("clustered lock '" + name + "': the ClusteredLockManager was destroyed"),
        CancelledError("clustered lock '" + name +
                       "': the ClusteredLockManager was destroyed; this node's hold ended"),
        internal::ManagerGone(name), std::nullopt);
  }
  // Waits for the queued reconciles (which release every hold at the store)
  // and then for the callbacks they queued.
  shared_->Close();
  for (auto& [name, lock] : locks) lock->core_->Drain();
}

Result<bool> ClusteredLockManager::define(const std::string& name, ClusteredLockConfig config) {
  SIMBA_RETURN_IF_ERROR(shared_->factory->backend()->validate_mutex(name));
  const ContendOptions lease = config.lease.value_or(shared_->lease);
  if (Status s = lease.Validate(); !s.ok()) return s.WithContext("lease of '" + name + "'");
  std::lock_guard<std::mutex> lock(mu_);
  if (locks_.count(name) != 0) return false;
  auto core = std::make_shared<internal::ClusteredLockCore>(shared_, name, lease);
  locks_.emplace(name, std::shared_ptr<ClusteredLock>(new ClusteredLock(std::move(core))));
  return true;
}

bool ClusteredLockManager::is_defined(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return locks_.count(name) != 0;
}

Result<std::shared_ptr<ClusteredLock>> ClusteredLockManager::get(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = locks_.find(name);
  if (it == locks_.end()) {
    return NotFoundError("clustered lock '" + name +
                         "' is not defined in this manager; call define(\"" + name + "\") first");
  }
  return it->second;
}

std::future<Result<bool>> ClusteredLockManager::remove(const std::string& name) {
  auto promise = std::make_shared<std::promise<Result<bool>>>();
  auto future = promise->get_future();
  std::shared_ptr<ClusteredLock> removed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = locks_.find(name);
    if (it != locks_.end()) {
      removed = std::move(it->second);
      locks_.erase(it);
    }
  }
  if (!removed) {
    promise->set_value(false);
    return future;
  }
  removed->core_->Close(
      CancelledError("clustered lock '" + name + "' was removed while this call waited"),
      CancelledError("clustered lock '" + name + "' was removed; this node's hold ended"),
      FailedPreconditionError("clustered lock '" + name +
                              "' was removed from its manager; define it again and get a new "
                              "handle"),
      internal::ForPromise(promise));
  return future;
}

const std::string& ClusteredLockManager::node_id() const { return shared_->node_id; }

const std::shared_ptr<MutexContendServiceFactory>& ClusteredLockManager::factory() const {
  return shared_->factory;
}

}  // namespace simba
