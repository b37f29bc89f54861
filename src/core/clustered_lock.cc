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
#include "core/store_errors.h"

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
T as(Result<bool> r) {
  if constexpr (std::is_same_v<T, Status>) {
    return r.ok() ? ok_status() : r.status();
  } else {
    return r;
  }
}

template <class T>
Completion for_promise(const std::shared_ptr<std::promise<T>>& promise) {
  return {[promise](Result<bool> r) { promise->set_value(as<T>(std::move(r))); }, false};
}
template <class T>
Completion for_callback(std::function<void(T)> done) {
  return {[done = std::move(done)](Result<bool> r) {
            if (done) done(as<T>(std::move(r)));
          },
          true};
}

// Makes the call with a promise and returns its future.
template <class T, class Call>
std::future<T> promised(Call call) {
  auto promise = std::make_shared<std::promise<T>>();
  auto future = promise->get_future();
  call(for_promise(promise));
  return future;
}

Status manager_gone(const std::string& name) {
  return failed_precondition_error("clustered lock '" + name +
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
  bool post_io(Task task) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (closed) return false;
      ++pending;
    }
    if (runtime->post_io([this_shared = this, task = std::move(task)] {
          task();
          this_shared->done();
        })) {
      return true;
    }
    done();
    return false;
  }
  // Whether the manager is gone (its callbacks then run where they are
  // completed).
  bool is_closed() {
    std::lock_guard<std::mutex> lock(mu);
    return closed || runtime->closed();
  }
  // The manager's end: waits for its store calls (which release every hold)
  // to finish, then takes no more. On threads of its own, Runtime::shutdown
  // does that.
  void close() {
    if (owns_runtime) {
      runtime->shutdown();
      return;
    }
    std::unique_lock<std::mutex> lock(mu);
    idle.wait(lock, [&] { return pending == 0; });
    closed = true;
  }
  void done() {
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
        strand_(shared_->runtime->make_strand()) {}

  const std::string& name() const { return name_; }
  const std::string& node_id() const { return shared_->node_id; }
  // Waits for the callbacks queued so far (not from one of them).
  void drain() {
    if (!strand_->running_in_this_thread()) strand_->drain();
  }

  void lock(Completion done);
  void try_lock(Completion done);
  void try_lock_for(milliseconds timeout, Completion done);
  void unlock(Completion done);
  void is_locked(Completion done);
  void is_locked_by_me(Completion done);
  std::uint64_t fencing_token() const;
  std::optional<Clock::TimePoint> lease_deadline() const;
  std::stop_token lost_token() const;
  ClusteredLock::ListenerId add_loss_listener(ClusteredLock::LossListener listener);
  void remove_loss_listener(ClusteredLock::ListenerId id);

  // Ends this lock's life in the manager (remove() or the manager's
  // destruction): pending calls fail with `pending`, a hold is ended (its
  // holder told, with `hold_ended` as the reason), later calls fail with
  // `later`, and `released` (if set) completes once the store has released.
  void close(Status pending, const Status& hold_ended, Status later,
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
    void complete(Completion done, Result<bool> result) {
      items.push_back(
          {[fn = std::move(done.fn), r = std::move(result)]() mutable { fn(std::move(r)); },
           done.user});
    }
  };

  void flush(Outbox& out);
  // Runs `decide` under mu_, then does what it left in the outbox.
  template <class Fn>
  void locked(Fn decide) {
    Outbox out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      decide(out);
    }
    flush(out);
  }
  // Queues a call that waits for the lock.
  void wait_locked(Waiter waiter, Outbox& out);
  // Error for a call on a closed lock, or OK.
  Status usable_locked() const;
  // Brings the hold in line with the live service: detects a lost hold and
  // grants the lock to the first waiter when the service owns it.
  void sync_locked(Outbox& out);
  void lose_hold_locked(const Status& reason, Outbox& out);
  // Answers the kOnce waiters that `run`'s attempt covers (not granted).
  void resolve_once_locked(std::uint64_t up_to_run, const Result<bool>& answer, Outbox& out);
  bool need_fresh_run_locked() const;
  void request_reconcile_locked();
  void reconcile();
  void on_service_event(std::uint64_t run);
  void on_attempt_done(std::uint64_t run, const Status& status);
  void on_timeout(std::uint64_t waiter_id);
  void on_retry_timer();
  // Answers `done` on the I/O threads from the store's record of the lock.
  void read_store(Completion done, Outbox& out,
                  std::function<bool(ClusteredLockCore&, const OwnerRecord&)> answer);
  Deadline store_deadline() const {
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
  // The live run's failed store calls in a row and the last one's error:
  // a try_lock(timeout) that runs out meanwhile says why.
  int failures_in_a_row_ = 0;
  Status last_failure_;
  bool reconcile_active_ = false;
  int start_failures_ = 0;
  Clock::TimePoint retry_at_{};
  Runtime::TimerId retry_timer_ = 0;
  std::map<ClusteredLock::ListenerId, ClusteredLock::LossListener> listeners_;
  ClusteredLock::ListenerId next_listener_ = 1;
};

void ClusteredLockCore::flush(Outbox& out) {
  for (auto& item : out.items) {
    if (item.user && !shared_->is_closed()) {
      strand_->post(std::move(item.run));
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

Status ClusteredLockCore::usable_locked() const { return closed_ ? closed_status_ : ok_status(); }

void ClusteredLockCore::lose_hold_locked(const Status& reason, Outbox& out) {
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
  for (const auto& entry : listeners_) {
    out.items.push_back({[listener = entry.second, reason] { listener(reason); }, true});
  }
}

void ClusteredLockCore::sync_locked(Outbox& out) {
  // 0 unless the service owns the lock and its lease deadline has not passed.
  const std::uint64_t token = service_ ? service_->fencing_token() : 0;
  if (held_ && token != hold_token_) {
    lose_hold_locked(
        aborted_error("clustered lock '" + name_ + "': this node lost its hold (token " +
                      std::to_string(hold_token_) +
                      "): the lease was not renewed in time or the store ended it"),
        out);
  }
  if (held_ || token == 0 || must_release_ || waiters_.empty()) return;
  Waiter granted = std::move(waiters_.front());
  waiters_.pop_front();
  shared_->runtime->cancel(granted.timer);
  held_ = true;
  hold_token_ = token;
  lost_source_ = std::stop_source();
  out.complete(std::move(granted.done), true);
  // Other single attempts lost to this grant: the node holds the lock now.
  resolve_once_locked(~std::uint64_t{0}, false, out);
}

void ClusteredLockCore::resolve_once_locked(std::uint64_t up_to_run, const Result<bool>& answer,
                                            Outbox& out) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->kind == Kind::kOnce && it->min_run <= up_to_run) {
      out.complete(std::move(it->done), answer);
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

bool ClusteredLockCore::need_fresh_run_locked() const {
  // A try_lock() that came after the live run's attempts began needs an
  // attempt of its own; restart the run (it holds nothing for anybody).
  if (!service_ || held_) return false;
  return std::any_of(waiters_.begin(), waiters_.end(), [this](const Waiter& w) {
    return w.kind == Kind::kOnce && w.min_run > live_run_;
  });
}

void ClusteredLockCore::request_reconcile_locked() {
  if (reconcile_active_) return;  // the running task re-reads the state
  reconcile_active_ = true;
  std::weak_ptr<ClusteredLockCore> weak = weak_from_this();
  if (!shared_->post_io([weak] {
        if (auto self = weak.lock()) self->reconcile();
      })) {
    reconcile_active_ = false;
    SIMBA_LOG(kWarn, "clustered lock '" << name_ << "': the manager is closed; not reconciling");
  }
}

void ClusteredLockCore::reconcile() {
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
      if (service_ && (!want || must_release_ || need_fresh_run_locked())) {
        // Stopping releases at the store (and wakes the next node).
        to_stop = std::move(service_);
        live_run_ = 0;
        attempts_in_run_ = 0;
        must_release_ = false;
        released = std::move(after_release_);
        after_release_.clear();
      } else if (!service_ && want) {
        const Clock::TimePoint now = shared_->clock->now();
        if (now < retry_at_) {
          if (retry_timer_ == 0) {
            std::weak_ptr<ClusteredLockCore> weak = weak_from_this();
            retry_timer_ = shared_->runtime->schedule_at(retry_at_, [weak] {
              if (auto self = weak.lock()) self->on_retry_timer();
            });
          }
          reconcile_active_ = false;
          return;
        }
        run = ++runs_;
        std::weak_ptr<ClusteredLockCore> weak = weak_from_this();
        auto on_event = [weak, run](const MutexState&) {
          if (auto self = weak.lock()) self->on_service_event(run);
        };
        ServiceHooks hooks;
        hooks.attempt_done = [weak, run](const Status& status) {
          if (auto self = weak.lock()) self->on_attempt_done(run, status);
        };
        auto service = shared_->impl->create_contend_service(
            make_contender(name_, on_event, on_event, shared_->node_id), lease_, std::move(hooks));
        if (!service.ok()) {
          // Names and options were checked by define(): this cannot get
          // better by waiting, so nobody waits for it.
          const Status error = service.status().with_context("clustered lock '" + name_ + "'");
          for (auto& w : waiters_) {
            shared_->runtime->cancel(w.timer);
            out.complete(std::move(w.done), error);
          }
          waiters_.clear();
        } else {
          service_ = std::move(*service);
          live_run_ = run;
          attempts_in_run_ = 0;
          failures_in_a_row_ = 0;
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
        out.complete(std::move(done), stopped.ok() ? Result<bool>(true) : Result<bool>(stopped));
      }
    } else if (to_start) {
      if (Status started = to_start->start(); !started.ok()) {
        const Status error = started.with_context("clustered lock '" + name_ + "'");
        std::lock_guard<std::mutex> lock(mu_);
        if (service_ == to_start) {
          service_.reset();
          live_run_ = 0;
        }
        ++start_failures_;
        const int shift = std::min(start_failures_ - 1, 5);
        retry_at_ =
            shared_->clock->now() + std::min(kMaxStartRetry, kFirstStartRetry * (1 << shift));
        // A single attempt gets this failure as its answer; lock() and
        // try_lock(timeout) keep waiting for a later start.
        resolve_once_locked(run, error, out);
      } else {
        std::lock_guard<std::mutex> lock(mu_);
        start_failures_ = 0;
      }
    } else {
      for (auto& done : released) out.complete(std::move(done), true);
    }
    flush(out);
    if (converged) return;
  }
}

void ClusteredLockCore::on_retry_timer() {
  std::lock_guard<std::mutex> lock(mu_);
  retry_timer_ = 0;
  request_reconcile_locked();
}

void ClusteredLockCore::on_service_event(std::uint64_t run) {
  locked([&](Outbox& out) {
    if (run != live_run_) return;  // a stopped run's last words
    sync_locked(out);
    request_reconcile_locked();
  });
}

void ClusteredLockCore::on_attempt_done(std::uint64_t run, const Status& status) {
  locked([&](Outbox& out) {
    if (run != live_run_) return;
    ++attempts_in_run_;
    failures_in_a_row_ = status.ok() ? 0 : failures_in_a_row_ + 1;
    last_failure_ = status;
    // Most attempts are renewals that change nothing: reconcile only when
    // the hold or the queue changed.
    const bool held_before = held_;
    const std::size_t waiting_before = waiters_.size();
    sync_locked(out);
    const Status error = status.with_context("clustered lock '" + name_ + "'");
    resolve_once_locked(run, status.ok() ? Result<bool>(false) : Result<bool>(error), out);
    if (!status.ok() && !is_retryable(status)) {
      // The store refused the call (credentials, TLS verification, ...):
      // waiting cannot make it answer, so nobody waits for it. A transient
      // failure (the store unreachable, failing over) is waited out.
      for (auto& w : waiters_) {
        shared_->runtime->cancel(w.timer);
        out.complete(std::move(w.done), error);
      }
      waiters_.clear();
    }
    if (held_ != held_before || waiters_.size() != waiting_before) request_reconcile_locked();
  });
}

void ClusteredLockCore::on_timeout(std::uint64_t waiter_id) {
  locked([&](Outbox& out) {
    auto it = std::find_if(waiters_.begin(), waiters_.end(),
                           [waiter_id](const Waiter& w) { return w.id == waiter_id; });
    if (it == waiters_.end()) return;  // granted or failed meanwhile
    if (service_ && failures_in_a_row_ > 0) {
      // Out of time while the store could not be reached: say so, naming
      // what the store said, rather than "held elsewhere" (false).
      out.complete(std::move(it->done), unreachable_after(failures_in_a_row_, last_failure_)
                                            .with_context("clustered lock '" + name_ + "'"));
    } else {
      out.complete(std::move(it->done), false);
    }
    waiters_.erase(it);
    request_reconcile_locked();
  });
}

void ClusteredLockCore::lock(Completion done) {
  locked([&](Outbox& out) {
    if (Status usable = usable_locked(); !usable.ok()) {
      out.complete(std::move(done), usable);
    } else {
      wait_locked(Waiter{next_waiter_id_++, Kind::kLock, std::move(done), 0, 0}, out);
    }
  });
}

void ClusteredLockCore::wait_locked(Waiter waiter, Outbox& out) {
  waiters_.push_back(std::move(waiter));
  sync_locked(out);
  request_reconcile_locked();
}

void ClusteredLockCore::try_lock(Completion done) {
  locked([&](Outbox& out) {
    sync_locked(out);
    if (Status usable = usable_locked(); !usable.ok()) {
      out.complete(std::move(done), usable);
    } else if (held_ || std::any_of(waiters_.begin(), waiters_.end(),
                                    [](const Waiter& w) { return w.kind != Kind::kOnce; })) {
      // Held by this node (non-reentrant), or a call of this node is
      // waiting ahead: not available to this call.
      out.complete(std::move(done), false);
    } else {
      // The attempt that answers it: the live run's first one if none has
      // finished yet, otherwise a fresh run's (the node holds nothing).
      std::uint64_t min_run = runs_ + 1;
      if (service_) min_run = attempts_in_run_ == 0 ? live_run_ : live_run_ + 1;
      wait_locked(Waiter{next_waiter_id_++, Kind::kOnce, std::move(done), 0, min_run}, out);
    }
  });
}

void ClusteredLockCore::try_lock_for(milliseconds timeout, Completion done) {
  if (timeout == milliseconds(0)) return try_lock(std::move(done));
  locked([&](Outbox& out) {
    if (timeout < milliseconds(0)) {
      out.complete(std::move(done),
                   invalid_argument_error("timeout must be >= 0 (got " +
                                          std::to_string(timeout.count()) + "ms)"));
    } else if (Status usable = usable_locked(); !usable.ok()) {
      out.complete(std::move(done), usable);
    } else {
      const std::uint64_t id = next_waiter_id_++;
      std::weak_ptr<ClusteredLockCore> weak = weak_from_this();
      const Runtime::TimerId timer =
          shared_->runtime->schedule_at(shared_->clock->now() + timeout, [weak, id] {
            if (auto self = weak.lock()) self->on_timeout(id);
          });
      if (timer == 0) {
        out.complete(std::move(done), manager_gone(name_));
      } else {
        wait_locked(Waiter{id, Kind::kTimed, std::move(done), timer, 0}, out);
      }
    }
  });
}

void ClusteredLockCore::unlock(Completion done) {
  locked([&](Outbox& out) {
    // A hold lost a moment ago is not this node's to unlock any more.
    sync_locked(out);
    if (Status usable = usable_locked(); !usable.ok()) {
      out.complete(std::move(done), usable);
    } else if (!held_) {
      out.complete(std::move(done), false);
    } else {
      held_ = false;
      hold_token_ = 0;
      must_release_ = true;
      after_release_.push_back(std::move(done));
      request_reconcile_locked();
    }
  });
}

void ClusteredLockCore::is_locked(Completion done) {
  locked([&](Outbox& out) {
    if (Status usable = usable_locked(); !usable.ok()) {
      out.complete(std::move(done), usable);
    } else {
      read_store(std::move(done), out,
                 [](ClusteredLockCore&, const OwnerRecord& record) { return record.held(); });
    }
  });
}

void ClusteredLockCore::is_locked_by_me(Completion done) {
  locked([&](Outbox& out) {
    sync_locked(out);
    if (Status usable = usable_locked(); !usable.ok()) {
      out.complete(std::move(done), usable);
    } else if (!held_) {
      out.complete(std::move(done), false);
    } else {
      // Held here: confirm with the store (an operator's forced release
      // shows there before the next renewal tells us).
      read_store(std::move(done), out,
                 [token = hold_token_](ClusteredLockCore& self, const OwnerRecord& record) {
                   return record.owner.is_owner(self.shared_->node_id) &&
                          record.owner.fencing_token == token && record.held() &&
                          self.fencing_token() == token;
                 });
    }
  });
}

void ClusteredLockCore::read_store(
    Completion done, Outbox& out,
    std::function<bool(ClusteredLockCore&, const OwnerRecord&)> answer) {
  auto shared = std::make_shared<Completion>(std::move(done));
  std::weak_ptr<ClusteredLockCore> weak = weak_from_this();
  if (!shared_->post_io([weak, shared, answer = std::move(answer)] {
        auto self = weak.lock();
        if (!self) return;
        Outbox reply;
        auto record = self->shared_->factory->backend()->read(self->name_, self->store_deadline());
        if (!record.ok()) {
          reply.complete(std::move(*shared),
                         record.status().with_context("clustered lock '" + self->name_ + "'"));
        } else {
          reply.complete(std::move(*shared), answer(*self, *record));
        }
        self->flush(reply);
      })) {
    out.complete(std::move(*shared), manager_gone(name_));
  }
}

std::uint64_t ClusteredLockCore::fencing_token() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!held_ || !service_) return 0;
  return service_->fencing_token() == hold_token_ ? hold_token_ : 0;
}

std::optional<Clock::TimePoint> ClusteredLockCore::lease_deadline() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!held_ || !service_ || service_->fencing_token() != hold_token_) return std::nullopt;
  return service_->lease_deadline();
}

std::stop_token ClusteredLockCore::lost_token() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lost_source_.get_token();
}

ClusteredLock::ListenerId ClusteredLockCore::add_loss_listener(
    ClusteredLock::LossListener listener) {
  std::lock_guard<std::mutex> lock(mu_);
  const ClusteredLock::ListenerId id = next_listener_++;
  if (listener) listeners_.emplace(id, std::move(listener));
  return id;
}

void ClusteredLockCore::remove_loss_listener(ClusteredLock::ListenerId id) {
  std::lock_guard<std::mutex> lock(mu_);
  listeners_.erase(id);
}

void ClusteredLockCore::close(Status pending, const Status& hold_ended, Status later,
                              std::optional<Completion> released) {
  locked([&](Outbox& out) {
    if (closed_) {
      if (released) out.complete(std::move(*released), false);
    } else {
      closed_ = true;
      closed_status_ = std::move(later);
      for (auto& w : waiters_) {
        shared_->runtime->cancel(w.timer);
        out.complete(std::move(w.done), pending);
      }
      waiters_.clear();
      if (held_) lose_hold_locked(hold_ended, out);
      if (released) after_release_.push_back(std::move(*released));
      shared_->runtime->cancel(retry_timer_);
      retry_timer_ = 0;
      retry_at_ = {};
      request_reconcile_locked();
    }
  });
}

}  // namespace internal

// ---- ClusteredLock ---------------------------------------------------------------

using internal::Completion;
using internal::for_callback;
using internal::promised;

ClusteredLock::ClusteredLock(std::shared_ptr<internal::ClusteredLockCore> core)
    : core_(std::move(core)) {}
ClusteredLock::~ClusteredLock() = default;

const std::string& ClusteredLock::name() const { return core_->name(); }
const std::string& ClusteredLock::node_id() const { return core_->node_id(); }

std::future<Status> ClusteredLock::lock() {
  return promised<Status>([&](Completion done) { core_->lock(std::move(done)); });
}
void ClusteredLock::lock(StatusCallback done) { core_->lock(for_callback(std::move(done))); }

std::future<Result<bool>> ClusteredLock::try_lock() {
  return promised<Result<bool>>([&](Completion done) { core_->try_lock(std::move(done)); });
}
void ClusteredLock::try_lock(BoolCallback done) { core_->try_lock(for_callback(std::move(done))); }

std::future<Result<bool>> ClusteredLock::try_lock(std::chrono::milliseconds timeout) {
  return promised<Result<bool>>(
      [&](Completion done) { core_->try_lock_for(timeout, std::move(done)); });
}
void ClusteredLock::try_lock(std::chrono::milliseconds timeout, BoolCallback done) {
  core_->try_lock_for(timeout, for_callback(std::move(done)));
}

std::future<Result<bool>> ClusteredLock::unlock() {
  return promised<Result<bool>>([&](Completion done) { core_->unlock(std::move(done)); });
}
void ClusteredLock::unlock(BoolCallback done) { core_->unlock(for_callback(std::move(done))); }

std::future<Result<bool>> ClusteredLock::is_locked() {
  return promised<Result<bool>>([&](Completion done) { core_->is_locked(std::move(done)); });
}
void ClusteredLock::is_locked(BoolCallback done) {
  core_->is_locked(for_callback(std::move(done)));
}

std::future<Result<bool>> ClusteredLock::is_locked_by_me() {
  return promised<Result<bool>>([&](Completion done) { core_->is_locked_by_me(std::move(done)); });
}
void ClusteredLock::is_locked_by_me(BoolCallback done) {
  core_->is_locked_by_me(for_callback(std::move(done)));
}

bool ClusteredLock::is_held() const { return core_->fencing_token() != 0; }
std::uint64_t ClusteredLock::fencing_token() const { return core_->fencing_token(); }
std::optional<Clock::TimePoint> ClusteredLock::lease_deadline() const {
  return core_->lease_deadline();
}
std::stop_token ClusteredLock::lost_token() const { return core_->lost_token(); }

ClusteredLock::ListenerId ClusteredLock::add_loss_listener(LossListener listener) {
  return core_->add_loss_listener(std::move(listener));
}
void ClusteredLock::remove_loss_listener(ListenerId id) { core_->remove_loss_listener(id); }

// ---- ClusteredLockManager ----------------------------------------------------------

Result<std::unique_ptr<ClusteredLockManager>> ClusteredLockManager::create(
    std::shared_ptr<MutexContendServiceFactory> factory, ClusteredLockOptions options) {
  if (!factory) return invalid_argument_error("factory must not be null");
  if (options.callback_threads < 1 || options.callback_threads > 64) {
    return invalid_argument_error("callback_threads must be in [1, 64] (got " +
                                  std::to_string(options.callback_threads) + ")");
  }
  const ContendOptions lease = options.lease.value_or(factory->contend_options());
  if (Status s = lease.validate(); !s.ok()) return s.with_context("lease");
  std::string node_id = options.node_id.empty() ? MutexContender::generate_host_contender_id()
                                                : std::move(options.node_id);
  if (Status s = factory->backend()->validate_contender_id(node_id); !s.ok()) {
    return s.with_context("node_id");
  }
  auto shared = std::make_shared<internal::ClusteredShared>();
  shared->impl = internal::FactoryAccess::of(*factory);
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
    lock->core_->close(
        cancelled_error("clustered lock '" + name + "': the ClusteredLockManager was destroyed"),
        cancelled_error("clustered lock '" + name +
                        "': the ClusteredLockManager was destroyed; this node's hold ended"),
        internal::manager_gone(name), std::nullopt);
  }
  // Waits for the queued reconciles (which release every hold at the store)
  // and then for the callbacks they queued.
  shared_->close();
  for (auto& [name, lock] : locks) lock->core_->drain();
}

Result<bool> ClusteredLockManager::define(const std::string& name, ClusteredLockConfig config) {
  SIMBA_RETURN_IF_ERROR(shared_->factory->backend()->validate_mutex(name));
  const ContendOptions lease = config.lease.value_or(shared_->lease);
  if (Status s = lease.validate(); !s.ok()) return s.with_context("lease of '" + name + "'");
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
    return not_found_error("clustered lock '" + name +
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
  removed->core_->close(
      cancelled_error("clustered lock '" + name + "' was removed while this call waited"),
      cancelled_error("clustered lock '" + name + "' was removed; this node's hold ended"),
      failed_precondition_error("clustered lock '" + name +
                                "' was removed from its manager; define it again and get a new "
                                "handle"),
      internal::for_promise(promise));
  return future;
}

const std::string& ClusteredLockManager::node_id() const { return shared_->node_id; }

const std::shared_ptr<MutexContendServiceFactory>& ClusteredLockManager::factory() const {
  return shared_->factory;
}

}  // namespace simba
