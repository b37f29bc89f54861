// Threads and timing that the backends' own loops share: a worker thread that
// may be stopped from any thread, itself included, a reconnect backoff, and
// a deadline-bounded turn on something used one call at a time.
#ifndef SIMBA_CORE_WORKER_H_
#define SIMBA_CORE_WORKER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <stop_token>
#include <string_view>
#include <thread>
#include <utility>

#include "simba/backend.h"
#include "simba/status.h"

namespace simba::internal {

// Names the calling thread "simba:<name>" (for threads not started by a
// Worker).
void name_this_thread(std::string_view name);

// One thread running `body`, joined by join() (or the destructor) from any
// thread, the worker's own included.
//
// Joined from another thread, join() waits until `body` has returned.
// Joined from inside `body` (a listener on the worker's thread destroyed
// what owns the worker), it returns at once and the thread ends when `body`
// returns; after `body` the thread touches nothing of this Worker, so the
// Worker and its owner may be gone by then. What `body` itself uses after
// such a join it must own: capture a shared_ptr to the owner, e.g.
//   worker_.start("name", [self = shared_from_this()] { self->run(); });
// and have the owner's stop() (not its destructor, which the capture holds
// off) set its stop flag, wake the body, and call worker_.join().
//
// Thread safety: every method may be called from any thread.
class Worker {
 public:
  Worker() = default;
  ~Worker() { join(); }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Starts `body` on a new thread named "simba:<name>" (cut to the 15
  // characters Linux keeps), so that top, gdb and the thread budget's tests
  // tell Simba's threads from a client library's. False (nothing runs) if
  // it was started or joined before. Throws std::system_error when no
  // thread can be made.
  bool start(std::string_view name, std::function<void()> body);
  // See the class comment. Idempotent.
  void join();
  // Whether start() ran and join() did not yet.
  bool running() const;

 private:
  mutable std::mutex mu_;
  bool used_ = false;
  std::thread thread_;
};

// The delay between attempts to (re)connect: none after a working
// connection, then `first`, doubling up to `max`.
//
//   if (Status ready = backoff_.ready(); !ready.ok()) return ready;
//   auto conn = Connect();
//   if (!conn.ok()) { backoff_.failed(conn.status()); return conn.status(); }
//   backoff_.reset();
//
// Not thread-safe: guard it with the lock of what it paces.
class Backoff {
 public:
  static constexpr std::chrono::milliseconds kFirst{100};
  static constexpr std::chrono::milliseconds kMax{2000};

  explicit Backoff(std::chrono::milliseconds first = kFirst, std::chrono::milliseconds max = kMax)
      : first_(first), max_(max) {}

  // An attempt failed with `error`: returns the delay before the next one,
  // which ready() enforces.
  std::chrono::milliseconds failed(Status error = ok_status());
  // An attempt worked: the next one may come at once, and the next failure
  // waits `first` again.
  void reset();
  // OK when an attempt may be made now; otherwise the last failure, its
  // message ending in " (next reconnect in <time>)".
  Status ready() const;
  // When ready() turns OK (a time already past when it is OK now).
  std::chrono::steady_clock::time_point ready_at() const { return next_; }

 private:
  const std::chrono::milliseconds first_;
  const std::chrono::milliseconds max_;
  std::chrono::milliseconds delay_{0};
  std::chrono::steady_clock::time_point next_{};
  Status last_error_;
};

// A turn on something used by one call at a time (a connection, a keyed
// lease's key), given in arrival order and waited for no longer than the
// call's deadline or its cancellation. (Not std::timed_mutex: its
// try_lock_until is invisible to ThreadSanitizer on Debian 12's glibc.)
//
//   TurnGate::Turn turn = gate_.take(deadline);
//   if (!turn.taken()) return deadline_exceeded_error("...");
//
// Thread safety: take() from any thread; a Turn is released by its
// destructor, on any thread.
class TurnGate {
 public:
  class Turn {
   public:
    Turn() = default;
    Turn(Turn&& other) noexcept : gate_(std::exchange(other.gate_, nullptr)) {}
    Turn& operator=(Turn&& other) noexcept;
    ~Turn() { release(); }
    // False when the deadline passed or `cancel` stopped first (or for a
    // default Turn).
    bool taken() const { return gate_ != nullptr; }
    // Gives the turn back before the destructor would.
    void release();

   private:
    friend class TurnGate;
    explicit Turn(TurnGate* gate) : gate_(gate) {}
    TurnGate* gate_ = nullptr;
  };

  // Waits until no other Turn of this gate is held and every earlier
  // take() has had its turn or given up, or until `deadline` or `cancel`.
  Turn take(Deadline deadline, const std::stop_token& cancel = {});

 private:
  // Wakes the first take() in line, if any.
  void wake_first_locked();

  std::mutex mu_;
  bool busy_ = false;
  // The take() calls waiting, in arrival order: ticket -> its condition.
  std::uint64_t next_ticket_ = 0;
  std::map<std::uint64_t, std::condition_variable*> waiting_;
};

}  // namespace simba::internal

#endif  // SIMBA_CORE_WORKER_H_
