#include "testing/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

extern char** environ;

namespace simba::testing {

double time_scale() {
  static const double kScale = [] {
    const char* env = std::getenv("SIMBA_TEST_TIME_SCALE");
    if (env == nullptr) return 1.0;
    const double v = std::strtod(env, nullptr);
    return v >= 1.0 ? v : 1.0;
  }();
  return kScale;
}

std::chrono::milliseconds scaled(std::chrono::milliseconds d) {
  return std::chrono::milliseconds(
      static_cast<long long>(static_cast<double>(d.count()) * time_scale()));
}

Subprocess::Subprocess(const std::vector<std::string>& argv, const SpawnOptions& options) {
  int fds[2] = {-1, -1};
  if (options.read_stdout && pipe2(fds, O_CLOEXEC) != 0) return;
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  if (!options.die_with_parent && options.stderr_path.empty()) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (fds[1] >= 0) posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) pid = -1;
  } else {
    // What posix_spawn cannot do (a death signal), by hand: between fork
    // and exec only async-signal-safe calls, on what was prepared before.
    const pid_t parent = getpid();
    pid = fork();
    if (pid == 0) {
      if (options.die_with_parent) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
      }
      if (fds[1] >= 0) dup2(fds[1], STDOUT_FILENO);
      if (!options.stderr_path.empty()) {
        const int fd = open(options.stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0 && fd != STDERR_FILENO) {
          dup2(fd, STDERR_FILENO);
          close(fd);
        }
      }
      execv(args[0], args.data());
      _exit(127);
    }
  }
  if (fds[1] >= 0) close(fds[1]);
  if (pid <= 0) {
    if (fds[0] >= 0) close(fds[0]);
    return;
  }
  pid_ = pid;
  out_fd_ = fds[0];
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    kill(pid_, SIGCONT);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
}

std::optional<std::string> Subprocess::read_line(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + scaled(timeout);
  for (;;) {
    const auto nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    if (out_fd_ < 0) return std::nullopt;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd pfd{out_fd_, POLLIN, 0};
    const int ready = poll(&pfd, 1, static_cast<int>(left.count()));
    if (ready <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(out_fd_, chunk, sizeof chunk);
    if (n <= 0) {
      close(out_fd_);
      out_fd_ = -1;
      continue;
    }
    buffer_.append(chunk, static_cast<std::size_t>(n));
  }
}

std::optional<std::string> Subprocess::wait_for_line(const std::string& prefix,
                                                     std::chrono::milliseconds timeout,
                                                     std::vector<std::string>* seen) {
  const auto deadline = std::chrono::steady_clock::now() + scaled(timeout);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    // ReadLine scales again; undo it so the overall bound stays `timeout`.
    auto line = read_line(std::chrono::milliseconds(
        static_cast<long long>(static_cast<double>(left.count()) / time_scale()) + 1));
    if (!line) return std::nullopt;
    if (seen != nullptr) seen->push_back(*line);
    if (line->rfind(prefix, 0) == 0) return line;
  }
}

void Subprocess::signal(int signal) {
  if (pid_ > 0 && !reaped_) kill(pid_, signal);
}

int Subprocess::wait() {
  int status = 0;
  if (pid_ > 0 && !reaped_) {
    waitpid(pid_, &status, 0);
    reaped_ = true;
  }
  return status;
}

std::optional<int> Subprocess::wait_for(std::chrono::milliseconds timeout) {
  if (pid_ <= 0 || reaped_) return reaped_ ? std::optional<int>(0) : std::nullopt;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_ || (done < 0 && errno != EINTR)) {
      reaped_ = true;
      return status;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

namespace {

struct ProcStat {
  char state = 0;  // R, S, D, T (stopped), t, Z, ...
  pid_t parent = -1;
};

// Process `pid`'s state and parent from /proc/PID/stat ("pid (comm) state
// ppid ..."; comm may hold spaces and parentheses, so read after the last
// ')'); nullopt when it is gone.
std::optional<ProcStat> proc_stat(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return std::nullopt;
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(stat.substr(close + 1));
  ProcStat out;
  rest >> out.state >> out.parent;
  if (!rest) return std::nullopt;
  return out;
}

}  // namespace

std::vector<pid_t> process_tree(pid_t root) {
  std::map<pid_t, std::vector<pid_t>> children;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() ||
        !std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    const pid_t pid = static_cast<pid_t>(std::atoi(name.c_str()));
    const auto stat = proc_stat(pid);
    if (stat && stat->parent > 0) children[stat->parent].push_back(pid);
  }
  std::vector<pid_t> tree = {root};
  for (std::size_t i = 0; i < tree.size(); ++i) {
    for (const pid_t child : children[tree[i]]) tree.push_back(child);
  }
  return tree;
}

std::vector<pid_t> freeze_process_tree(pid_t root) {
  // The root first, before any look at /proc: a scan of every process can
  // take tens of milliseconds on a busy machine, in which the root would
  // go on acting after its caller decided to stop it.
  std::set<pid_t> stopped = {root};
  std::vector<pid_t> fresh = {root};
  while (!fresh.empty()) {
    signal_processes(fresh, SIGSTOP);
    // A signal is taken when its process next leaves the kernel: a fork
    // under way finishes first. Look again only once each has stopped (or
    // died), so that look finds every child they made (up to 1 s each).
    for (const pid_t pid : fresh) {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      for (;;) {
        const auto stat = proc_stat(pid);
        if (!stat || stat->state == 'T' || stat->state == 'Z' || stat->state == 'X') break;
        if (std::chrono::steady_clock::now() >= give_up) break;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    fresh.clear();
    for (const pid_t pid : process_tree(root)) {
      if (stopped.insert(pid).second) fresh.push_back(pid);
    }
  }
  return {stopped.begin(), stopped.end()};
}

void signal_processes(const std::vector<pid_t>& pids, int signal) {
  for (const pid_t pid : pids) kill(pid, signal);
}

CommandRun run_command_line(const std::string& command_line) {
  CommandRun run;
  const auto started = std::chrono::steady_clock::now();
  const std::string command = command_line + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) run.output.append(buffer, n);
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - started);
  return run;
}

std::future<CommandRun> start_command_line(const std::string& command_line) {
  return std::async(std::launch::async, [command_line] { return run_command_line(command_line); });
}

}  // namespace simba::testing
