// The two sides of a fault run (tests/faults) that are not the harness:
//
//   FaultWorker     contends for one mutex; while it owns it, writes to a
//                   fenced resource every few milliseconds; lets go after a
//                   random hold and contends again; logs every step as a
//                   WorkerEvent line (testing/fault_history.h)
//   FencedRegister  the protected resource: remembers the highest fencing
//                   token it accepted and rejects lower ones, logging each
//                   decision; served to worker processes on a Unix socket by
//                   FencedRegisterServer, reached through FencedRegisterClient
//
// A worker runs in a process of its own (simba-fault-worker) for the stores
// other processes can reach, and as a thread on a ManualClock for memory://.
#ifndef SIMBA_TESTING_FAULT_WORKER_H_
#define SIMBA_TESTING_FAULT_WORKER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "simba/clock.h"
#include "simba/clustered_lock.h"
#include "simba/contend_service.h"
#include "simba/keyed_lock.h"
#include "simba/status.h"
#include "testing/fault_history.h"

namespace simba::testing {

// Nanoseconds of `clock` since its epoch: the time base of every log line.
Nanos now_nanos(const Clock& clock);
// The same for a time point of a clock (a lease deadline).
Nanos nanos_of(Clock::TimePoint t);
// Sleeps `d` of `clock`'s time (virtual time for a ManualClock).
void sleep_on(const Clock& clock, Clock::Duration d);

class FencedResource {
 public:
  virtual ~FencedResource() = default;
  // A write guarded by `token`: true if accepted, false if the token was
  // lower than one accepted before; an error when the resource was not
  // reached (nothing was written then).
  virtual Result<bool> write(int worker, std::uint64_t token, std::int64_t seq) = 0;
};

class FencedRegister final : public FencedResource {
 public:
  explicit FencedRegister(std::shared_ptr<Clock> clock) : clock_(std::move(clock)) {}
  Result<bool> write(int worker, std::uint64_t token, std::int64_t seq) override;
  // Every decision so far, in the order they were made.
  std::vector<ResourceEvent> decisions() const;
  // The last accepted write, if any.
  std::optional<ResourceEvent> last_accepted() const;
  // Waits up to `wait` for the next accepted write and keeps its writer in
  // write() for `hold` after the decision, so for that long the writer is
  // certainly holding (it lets go only after a write returns). A fault
  // aimed at "the holder" strikes in that time; nullopt if none came.
  std::optional<ResourceEvent> catch_next_writer(Clock::Duration wait, Clock::Duration hold);

 private:
  std::shared_ptr<Clock> clock_;
  mutable std::mutex mu_;
  std::condition_variable caught_cv_;
  bool trap_armed_ = false;
  Clock::Duration trap_hold_{0};
  std::optional<ResourceEvent> caught_;
  std::uint64_t highest_ = 0;
  std::vector<ResourceEvent> decisions_;
  std::optional<ResourceEvent> last_accepted_;
};

// Serves `target` on a Unix SOCK_SEQPACKET socket at `path`: one thread, one
// request at a time, so a worker paused mid-request blocks nobody.
class FencedRegisterServer {
 public:
  // kUnavailable when the socket cannot be made.
  static Result<std::unique_ptr<FencedRegisterServer>> start(std::string path,
                                                             FencedRegister* target);
  ~FencedRegisterServer();
  FencedRegisterServer(const FencedRegisterServer&) = delete;
  FencedRegisterServer& operator=(const FencedRegisterServer&) = delete;

 private:
  FencedRegisterServer(std::string path, FencedRegister* target, int listen_fd);
  void loop();

  std::string path_;
  FencedRegister* target_;
  int listen_fd_;
  int wake_[2] = {-1, -1};
  std::thread thread_;
};

class FencedRegisterClient final : public FencedResource {
 public:
  explicit FencedRegisterClient(std::string path) : path_(std::move(path)) {}
  ~FencedRegisterClient() override;
  // Connects on first use and again after an error; gives up after 2 s.
  Result<bool> write(int worker, std::uint64_t token, std::int64_t seq) override;

 private:
  std::string path_;
  int fd_ = -1;
};

// A lock the worker asks for and waits on (a keyed lease, a clustered
// lock), where the contend service instead calls back. One hold at a time.
class PulledLock {
 public:
  virtual ~PulledLock() = default;
  // Waits up to `wait` for a hold: its fencing token, or 0 when not held in
  // time. `on_lost` runs (on any thread, at most once) if this hold ends
  // other than by release().
  virtual Result<std::uint64_t> acquire(std::chrono::milliseconds wait,
                                        std::function<void()> on_lost) = 0;
  // The API's own ownership check, its token now (0: none), and the last
  // instant it promises the hold (nanoseconds of the clock; 0: none).
  virtual bool is_held() const = 0;
  virtual std::uint64_t fencing_token() const = 0;
  virtual Nanos deadline() const = 0;
  // Ends the hold (a lost one too); idempotent.
  virtual Status release() = 0;
};

// A KeyedLockProvider's lease of `key`, each hold capped at `max_hold`: the
// deadline is the hold's max_hold watchdog (Lease::hold_deadline()).
std::unique_ptr<PulledLock> keyed_pulled_lock(std::unique_ptr<KeyedLockProvider> provider,
                                              std::string key, std::chrono::milliseconds max_hold);
// A ClusteredLockManager's lock `name` (defined here): the deadline is the
// hold's lease (ClusteredLock::lease_deadline()).
Result<std::unique_ptr<PulledLock>> clustered_pulled_lock(
    std::unique_ptr<ClusteredLockManager> manager, const std::string& name);

struct FaultWorkerOptions {
  int id = 1;
  std::string mutex = "fault-run";
  ContendOptions contend;
  // How long an acquisition is held before the worker lets go (uniform).
  std::chrono::milliseconds hold_min{300}, hold_max{1500};
  // How long it waits before contending again after letting go (uniform from 0).
  std::chrono::milliseconds rest_max{300};
  // A guarded write this often while it owns the mutex...
  std::chrono::milliseconds write_interval{20};
  // ...each this long after its ownership check: a pause that lands in the
  // gap sends a stale token to the resource, which must turn it away.
  std::chrono::milliseconds write_gap{5};
  std::chrono::milliseconds beat_interval{100};
  // (run_pulled) One hold in five is kept until the lock itself ends it (a
  // keyed lease's max_hold watchdog) rather than let go after its hold.
  bool hold_until_lost = false;
  // (run_pulled) Logs ev=start and ev=exit; off for a `simba run` command,
  // one of many in its worker's life, whose worker logs them (run_cli).
  bool lifecycle_events = true;
  // The sequence number of the first guarded write: a worker's writes are
  // told apart by it, across the several processes of a `simba run` worker.
  std::int64_t first_seq = 0;
  std::uint64_t seed = 1;
  // (run_cli) `simba run --timeout`: how long each run may wait for the
  // mutex (and for a store that cannot be reached). A run that exits on an
  // error before it is logged as gave-up.
  std::chrono::milliseconds run_timeout{1000};
};

// The command `simba run` starts, as a PulledLock: its one hold is the token
// the CLI put in SIMBA_FENCING_TOKEN, held until SIGTERM (the CLI lost the
// lease: a loss) or SIGINT (forwarded from the worker's own stop). It
// promises no deadline (0). Call it before any other thread is made: it
// blocks both signals in the calling thread and takes them on a thread of
// its own. kInvalidArgument when the variable is missing or not a token.
// `linger` (a negative control): on SIGTERM the command acts on for that
// long, as if its hold were still good (a command that finishes its batch
// before it exits), then ends the hold as a release.
Result<std::unique_ptr<PulledLock>> cli_command_lock(
    std::chrono::milliseconds linger = std::chrono::milliseconds(0));
// True once the command's hold is over (released, lost, or stopped): its
// run_pulled loop ends then.
bool cli_command_done();

// Runs one worker: logs ev=start, contends, writes while it owns the mutex,
// releases and contends again, until `stop_requested`; then stops its
// service (releasing the mutex) and logs ev=exit. `log` gets one formatted
// WorkerEvent per call, from several threads (it must be thread-safe).
class FaultWorker {
 public:
  // `factory` may be null for run_pulled() (the clock is then steady).
  FaultWorker(MutexContendServiceFactory* factory, FencedResource* resource,
              std::function<void(const std::string&)> log, FaultWorkerOptions options);
  // Non-OK only when the service could not be made or started.
  Status run(const std::function<bool()>& stop_requested);
  // The same loop over a lock that is asked for rather than calling back:
  // acquire (waiting up to 500 ms at a time), write while is_held() passes,
  // let go after the hold (or, with hold_until_lost, one hold in five when
  // the lock itself ends it). A hold that ends without
  // its loss signal is let go 500 ms after is_held() first failed.
  // `factory` may be null for this form.
  Status run_pulled(PulledLock& lock, const std::function<bool()>& stop_requested);
  // The same loop through the CLI: over and over, `simba run` (at
  // `simba_path`, with `run_flags` before its `--` and the command after it)
  // until `stop_requested`, then SIGINT to it (which it forwards to its
  // command) and a wait for it. Logs ev=start, a beat every beat_interval
  // and ev=exit; the command logs its hold (cli_command_lock). Each simba
  // dies with the worker (PR_SET_PDEATHSIG), and its command with it (the
  // CLI's reaper). Their stderr is appended to `stderr_path` (inherited
  // when empty): the CLI says why it did not acquire every time it times
  // out.
  Status run_cli(const std::string& simba_path, const std::vector<std::string>& run_flags,
                 const std::vector<std::string>& command, const std::string& stderr_path,
                 const std::function<bool()>& stop_requested);

  // What on_acquired does before it logs: reads `clock`, then publishes
  // `token` to the writing loop; returns the ev=acquired event stamped with
  // that earlier time. Public for its unit test.
  WorkerEvent publish_acquired(const Clock& clock, std::uint64_t token);
  // The token on_acquired published (0: none, or on_released since).
  std::uint64_t published_token() const;

 private:
  void log(WorkerEvent e);
  // Logs the end of tenure number `tenure` as `kind` (kLost, kReleased),
  // once, and only while it is the current tenure: a late loss signal of
  // an earlier hold is not the current hold's end.
  void end_tenure(std::uint64_t tenure, WorkerEvent::Kind kind);
  // Waits, writes and logs one guarded write for `token` after a check at
  // `check` that passed with `deadline`.
  void guarded_write(std::uint64_t token, Nanos check, Nanos deadline, std::int64_t* seq);

  MutexContendServiceFactory* factory_;
  FencedResource* resource_;
  std::function<void(const std::string&)> log_;
  FaultWorkerOptions options_;
  std::shared_ptr<Clock> clock_;
  // The token of the ownership on_acquired announced (0: none).
  // and how many times on_acquired came (the last reported lease deadline
  // is remembered per tenure); read together under mu_.
  mutable std::mutex mu_;
  std::uint64_t token_ = 0;
  std::uint64_t tenures_ = 0;
  // (run_pulled) The tenure whose end was logged last.
  std::uint64_t ended_tenure_ = 0;
  // The worker itself is stopping its service: on_released is a release,
  // not a loss.
  std::atomic<bool> letting_go_{false};
};

}  // namespace simba::testing

#endif  // SIMBA_TESTING_FAULT_WORKER_H_
