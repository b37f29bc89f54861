#include "testing/fault_worker.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>

#include "testing/subprocess.h"

namespace simba::testing {
namespace {

using std::chrono::milliseconds;

bool unix_address(const std::string& path, sockaddr_un* address) {
  std::memset(address, 0, sizeof *address);
  address->sun_family = AF_UNIX;
  if (path.size() >= sizeof address->sun_path) return false;
  std::memcpy(address->sun_path, path.c_str(), path.size() + 1);
  return true;
}

// "W <worker> <token> <seq>" -> the parts; false for anything else.
bool parse_request(const char* text, int* worker, std::uint64_t* token, std::int64_t* seq) {
  unsigned long long t = 0;
  long long s = 0;
  if (std::sscanf(text, "W %d %llu %lld", worker, &t, &s) != 3) return false;
  *token = t;
  *seq = s;
  return true;
}

// A duration drawn uniformly from [lo, hi] (lo when hi <= lo).
milliseconds uniform_ms(std::mt19937_64& random, milliseconds lo, milliseconds hi) {
  if (hi <= lo) return lo;
  return milliseconds(std::uniform_int_distribution<std::int64_t>(lo.count(), hi.count())(random));
}

}  // namespace

Nanos nanos_of(Clock::TimePoint t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

Nanos now_nanos(const Clock& clock) { return nanos_of(clock.now()); }

void sleep_on(const Clock& clock, Clock::Duration d) {
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mu);
  const Clock::TimePoint until = clock.now() + d;
  while (clock.now() < until) clock.wait_until(cv, lock, until);
}

// ---- FencedRegister ------------------------------------------------------------------

Result<bool> FencedRegister::write(int worker, std::uint64_t token, std::int64_t seq) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool accepted = token >= highest_;
  if (accepted) highest_ = token;
  ResourceEvent e{worker, token, seq, accepted, now_nanos(*clock_)};
  decisions_.push_back(e);
  if (accepted) last_accepted_ = e;
  if (accepted && trap_armed_) {
    trap_armed_ = false;
    caught_ = e;
    const Clock::Duration hold = trap_hold_;
    lock.unlock();
    caught_cv_.notify_all();
    sleep_on(*clock_, hold);  // decided and logged: only the reply waits
  }
  return accepted;
}

std::optional<ResourceEvent> FencedRegister::catch_next_writer(Clock::Duration wait,
                                                               Clock::Duration hold) {
  std::unique_lock<std::mutex> lock(mu_);
  caught_.reset();
  trap_armed_ = true;
  trap_hold_ = hold;
  const Clock::TimePoint until = clock_->now() + wait;
  while (!caught_ && clock_->now() < until) clock_->wait_until(caught_cv_, lock, until);
  trap_armed_ = false;
  return caught_;
}

std::vector<ResourceEvent> FencedRegister::decisions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return decisions_;
}

std::optional<ResourceEvent> FencedRegister::last_accepted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_accepted_;
}

// ---- FencedRegisterServer --------------------------------------------------------------

Result<std::unique_ptr<FencedRegisterServer>> FencedRegisterServer::start(std::string path,
                                                                          FencedRegister* target) {
  sockaddr_un address;
  if (!unix_address(path, &address)) return unavailable_error("socket path too long: " + path);
  ::unlink(path.c_str());
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return unavailable_error(std::string("socket: ") + std::strerror(errno));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(fd, 64) != 0) {
    const std::string error = std::strerror(errno);
    ::close(fd);
    return unavailable_error("cannot listen on " + path + ": " + error);
  }
  return std::unique_ptr<FencedRegisterServer>(
      new FencedRegisterServer(std::move(path), target, fd));
}

FencedRegisterServer::FencedRegisterServer(std::string path, FencedRegister* target, int listen_fd)
    : path_(std::move(path)), target_(target), listen_fd_(listen_fd) {
  if (::pipe2(wake_, O_CLOEXEC) != 0) wake_[0] = wake_[1] = -1;
  thread_ = std::thread([this] { loop(); });
}

FencedRegisterServer::~FencedRegisterServer() {
  if (wake_[1] >= 0) {
    const char byte = 1;
    const ssize_t ignored = ::write(wake_[1], &byte, 1);
    (void)ignored;
  }
  thread_.join();
  ::close(listen_fd_);
  if (wake_[0] >= 0) ::close(wake_[0]);
  if (wake_[1] >= 0) ::close(wake_[1]);
  ::unlink(path_.c_str());
}

void FencedRegisterServer::loop() {
  std::vector<int> clients;
  for (;;) {
    std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (int c : clients) fds.push_back({c, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) break;
    if (fds[0].revents != 0) break;
    std::vector<int> alive;
    if (fds[1].revents & POLLIN) {
      const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) alive.push_back(c);  // polled from the next round on
    }
    for (std::size_t i = 2; i < fds.size(); ++i) {
      const int c = fds[i].fd;
      if (fds[i].revents == 0) {
        alive.push_back(c);
        continue;
      }
      char request[128] = {};
      const ssize_t n = ::recv(c, request, sizeof request - 1, 0);
      if (n <= 0) {
        ::close(c);
        continue;
      }
      int worker = 0;
      std::uint64_t token = 0;
      std::int64_t seq = 0;
      const char* reply = "E";
      if (parse_request(request, &worker, &token, &seq)) {
        reply = *target_->write(worker, token, seq) ? "A" : "R";
      }
      if (::send(c, reply, 1, MSG_NOSIGNAL) != 1) {
        ::close(c);
        continue;
      }
      alive.push_back(c);
    }
    clients = std::move(alive);
  }
  for (int c : clients) ::close(c);
}

// ---- FencedRegisterClient --------------------------------------------------------------

FencedRegisterClient::~FencedRegisterClient() {
  if (fd_ >= 0) ::close(fd_);
}

Result<bool> FencedRegisterClient::write(int worker, std::uint64_t token, std::int64_t seq) {
  auto fail = [&](const std::string& what) -> Result<bool> {
    const std::string error = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    return unavailable_error("fenced resource " + path_ + ": " + what + ": " + error);
  };
  if (fd_ < 0) {
    sockaddr_un address;
    if (!unix_address(path_, &address)) return unavailable_error("socket path too long: " + path_);
    fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return fail("socket");
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      return fail("connect");
    }
  }
  const std::string request =
      "W " + std::to_string(worker) + " " + std::to_string(token) + " " + std::to_string(seq);
  if (::send(fd_, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return fail("send");
  }
  pollfd p{fd_, POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&p, 1, 2000);
  } while (ready < 0 && errno == EINTR);
  if (ready <= 0) {
    errno = ETIMEDOUT;
    return fail("no answer");
  }
  char reply = 0;
  if (::recv(fd_, &reply, 1, 0) != 1) return fail("recv");
  if (reply != 'A' && reply != 'R') {
    errno = EPROTO;
    return fail("bad answer");
  }
  return reply == 'A';
}

// ---- FaultWorker -----------------------------------------------------------------------

FaultWorker::FaultWorker(MutexContendServiceFactory* factory, FencedResource* resource,
                         std::function<void(const std::string&)> log, FaultWorkerOptions options)
    : factory_(factory),
      resource_(resource),
      log_(std::move(log)),
      options_(std::move(options)),
      clock_(factory != nullptr ? factory->clock() : Clock::steady()) {}

WorkerEvent FaultWorker::publish_acquired(const Clock& clock, std::uint64_t token) {
  // The time first: a loop that sees the token checks ownership no earlier
  // than the acquisition it logs, so its write lies inside the tenure
  // (the checker matches a write to a tenure by check >= acquired).
  const Nanos at = now_nanos(clock);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++tenures_;
    token_ = token;
  }
  return {WorkerEvent::Kind::kAcquired, at, token};
}

std::uint64_t FaultWorker::published_token() const {
  std::lock_guard<std::mutex> lock(mu_);
  return token_;
}

void FaultWorker::log(WorkerEvent e) {
  if (e.t == 0) e.t = now_nanos(*clock_);
  log_(format_worker_event(e));
}

void FaultWorker::guarded_write(std::uint64_t token, Nanos check, Nanos deadline,
                                std::int64_t* seq) {
  if (options_.write_gap.count() > 0) sleep_on(*clock_, options_.write_gap);
  const Result<bool> accepted = resource_->write(options_.id, token, *seq);
  if (accepted.ok()) {
    WorkerEvent e{WorkerEvent::Kind::kWrite, 0, token, *seq};
    e.check = check;
    e.deadline = deadline;
    e.accepted = *accepted;
    log(e);
  } else {
    std::fprintf(stderr, "worker %d: %s\n", options_.id, accepted.status().to_string().c_str());
  }
  ++*seq;
}

void FaultWorker::end_tenure(std::uint64_t tenure, WorkerEvent::Kind kind) {
  std::uint64_t token;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (tenure != tenures_ || ended_tenure_ == tenure) return;
    ended_tenure_ = tenure;
    token = token_;
    token_ = 0;
  }
  log({kind, 0, token});
}

Status FaultWorker::run(const std::function<bool()>& stop_requested) {
  using Kind = WorkerEvent::Kind;
  std::mt19937_64 random(options_.seed);
  auto uniform = [&](milliseconds lo, milliseconds hi) { return uniform_ms(random, lo, hi); };
  auto contender = make_contender(
      options_.mutex,
      [this](const MutexState& s) { log(publish_acquired(*clock_, s.after.fencing_token)); },
      [this](const MutexState& s) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          token_ = 0;
        }
        log({letting_go_ ? Kind::kReleased : Kind::kLost, 0, s.before.fencing_token});
      },
      "fault-worker-" + std::to_string(options_.id) + "-" +
          MutexContender::generate_uuid_contender_id().substr(0, 8));
  auto service = factory_->create_contend_service(contender, options_.contend);
  if (!service.ok()) return service.status();
  MutexContendService& contend = **service;
  log({Kind::kStart});
  SIMBA_RETURN_IF_ERROR(contend.start());

  std::int64_t seq = options_.first_seq;
  std::optional<Clock::TimePoint> hold_until;
  Clock::TimePoint next_beat = clock_->now();
  // The last lease deadline the service reported in the tenure numbered
  // `deadline_tenure` (0: none yet).
  std::uint64_t deadline_tenure = 0;
  Nanos last_deadline = 0;
  while (!stop_requested()) {
    std::uint64_t tenure, token;
    {
      std::lock_guard<std::mutex> lock(mu_);
      tenure = tenures_;
      token = token_;
    }
    if (token != 0) {
      if (!hold_until) hold_until = clock_->now() + uniform(options_.hold_min, options_.hold_max);
      // The check time is read before is_owner(), which reads the clock
      // again: a check that passes proves ownership at `check` or later.
      const Nanos check = now_nanos(*clock_);
      const bool owner = contend.is_owner();
      // Read after the check: a renewal in between only moves it later, so
      // it never makes a true violation look fine.
      const auto deadline = contend.lease_deadline();
      const std::uint64_t current = contend.fencing_token();
      if (tenure != deadline_tenure) {
        deadline_tenure = tenure;
        last_deadline = 0;
      }
      if (deadline) {
        last_deadline = nanos_of(*deadline);
      }
      // Every check that passes is acted on, with the last deadline the
      // service reported for this tenure: an is_owner() that stopped
      // reading the clock passes after lease_deadline() has gone quiet, and
      // must still produce a write for the checker to judge
      // (write-after-deadline). Only a service that names another token
      // (its on_acquired not delivered yet) is not written for.
      if (owner && (current == token || current == 0)) {
        guarded_write(token, check, last_deadline, &seq);
      }
      if (clock_->now() >= *hold_until) {
        letting_go_ = true;
        (void)contend.stop();  // a failed release leaves a lease that expires
        letting_go_ = false;
        hold_until.reset();
        sleep_on(*clock_, uniform(milliseconds(0), options_.rest_max));
        if (stop_requested()) break;
        SIMBA_RETURN_IF_ERROR(contend.start());
      }
    } else {
      hold_until.reset();
    }
    if (clock_->now() >= next_beat) {
      log({Kind::kBeat});
      next_beat = clock_->now() + options_.beat_interval;
    }
    sleep_on(*clock_, options_.write_interval);
  }
  letting_go_ = true;
  if (contend.running()) (void)contend.stop();
  log({Kind::kExit});
  return ok_status();
}

Status FaultWorker::run_pulled(PulledLock& lock, const std::function<bool()>& stop_requested) {
  using Kind = WorkerEvent::Kind;
  // Each call waits this long at most, so the loop beats and sees a stop.
  constexpr milliseconds kAcquireWait{500};
  // A hold whose check failed this long without its loss signal is let go
  // (and logged released): the checker's overlap rule, with its own 500 ms
  // of dispatch, then judges a signal that never came.
  constexpr milliseconds kSilentLoss{500};
  std::mt19937_64 random(options_.seed);
  auto uniform = [&](milliseconds lo, milliseconds hi) { return uniform_ms(random, lo, hi); };
  if (options_.lifecycle_events) log({Kind::kStart});
  std::int64_t seq = options_.first_seq;
  bool holding = false;
  std::uint64_t tenure = 0;
  std::uint64_t held_token = 0;
  Clock::TimePoint hold_until{};
  // When the hold's check first failed (max: it passes).
  Clock::TimePoint not_held_since = Clock::TimePoint::max();
  Clock::TimePoint next_beat = clock_->now();
  auto beat = [&] {
    if (clock_->now() >= next_beat) {
      log({Kind::kBeat});
      next_beat = clock_->now() + options_.beat_interval;
    }
  };
  auto let_go = [&] {
    // Logged as decided, before the store hears it (as the contend
    // service's on_released runs before its release leaves): no check
    // passes after this, however long the store takes to answer.
    end_tenure(tenure, Kind::kReleased);
    const Status released = lock.release();
    if (!released.ok()) {
      std::fprintf(stderr, "worker %d: release: %s\n", options_.id, released.to_string().c_str());
    }
    holding = false;
  };
  while (!stop_requested()) {
    beat();
    if (!holding) {
      std::uint64_t next;
      {
        std::lock_guard<std::mutex> guard(mu_);
        next = tenures_ + 1;
      }
      const Nanos asked = now_nanos(*clock_);
      const Result<std::uint64_t> got =
          lock.acquire(kAcquireWait, [this, next] { end_tenure(next, Kind::kLost); });
      if (!got.ok()) {
        // An error before the wait ran out is a store error not waited out.
        WorkerEvent gave_up{Kind::kGaveUp, 0, 0, static_cast<int>(got.status().code())};
        gave_up.check = asked;
        gave_up.deadline = asked + std::chrono::nanoseconds(kAcquireWait).count();
        log(gave_up);
        std::fprintf(stderr, "worker %d: acquire: %s\n", options_.id,
                     got.status().to_string().c_str());
        sleep_on(*clock_, options_.write_interval);
        continue;
      }
      if (*got == 0) continue;
      log(publish_acquired(*clock_, *got));
      holding = true;
      tenure = next;
      held_token = *got;
      not_held_since = Clock::TimePoint::max();
      // One hold in five runs until the lock ends it (a keyed lease's
      // max_hold watchdog; the worker's stop otherwise).
      hold_until = options_.hold_until_lost && std::uniform_int_distribution<int>(0, 4)(random) == 0
                       ? Clock::TimePoint::max()
                       : clock_->now() + uniform(options_.hold_min, options_.hold_max);
      continue;
    }
    // As run(): the check time first, then the API's check, then what it
    // reports (a renewal in between only moves the deadline later).
    const Nanos check = now_nanos(*clock_);
    const bool owner = lock.is_held();
    const std::uint64_t current = lock.fencing_token();
    const Nanos deadline = lock.deadline();
    const std::uint64_t published = published_token();
    // The hold is over only on a check that passed just now (the write
    // after a pause carries the check from before it): a failed check waits
    // for the loss signal instead, so the signal is tested after a pause.
    const bool passed = owner && published == held_token && (current == held_token || current == 0);
    bool done = passed && clock_->now() >= hold_until;
    if (passed && !done) {
      guarded_write(held_token, check, deadline, &seq);
      not_held_since = Clock::TimePoint::max();
    } else if (!owner && not_held_since == Clock::TimePoint::max()) {
      not_held_since = clock_->now();
    }
    // Let go, too, once the loss was heard, or when its signal is late.
    const auto now = clock_->now();
    const bool silent_loss =
        not_held_since != Clock::TimePoint::max() && now - not_held_since >= kSilentLoss;
    if (silent_loss && published != 0) {
      // Not a rule of the checker (the hold's own check stopped passing in
      // time); said so that runs show how often the signal is late.
      std::fprintf(stderr,
                   "worker %d: hold %llu: is_held() false for %lld ms and no loss signal yet\n",
                   options_.id, static_cast<unsigned long long>(held_token),
                   static_cast<long long>(
                       std::chrono::duration_cast<milliseconds>(now - not_held_since).count()));
    }
    done = done || published == 0 || silent_loss;
    if (done) {
      let_go();
      sleep_on(*clock_, uniform(milliseconds(0), options_.rest_max));
      continue;
    }
    sleep_on(*clock_, options_.write_interval);
  }
  if (holding) let_go();
  if (options_.lifecycle_events) log({Kind::kExit});
  return ok_status();
}

Status FaultWorker::run_cli(const std::string& simba_path,
                            const std::vector<std::string>& run_flags,
                            const std::vector<std::string>& command, const std::string& stderr_path,
                            const std::function<bool()>& stop_requested) {
  using Kind = WorkerEvent::Kind;
  std::mt19937_64 random(options_.seed);
  std::vector<std::string> argv = {simba_path, "run"};
  argv.insert(argv.end(), run_flags.begin(), run_flags.end());
  argv.emplace_back("--");
  argv.insert(argv.end(), command.begin(), command.end());
  // Dies with the worker (the harness's kill takes the whole tree at once;
  // this covers the harness itself dying); its stderr to a file.
  SpawnOptions spawn;
  spawn.read_stdout = false;
  spawn.stderr_path = stderr_path;
  spawn.die_with_parent = true;
  log({Kind::kStart});
  Clock::TimePoint next_beat = clock_->now();
  while (!stop_requested()) {
    const Nanos started = now_nanos(*clock_);
    Subprocess simba(argv, spawn);
    if (!simba.started()) return internal_error("cannot start " + simba_path);
    bool interrupted = false;
    std::optional<int> status;
    while (!(status = simba.wait_for(milliseconds(0)))) {
      if (!interrupted && stop_requested()) {
        simba.signal(SIGINT);
        interrupted = true;
      }
      if (clock_->now() >= next_beat) {
        log({Kind::kBeat});
        next_beat = clock_->now() + options_.beat_interval;
      }
      sleep_on(*clock_, milliseconds(10));
    }
    // 0: the command's hold ended; 75: not acquired in time; 76: the
    // lease was lost (the command logged it); 130: stopped by SIGINT.
    const int code = WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
    if (code != 0 && code != 75 && code != 76 && code != 130) {
      // 69: the store refused us, or could not be reached within
      // --timeout: the latter only at its end (the checker tells them
      // apart by the time).
      WorkerEvent gave_up{Kind::kGaveUp, 0, 0, code};
      gave_up.check = started;
      gave_up.deadline = started + std::chrono::nanoseconds(options_.run_timeout).count();
      log(gave_up);
      std::fprintf(stderr, "worker %d: simba run exited with %d\n", options_.id, code);
      // Not at full speed against a store that is down (69).
      sleep_on(*clock_, milliseconds(100));
    }
    sleep_on(*clock_, uniform_ms(random, milliseconds(0), options_.rest_max));
  }
  log({Kind::kExit});
  return ok_status();
}

// ---- the pulled locks ----------------------------------------------------------------

namespace {

class KeyedPulledLock final : public PulledLock {
 public:
  KeyedPulledLock(std::unique_ptr<KeyedLockProvider> provider, std::string key,
                  milliseconds max_hold)
      : provider_(std::move(provider)), key_(std::move(key)), max_hold_(max_hold) {}
  ~KeyedPulledLock() override { (void)release(); }

  Result<std::uint64_t> acquire(milliseconds wait, std::function<void()> on_lost) override {
    Result<std::optional<Lease>> got = provider_->try_acquire(key_, wait, max_hold_);
    if (!got.ok()) return got.status();
    if (!got->has_value()) return std::uint64_t{0};
    Lease lease = std::move(**got);
    const std::uint64_t token = lease.fencing_token();
    if (token == 0) return std::uint64_t{0};  // ended as it was granted (~Lease frees it)
    std::lock_guard<std::mutex> lock(mu_);
    lease_ = std::move(lease);
    on_lost_.emplace(lease_->lost_token(), std::move(on_lost));
    return token;
  }
  bool is_held() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return lease_ && lease_->is_held();
  }
  std::uint64_t fencing_token() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return lease_ ? lease_->fencing_token() : 0;
  }
  Nanos deadline() const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!lease_) return 0;
    return nanos_of(lease_->hold_deadline());
  }
  Status release() override {
    std::optional<Lease> lease;
    {
      std::lock_guard<std::mutex> lock(mu_);
      lease.swap(lease_);
    }
    if (!lease) return ok_status();
    const Status released = lease->release();
    // After the release: a loss that raced it is still heard (and the
    // worker logs whichever came first).
    std::lock_guard<std::mutex> lock(mu_);
    on_lost_.reset();
    return released;
  }

 private:
  const std::unique_ptr<KeyedLockProvider> provider_;
  const std::string key_;
  const milliseconds max_hold_;
  mutable std::mutex mu_;
  std::optional<Lease> lease_;
  std::optional<std::stop_callback<std::function<void()>>> on_lost_;
};

class ClusteredPulledLock final : public PulledLock {
 public:
  ClusteredPulledLock(std::unique_ptr<ClusteredLockManager> manager,
                      std::shared_ptr<ClusteredLock> lock)
      : manager_(std::move(manager)), lock_(std::move(lock)) {
    listener_ = lock_->add_loss_listener([this](const Status&) {
      std::function<void()> on_lost;
      {
        std::lock_guard<std::mutex> guard(mu_);
        on_lost.swap(on_lost_);
      }
      if (on_lost) on_lost();
    });
  }
  ~ClusteredPulledLock() override {
    (void)release();
    lock_->remove_loss_listener(listener_);
    // Its callback threads end with it: no listener runs after this.
    manager_.reset();
  }

  Result<std::uint64_t> acquire(milliseconds wait, std::function<void()> on_lost) override {
    {
      std::lock_guard<std::mutex> guard(mu_);
      on_lost_ = std::move(on_lost);  // before the hold can end
    }
    Result<bool> got = lock_->try_lock(wait).get();
    if (!got.ok()) return got.status();
    if (!*got) return std::uint64_t{0};
    held_ = true;
    return lock_->fencing_token();  // 0 if lost already: the worker lets go
  }
  bool is_held() const override { return lock_->is_held(); }
  std::uint64_t fencing_token() const override { return lock_->fencing_token(); }
  Nanos deadline() const override {
    const auto deadline = lock_->lease_deadline();
    return deadline ? nanos_of(*deadline) : 0;
  }
  Status release() override {
    if (!held_) return ok_status();
    held_ = false;
    Result<bool> unlocked = lock_->unlock().get();
    std::lock_guard<std::mutex> guard(mu_);
    on_lost_ = nullptr;
    return unlocked.status();
  }

 private:
  std::unique_ptr<ClusteredLockManager> manager_;
  const std::shared_ptr<ClusteredLock> lock_;
  ClusteredLock::ListenerId listener_ = 0;
  std::mutex mu_;
  std::function<void()> on_lost_;
  bool held_ = false;  // the worker's thread only
};

// The process's one hold and its signals (see cli_command_lock).
struct CliCommandState {
  std::mutex mu;
  std::function<void()> on_lost;
  bool granted = false;  // acquire() handed out the token
  std::atomic<bool> lost{false};
  std::atomic<bool> done{false};
};

CliCommandState& cli_command_state() {
  static CliCommandState state;
  return state;
}

class CliCommandLock final : public PulledLock {
 public:
  explicit CliCommandLock(std::uint64_t token) : token_(token) {}

  Result<std::uint64_t> acquire(milliseconds wait, std::function<void()> on_lost) override {
    CliCommandState& state = cli_command_state();
    {
      std::lock_guard<std::mutex> lock(state.mu);
      if (!state.granted && !state.lost && !state.done) {
        state.granted = true;
        state.on_lost = std::move(on_lost);
        return token_;
      }
    }
    // One hold per command: there is nothing more to wait for.
    std::this_thread::sleep_for(std::min(wait, milliseconds(10)));
    return std::uint64_t{0};
  }
  bool is_held() const override { return !cli_command_state().lost; }
  std::uint64_t fencing_token() const override { return token_; }
  Nanos deadline() const override { return 0; }
  Status release() override {
    cli_command_state().done = true;
    return ok_status();
  }

 private:
  const std::uint64_t token_;
};

}  // namespace

Result<std::unique_ptr<PulledLock>> cli_command_lock(milliseconds linger) {
  const char* env = std::getenv("SIMBA_FENCING_TOKEN");
  char* end = nullptr;
  const unsigned long long token = env != nullptr ? std::strtoull(env, &end, 10) : 0;
  if (env == nullptr || *env == '\0' || *end != '\0' || token == 0) {
    return invalid_argument_error(
        "SIMBA_FENCING_TOKEN is not a fencing token (run this under `simba run`)");
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // Detached: it lives as long as the process, which exits from main.
  std::thread([signals, linger] {
    CliCommandState& state = cli_command_state();
    for (;;) {
      int signal = 0;
      if (sigwait(&signals, &signal) != 0) continue;
      if (signal == SIGINT) {
        // The worker stops: the command lets go (run_pulled logs released).
        state.done = true;
        continue;
      }
      if (linger.count() > 0) {
        // The negative control's command: it winds down as if it had not
        // lost anything, acting all the while, then ends its hold as
        // finished (run_pulled logs released).
        std::this_thread::sleep_for(linger);
        state.done = true;
        continue;
      }
      // SIGTERM: the CLI lost the lease. The check fails from now on, and
      // the loss is logged at once.
      std::function<void()> on_lost;
      {
        std::lock_guard<std::mutex> lock(state.mu);
        state.lost = true;
        on_lost.swap(state.on_lost);
      }
      if (on_lost) on_lost();
      state.done = true;
    }
  }).detach();
  return std::unique_ptr<PulledLock>(std::make_unique<CliCommandLock>(token));
}

bool cli_command_done() { return cli_command_state().done; }

std::unique_ptr<PulledLock> keyed_pulled_lock(std::unique_ptr<KeyedLockProvider> provider,
                                              std::string key, milliseconds max_hold) {
  return std::make_unique<KeyedPulledLock>(std::move(provider), std::move(key), max_hold);
}

Result<std::unique_ptr<PulledLock>> clustered_pulled_lock(
    std::unique_ptr<ClusteredLockManager> manager, const std::string& name) {
  SIMBA_RETURN_IF_ERROR(manager->define(name).status());
  Result<std::shared_ptr<ClusteredLock>> lock = manager->get(name);
  if (!lock.ok()) return lock.status();
  return std::unique_ptr<PulledLock>(
      std::make_unique<ClusteredPulledLock>(std::move(manager), std::move(*lock)));
}

}  // namespace simba::testing
