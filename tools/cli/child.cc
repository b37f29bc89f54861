#include "tools/cli/child.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

extern char** environ;

namespace simba::cli {
namespace {

std::atomic<int> g_signal{0};

void on_signal(int signal) { g_signal = signal; }

// The reaper: a process of simba's own that outlives simba only to kill the
// job's group when simba dies without saying the job has ended. It holds the
// read end of a pipe whose only write end is simba's: simba writes one byte
// once it has collected the job (the reaper then exits quietly); end of file
// without that byte means simba is gone, so the job's group is killed.
// Forked from a process with threads, it calls only async-signal-safe
// functions until it exits.
[[noreturn]] void run_reaper(int read_fd, pid_t job) {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  // Ctrl-C and a kill of simba's own group must not end the reaper before it
  // has done its one job; SIGKILL still can (nothing is lost but the guard).
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) sigaction(s, &ignore, nullptr);
  // No descriptor of simba's but its own pipe: other reapers' pipes must
  // reach end of file when simba dies, and simba's output pipes must close.
  if (read_fd > 0) close_range(0, static_cast<unsigned>(read_fd) - 1, 0);
  close_range(static_cast<unsigned>(read_fd) + 1, ~0U, 0);
  char byte = 0;
  ssize_t n;
  do {
    n = read(read_fd, &byte, 1);
  } while (n < 0 && errno == EINTR);
  if (n != 1) {
    kill(-job, SIGKILL);
    kill(job, SIGKILL);
  }
  _exit(0);
}

int shell_status(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

}  // namespace

Result<Child> Child::start(const std::vector<std::string>& command,
                           const std::map<std::string, std::string>& env) {
  if (command.empty()) return invalid_argument_error("no command given after '--'");
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string key = entry.substr(0, entry.find('='));
    if (env.count(key) == 0) env_strings.push_back(entry);
  }
  for (const auto& [key, value] : env) env_strings.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = command;
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // A process group of its own (pgid = its pid) so a signal reaches the
  // whole job; default dispositions and an empty mask, whatever simba uses.
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], nullptr, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  if (rc == ENOENT) return not_found_error("command not found: " + command[0]);
  if (rc == EACCES || rc == ENOEXEC) {
    return permission_denied_error("cannot execute " + command[0] + ": " + std::strerror(rc));
  }
  if (rc != 0) return internal_error("cannot start " + command[0] + ": " + std::strerror(rc));

  // The reaper (see RunReaper). The write end is close-on-exec, so no child
  // started later keeps it open.
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    const int error = errno;
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return internal_error(std::string("cannot guard the command (pipe): ") + std::strerror(error));
  }
  const pid_t reaper = fork();
  if (reaper == 0) run_reaper(fds[0], pid);
  const int fork_error = errno;
  close(fds[0]);
  if (reaper < 0) {
    close(fds[1]);
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return internal_error(std::string("cannot guard the command (fork): ") +
                          std::strerror(fork_error));
  }
  return Child(pid, reaper, fds[1]);
}

Child::Child(Child&& other) noexcept
    : pid_(other.pid_),
      status_(other.status_),
      reaper_(std::exchange(other.reaper_, -1)),
      reaper_fd_(std::exchange(other.reaper_fd_, -1)) {}

Child& Child::operator=(Child&& other) noexcept {
  if (this != &other) {
    release_reaper();
    pid_ = other.pid_;
    status_ = other.status_;
    reaper_ = std::exchange(other.reaper_, -1);
    reaper_fd_ = std::exchange(other.reaper_fd_, -1);
  }
  return *this;
}

Child::~Child() { release_reaper(); }

void Child::dismiss_reaper() {
  if (reaper_fd_ >= 0) {
    const char done = 'x';
    ssize_t n;
    do {
      n = write(reaper_fd_, &done, 1);
    } while (n < 0 && errno == EINTR);
    close(reaper_fd_);
    reaper_fd_ = -1;
  }
  if (reaper_ > 0) {
    while (waitpid(reaper_, nullptr, 0) < 0 && errno == EINTR) {
    }
    reaper_ = -1;
  }
}

void Child::release_reaper() {
  if (status_) {
    dismiss_reaper();
    return;
  }
  if (reaper_fd_ >= 0) {
    close(reaper_fd_);
    reaper_fd_ = -1;
  }
  if (reaper_ > 0) {
    while (waitpid(reaper_, nullptr, 0) < 0 && errno == EINTR) {
    }
    reaper_ = -1;
  }
}

void Child::signal(int signal) const {
  if (status_) return;
  // The group first; the pid too, in case the child left its group.
  kill(-pid_, signal);
  kill(pid_, signal);
}

std::optional<int> Child::poll() {
  if (status_) return status_;
  int wait_status = 0;
  const pid_t r = waitpid(pid_, &wait_status, WNOHANG);
  if (r == pid_) {
    status_ = shell_status(wait_status);
    // At once: from now on the job's pid may be reused by someone else.
    dismiss_reaper();
  }
  return status_;
}

int stop_child(Child& child, std::chrono::milliseconds kill_after) {
  child.signal(SIGTERM);
  const auto kill_at = std::chrono::steady_clock::now() + kill_after;
  bool killed = false;
  for (;;) {
    if (auto status = child.poll()) return *status;
    if (!killed && std::chrono::steady_clock::now() >= kill_at) {
      child.signal(SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void install_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaction(s, &action, nullptr);
}

int take_signal() { return g_signal.exchange(0); }

}  // namespace simba::cli
