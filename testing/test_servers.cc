#include "testing/test_servers.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "testing/test_util.h"

#ifndef SIMBA_SOURCE_DIR
#error "SIMBA_SOURCE_DIR must be defined (testing/CMakeLists.txt)"
#endif

extern char** environ;

namespace simba::testing {
namespace {

// Generous: a start waits up to 10 s for the server, and may first stop a
// leftover one (up to 20 s) or retry on another port.
constexpr std::chrono::seconds kScriptTimeout{120};

struct CommandOutput {
  int exit_code = -1;  // -1: killed by a signal
  std::string output;  // stdout and stderr, interleaved
};

// Runs argv (argv[0] a full path) with stdin on /dev/null and stdout and
// stderr captured, for at most `timeout` (scaled). No shell is involved, so
// no argument is ever parsed as shell syntax.
Result<CommandOutput> run_command(const std::vector<std::string>& argv,
                                  std::chrono::milliseconds timeout) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return internal_error("pipe2 failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return internal_error("cannot run " + argv[0] + ": " + std::strerror(rc));
  }

  CommandOutput result;
  const auto deadline = std::chrono::steady_clock::now() + scaled(timeout);
  auto left_ms = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                 std::chrono::steady_clock::now())
        .count();
  };
  bool timed_out = false;
  // Output until EOF: the scripts hand their servers no end of the pipe, so
  // EOF comes when the script exits.
  for (;;) {
    const auto left = left_ms();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd pfd{fds[0], POLLIN, 0};
    const int ready = poll(&pfd, 1, static_cast<int>(left));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(fds[0], chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(chunk, static_cast<std::size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  for (;;) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0) {
      if (errno == EINTR) continue;
      return internal_error(std::string("waitpid failed: ") + std::strerror(errno));
    }
    if (!timed_out && left_ms() > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    timed_out = true;
    kill(pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    break;
  }
  if (timed_out) {
    return deadline_exceeded_error("timed out; output so far:\n" + result.output);
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Kinds name scripts/servers/<kind>.sh: letters, digits and '_' only, so a
// kind cannot point elsewhere.
bool valid_kind(const std::string& kind) {
  if (kind.empty()) return false;
  for (const char c : kind) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

std::string script_path(const std::string& kind) {
  return std::string(SIMBA_SOURCE_DIR) + "/scripts/servers/" + kind + ".sh";
}

// What the fixture in tests/CMakeLists.txt passes, so a test sees the same
// kind of server with or without ctest.
std::vector<std::string> shared_server_args(const std::string& kind) {
  if (kind == "redis") return {"--appendonly", "yes", "--appendfsync", "always"};
  // postgres and mysql: durable with their defaults, so nothing to add. Their
  // URIs name the database simba, which the scripts create (mysql: with the
  // user simba, password simba-test).
  return {};
}

}  // namespace

TestServer::TestServer(std::string kind, std::vector<std::string> extra_args)
    : kind_(std::move(kind)),
      extra_args_(std::move(extra_args)),
      dir_(std::make_unique<TempDir>()),
      owner_pid_(getpid()) {}

Result<std::unique_ptr<TestServer>> TestServer::start(std::string kind,
                                                      std::vector<std::string> extra_args) {
  if (!valid_kind(kind)) return invalid_argument_error("bad server kind '" + kind + "'");
  std::error_code ec;
  if (!std::filesystem::exists(script_path(kind), ec)) {
    return invalid_argument_error("no script for server kind '" + kind + "': " + script_path(kind));
  }
  std::unique_ptr<TestServer> server(new TestServer(std::move(kind), std::move(extra_args)));
  if (Status s = server->restart(); !s.ok()) return unavailable_error(s.message());
  return server;
}

TestServer::~TestServer() {
  if (getpid() != owner_pid_) {
    // A forked child (a death test) must leave the parent's server and
    // directory alone: the TempDir is deliberately not destroyed here.
    static_cast<void>(dir_.release());
    return;
  }
  if (Status s = stop(); !s.ok()) {
    std::cerr << "TestServer(" << kind_ << "): " << s << "\n";
  }
}

const std::string& TestServer::dir() const { return dir_->path(); }

Status TestServer::script(const std::string& command, bool with_extra_args) {
  // env passes the owner's PID to the script, whose watchdog stops the
  // server if this process dies without doing so.
  std::vector<std::string> argv = {
      "/usr/bin/env", "SIMBA_SERVER_OWNER_PID=" + std::to_string(owner_pid_),
      "bash",         script_path(kind_),
      command,        dir()};
  if (with_extra_args) argv.insert(argv.end(), extra_args_.begin(), extra_args_.end());
  Result<CommandOutput> out = run_command(argv, kScriptTimeout);
  const std::string what = kind_ + ".sh " + command + " " + dir();
  if (!out.ok()) return out.status().with_context(what + ": ");
  if (out->exit_code != 0) {
    return internal_error(what + " failed (exit " + std::to_string(out->exit_code) + "):\n" +
                          out->output);
  }
  return ok_status();
}

namespace {

// Runs `argv` (a script and its arguments) and returns its output, with
// trailing white space removed if `trim`; `what` names it in errors.
Result<std::string> script_output(const std::vector<std::string>& argv, const std::string& what,
                                  bool trim = true) {
  Result<CommandOutput> out = run_command(argv, kScriptTimeout);
  if (!out.ok()) return out.status().with_context(what + ": ");
  if (out->exit_code != 0) {
    return internal_error(what + " failed (exit " + std::to_string(out->exit_code) + "):\n" +
                          out->output);
  }
  std::string text = std::move(out->output);
  while (trim && !text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.pop_back();
  }
  return text;
}

}  // namespace

Result<std::string> TestServer::member_script(const std::string& command,
                                              const std::vector<std::string>& args, bool trim) {
  std::vector<std::string> argv = {
      "/usr/bin/env", "SIMBA_SERVER_OWNER_PID=" + std::to_string(owner_pid_),
      "bash",         script_path(kind_),
      command,        dir()};
  argv.insert(argv.end(), args.begin(), args.end());
  return script_output(argv, kind_ + ".sh " + command + " " + dir(), trim);
}

Result<std::string> TestServer::command(const std::string& command,
                                        const std::vector<std::string>& args) {
  return member_script(command, args, true);
}

Result<std::string> run_server_script(const std::string& script,
                                      const std::vector<std::string>& args) {
  if (!valid_kind(script)) return invalid_argument_error("no script " + script);
  std::vector<std::string> argv = {"/usr/bin/env", "bash", script_path(script)};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string what = script + ".sh";
  for (const std::string& a : args) what += " " + a;
  return script_output(argv, what);
}

Status TestServer::stop() { return script("stop", false); }
Status TestServer::kill() { return script("kill", false); }
Status TestServer::pause() { return script("pause", false); }
Status TestServer::resume() { return script("resume", false); }

Result<std::string> TestServer::run(const std::string& command,
                                    const std::vector<std::string>& args) {
  return member_script(command, args, false);
}

Status TestServer::restart() {
  SIMBA_RETURN_IF_ERROR(script("start", true));
  // The script leaves the address in files of the directory: read them
  // rather than parse its output, which may carry warnings.
  const std::string port_text = read_first_line(dir() + "/port");
  const std::string uri = read_first_line(dir() + "/uri");
  const int port = std::atoi(port_text.c_str());
  if (port <= 0 || uri.empty()) {
    return internal_error(kind_ + ".sh start wrote no port or uri in " + dir());
  }
  port_ = port;
  uri_ = uri;
  return ok_status();
}

std::string shared_server_uri(const std::string& kind) {
  if (const char* servers_dir = std::getenv("SIMBA_TEST_SERVERS_DIR");
      servers_dir != nullptr && servers_dir[0] != '\0') {
    const std::string path = std::string(servers_dir) + "/" + kind + "/uri";
    std::string uri = read_first_line(path);
    if (!uri.empty()) return uri;
    // The test declared no fixture for this kind: a private server still
    // lets it run, but it should say `FIXTURES <kind>`.
    static std::once_flag warned;
    std::call_once(warned, [&] {
      std::cerr << "SharedServerUri(" << kind << "): no " << path
                << "; starting a private server (does the test lack FIXTURES " << kind << "?)\n";
    });
  }

  // Destroyed at exit, which stops the servers. A failed start is
  // remembered (as null) so it is neither retried nor reported per test.
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<TestServer>> servers;
  std::lock_guard<std::mutex> lock(mu);
  auto it = servers.find(kind);
  if (it == servers.end()) {
    Result<std::unique_ptr<TestServer>> started = TestServer::start(kind, shared_server_args(kind));
    if (!started.ok()) {
      std::cerr << "SharedServerUri(" << kind << "): " << started.status() << "\n";
      it = servers.emplace(kind, nullptr).first;
    } else {
      it = servers.emplace(kind, std::move(started).value()).first;
    }
  }
  return it->second != nullptr ? it->second->uri() : std::string();
}

}  // namespace simba::testing
