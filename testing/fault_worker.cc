#include "testing/fault_worker.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>

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

}  // namespace

Nanos now_nanos(const Clock& clock) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock.now().time_since_epoch())
      .count();
}

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
      clock_(factory->clock()) {}

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

Status FaultWorker::run(const std::function<bool()>& stop_requested) {
  using Kind = WorkerEvent::Kind;
  std::mt19937_64 random(options_.seed);
  auto uniform = [&](milliseconds lo, milliseconds hi) {
    if (hi <= lo) return lo;
    return milliseconds(
        std::uniform_int_distribution<std::int64_t>(lo.count(), hi.count())(random));
  };
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

  std::int64_t seq = 0;
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
        last_deadline =
            std::chrono::duration_cast<std::chrono::nanoseconds>(deadline->time_since_epoch())
                .count();
      }
      // Every check that passes is acted on, with the last deadline the
      // service reported for this tenure: an is_owner() that stopped
      // reading the clock passes after lease_deadline() has gone quiet, and
      // must still produce a write for the checker to judge
      // (write-after-deadline). Only a service that names another token
      // (its on_acquired not delivered yet) is not written for.
      if (owner && (current == token || current == 0)) {
        if (options_.write_gap.count() > 0) sleep_on(*clock_, options_.write_gap);
        const Result<bool> accepted = resource_->write(options_.id, token, seq);
        if (accepted.ok()) {
          WorkerEvent e{Kind::kWrite, 0, token, seq};
          e.check = check;
          e.deadline = last_deadline;
          e.accepted = *accepted;
          log(e);
        } else {
          std::fprintf(stderr, "worker %d: %s\n", options_.id,
                       accepted.status().to_string().c_str());
        }
        ++seq;
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

}  // namespace simba::testing
