#include "tools/cli/child.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

extern char** environ;

namespace simba::cli {
namespace {

std::atomic<int> g_signal{0};

void OnSignal(int signal) { g_signal = signal; }

int ShellStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

}  // namespace

Result<Child> Child::Start(const std::vector<std::string>& command,
                           const std::map<std::string, std::string>& env) {
  if (command.empty()) return InvalidArgumentError("no command given after '--'");
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
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF |
                                      POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], nullptr, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  if (rc == ENOENT) return NotFoundError("command not found: " + command[0]);
  if (rc == EACCES || rc == ENOEXEC) {
    return PermissionDeniedError("cannot execute " + command[0] + ": " + std::strerror(rc));
  }
  if (rc != 0) return InternalError("cannot start " + command[0] + ": " + std::strerror(rc));
  return Child(pid);
}

void Child::Signal(int signal) const {
  if (status_) return;
  // The group first; the pid too, in case the child left its group.
  kill(-pid_, signal);
  kill(pid_, signal);
}

std::optional<int> Child::Poll() {
  if (status_) return status_;
  int wait_status = 0;
  const pid_t r = waitpid(pid_, &wait_status, WNOHANG);
  if (r == pid_) status_ = ShellStatus(wait_status);
  return status_;
}

int StopChild(Child& child, std::chrono::milliseconds kill_after) {
  child.Signal(SIGTERM);
  const auto kill_at = std::chrono::steady_clock::now() + kill_after;
  bool killed = false;
  for (;;) {
    if (auto status = child.Poll()) return *status;
    if (!killed && std::chrono::steady_clock::now() >= kill_at) {
      child.Signal(SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void InstallSignalHandlers() {
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaction(s, &action, nullptr);
}

int TakeSignal() { return g_signal.exchange(0); }

}  // namespace simba::cli
