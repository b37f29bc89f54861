// Real servers (redis-server, later postgres, mysql, zookeeper, etcd) for the
// tests of the server backends, run by scripts/servers/<kind>.sh: on
// 127.0.0.1, on a free port, with their data in a directory of their own,
// and stopped by PID.
//
// Two ways to get one:
//   - shared_server_uri("redis"): the server every test of this process may
//     share. Under ctest it is the fixture's (cmake/SimbaServers.cmake, and
//     `FIXTURES redis` in simba_add_test); a binary run by hand starts a
//     private one on first use.
//   - TestServer::start("redis"): a server for this test alone, for the
//     cases that stop, kill, restart or pause it.
//
// Every server started here is also watched by the script: if this process
// dies without stopping it (a crash, a ctest timeout), the server is stopped
// within about a second.
#ifndef SIMBA_TESTING_TEST_SERVERS_H_
#define SIMBA_TESTING_TEST_SERVERS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "simba/status.h"

namespace simba::testing {

class TempDir;

// A server started by scripts/servers/<kind>.sh in a directory of its own.
// Not thread-safe: one thread drives a TestServer at a time.
class TestServer {
 public:
  // Starts a private server (its own temp dir, removed when the object is
  // destroyed after stopping it). `extra_args` go to the server after the
  // script's own options, so they may override them (for redis:
  // {"--appendonly", "yes", "--appendfsync", "always"} makes it durable).
  // kUnavailable when the server could not be started (the script's output
  // is in the message); kInvalidArgument for an unknown kind.
  static Result<std::unique_ptr<TestServer>> start(std::string kind,
                                                   std::vector<std::string> extra_args = {});
  ~TestServer();  // stop + remove dir
  TestServer(const TestServer&) = delete;
  TestServer& operator=(const TestServer&) = delete;

  // e.g. "redis://127.0.0.1:23456"; the same after restart().
  const std::string& uri() const { return uri_; }
  int port() const { return port_; }
  const std::string& dir() const;

  // Graceful stop (SIGTERM, SIGKILL after 10 s). OK when already stopped.
  Status stop();
  // SIGKILL, as in a crash; returns once the process is gone.
  Status kill();
  // Starts again on the same port and with the same data dir and args, after
  // stop() or kill() (a running server is stopped first).
  Status restart();
  // SIGSTOP / SIGCONT: a server that hangs (connections stay open, nothing
  // is answered) and comes back.
  Status pause();
  Status resume();
  // Runs `<kind>.sh COMMAND DIR ARGS...` (a topology's member commands:
  // "kill-member", "promote", "primary", ...) and returns its output
  // (stdout and stderr), or an error with it when the script fails.
  Result<std::string> run(const std::string& command, const std::vector<std::string>& args = {});

  // Runs `<kind>.sh <command> <dir> <args...>` (e.g. etcd.sh's cluster
  // commands: "kill-member", {"2"}; "leader", {}; zookeeper.sh's {"kill",
  // "2"}; redis.sh's "primary") and returns its output
  // (stdout and stderr) with trailing white space removed; non-OK if it
  // fails.
  Result<std::string> command(const std::string& command,
                              const std::vector<std::string>& args = {});

 private:
  TestServer(std::string kind, std::vector<std::string> extra_args);
  // Runs `<kind>.sh <command> <dir> [extra args]`; non-OK if it fails.
  Status script(const std::string& command, bool with_extra_args);
  // Runs `<kind>.sh <command> <dir> <args...>`: its output (trimmed of
  // trailing white space if `trim`), or non-OK with it if it fails.
  Result<std::string> member_script(const std::string& command,
                                    const std::vector<std::string>& args, bool trim);

  std::string kind_;
  std::vector<std::string> extra_args_;
  std::unique_ptr<TempDir> dir_;
  std::string uri_;
  int port_ = 0;
  // The process that started the server: a child forked from it (a gtest
  // death test) that runs destructors must not stop the parent's server.
  pid_t owner_pid_;
};

// The URI of the server shared by this test process: the ctest fixture's
// (from $SIMBA_TEST_SERVERS_DIR/<kind>/uri) when set, otherwise a private
// server started on first use and stopped at exit (so a test binary also
// runs by hand without ctest). A private redis is durable, like the
// fixture's. Empty when no server could be started; the reason is printed
// to stderr once. Thread-safe.
std::string shared_server_uri(const std::string& kind);

// Runs `scripts/servers/<script>.sh ARGS...` (a helper that is no server's,
// such as netns.sh) and returns its output (stdout and stderr) with
// trailing white space removed; non-OK if it fails.
Result<std::string> run_server_script(const std::string& script,
                                      const std::vector<std::string>& args);

}  // namespace simba::testing

#endif  // SIMBA_TESTING_TEST_SERVERS_H_
