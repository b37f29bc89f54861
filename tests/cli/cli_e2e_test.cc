// End-to-end tests of the `simba` command line (docs/cli.md is the contract):
// the real binary, started as separate processes, sharing a store.
//
// Value-parameterized over the stores that several processes can share. A
// backend joins with one more CliTarget function (listed in
// TargetsOfThisBinary at the bottom) and a binary in tests/CMakeLists.txt.
//
// Every wait has a timeout (scaled by SIMBA_TEST_TIME_SCALE), so a hang fails
// the test instead of hanging ctest. Every process a test starts is killed and
// reaped when the test ends: the `simba` processes (and whatever runs in their
// process group) by their Proc, and the children `simba` put in process groups
// of their own through the pid files they write.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "simba/uri.h"
#include "testing/json_reader.h"
#include "testing/test_servers.h"
#include "testing/test_util.h"

#ifndef SIMBA_CLI_PATH
#error "SIMBA_CLI_PATH must name the simba binary"
#endif

extern char** environ;

namespace simba::testing {

// The store this binary's tests run on ("sqlite", "redis", ...): defined by
// tests/cli/cli_store.cc, built into each store's binary with its name.
std::string_view CliStoreOfThisBinary();

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

const std::string kSimba = SIMBA_CLI_PATH;

// Short leases so hand-offs and failovers are quick.
constexpr milliseconds kTtl{1000};
constexpr milliseconds kTransition{500};
const std::vector<std::string> kLeaseFlags = {"--ttl", "1s", "--transition", "500ms"};

// The longest a waiter needs to notice that a killed owner's lease ended:
// ttl + transition plus the contender's largest jitter (DESIGN §3: U[-200,
// 1000) ms), as docs/guide.md says, plus 0.5 s for the acquisition's round
// trip and the job's start (a shell writing a file) on a loaded machine.
// (Sanitized builds stretch the margin: SIMBA_TEST_TIME_SCALE.)
const milliseconds kFailoverBound = kTtl + kTransition + seconds(1) + Scaled(milliseconds(500));

// ---- the stores ------------------------------------------------------------------

// A store several processes can share.
struct CliTarget {
  // Test name part and ctest label: "sqlite", ...
  std::string name;
  // The store URI for one test: `dir` is the test's own temporary directory,
  // `unique` differs per test (a server-backed store may use it as a prefix).
  std::function<std::string(const std::string& dir, const std::string& unique)> uri;
  // A URI of this scheme that cannot be opened (exit 69).
  std::string unavailable_uri;
  // SQL servers: the argv of a client that runs the SQL on its stdin in the
  // database of uri(), as a DBA would run what `simba schema` prints. Empty
  // for stores without a schema (`simba schema` exits 64 there).
  // (A function: the server's URI is known only once the test runs.)
  std::function<std::vector<std::string>()> sql_client;
  // Stores whose URI may carry a password: uri() with `secret` as the
  // password (empty function otherwise), and whether the server lets that
  // password in (PostgreSQL's test server trusts every local connection;
  // MySQL's and Redis's refuse a wrong password).
  std::function<std::string(const std::string& unique, const std::string& secret)> password_uri;
  bool password_accepted = false;
};

void PrintTo(const CliTarget& target, std::ostream* os) { *os << target.name; }

std::string CliTargetName(const ::testing::TestParamInfo<CliTarget>& info) {
  return info.param.name;
}

CliTarget SqliteTarget() {
  return {"sqlite",
          [](const std::string& dir, const std::string& unique) {
            return "sqlite://" + dir + "/" + unique + ".db";
          },
          "sqlite:///nonexistent-dir/x.db",
          nullptr,
          nullptr,
          false};
}

// Every test gets a key prefix of its own on the shared server. Port 1 on
// loopback refuses connections: an unreachable store.
CliTarget RedisTarget() {
  return {"redis",
          [](const std::string&, const std::string& unique) {
            return SharedServerUri("redis") + "?key_prefix=cli-" + unique;
          },
          "redis://127.0.0.1:1",
          nullptr,
          [](const std::string& unique, const std::string& secret) {
            // redis://127.0.0.1:PORT -> redis://:SECRET@127.0.0.1:PORT
            std::string uri = RedisTarget().uri("", unique);
            return uri.insert(uri.find("://") + 3, ":" + secret + "@");
          },
          false};
}
// Every test gets a table of its own in the shared database.
CliTarget PostgresTarget() {
  return {"postgres",
          [](const std::string&, const std::string& unique) {
            std::string table = "cli_" + unique;
            std::replace(table.begin(), table.end(), '-', '_');
            return SharedServerUri("postgres") + "?table=" + table;
          },
          "postgresql://nobody@127.0.0.1:1/db",
          [] {
            return std::vector<std::string>{"psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d",
                                            SharedServerUri("postgres")};
          },
          [](const std::string& unique, const std::string& secret) {
            // postgresql://postgres@... -> postgresql://postgres:SECRET@...
            std::string uri = PostgresTarget().uri("", unique);
            return uri.insert(uri.find('@'), ":" + secret);
          },
          true};
}
// The MariaDB client (scripts/install-deps.sh --servers installs it for
// scripts/servers/mysql.sh) on the shared server's database, as its URI's user.
std::vector<std::string> MysqlClient() {
  auto server = Uri::Parse(SharedServerUri("mysql"));
  if (!server.ok() || server->hosts.empty()) return {"false"};
  return {"mariadb",
          "--protocol=TCP",
          "--host=" + server->hosts.front().host,
          "--port=" + std::to_string(server->hosts.front().port.value_or(3306)),
          "--user=" + server->user.value_or(""),
          "--password=" + server->password.value_or(""),
          server->path.substr(1)};
}
// Every test gets a table of its own in the shared database.
CliTarget MysqlTarget() {
  return {"mysql",
          [](const std::string&, const std::string& unique) {
            std::string table = "cli_" + unique;
            std::replace(table.begin(), table.end(), '-', '_');
            return SharedServerUri("mysql") + "?table=" + table;
          },
          "mysql://nobody@127.0.0.1:1/db",
          MysqlClient,
          [](const std::string& unique, const std::string& secret) {
            // mysql://simba:simba-test@... -> mysql://simba:SECRET@...
            const std::string uri = MysqlTarget().uri("", unique);
            const auto colon = uri.find(':', uri.find("://") + 3);
            return uri.substr(0, colon + 1) + secret + uri.substr(uri.find('@'));
          },
          false};
}
// Every test gets a root node of its own on the shared server.
CliTarget ZookeeperTarget() {
  return {"zookeeper",
          [](const std::string&, const std::string& unique) {
            return SharedServerUri("zookeeper") + "?root=/cli-" + unique;
          },
          "zookeeper://127.0.0.1:1?connect_timeout=1s",
          nullptr,
          nullptr,
          false};
}
// Every test gets a key prefix of its own on the shared server.
CliTarget EtcdTarget() {
  return {"etcd",
          [](const std::string&, const std::string& unique) {
            return SharedServerUri("etcd") + "?key_prefix=cli-" + unique;
          },
          "etcd://127.0.0.1:1",
          nullptr,
          nullptr,
          false};
}

// ---- processes -------------------------------------------------------------------

// Exit code of a wait status: the code for a normal exit, 1000 + N when the
// process itself was killed by signal N (so it never equals a `simba` exit
// code such as 128 + N).
int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 1000 + WTERMSIG(status);
  return -1;
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool FileExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// Whether `pid` is a live process (not gone, not a zombie).
bool Alive(pid_t pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  const std::string stat = ReadWholeFile("/proc/" + std::to_string(pid) + "/stat");
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return true;
  return stat[paren + 2] != 'Z';
}

std::string Join(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

// Environment overrides: a value sets the variable, nullopt removes it.
using Env = std::map<std::string, std::optional<std::string>>;

// A process started with posix_spawn in a process group of its own, with
// stdout and stderr going to files. The destructor SIGKILLs the group and
// reaps the process if it still runs.
class Proc {
 public:
  Proc(const std::vector<std::string>& argv, const std::string& cwd, const std::string& log_base,
       const Env& env)
      : argv_(argv), out_path_(log_base + ".out"), err_path_(log_base + ".err") {
    // The inherited environment without SIMBA_* (the caller decides those).
    std::vector<std::string> envs;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      const std::string key = kv.substr(0, kv.find('='));
      if (key.rfind("SIMBA_", 0) == 0 && key != "SIMBA_TEST_TIME_SCALE") continue;
      if (env.count(key) != 0) continue;
      envs.push_back(kv);
    }
    for (const auto& [key, value] : env) {
      if (value) envs.push_back(key + "=" + *value);
    }
    std::vector<char*> envp;
    for (auto& e : envs) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<char*> args;
    for (const auto& a : argv_) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setpgroup(&attr, 0);
    // Start with default signal dispositions and nothing blocked, whatever
    // the test runner left us.
    sigset_t all;
    sigfillset(&all);
    sigdelset(&all, SIGKILL);
    sigdelset(&all, SIGSTOP);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF |
                                        POSIX_SPAWN_SETSIGMASK);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, args[0], &actions, &attr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (rc == 0) pid_ = pid;
    started_ = Clock::now();
  }

  ~Proc() {
    if (pid_ > 0 && !reaped_) {
      ::kill(-pid_, SIGKILL);
      ::kill(pid_, SIGKILL);
      ::kill(pid_, SIGCONT);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;

  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0; }

  // The exit code (see ExitCode) once the process exits, or nullopt when
  // `timeout` (scaled) passes first.
  std::optional<int> Wait(milliseconds timeout) {
    if (reaped_) return code_;
    if (pid_ <= 0) return std::nullopt;
    const auto deadline = Clock::now() + Scaled(timeout);
    for (;;) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        ended_ = Clock::now();
        code_ = ExitCode(status);
        return code_;
      }
      if (r < 0) return std::nullopt;
      if (Clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(milliseconds(2));
    }
  }

  // Whether it still runs (reaps it if it has exited).
  bool Running() {
    if (reaped_ || pid_ <= 0) return false;
    return !Wait(milliseconds(0)).has_value();
  }

  void Signal(int signal) {
    if (pid_ > 0 && !reaped_) ::kill(pid_, signal);
  }

  // From the start to the exit (or to now while it runs).
  milliseconds Elapsed() const {
    return std::chrono::duration_cast<milliseconds>((reaped_ ? ended_ : Clock::now()) - started_);
  }

  std::string Stdout() const { return ReadWholeFile(out_path_); }
  std::string Stderr() const { return ReadWholeFile(err_path_); }
  std::string Describe() const {
    return "command: " + Join(argv_) + "\n--- stdout ---\n" + Stdout() + "--- stderr ---\n" +
           Stderr();
  }

 private:
  std::vector<std::string> argv_;
  std::string out_path_;
  std::string err_path_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::optional<int> code_;
  Clock::time_point started_;
  Clock::time_point ended_;
};

// The result of a process run to completion.
struct Ran {
  int code = -1;  // -1: did not exit in time (then it was killed)
  std::string out;
  std::string err;
  milliseconds elapsed{0};
  std::string describe;
};

// ---- JSON (testing/json_reader.h) ----------------------------------------------------

// Store-agnostic tests run once: SIMBA_CLI_STORE_AGNOSTIC is set only in the
// SQLite binary's build of this file.
#if SIMBA_CLI_STORE_AGNOSTIC
TEST(CliJsonReader, ReadsTheDocumentedShape) {
  const std::string doc = R"({"store": "sqlite:///tmp/s.db", "mutexes": [
    {"mutex": "orders", "held": true, "owner": "0:4711@host/9f2c01aa", "fencing_token": 7,
     "acquired_ms_ago": 1200, "ttl_ends_in_ms": 8800, "x": [1.5e3, null, false, "a\"b"]}]})";
  std::string error;
  auto json = ParseJson(doc, &error);
  ASSERT_TRUE(json.has_value()) << error;
  const Json* mutexes = json->Get("mutexes");
  ASSERT_NE(mutexes, nullptr);
  ASSERT_EQ(mutexes->array.size(), 1u);
  EXPECT_EQ(mutexes->array[0].Get("mutex")->string, "orders");
  EXPECT_TRUE(mutexes->array[0].Get("held")->boolean);
  EXPECT_EQ(mutexes->array[0].Get("fencing_token")->Int(), 7);
  EXPECT_FALSE(ParseJson(R"({"a": 1,})", &error).has_value());
  EXPECT_FALSE(ParseJson(R"({"a": 1} x)", &error).has_value());
}
#endif  // store-agnostic tests

// ---- the fixture -------------------------------------------------------------------

std::atomic<int> g_counter{0};

// Processes, files and cleanup; `Cli` tests need no store, `CliE2E` tests
// run on each CliTarget.

class CliBase : public ::testing::Test {
 protected:
  CliBase() : unique_("t" + std::to_string(::getpid()) + "-" + std::to_string(++g_counter)) {}

  void TearDown() override {
    // Children that `simba` put in process groups of their own outlive a
    // SIGKILLed `simba`: kill them (and their groups) by the pids they wrote.
    for (const auto& file : pid_files_) {
      std::istringstream in(ReadWholeFile(Path(file)));
      std::string line;
      while (std::getline(in, line)) {
        std::istringstream words(line);
        long pid = 0;
        if (words >> pid) KillPid(static_cast<pid_t>(pid));
      }
    }
    for (pid_t pid : pids_) KillPid(pid);
  }

  static void KillPid(pid_t pid) {
    if (pid <= 1) return;
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
  }

  const std::string& uri() const { return uri_; }
  std::string Path(const std::string& name) const { return dir_.path() + "/" + name; }
  std::string Mutex(const std::string& base) const { return base + "-" + unique_; }

  // Remember a file of pids (one per line, first word) to kill at the end.
  void TrackPids(const std::string& file) { pid_files_.push_back(file); }
  void TrackPid(pid_t pid) { pids_.push_back(pid); }

  // argv of `simba run` on this test's store, with the short lease.
  std::vector<std::string> RunArgs(const std::string& mutex, const std::vector<std::string>& flags,
                                   const std::vector<std::string>& command) const {
    std::vector<std::string> argv = {kSimba, "run", "--store", uri_, "--mutex", mutex};
    argv.insert(argv.end(), kLeaseFlags.begin(), kLeaseFlags.end());
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back("--");
    argv.insert(argv.end(), command.begin(), command.end());
    return argv;
  }
  std::vector<std::string> ElectArgs(const std::string& mutex,
                                     const std::vector<std::string>& command) const {
    std::vector<std::string> argv = {kSimba, "elect", "--store", uri_, "--mutex", mutex};
    argv.insert(argv.end(), kLeaseFlags.begin(), kLeaseFlags.end());
    argv.push_back("--");
    argv.insert(argv.end(), command.begin(), command.end());
    return argv;
  }

  std::unique_ptr<Proc> Start(const std::vector<std::string>& argv, const Env& env = {}) {
    auto proc = std::make_unique<Proc>(argv, dir_.path(),
                                       Path("proc-" + std::to_string(++procs_)), env);
    EXPECT_TRUE(proc->started()) << "could not start " << Join(argv);
    return proc;
  }

  // Runs to completion (at most `timeout`, scaled; then it is killed).
  Ran Exec(const std::vector<std::string>& argv, const Env& env = {},
           milliseconds timeout = seconds(30)) {
    auto proc = Start(argv, env);
    Ran ran;
    const auto code = proc->Wait(timeout);
    if (!code) {
      ADD_FAILURE() << "did not exit within " << timeout.count() << " ms: " << Join(argv);
      proc.reset();
    } else {
      ran.code = *code;
    }
    if (proc) {
      ran.elapsed = proc->Elapsed();
      ran.out = proc->Stdout();
      ran.err = proc->Stderr();
      ran.describe = proc->Describe();
    }
    return ran;
  }
  Ran Simba(const std::vector<std::string>& args, const Env& env = {},
            milliseconds timeout = seconds(30)) {
    std::vector<std::string> argv = {kSimba};
    argv.insert(argv.end(), args.begin(), args.end());
    return Exec(argv, env, timeout);
  }

  // The file's content once it exists and ends with a newline, or nullopt
  // when `timeout` passes first.
  std::optional<std::string> WaitForFile(const std::string& name, milliseconds timeout) const {
    std::string content;
    const bool ok = Eventually(
        [&] {
          content = ReadWholeFile(Path(name));
          return !content.empty() && content.back() == '\n';
        },
        timeout);
    if (!ok) return std::nullopt;
    return content;
  }
  // The first line of a file, as a number (a pid or a token).
  std::optional<long long> WaitForNumber(const std::string& name, milliseconds timeout) const {
    auto content = WaitForFile(name, timeout);
    if (!content) return std::nullopt;
    try {
      return std::stoll(*content);
    } catch (...) {
      ADD_FAILURE() << name << " holds no number: " << *content;
      return std::nullopt;
    }
  }
  std::string Read(const std::string& name) const { return ReadWholeFile(Path(name)); }
  bool Exists(const std::string& name) const { return FileExists(Path(name)); }

  // A child that records its pid and token, then holds until killed.
  std::vector<std::string> HoldingChild(const std::string& tag) const {
    return {"sh", "-c",
            "echo $SIMBA_FENCING_TOKEN > " + Path(tag + ".token") + "; echo $$ > " +
                Path(tag + ".pid") + "; exec sleep 60"};
  }
  // A child that records its contender id, token and pid and, on SIGTERM, writes
  // `<tag>.marker` and exits with `term_exit`.
  std::vector<std::string> TrappingChild(const std::string& tag, int term_exit = 0) const {
    return {"sh", "-c",
            "trap 'echo terminated > " + Path(tag + ".marker") + "; exit " +
                std::to_string(term_exit) + "' TERM INT HUP; echo $SIMBA_CONTENDER_ID > " +
                Path(tag + ".id") + "; echo $SIMBA_FENCING_TOKEN > " + Path(tag + ".token") +
                "; echo $$ > " + Path(tag + ".pid") +
                "; while :; do sleep 0.1; done"};
  }

  TempDir dir_;
  std::string unique_;
  std::string uri_;
  std::vector<std::string> pid_files_;
  std::vector<pid_t> pids_;
  int procs_ = 0;
};

class Cli : public CliBase {};

class CliE2E : public CliBase, public ::testing::WithParamInterface<CliTarget> {
 protected:
  void SetUp() override { uri_ = GetParam().uri(dir_.path(), unique_); }
};

// The integers in `text`, in order.
std::vector<long long> Integers(const std::string& text) {
  std::vector<long long> out;
  std::string digits;
  for (const char c : text + " ") {
    if (std::isdigit(static_cast<unsigned char>(c)) != 0) {
      digits.push_back(c);
    } else if (!digits.empty()) {
      if (digits.size() < 19) out.push_back(std::stoll(digits));
      digits.clear();
    }
  }
  return out;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

[[maybe_unused]] std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// ---- 1. mutual exclusion across processes -------------------------------------------

TEST_P(CliE2E, ConcurrentRunsSerializeAReadModifyWrite) {
  constexpr int kProcesses = 4;
  constexpr int kRounds = 3;
  const std::string mutex = Mutex("counter");
  {
    std::ofstream(Path("counter")) << "0\n";
  }
  // The critical section: a read-modify-write with a gap, an overlap
  // detector, and the token appended in critical-section order.
  const std::string body =
      "mkdir " + Path("inside") + " 2>/dev/null || echo overlap >> " + Path("violations") +
      "; c=$(cat " + Path("counter") + "); sleep 0.05; echo $((c+1)) > " + Path("counter") +
      "; echo $SIMBA_FENCING_TOKEN >> " + Path("tokens") + "; rmdir " + Path("inside");
  const std::string loop =
      "i=0; while [ $i -lt " + std::to_string(kRounds) +
      " ]; do \"$CLI_BIN\" run --store \"$CLI_URI\" --mutex \"$CLI_MUTEX\" --ttl 1s "
      "--transition 500ms --wait -- sh -c \"$CLI_BODY\" || exit $?; i=$((i+1)); done";
  const Env env = {{"CLI_BIN", kSimba}, {"CLI_URI", uri()}, {"CLI_MUTEX", mutex},
                   {"CLI_BODY", body}};
  std::vector<std::unique_ptr<Proc>> procs;
  for (int p = 0; p < kProcesses; ++p) procs.push_back(Start({"/bin/sh", "-c", loop}, env));
  for (auto& proc : procs) {
    const auto code = proc->Wait(seconds(100));
    ASSERT_TRUE(code.has_value()) << "a contender loop did not finish\n" << proc->Describe();
    EXPECT_EQ(*code, 0) << proc->Describe();
  }
  EXPECT_FALSE(Exists("violations")) << "two critical sections overlapped";
  EXPECT_EQ(Read("counter"), std::to_string(kProcesses * kRounds) + "\n");
  const auto tokens = Lines(Read("tokens"));
  ASSERT_EQ(tokens.size(), static_cast<std::size_t>(kProcesses * kRounds)) << Read("tokens");
  long long last = 0;
  for (const auto& t : tokens) {
    const long long token = std::stoll(t);
    EXPECT_GT(token, last) << "fencing tokens must increase in critical-section order:\n"
                           << Read("tokens");
    last = token;
  }
}

// ---- 2. the child's environment and argv ------------------------------------------------

TEST_P(CliE2E, ChildSeesMutexContenderIdAndToken) {
  const std::string mutex = Mutex("env");
  // Also the `--flag=value` form and --verbose.
  const Ran ran = Exec({kSimba, "run", "--store=" + uri(), "--mutex=" + mutex, "--ttl=1s",
                        "--transition=500ms", "--verbose", "--", "sh", "-c",
                        "printf '%s\\n%s\\n%s\\n' \"$SIMBA_MUTEX\" \"$SIMBA_CONTENDER_ID\" "
                        "\"$SIMBA_FENCING_TOKEN\" > " +
                            Path("env.txt")});
  ASSERT_EQ(ran.code, 0) << ran.describe;
  const std::string content = Read("env.txt");
  std::vector<std::string> lines;
  std::istringstream in(content);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u) << content;
  EXPECT_EQ(lines[0], mutex);
  EXPECT_FALSE(lines[1].empty()) << "SIMBA_CONTENDER_ID is empty";
  ASSERT_FALSE(lines[2].empty()) << "SIMBA_FENCING_TOKEN is empty";
  EXPECT_TRUE(std::all_of(lines[2].begin(), lines[2].end(),
                          [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }))
      << "SIMBA_FENCING_TOKEN is not an integer: " << lines[2];
  EXPECT_GT(std::stoll(lines[2]), 0);
  // --verbose tells the acquisition and its token on stderr.
  EXPECT_NE(ran.err.find(lines[2]), std::string::npos)
      << "--verbose did not show the token\n" << ran.describe;
}

TEST_P(CliE2E, CommandAndArgumentsArePassedAsTheyAre) {
  const Ran ran = Exec(RunArgs(Mutex("argv"), {},
                               {"sh", "-c", "printf '%s|' \"$@\" > " + Path("args.txt"), "sh",
                                "a b", "$HOME", "--mutex", "--", "*"}));
  ASSERT_EQ(ran.code, 0) << ran.describe;
  EXPECT_EQ(Read("args.txt"), "a b|$HOME|--mutex|--|*|");
}

// ---- 3. exit codes -------------------------------------------------------------------

TEST_P(CliE2E, ChildExitStatusPropagates) {
  const Ran seven = Exec(RunArgs(Mutex("exit"), {}, {"sh", "-c", "exit 7"}));
  EXPECT_EQ(seven.code, 7) << seven.describe;
  const Ran zero = Exec(RunArgs(Mutex("exit"), {}, {"true"}));
  EXPECT_EQ(zero.code, 0) << zero.describe;
  const Ran killed = Exec(RunArgs(Mutex("exit"), {}, {"sh", "-c", "kill -KILL $$"}));
  EXPECT_EQ(killed.code, 128 + SIGKILL) << killed.describe;
  const Ran termed = Exec(RunArgs(Mutex("exit"), {}, {"sh", "-c", "kill -TERM $$"}));
  EXPECT_EQ(termed.code, 128 + SIGTERM) << termed.describe;
}

TEST_P(CliE2E, CommandNotFoundOrNotExecutable) {
  const Ran missing = Exec(RunArgs(Mutex("exec"), {}, {"simba-no-such-command-xyz"}));
  EXPECT_EQ(missing.code, 127) << missing.describe;
  const Ran missing_path = Exec(RunArgs(Mutex("exec"), {}, {Path("no-such-file")}));
  EXPECT_EQ(missing_path.code, 127) << missing_path.describe;
  {
    std::ofstream(Path("not-executable")) << "#!/bin/sh\necho ran > " << Path("ran") << "\n";
  }
  ::chmod(Path("not-executable").c_str(), 0644);
  const Ran denied = Exec(RunArgs(Mutex("exec"), {}, {Path("not-executable")}));
  EXPECT_EQ(denied.code, 126) << denied.describe;
  EXPECT_FALSE(Exists("ran"));
  // The mutex was released after each failure.
  const Ran after = Exec(RunArgs(Mutex("exec"), {"--no-wait"}, {"true"}));
  EXPECT_EQ(after.code, 0) << after.describe;
}

TEST_P(CliE2E, NoWaitAndTimeoutGiveUpWhileAnotherHolds) {
  const std::string mutex = Mutex("busy");
  auto holder = Start(RunArgs(mutex, {}, TrappingChild("holder")));
  TrackPids("holder.pid");
  ASSERT_TRUE(WaitForFile("holder.pid", seconds(10))) << holder->Describe();

  const Ran no_wait = Exec(RunArgs(mutex, {"--no-wait"}, {"touch", Path("no-wait-ran")}));
  EXPECT_EQ(no_wait.code, 75) << no_wait.describe;
  EXPECT_LT(no_wait.elapsed, Scaled(seconds(3)));
  EXPECT_FALSE(Exists("no-wait-ran"));

  const Ran timeout = Exec(
      RunArgs(mutex, {"--timeout", "1s", "--verbose"}, {"touch", Path("timeout-ran")}));
  EXPECT_EQ(timeout.code, 75) << timeout.describe;
  // --verbose tells who holds the mutex while waiting.
  std::string holder_id = Read("holder.id");
  ASSERT_FALSE(holder_id.empty());
  holder_id.pop_back();
  EXPECT_NE(timeout.err.find(holder_id), std::string::npos)
      << "--verbose does not show the holder " << holder_id << " while waiting\n"
      << timeout.describe;
  EXPECT_GE(timeout.elapsed, milliseconds(900)) << "--timeout 1s gave up early";
  EXPECT_LT(timeout.elapsed, Scaled(seconds(3))) << "--timeout 1s took too long";
  EXPECT_FALSE(Exists("timeout-ran"));

  EXPECT_TRUE(holder->Running()) << holder->Describe();
  holder->Signal(SIGTERM);
  const auto code = holder->Wait(seconds(10));
  ASSERT_TRUE(code.has_value()) << holder->Describe();
  EXPECT_EQ(*code, 0) << holder->Describe();
}

TEST_P(CliE2E, TimeoutAcquiresWhenTheHolderFinishesInTime) {
  const std::string mutex = Mutex("handoff");
  auto holder = Start(RunArgs(mutex, {}, {"sh", "-c", "echo x > " + Path("held") + "; sleep 1"}));
  ASSERT_TRUE(WaitForFile("held", seconds(10))) << holder->Describe();
  const Ran waiter = Exec(RunArgs(mutex, {"--timeout", "10s"}, {"touch", Path("waiter-ran")}));
  EXPECT_EQ(waiter.code, 0) << waiter.describe;
  EXPECT_TRUE(Exists("waiter-ran"));
  const auto code = holder->Wait(seconds(10));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << holder->Describe();
}

TEST_P(CliE2E, ZeroTimeoutOnAFreeMutexStillTriesOnce) {
  // "--timeout D waits at most D": with D = 0 that is one attempt, and a
  // free mutex is acquired (75 means it was held, or the wait ran out).
  // Rejecting 0 as a malformed value (64) would also keep the contract.
  const Ran ran = Exec(RunArgs(Mutex("zero"), {"--timeout", "0s"}, {"touch", Path("ran")}));
  EXPECT_TRUE(ran.code == 0 || ran.code == 64)
      << "--timeout 0s on a free mutex must acquire (or be refused as a usage error)\n"
      << ran.describe;
  if (ran.code == 0) {
    EXPECT_TRUE(Exists("ran"));
  }
}

TEST_P(CliE2E, UnavailableStoreExits69) {
  const std::string bad = GetParam().unavailable_uri;
  const std::vector<std::vector<std::string>> commands = {
      {"run", "--store", bad, "--mutex", "m", "--no-wait", "--", "touch", Path("ran")},
      {"run", "--store", bad, "--mutex", "m", "--", "touch", Path("ran")},
      {"elect", "--store", bad, "--mutex", "m", "--", "touch", Path("ran")},
      {"status", "--store", bad},
      {"status", "--store", bad, "m", "--json"},
      {"release", "--store", bad, "--mutex", "m", "--force"},
  };
  for (const auto& args : commands) {
    const Ran ran = Simba(args);
    EXPECT_EQ(ran.code, 69) << ran.describe;
    EXPECT_NE(ran.err.find(bad), std::string::npos)
        << "the error does not name the URI at fault\n" << ran.describe;
  }
  EXPECT_FALSE(Exists("ran"));
}

TEST_P(CliE2E, StoreFromTheEnvironment) {
  const std::string mutex = Mutex("env-store");
  const Ran run = Exec({kSimba, "run", "--mutex", mutex, "--ttl", "1s", "--transition", "500ms",
                        "--", "sh", "-c", "echo $SIMBA_FENCING_TOKEN > " + Path("token")},
                       {{"SIMBA_STORE", uri()}});
  EXPECT_EQ(run.code, 0) << run.describe;
  EXPECT_TRUE(WaitForNumber("token", seconds(1)).has_value());
  const Ran status = Simba({"status", mutex}, {{"SIMBA_STORE", uri()}});
  EXPECT_EQ(status.code, 0) << status.describe;
  EXPECT_NE(status.out.find(mutex), std::string::npos) << status.describe;
  // --store wins over SIMBA_STORE.
  const Ran both = Simba({"status", "--store", uri(), mutex},
                         {{"SIMBA_STORE", GetParam().unavailable_uri}});
  EXPECT_EQ(both.code, 0) << both.describe;
  // Neither: a usage error naming the missing store.
  const Ran neither = Simba({"run", "--mutex", mutex, "--", "touch", Path("ran")});
  EXPECT_EQ(neither.code, 64) << neither.describe;
  EXPECT_TRUE(neither.err.find("--store") != std::string::npos ||
              neither.err.find("SIMBA_STORE") != std::string::npos)
      << neither.describe;
  EXPECT_FALSE(Exists("ran"));
}

// Usage errors: 64, the message names the flag (or command) at fault, and
// nothing runs.
TEST_P(CliE2E, UsageErrorsExit64NamingTheFlag) {
  const std::string u = uri();
  const std::vector<std::string> cmd = {"--", "touch", Path("ran")};
  auto run = [&](std::vector<std::string> flags, bool with_command = true) {
    std::vector<std::string> args = {"run", "--store", u};
    args.insert(args.end(), flags.begin(), flags.end());
    if (with_command) args.insert(args.end(), cmd.begin(), cmd.end());
    return args;
  };
  struct Case {
    std::vector<std::string> args;
    std::string named;  // must appear in stderr ("" : any message)
  };
  const std::vector<Case> cases = {
      {run({"--mutex", "m", "--bogus"}), "--bogus"},
      {run({"--mutex", "m", "--bogus=1"}), "--bogus"},
      {run({}), "--mutex"},
      {run({"--mutex", ""}), "--mutex"},
      {run({"--mutex", std::string(1000, 'x')}), "--mutex"},
      {run({"--mutex", "m", "--ttl", "10"}), "--ttl"},
      {run({"--mutex", "m", "--ttl", "abc"}), "--ttl"},
      {run({"--mutex", "m", "--ttl=abc"}), "--ttl"},
      {run({"--mutex", "m", "--ttl", "0s"}), "--ttl"},
      {run({"--mutex", "m", "--ttl", "-1s"}), "--ttl"},
      {run({"--mutex", "m", "--transition", "5"}), "--transition"},
      {run({"--mutex", "m", "--timeout", "soon"}), "--timeout"},
      {run({"--mutex", "m", "--kill-after", "3"}), "--kill-after"},
      {run({"--mutex", "m", "--ttl"}, false), "--ttl"},
      {run({"--mutex"}, false), "--mutex"},
      {run({"--mutex", "m"}, false), ""},
      {{"run", "--store", u, "--mutex", "m", "--"}, ""},
      {{"frobnicate", "--store", u}, "frobnicate"},
      {{}, ""},
      {{"elect", "--store", u, "--mutex", "m"}, ""},
      {{"elect", "--store", u, "--mutex", "m", "--no-wait", "--", "touch", Path("ran")},
       "--no-wait"},
      {{"elect", "--store", u, "--", "touch", Path("ran")}, "--mutex"},
      {{"status", "--store", u, "--bogus"}, "--bogus"},
      {{"release", "--store", u, "--force"}, "--mutex"},
      {{"release", "--store", u, "--mutex", "m"}, "--force"},
  };
  for (const auto& c : cases) {
    const Ran ran = Simba(c.args);
    EXPECT_EQ(ran.code, 64) << ran.describe;
    EXPECT_FALSE(ran.err.empty()) << "no message on stderr\n" << ran.describe;
    if (!c.named.empty()) {
      EXPECT_NE(ran.err.find(c.named), std::string::npos)
          << "the message does not name " << c.named << "\n" << ran.describe;
    }
  }
  EXPECT_FALSE(Exists("ran")) << "a command ran despite a usage error";
}

// ---- 4. a killed holder -----------------------------------------------------------------

TEST_P(CliE2E, KilledHolderIsReplacedWithinTheLease) {
  const std::string mutex = Mutex("killed");
  auto holder = Start(RunArgs(mutex, {}, HoldingChild("holder")));
  TrackPids("holder.pid");
  ASSERT_TRUE(WaitForFile("holder.pid", seconds(10))) << holder->Describe();
  const auto holder_token = WaitForNumber("holder.token", seconds(1));
  ASSERT_TRUE(holder_token.has_value());

  auto waiter = Start(RunArgs(mutex, {"--wait"},
                              {"sh", "-c", "echo $SIMBA_FENCING_TOKEN > " + Path("waiter.token")}));
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_FALSE(Exists("waiter.token")) << "the waiter ran while the holder held the mutex";

  const auto job = WaitForNumber("holder.pid", seconds(1));
  ASSERT_TRUE(job.has_value());
  holder->Signal(SIGKILL);
  ASSERT_TRUE(holder->Wait(seconds(5)).has_value());
  const auto killed = Clock::now();
  // The job dies with simba (its reaper kills the job's group), long before
  // the lease could pass to the waiter: no job runs on without its lease.
  EXPECT_TRUE(Eventually([&] { return !Alive(static_cast<pid_t>(*job)); }, seconds(2)))
      << "simba run was SIGKILLed but its job runs on";
  const auto waiter_token = WaitForNumber("waiter.token", kFailoverBound);
  ASSERT_TRUE(waiter_token.has_value())
      << "the waiter did not take over within ttl + transition + 1.5 s\n" << waiter->Describe();
  RecordProperty("failover_ms",
                 std::to_string(std::chrono::duration_cast<milliseconds>(Clock::now() - killed)
                                    .count()));
  EXPECT_GT(*waiter_token, *holder_token);
  const auto code = waiter->Wait(seconds(10));
  ASSERT_TRUE(code.has_value()) << waiter->Describe();
  EXPECT_EQ(*code, 0) << waiter->Describe();
}

TEST_P(CliE2E, StatusShowsAnExpiredLeaseAsFree) {
  const std::string mutex = Mutex("expired");
  auto holder = Start(RunArgs(mutex, {}, HoldingChild("holder")));
  TrackPids("holder.pid");
  ASSERT_TRUE(WaitForFile("holder.pid", seconds(10))) << holder->Describe();
  holder->Signal(SIGKILL);
  ASSERT_TRUE(holder->Wait(seconds(5)).has_value());
  bool free = false;
  std::string last;
  const auto deadline = Clock::now() + Scaled(kTtl + kTransition + seconds(2));
  while (!free && Clock::now() < deadline) {
    const Ran status = Simba({"status", "--store", uri(), mutex, "--json"});
    ASSERT_EQ(status.code, 0) << status.describe;
    last = status.out;
    free = status.out.find("\"held\":false") != std::string::npos ||
           status.out.find("\"held\": false") != std::string::npos;
    if (!free) std::this_thread::sleep_for(milliseconds(200));
  }
  EXPECT_TRUE(free) << "a lease that ended without a release does not show as free:\n" << last;
}

// ---- 5. a paused holder -------------------------------------------------------------------

TEST_P(CliE2E, PausedHolderStopsItsChildAndExits76) {
  const std::string mutex = Mutex("paused");
  auto holder = Start(RunArgs(mutex, {}, TrappingChild("holder")));
  TrackPids("holder.pid");
  ASSERT_TRUE(WaitForFile("holder.pid", seconds(10))) << holder->Describe();
  const auto holder_token = WaitForNumber("holder.token", seconds(1));
  ASSERT_TRUE(holder_token.has_value());

  // The classic GC pause: `simba` stops, its child keeps running.
  holder->Signal(SIGSTOP);
  const auto paused = Clock::now();
  auto other = Start(RunArgs(mutex, {"--wait"}, TrappingChild("other")));
  TrackPids("other.pid");
  const auto other_token = WaitForNumber("other.token", kFailoverBound + seconds(1));
  ASSERT_TRUE(other_token.has_value())
      << "nobody acquired while the holder was paused\n" << other->Describe();
  EXPECT_GT(*other_token, *holder_token);
  // Paused past the whole lease.
  std::this_thread::sleep_until(paused + kTtl + kTransition + seconds(1));
  EXPECT_FALSE(Exists("holder.marker")) << "the child was stopped while simba was paused";

  holder->Signal(SIGCONT);
  EXPECT_TRUE(WaitForFile("holder.marker", seconds(3)))
      << "the paused holder's child did not get SIGTERM after SIGCONT\n" << holder->Describe();
  const auto code = holder->Wait(seconds(5));
  ASSERT_TRUE(code.has_value()) << "the paused holder did not exit\n" << holder->Describe();
  EXPECT_EQ(*code, 76) << holder->Describe();

  // The other holder was not disturbed, and ends normally.
  EXPECT_TRUE(other->Running()) << other->Describe();
  EXPECT_FALSE(Exists("other.marker"));
  other->Signal(SIGTERM);
  const auto other_code = other->Wait(seconds(10));
  ASSERT_TRUE(other_code.has_value()) << other->Describe();
  EXPECT_EQ(*other_code, 0) << other->Describe();
}

// ---- 6. signals -------------------------------------------------------------------------

TEST_P(CliE2E, SignalsAreForwardedAndTheMutexReleased) {
  const std::string mutex = Mutex("signals");
  for (const int sig : {SIGTERM, SIGINT, SIGHUP}) {
    SCOPED_TRACE(strsignal(sig));
    const std::string tag = "child" + std::to_string(sig);
    auto holder = Start(RunArgs(mutex, {}, TrappingChild(tag, 3)));
    TrackPids(tag + ".pid");
    ASSERT_TRUE(WaitForFile(tag + ".pid", seconds(10))) << holder->Describe();
    holder->Signal(sig);
    EXPECT_TRUE(WaitForFile(tag + ".marker", seconds(3)))
        << "the signal was not passed on to the child\n" << holder->Describe();
    const auto code = holder->Wait(seconds(5));
    ASSERT_TRUE(code.has_value()) << holder->Describe();
    EXPECT_EQ(*code, 3) << "simba must exit with the child's status\n" << holder->Describe();
    // Released: a --no-wait run acquires at once.
    const Ran next = Exec(RunArgs(mutex, {"--no-wait"}, {"true"}));
    EXPECT_EQ(next.code, 0) << "the mutex was not released\n" << next.describe;
  }
}

TEST_P(CliE2E, LeaseLossEscalatesToSigkillAfterKillAfter) {
  const std::string mutex = Mutex("stubborn");
  // A child that ignores SIGTERM.
  auto holder = Start(RunArgs(mutex, {"--kill-after", "1s"},
                              {"sh", "-c",
                               "trap '' TERM; echo $SIMBA_FENCING_TOKEN > " + Path("holder.token") +
                                   "; echo $$ > " + Path("holder.pid") +
                                   "; while :; do sleep 0.1; done"}));
  TrackPids("holder.pid");
  const auto child = WaitForNumber("holder.pid", seconds(10));
  ASSERT_TRUE(child.has_value()) << holder->Describe();
  const Ran release = Simba({"release", "--store", uri(), "--mutex", mutex, "--force"});
  ASSERT_EQ(release.code, 0) << release.describe;
  const auto code = holder->Wait(kTtl + seconds(1) + seconds(3));
  ASSERT_TRUE(code.has_value()) << "simba did not give up a child that ignores SIGTERM\n"
                                << holder->Describe();
  EXPECT_EQ(*code, 76) << holder->Describe();
  EXPECT_TRUE(Eventually([&] { return !Alive(static_cast<pid_t>(*child)); }, seconds(2)))
      << "the child survived";
}

// ---- 6b. lock events on stderr (--verbose, --log-format json) --------------------------

// Every stderr line of `err` as a JSON object (failing the test for a line
// that is not one).
std::vector<Json> JsonLines(const std::string& err) {
  std::vector<Json> out;
  for (const auto& line : Lines(err)) {
    std::string error;
    auto parsed = ParseJson(line, &error);
    if (!parsed || parsed->type != Json::Type::kObject) {
      ADD_FAILURE() << "not a JSON object: " << line << " (" << error << ")";
      continue;
    }
    out.push_back(*parsed);
  }
  return out;
}

std::string Field(const Json& object, const std::string& key) {
  const Json* value = object.Get(key);
  if (value == nullptr) return "";
  return value->type == Json::Type::kString ? value->string : value->number;
}

TEST_P(CliE2E, JsonLogsCarryEveryLockEventOfAHold) {
  const std::string mutex = Mutex("json-events");
  // Held for 2.5 renewals of the 1 s ttl; a transition of 2 s so that a
  // loaded CI machine does not turn this test of logging into a lost lease.
  const Ran ran = Exec({kSimba, "run", "--store", uri(), "--mutex", mutex, "--ttl", "1s",
                        "--transition", "2s", "--verbose", "--log-format", "json", "--", "sh",
                        "-c", "echo $SIMBA_FENCING_TOKEN > " + Path("token") + "; sleep 2.5"});
  ASSERT_EQ(ran.code, 0) << ran.describe;
  const auto token = WaitForNumber("token", seconds(1));
  ASSERT_TRUE(token.has_value());
  std::vector<std::string> kinds;
  for (const Json& line : JsonLines(ran.err)) {
    ASSERT_NE(line.Get("time"), nullptr) << ran.describe;
    const std::string kind = Field(line, "event");
    if (kind == "info") continue;  // --verbose's own reports
    kinds.push_back(kind);
    EXPECT_EQ(Field(line, "mutex"), mutex);
    EXPECT_EQ(Field(line, "token"), std::to_string(*token)) << ran.describe;
    EXPECT_FALSE(Field(line, "contender").empty());
    EXPECT_EQ(Field(line, "store") + ":", uri().substr(0, Field(line, "store").size() + 1));
    if (kind == "acquired") {
      EXPECT_NE(line.Get("waited_ms"), nullptr) << ran.describe;
    }
    if (kind == "renewed") {
      EXPECT_NE(line.Get("margin_ms"), nullptr) << ran.describe;
    }
  }
  ASSERT_GE(kinds.size(), 3u) << ran.describe;
  EXPECT_EQ(kinds.front(), "acquired") << ran.describe;
  EXPECT_EQ(kinds.back(), "released") << ran.describe;
  EXPECT_GE(std::count(kinds.begin(), kinds.end(), "renewed"), 1) << ran.describe;
}

TEST_P(CliE2E, JsonLogsTellALossAndItsCauseEvenWithoutVerbose) {
  const std::string mutex = Mutex("json-loss");
  // (The child's own stderr, which it shares with simba, stays quiet.)
  std::vector<std::string> child = TrappingChild("holder");
  child.back() = "exec 2>/dev/null; " + child.back();
  auto holder = Start(RunArgs(mutex, {"--log-format", "json"}, child));
  TrackPids("holder.pid");
  ASSERT_TRUE(WaitForNumber("holder.pid", seconds(10)).has_value()) << holder->Describe();
  const Ran release = Simba({"release", "--store", uri(), "--mutex", mutex, "--force"});
  ASSERT_EQ(release.code, 0) << release.describe;
  const auto code = holder->Wait(kTtl + seconds(1) + seconds(3));
  ASSERT_TRUE(code.has_value()) << holder->Describe();
  EXPECT_EQ(*code, 76) << holder->Describe();
  bool lost = false;
  bool said_why = false;
  for (const Json& line : JsonLines(holder->Stderr())) {
    const std::string kind = Field(line, "event");
    EXPECT_NE(kind, "acquired") << "acquisitions are --verbose only";
    if (kind == "lost") {
      lost = true;
      const std::string cause = Field(line, "cause");
      // Stores that push the loss can tell it was forced; the others learn
      // at the next renewal that the store has somebody else (or nobody).
      EXPECT_TRUE(cause == "forced_release" || cause == "other_owner") << cause;
    }
    if (kind == "error" && Field(line, "message").find("lost the lease") != std::string::npos) {
      said_why = true;
    }
  }
  EXPECT_TRUE(lost) << holder->Describe();
  EXPECT_TRUE(said_why) << holder->Describe();
}

// ---- 7. simba elect ----------------------------------------------------------------------

struct Leader {
  pid_t pid;
  pid_t parent;
  long long token;
};

std::vector<Leader> ParseLeaders(const std::string& text) {
  std::vector<Leader> out;
  for (const auto& line : Lines(text)) {
    std::istringstream in(line);
    long pid = 0;
    long parent = 0;
    long long token = 0;
    if (in >> pid >> parent >> token) {
      out.push_back({static_cast<pid_t>(pid), static_cast<pid_t>(parent), token});
    }
  }
  return out;
}

TEST_P(CliE2E, ElectRunsOneLeaderAndFailsOver) {
  const std::string mutex = Mutex("elect");
  const std::vector<std::string> child = {
      "sh", "-c",
      "echo \"$$ $PPID $SIMBA_FENCING_TOKEN\" >> " + Path("leaders") + "; trap 'echo $$ >> " +
          Path("stopped") + "; exit 0' TERM; while :; do sleep 0.1; done"};
  TrackPids("leaders");
  auto a = Start(ElectArgs(mutex, child));
  auto b = Start(ElectArgs(mutex, child));
  ASSERT_TRUE(WaitForFile("leaders", seconds(10))) << a->Describe() << b->Describe();
  // Exactly one leader, for longer than a whole lease.
  std::this_thread::sleep_for(kTtl + kTransition + milliseconds(500));
  auto leaders = ParseLeaders(Read("leaders"));
  ASSERT_EQ(leaders.size(), 1u) << Read("leaders");
  Proc* leader = leaders[0].parent == a->pid() ? a.get() : b.get();
  Proc* follower = leader == a.get() ? b.get() : a.get();
  ASSERT_EQ(leaders[0].parent, leader->pid())
      << "the leader's child is not a child of either simba elect";
  EXPECT_TRUE(Alive(leaders[0].pid));

  // Kill the leader: its child dies with it (simba's reaper), long before
  // the lease could pass to the other elect.
  leader->Signal(SIGKILL);
  ASSERT_TRUE(leader->Wait(seconds(5)).has_value());
  const auto killed = Clock::now();
  EXPECT_TRUE(Eventually([&] { return !Alive(leaders[0].pid); }, seconds(2)))
      << "simba elect was SIGKILLed but its child runs on";
  KillPid(leaders[0].pid);  // (only if the check above failed)
  ASSERT_TRUE(Eventually([&] { return ParseLeaders(Read("leaders")).size() >= 2; },
                         kFailoverBound))
      << "the other elect did not take over within ttl + transition + 1.5 s\n"
      << follower->Describe();
  RecordProperty("failover_ms",
                 std::to_string(std::chrono::duration_cast<milliseconds>(Clock::now() - killed)
                                    .count()));
  leaders = ParseLeaders(Read("leaders"));
  ASSERT_EQ(leaders.size(), 2u) << Read("leaders");
  EXPECT_EQ(leaders[1].parent, follower->pid());
  EXPECT_GT(leaders[1].token, leaders[0].token);

  // A third process that only waits: SIGTERM ends it with 0 without a child.
  auto waiting = Start(ElectArgs(mutex, child));
  std::this_thread::sleep_for(milliseconds(700));
  waiting->Signal(SIGTERM);
  const auto waiting_code = waiting->Wait(seconds(5));
  ASSERT_TRUE(waiting_code.has_value()) << waiting->Describe();
  EXPECT_EQ(*waiting_code, 0) << waiting->Describe();
  EXPECT_EQ(ParseLeaders(Read("leaders")).size(), 2u) << Read("leaders");

  // SIGTERM to the leader stops its child and exits 0.
  follower->Signal(SIGTERM);
  const auto code = follower->Wait(seconds(10));
  ASSERT_TRUE(code.has_value()) << follower->Describe();
  EXPECT_EQ(*code, 0) << follower->Describe();
  EXPECT_NE(Read("stopped").find(std::to_string(leaders[1].pid)), std::string::npos)
      << "the leader's child was not sent SIGTERM";
  EXPECT_FALSE(Alive(leaders[1].pid));
  // Leadership was released: a run gets the mutex at once.
  const Ran next = Exec(RunArgs(mutex, {"--no-wait"}, {"true"}));
  EXPECT_EQ(next.code, 0) << next.describe;
}

TEST_P(CliE2E, ElectLeaderThatLosesLeadershipStopsItsChildAndRejoins) {
  const std::string mutex = Mutex("elect-pause");
  const std::vector<std::string> child = {
      "sh", "-c",
      "echo \"$$ $PPID $SIMBA_FENCING_TOKEN\" >> " + Path("leaders") + "; trap 'echo $$ >> " +
          Path("stopped") + "; exit 0' TERM; while :; do sleep 0.1; done"};
  TrackPids("leaders");
  auto first = Start(ElectArgs(mutex, child));
  ASSERT_TRUE(WaitForFile("leaders", seconds(10))) << first->Describe();
  auto second = Start(ElectArgs(mutex, child));
  std::this_thread::sleep_for(milliseconds(300));
  ASSERT_EQ(ParseLeaders(Read("leaders")).size(), 1u) << Read("leaders");
  ASSERT_EQ(ParseLeaders(Read("leaders"))[0].parent, first->pid());

  // The leader pauses past its lease; the other one takes over.
  first->Signal(SIGSTOP);
  const auto paused = Clock::now();
  ASSERT_TRUE(Eventually([&] { return ParseLeaders(Read("leaders")).size() >= 2; },
                         kFailoverBound + seconds(1)))
      << "nobody took over from the paused leader\n" << second->Describe();
  std::this_thread::sleep_until(paused + kTtl + kTransition + seconds(1));
  auto leaders = ParseLeaders(Read("leaders"));
  ASSERT_EQ(leaders.size(), 2u) << Read("leaders");
  EXPECT_EQ(leaders[1].parent, second->pid());
  EXPECT_GT(leaders[1].token, leaders[0].token);

  // Resumed, the old leader stops its child and stays in the election.
  first->Signal(SIGCONT);
  EXPECT_TRUE(Eventually(
      [&] { return Read("stopped").find(std::to_string(leaders[0].pid)) != std::string::npos; },
      seconds(3)))
      << "the old leader's child was not stopped when leadership was lost\n"
      << first->Describe();
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_TRUE(first->Running()) << "simba elect must wait to be elected again\n"
                                << first->Describe();
  EXPECT_EQ(ParseLeaders(Read("leaders")).size(), 2u) << "two leaders at once\n"
                                                       << Read("leaders");

  // When the new leader leaves, the old one leads again with a new token.
  second->Signal(SIGTERM);
  const auto second_code = second->Wait(seconds(10));
  ASSERT_TRUE(second_code.has_value()) << second->Describe();
  EXPECT_EQ(*second_code, 0) << second->Describe();
  ASSERT_TRUE(Eventually([&] { return ParseLeaders(Read("leaders")).size() >= 3; },
                         kFailoverBound))
      << "the old leader was not elected again\n" << first->Describe();
  leaders = ParseLeaders(Read("leaders"));
  ASSERT_EQ(leaders.size(), 3u) << Read("leaders");
  EXPECT_EQ(leaders[2].parent, first->pid());
  EXPECT_GT(leaders[2].token, leaders[1].token);
  first->Signal(SIGTERM);
  const auto first_code = first->Wait(seconds(10));
  ASSERT_TRUE(first_code.has_value()) << first->Describe();
  EXPECT_EQ(*first_code, 0) << first->Describe();
}

TEST_P(CliE2E, ElectExitsWithTheChildsStatusAndHandsOver) {
  const std::string mutex = Mutex("elect-exit");
  const std::vector<std::string> child = {
      "sh", "-c",
      "echo \"$$ $PPID $SIMBA_FENCING_TOKEN\" >> " + Path("leaders") + "; sleep 0.5; exit 5"};
  auto a = Start(ElectArgs(mutex, child));
  auto b = Start(ElectArgs(mutex, child));
  const auto code_a = a->Wait(seconds(20));
  const auto code_b = b->Wait(seconds(20));
  ASSERT_TRUE(code_a.has_value()) << a->Describe();
  ASSERT_TRUE(code_b.has_value()) << b->Describe();
  EXPECT_EQ(*code_a, 5) << a->Describe();
  EXPECT_EQ(*code_b, 5) << b->Describe();
  const auto leaders = ParseLeaders(Read("leaders"));
  ASSERT_EQ(leaders.size(), 2u) << Read("leaders");
  EXPECT_NE(leaders[0].parent, leaders[1].parent);
  EXPECT_GT(leaders[1].token, leaders[0].token);
}

// docs/cli.md, `simba elect`: "SIGINT/SIGTERM/SIGHUP stop CMD (if running),
// release leadership and exit with code 0 (137 if CMD ignored SIGTERM and had
// to be killed after --kill-after)", and when leadership is lost "it stops
// CMD (SIGTERM, then SIGKILL after --kill-after) and waits to be elected
// again".
TEST_P(CliE2E, ElectKillAfterSigkillsAChildThatIgnoresSigterm) {
  const std::string mutex = Mutex("elect-stubborn");
  // 2 s: long enough that a SIGKILL sent at once (--kill-after ignored) ends
  // the child far sooner than the lower bounds below, short enough to wait.
  constexpr milliseconds kKillAfter{2000};
  std::vector<std::string> argv = {kSimba, "elect", "--store", uri(), "--mutex", mutex,
                                   "--kill-after", "2s"};
  argv.insert(argv.end(), kLeaseFlags.begin(), kLeaseFlags.end());
  argv.push_back("--");
  // The child records its token and pid (a line per start) and, on SIGTERM,
  // a line in child.terms, but runs on: only SIGKILL ends it. (Its `sleep`
  // gets the SIGTERM too and ends; the loop goes on.)
  const std::vector<std::string> child = {
      "sh", "-c",
      "trap 'echo term >> " + Path("child.terms") + "' TERM; echo $SIMBA_FENCING_TOKEN >> " +
          Path("child.tokens") + "; echo $$ >> " + Path("child.pids") +
          "; while :; do sleep 0.1; done"};
  argv.insert(argv.end(), child.begin(), child.end());
  auto elect = Start(argv);
  TrackPids("child.pids");
  const auto first = WaitForNumber("child.pids", seconds(10));
  ASSERT_TRUE(first.has_value()) << elect->Describe();

  // 1. Leadership lost (an operator's forced release): SIGTERM, ignored, then
  // SIGKILL no sooner than --kill-after after the release began (the loss
  // cannot be seen before it, and SIGKILL follows the SIGTERM by
  // --kill-after), and simba elect stays in the election.
  const auto release_began = Clock::now();
  const Ran release = Simba({"release", "--store", uri(), "--mutex", mutex, "--force"});
  ASSERT_EQ(release.code, 0) << release.describe;
  // Bound: the loss is seen within a renewal (ttl; MySQL learns it there),
  // then --kill-after, plus 3 s for a loaded machine.
  ASSERT_TRUE(Eventually([&] { return !Alive(static_cast<pid_t>(*first)); },
                         kTtl + kKillAfter + seconds(3)))
      << "the child that ignores SIGTERM survived the loss of leadership\n" << elect->Describe();
  const auto first_died = Clock::now();
  EXPECT_GE(first_died - release_began, kKillAfter)
      << "the child was killed before --kill-after passed\n" << elect->Describe();
  // (SIGTERM goes to the group and to the child: sh may run its trap twice.)
  const std::size_t terms = Lines(Read("child.terms")).size();
  EXPECT_GE(terms, 1u) << "the child did not get SIGTERM before SIGKILL\n" << elect->Describe();
  EXPECT_NE(elect->Stderr().find("lost leadership"), std::string::npos) << elect->Describe();

  // Still in the election: it leads again (the mutex is free) with a new token.
  ASSERT_TRUE(Eventually([&] { return Lines(Read("child.pids")).size() >= 2; }, kFailoverBound))
      << "simba elect did not lead again after the lost leadership\n" << elect->Describe();
  ASSERT_TRUE(elect->Running()) << elect->Describe();
  ASSERT_TRUE(Eventually([&] { return Lines(Read("child.tokens")).size() >= 2; }, seconds(2)));
  const std::vector<std::string> tokens = Lines(Read("child.tokens"));
  EXPECT_GT(std::stoll(tokens[1]), std::stoll(tokens[0])) << Read("child.tokens");
  const pid_t second = static_cast<pid_t>(std::stol(Lines(Read("child.pids"))[1]));
  ASSERT_TRUE(Alive(second));

  // 2. simba elect stopped: SIGTERM to the child, SIGKILL after --kill-after,
  // exit 137 (the signal reaches simba after it is sent: the lower bound holds).
  const auto signalled = Clock::now();
  elect->Signal(SIGTERM);
  const auto code = elect->Wait(kKillAfter + seconds(5));
  ASSERT_TRUE(code.has_value()) << "simba elect did not exit\n" << elect->Describe();
  EXPECT_EQ(*code, 128 + SIGKILL) << elect->Describe();
  EXPECT_GE(Clock::now() - signalled, kKillAfter)
      << "simba elect killed its child before --kill-after passed\n" << elect->Describe();
  EXPECT_FALSE(Alive(second)) << "the child survived simba elect";
  EXPECT_GT(Lines(Read("child.terms")).size(), terms)
      << "the second child did not get SIGTERM before SIGKILL\n" << elect->Describe();
  // Leadership was released on the way out.
  const Ran next = Exec(RunArgs(mutex, {"--no-wait"}, {"true"}));
  EXPECT_EQ(next.code, 0) << next.describe;
}

// docs/cli.md's exit codes as they apply to `simba elect`: the child's status
// (128 + N when a signal N ended it), 0 when stopped by SIGINT, SIGTERM or
// SIGHUP whatever the child's status then, 126/127 when the command cannot
// run. Each time leadership is given up.
TEST_P(CliE2E, ElectExitCodes) {
  const std::string mutex = Mutex("elect-codes");
  auto expect_released = [&](const std::string& what) {
    const Ran next = Exec(RunArgs(mutex, {"--no-wait"}, {"true"}));
    EXPECT_EQ(next.code, 0) << "leadership not released after " << what << "\n" << next.describe;
  };
  // Stopped by a signal: 0, although the child exits 3 on it.
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    SCOPED_TRACE(strsignal(sig));
    const std::string tag = "stopped" + std::to_string(sig);
    auto elect = Start(ElectArgs(mutex, TrappingChild(tag, 3)));
    TrackPids(tag + ".pid");
    ASSERT_TRUE(WaitForFile(tag + ".pid", seconds(10))) << elect->Describe();
    elect->Signal(sig);
    const auto code = elect->Wait(seconds(10));
    ASSERT_TRUE(code.has_value()) << elect->Describe();
    EXPECT_EQ(*code, 0) << elect->Describe();
    EXPECT_TRUE(Exists(tag + ".marker")) << "the child was not stopped with SIGTERM";
    expect_released(strsignal(sig));
  }
  // The child killed by a signal: 128 + N.
  {
    const Ran ran = Exec(ElectArgs(mutex, {"sh", "-c", "kill -USR1 $$"}));
    EXPECT_EQ(ran.code, 128 + SIGUSR1) << ran.describe;
    expect_released("a child killed by SIGUSR1");
  }
  // The command cannot be run.
  {
    const Ran ran = Exec(ElectArgs(mutex, {Path("no-such-command")}));
    EXPECT_EQ(ran.code, 127) << ran.describe;
    EXPECT_NE(ran.err.find("no-such-command"), std::string::npos) << ran.describe;
    expect_released("a command not found");
  }
  {
    std::ofstream(Path("not-executable")) << "#!/bin/sh\ntrue\n";
    ::chmod(Path("not-executable").c_str(), 0644);
    const Ran ran = Exec(ElectArgs(mutex, {Path("not-executable")}));
    EXPECT_EQ(ran.code, 126) << ran.describe;
    expect_released("a command that cannot be executed");
  }
}

// ---- 8. simba status ---------------------------------------------------------------------

std::optional<Json> ParseStatus(const Ran& ran) {
  std::string error;
  auto json = ParseJson(ran.out, &error);
  EXPECT_TRUE(json.has_value()) << error << "\n" << ran.describe;
  return json;
}

const Json* FindMutex(const Json& doc, const std::string& name) {
  const Json* mutexes = doc.Get("mutexes");
  if (mutexes == nullptr || mutexes->type != Json::Type::kArray) return nullptr;
  for (const auto& m : mutexes->array) {
    const Json* n = m.Get("mutex");
    if (n != nullptr && n->string == name) return &m;
  }
  return nullptr;
}

TEST_P(CliE2E, StatusShowsOwnersTokensAndLeases) {
  const std::string held = Mutex("held");
  const std::string free = Mutex("free");
  // `free` has a record (it was used) but nobody holds it.
  const Ran used = Exec(RunArgs(free, {}, {"true"}));
  ASSERT_EQ(used.code, 0) << used.describe;
  auto holder = Start(RunArgs(held, {},
                              {"sh", "-c",
                               "echo $SIMBA_CONTENDER_ID > " + Path("holder.id") +
                                   "; echo $SIMBA_FENCING_TOKEN > " + Path("holder.token") +
                                   "; echo $$ > " + Path("holder.pid") + "; exec sleep 60"}));
  TrackPids("holder.pid");
  ASSERT_TRUE(WaitForFile("holder.pid", seconds(10))) << holder->Describe();
  const auto token = WaitForNumber("holder.token", seconds(1));
  ASSERT_TRUE(token.has_value());
  std::string owner = Read("holder.id");
  ASSERT_FALSE(owner.empty());
  owner.pop_back();

  // The table: every mutex, with the holder's id.
  const Ran all = Simba({"status", "--store", uri()});
  ASSERT_EQ(all.code, 0) << all.describe;
  EXPECT_NE(all.out.find(held), std::string::npos) << all.describe;
  EXPECT_NE(all.out.find(owner), std::string::npos) << all.describe;
  EXPECT_NE(all.out.find(free), std::string::npos) << all.describe;
  EXPECT_NE(all.out.find(std::to_string(*token)), std::string::npos)
      << "the table does not show the fencing token\n" << all.describe;
  // Columns line up whatever the token's length (Redis's have 16 digits),
  // and a free mutex shows no token.
  {
    std::istringstream lines(all.out);
    std::string header, line, held_line, free_line;
    std::getline(lines, header);
    while (std::getline(lines, line)) {
      if (line.rfind(held + " ", 0) == 0) held_line = line;
      if (line.rfind(free + " ", 0) == 0) free_line = line;
    }
    const std::size_t token_at = header.find("TOKEN");
    const std::size_t acquired_at = header.find("ACQUIRED");
    ASSERT_NE(token_at, std::string::npos) << all.describe;
    ASSERT_NE(acquired_at, std::string::npos) << all.describe;
    // (Compared in place: a short token like "1" also occurs in the names.)
    const std::string token_cell = std::to_string(*token) + " ";
    EXPECT_EQ(held_line.compare(token_at, token_cell.size(), token_cell), 0) << all.describe;
    EXPECT_EQ(held_line[token_at - 1], ' ') << all.describe;
    // "<n>s ago" starts right under ACQUIRED.
    ASSERT_GT(held_line.size(), acquired_at) << all.describe;
    EXPECT_EQ(held_line[acquired_at - 1], ' ') << all.describe;
    EXPECT_NE(held_line[acquired_at], ' ') << all.describe;
    EXPECT_NE(held_line.substr(acquired_at).find(" ago"), std::string::npos) << all.describe;
    ASSERT_GT(free_line.size(), token_at) << all.describe;
    EXPECT_EQ(free_line[token_at], '-') << all.describe;
    EXPECT_EQ(free_line[token_at + 1], ' ') << all.describe;
  }

  // Named: only that one.
  const Ran named = Simba({"status", "--store", uri(), held});
  ASSERT_EQ(named.code, 0) << named.describe;
  EXPECT_NE(named.out.find(held), std::string::npos) << named.describe;
  EXPECT_NE(named.out.find(owner), std::string::npos) << named.describe;
  EXPECT_EQ(named.out.find(free), std::string::npos) << named.describe;

  // JSON, every mutex.
  const Ran json_all = Simba({"status", "--store", uri(), "--json"});
  ASSERT_EQ(json_all.code, 0) << json_all.describe;
  auto doc = ParseStatus(json_all);
  ASSERT_TRUE(doc.has_value());
  ASSERT_NE(doc->Get("store"), nullptr) << json_all.describe;
  // The URI as given, with any password masked.
  auto given = Uri::Parse(uri());
  ASSERT_TRUE(given.ok());
  EXPECT_EQ(doc->Get("store")->string, given->ToString());
  if (given->password) {
    EXPECT_EQ(doc->Get("store")->string.find(*given->password + "@"), std::string::npos);
  }
  const Json* h = FindMutex(*doc, held);
  ASSERT_NE(h, nullptr) << json_all.describe;
  ASSERT_NE(h->Get("held"), nullptr);
  EXPECT_EQ(h->Get("held")->type, Json::Type::kBool);
  EXPECT_TRUE(h->Get("held")->boolean) << json_all.describe;
  ASSERT_NE(h->Get("owner"), nullptr);
  EXPECT_EQ(h->Get("owner")->string, owner);
  ASSERT_NE(h->Get("fencing_token"), nullptr);
  ASSERT_TRUE(h->Get("fencing_token")->IsInteger()) << json_all.describe;
  EXPECT_EQ(h->Get("fencing_token")->Int(), *token);
  for (const char* field : {"acquired_ms_ago", "ttl_ends_in_ms", "lease_ends_in_ms",
                            "acquired_at", "ttl_at", "transition_at"}) {
    ASSERT_NE(h->Get(field), nullptr) << field << "\n" << json_all.describe;
    EXPECT_TRUE(h->Get(field)->IsInteger()) << field << "\n" << json_all.describe;
  }
  if (!::testing::Test::HasFailure()) {
    EXPECT_GE(h->Get("acquired_ms_ago")->Int(), 0);
    EXPECT_GE(h->Get("ttl_ends_in_ms")->Int(), 0);
    EXPECT_LE(h->Get("ttl_ends_in_ms")->Int(), kTtl.count());
    EXPECT_GE(h->Get("lease_ends_in_ms")->Int(), h->Get("ttl_ends_in_ms")->Int());
    EXPECT_LE(h->Get("lease_ends_in_ms")->Int(), (kTtl + kTransition).count());
    EXPECT_LE(h->Get("acquired_at")->Int(), h->Get("ttl_at")->Int());
    EXPECT_LE(h->Get("ttl_at")->Int(), h->Get("transition_at")->Int());
    // Epoch milliseconds (after 2020).
    EXPECT_GT(h->Get("ttl_at")->Int(), 1577836800000LL);
  }
  const Json* f = FindMutex(*doc, free);
  ASSERT_NE(f, nullptr) << "a mutex with a record is missing from the list\n"
                        << json_all.describe;
  ASSERT_NE(f->Get("held"), nullptr);
  EXPECT_EQ(f->Get("held")->type, Json::Type::kBool);
  EXPECT_FALSE(f->Get("held")->boolean) << json_all.describe;
  ASSERT_NE(f->Get("owner"), nullptr);
  EXPECT_EQ(f->Get("owner")->string, "");
  for (const char* field : {"acquired_ms_ago", "ttl_ends_in_ms", "lease_ends_in_ms"}) {
    EXPECT_EQ(f->Get(field), nullptr) << "a free mutex has " << field << "\n"
                                      << json_all.describe;
  }

  // JSON, named.
  const Ran json_named = Simba({"status", "--store", uri(), "--json", free});
  ASSERT_EQ(json_named.code, 0) << json_named.describe;
  auto named_doc = ParseStatus(json_named);
  ASSERT_TRUE(named_doc.has_value());
  ASSERT_NE(named_doc->Get("mutexes"), nullptr);
  ASSERT_EQ(named_doc->Get("mutexes")->array.size(), 1u) << json_named.describe;
  EXPECT_NE(FindMutex(*named_doc, free), nullptr) << json_named.describe;

  holder->Signal(SIGTERM);
  ASSERT_TRUE(holder->Wait(seconds(10)).has_value()) << holder->Describe();
  // Released: shows free.
  const Ran after = Simba({"status", "--store", uri(), held, "--json"});
  ASSERT_EQ(after.code, 0) << after.describe;
  auto after_doc = ParseStatus(after);
  ASSERT_TRUE(after_doc.has_value());
  const Json* ha = FindMutex(*after_doc, held);
  ASSERT_NE(ha, nullptr) << after.describe;
  ASSERT_NE(ha->Get("held"), nullptr);
  EXPECT_FALSE(ha->Get("held")->boolean) << after.describe;
}

// ---- 9. simba release --force --------------------------------------------------------------

TEST_P(CliE2E, ForcedReleaseBumpsTheFloorAndStopsTheHolder) {
  const std::string mutex = Mutex("forced");
  auto holder = Start(RunArgs(mutex, {}, TrappingChild("holder")));
  TrackPids("holder.pid");
  ASSERT_TRUE(WaitForFile("holder.pid", seconds(10))) << holder->Describe();
  const auto holder_token = WaitForNumber("holder.token", seconds(1));
  ASSERT_TRUE(holder_token.has_value());
  const Ran id = Simba({"status", "--store", uri(), mutex, "--json"});
  auto doc = ParseStatus(id);
  ASSERT_TRUE(doc.has_value());
  const Json* entry = FindMutex(*doc, mutex);
  ASSERT_NE(entry, nullptr) << id.describe;
  ASSERT_NE(entry->Get("owner"), nullptr);
  const std::string owner = entry->Get("owner")->string;
  ASSERT_FALSE(owner.empty()) << id.describe;

  // Without --force: refused, nothing changes.
  const Ran refused = Simba({"release", "--store", uri(), "--mutex", mutex});
  EXPECT_EQ(refused.code, 64) << refused.describe;
  EXPECT_NE(refused.err.find("--force"), std::string::npos) << refused.describe;
  std::this_thread::sleep_for(kTtl + milliseconds(200));  // a renewal
  EXPECT_TRUE(holder->Running()) << holder->Describe();
  EXPECT_FALSE(Exists("holder.marker"));

  // With --force.
  const Ran forced = Simba({"release", "--store", uri(), "--mutex", mutex, "--force"});
  const auto released = Clock::now();
  ASSERT_EQ(forced.code, 0) << forced.describe;
  EXPECT_NE(forced.out.find(owner), std::string::npos)
      << "release --force does not print the old owner\n" << forced.describe;
  // The floor: the last integer printed once the owner id is taken out.
  std::string rest = forced.out;
  for (auto at = rest.find(owner); at != std::string::npos; at = rest.find(owner)) {
    rest.erase(at, owner.size());
  }
  const auto numbers = Integers(rest);
  ASSERT_FALSE(numbers.empty()) << "release --force does not print the new floor\n"
                                << forced.describe;
  const long long floor = numbers.back();
  EXPECT_GT(floor, *holder_token) << forced.describe;

  // A new run gets a token above the floor. (--timeout rather than --no-wait:
  // the old holder's next renewal may briefly re-take the free mutex before
  // it notices the new token and lets go.)
  auto next = Start(RunArgs(mutex, {"--timeout", "10s"}, TrappingChild("next")));
  TrackPids("next.pid");

  // The old holder stops its child and exits 76 within ttl + 2 s.
  const auto code = holder->Wait(kTtl + seconds(2));
  ASSERT_TRUE(code.has_value()) << "the old holder did not notice the forced release\n"
                                << holder->Describe();
  RecordProperty("noticed_ms",
                 std::to_string(std::chrono::duration_cast<milliseconds>(Clock::now() - released)
                                    .count()));
  EXPECT_EQ(*code, 76) << holder->Describe();
  EXPECT_TRUE(Exists("holder.marker")) << "the old holder's child was not sent SIGTERM";

  const auto next_token = WaitForNumber("next.token", seconds(10));
  ASSERT_TRUE(next_token.has_value()) << next->Describe();
  EXPECT_GT(*next_token, floor);
  next->Signal(SIGTERM);
  const auto next_code = next->Wait(seconds(10));
  ASSERT_TRUE(next_code.has_value()) << next->Describe();
  EXPECT_EQ(*next_code, 0) << next->Describe();
}

TEST_P(CliE2E, ForcedReleaseOfAFreeMutexSucceeds) {
  const std::string mutex = Mutex("forced-free");
  const Ran used = Exec(RunArgs(mutex, {}, {"sh", "-c", "echo $SIMBA_FENCING_TOKEN > " +
                                                             Path("first.token")}));
  ASSERT_EQ(used.code, 0) << used.describe;
  const auto first = WaitForNumber("first.token", seconds(1));
  ASSERT_TRUE(first.has_value());
  const Ran forced = Simba({"release", "--store", uri(), "--mutex", mutex, "--force"});
  EXPECT_EQ(forced.code, 0) << forced.describe;
  const auto numbers = Integers(forced.out);
  ASSERT_FALSE(numbers.empty()) << forced.describe;
  const Ran next = Exec(RunArgs(mutex, {"--no-wait"},
                                {"sh", "-c", "echo $SIMBA_FENCING_TOKEN > " + Path("next.token")}));
  EXPECT_EQ(next.code, 0) << next.describe;
  const auto token = WaitForNumber("next.token", seconds(1));
  ASSERT_TRUE(token.has_value());
  EXPECT_GT(*token, numbers.back());
  EXPECT_GT(*token, *first);
}

// ---- 9b. simba schema ---------------------------------------------------------------------

// docs/cli.md, `simba schema`: prints the CREATE TABLE statement of a SQL
// store's table (the URI's `table`), which a DBA runs when the application's
// user may not create tables; the backends' error then quotes the same
// statement. Other stores: exit 64.
// (The SQL servers' suite: CliE2ESql, instantiated on the targets with a
// sql_client; the others are CliE2ENoSchema.)
class CliE2ESql : public CliE2E {};
class CliE2ENoSchema : public CliE2E {};

TEST_P(CliE2ENoSchema, SchemaExits64NamingTheScheme) {
  const Ran schema = Simba({"schema", "--store", uri()});
  EXPECT_EQ(schema.code, 64) << schema.describe;
  EXPECT_EQ(schema.out, "") << schema.describe;
  const std::string scheme = uri().substr(0, uri().find(':'));
  EXPECT_NE(schema.err.find("'" + scheme + "'"), std::string::npos)
      << "the error does not name the store's scheme\n" << schema.describe;
}

TEST_P(CliE2ESql, SchemaPrintsTheDdlThatMakesAWorkingStore) {
  const CliTarget& target = GetParam();
  const Ran schema = Simba({"schema", "--store", uri()});
  ASSERT_EQ(schema.code, 0) << schema.describe;
  EXPECT_EQ(schema.err, "") << schema.describe;
  const auto table = Uri::Parse(uri())->Query("table");
  ASSERT_TRUE(table.has_value()) << uri();
  EXPECT_EQ(schema.out.rfind("CREATE TABLE IF NOT EXISTS " + *table + " (\n", 0), 0u)
      << "not the DDL of the URI's table\n" << schema.describe;
  EXPECT_EQ(schema.out.find("simba_mutex"), std::string::npos) << schema.describe;
  ASSERT_GE(schema.out.size(), 2u);
  EXPECT_EQ(schema.out.substr(schema.out.size() - 2), ";\n") << schema.describe;

  // create_table=off: only the DBA's table will do.
  const std::string store = uri() + "&create_table=off";
  const std::string mutex = Mutex("schema");
  auto run = [&](const std::string& tag) {
    return Exec({kSimba, "run", "--store", store, "--mutex", mutex, "--no-wait", "--", "sh", "-c",
                 "echo $SIMBA_FENCING_TOKEN > " + Path(tag)});
  };
  const Ran before = run("before.token");
  EXPECT_EQ(before.code, 69) << before.describe;
  EXPECT_FALSE(Exists("before.token"));
  const std::string statement = schema.out.substr(0, schema.out.size() - 2);
  EXPECT_NE(before.err.find(statement), std::string::npos)
      << "the backend's error does not quote what `simba schema` prints\n" << before.describe;

  // The DBA runs it, as printed.
  {
    std::ofstream(Path("schema.sql")) << schema.out;
  }
  std::vector<std::string> apply = {"/bin/sh", "-c", "exec \"$@\" < '" + Path("schema.sql") + "'",
                                    "sh"};
  const std::vector<std::string> client = target.sql_client();
  apply.insert(apply.end(), client.begin(), client.end());
  const Ran applied = Exec(apply);
  ASSERT_EQ(applied.code, 0) << applied.describe;

  const Ran after = run("after.token");
  EXPECT_EQ(after.code, 0) << after.describe;
  const auto token = WaitForNumber("after.token", seconds(1));
  ASSERT_TRUE(token.has_value()) << after.describe;
  EXPECT_GT(*token, 0);
  // The table keeps the fencing counter: the next holder's token is greater.
  const Ran again = run("again.token");
  EXPECT_EQ(again.code, 0) << again.describe;
  const auto next_token = WaitForNumber("again.token", seconds(1));
  ASSERT_TRUE(next_token.has_value()) << again.describe;
  EXPECT_GT(*next_token, *token);
  const Ran status = Simba({"status", "--store", store, mutex, "--json"});
  EXPECT_EQ(status.code, 0) << status.describe;
  auto doc = ParseStatus(status);
  ASSERT_TRUE(doc.has_value());
  EXPECT_NE(FindMutex(*doc, mutex), nullptr) << status.describe;
}

// Bad URIs: exit 64, and the message names the part at fault (docs/cli.md:
// "Errors ... name the flag or the URI at fault"). A bad table name must not
// reach the DDL a DBA is told to run.
TEST_P(CliE2ESql, SchemaUriErrorsExit64NamingThePart) {
  const std::string base = uri().substr(0, uri().find('?'));
  struct Case {
    std::string uri;
    std::string named;  // must appear in stderr
  };
  const std::vector<Case> cases = {
      {base + "?tabel=x", "tabel"},
      {base + "?table=bad-name", "bad-name"},
      {base + "?table=x;DROP%20TABLE%20y", "table"},
      {base + "?table=", "table"},
      {base + "?create_table=maybe", "create_table"},
      {base.substr(0, base.rfind('/')), "database"},
  };
  for (const auto& c : cases) {
    const Ran ran = Simba({"schema", "--store", c.uri});
    EXPECT_EQ(ran.code, 64) << ran.describe;
    EXPECT_EQ(ran.out, "") << "printed DDL for a bad URI\n" << ran.describe;
    EXPECT_NE(ran.err.find(c.named), std::string::npos)
        << "the error does not name " << c.named << "\n" << ran.describe;
  }
  // No store at all.
  const Ran missing = Simba({"schema"});
  EXPECT_EQ(missing.code, 64) << missing.describe;
  EXPECT_NE(missing.err.find("--store"), std::string::npos) << missing.describe;
}

// ---- 9c. passwords on a live server ----------------------------------------------------------

// docs/cli.md: errors "never show a password"; the JSON events name the
// store masked. Here with a real server: one that lets the password in
// (every event of a leadership printed) or refuses it (the error path).
// (Instantiated on the targets whose URIs carry a password.)
class CliE2EPassword : public CliE2E {};

TEST_P(CliE2EPassword, ElectAndSchemaNeverShowThePassword) {
  const std::string secret = "Pw4Cli" + std::to_string(::getpid()) + "xQz";
  const std::string store = GetParam().password_uri(unique_, secret);
  ASSERT_NE(store.find(secret), std::string::npos) << store;
  const std::string masked = Uri::Parse(store)->ToString();
  ASSERT_EQ(masked.find(secret), std::string::npos) << masked;
  const std::string mutex = Mutex("secret");
  auto expect_clean = [&](const Ran& ran) {
    EXPECT_EQ(ran.out.find(secret), std::string::npos) << "stdout shows the password\n"
                                                       << ran.describe;
    EXPECT_EQ(ran.err.find(secret), std::string::npos) << "stderr shows the password\n"
                                                       << ran.describe;
  };
  for (const std::string format : {"text", "json"}) {
    SCOPED_TRACE(format);
    const Ran elect = Exec({kSimba, "elect", "--store", store, "--mutex", mutex, "--ttl", "1s",
                            "--transition", "500ms", "--verbose", "--log-format", format, "--",
                            "sh", "-c", "echo $SIMBA_FENCING_TOKEN > " + Path(format + ".token")});
    expect_clean(elect);
    if (GetParam().password_accepted) {
      // Led, ran the child (which exited 0), gave up leadership: every event.
      EXPECT_EQ(elect.code, 0) << elect.describe;
      EXPECT_TRUE(Exists(format + ".token")) << elect.describe;
      EXPECT_NE(elect.err.find("acquired"), std::string::npos) << elect.describe;
      EXPECT_NE(elect.err.find("released"), std::string::npos) << elect.describe;
    } else {
      EXPECT_EQ(elect.code, 69) << elect.describe;
      EXPECT_FALSE(Exists(format + ".token"));
      EXPECT_NE(elect.err.find(masked.substr(0, masked.find('?'))), std::string::npos)
          << "the error does not name the store (password masked)\n" << elect.describe;
    }
    if (format == "json") {
      for (const Json& line : JsonLines(elect.err)) {
        const std::string kind = Field(line, "event");
        if (kind == "error" || kind == "info") continue;
        EXPECT_EQ(Field(line, "store").find(secret), std::string::npos);
      }
    }
  }
  // schema does not connect: it prints the DDL (SQL stores) or refuses (64),
  // never the password; nor does a bad URI's error.
  const Ran schema = Simba({"schema", "--store", store});
  EXPECT_EQ(schema.code, GetParam().sql_client ? 0 : 64) << schema.describe;
  expect_clean(schema);
  const Ran bad = Simba({"schema", "--store", store + "&tabel=x"});
  EXPECT_EQ(bad.code, 64) << bad.describe;
  expect_clean(bad);
  const Ran from_env = Simba({"schema"}, {{"SIMBA_STORE", store + "&tabel=x"}});
  EXPECT_EQ(from_env.code, 64) << from_env.describe;
  expect_clean(from_env);
}

// ---- 10. help, version, passwords -----------------------------------------------------------

#if SIMBA_CLI_STORE_AGNOSTIC
TEST_F(Cli, HelpForEveryCommandShowsAnExample) {
  for (const std::string command : {"run", "elect", "status", "release"}) {
    for (const auto& args : std::vector<std::vector<std::string>>{{command, "--help"},
                                                                  {"help", command}}) {
      const Ran ran = Simba(args);
      EXPECT_EQ(ran.code, 0) << ran.describe;
      EXPECT_NE(ran.out.find("simba " + command), std::string::npos) << ran.describe;
      EXPECT_NE(Lower(ran.out).find("example"), std::string::npos)
          << "no example in the help\n" << ran.describe;
    }
  }
  const Ran help = Simba({"help"});
  EXPECT_EQ(help.code, 0) << help.describe;
  for (const char* command : {"run", "elect", "status", "release"}) {
    EXPECT_NE(help.out.find(command), std::string::npos) << help.describe;
  }
  const Ran version = Simba({"--version"});
  EXPECT_EQ(version.code, 0) << version.describe;
  EXPECT_TRUE(std::any_of(version.out.begin(), version.out.end(),
                          [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }))
      << version.describe;
  const Ran unknown = Simba({"help", "frobnicate"});
  EXPECT_EQ(unknown.code, 64) << unknown.describe;
  // Asking help about itself gets the overview, not a usage error.
  for (const char* about_help : {"--help", "-h", "help"}) {
    const Ran ran = Simba({"help", about_help});
    EXPECT_EQ(ran.code, 0) << ran.describe;
    EXPECT_EQ(ran.out, help.out) << ran.describe;
  }
}

TEST_F(Cli, ErrorsNeverShowAPassword) {
  const std::vector<std::string> uris = {"nosuch://u:secret@h/x",
                                         "sqlite://user:secret@/nonexistent-dir/x.db",
                                         "redis://:secret@127.0.0.1:1/0",
                                         "postgresql://u:secret@127.0.0.1:1/db",
                                         "mysql://u:secret@127.0.0.1:1/db"};
  for (const auto& bad : uris) {
    SCOPED_TRACE(bad);
    const std::vector<std::pair<std::vector<std::string>, Env>> invocations = {
        {{"run", "--store", bad, "--mutex", "m", "--no-wait", "--", "true"}, {}},
        {{"run", "--store", bad, "--mutex", "m", "--verbose", "--timeout", "1s", "--", "true"},
         {}},
        {{"status", "--store", bad}, {}},
        {{"status", "--json"}, {{"SIMBA_STORE", bad}}},
        {{"release", "--store", bad, "--mutex", "m", "--force"}, {}},
        {{"elect", "--store", bad, "--mutex", "m", "--", "true"}, {}},
        {{"elect", "--store", bad, "--mutex", "m", "--verbose", "--log-format", "json", "--",
          "true"},
         {}},
        {{"elect", "--mutex", "m", "--", "true"}, {{"SIMBA_STORE", bad}}},
        {{"schema", "--store", bad + "?tabel=x"}, {}},
        // A usage error with the URI around.
        {{"run", "--store", bad, "--mutex", "m", "--ttl", "x", "--", "true"}, {}},
    };
    for (const auto& [args, env] : invocations) {
      const Ran ran = Simba(args, env);
      EXPECT_NE(ran.code, 0) << ran.describe;
      EXPECT_EQ(ran.err.find("secret"), std::string::npos) << "stderr shows the password\n"
                                                           << ran.describe;
      EXPECT_EQ(ran.out.find("secret"), std::string::npos) << "stdout shows the password\n"
                                                           << ran.describe;
    }
    // schema does not connect: it prints the DDL of a SQL store (exit 0),
    // refuses the others (64); never with the password.
    for (const Env& env : {Env{}, Env{{"SIMBA_STORE", bad}}}) {
      const Ran ran = Simba(env.empty() ? std::vector<std::string>{"schema", "--store", bad}
                                        : std::vector<std::string>{"schema"},
                            env);
      EXPECT_TRUE(ran.code == 0 || ran.code == 64) << ran.describe;
      EXPECT_EQ(ran.err.find("secret"), std::string::npos) << "stderr shows the password\n"
                                                           << ran.describe;
      EXPECT_EQ(ran.out.find("secret"), std::string::npos) << "stdout shows the password\n"
                                                           << ran.describe;
    }
    // The store error names the URI, password masked.
    const Ran ran = Simba({"status", "--store", bad});
    EXPECT_TRUE(ran.code == 64 || ran.code == 69) << ran.describe;
    EXPECT_NE(ran.err.find("****"), std::string::npos)
        << "the error does not name the URI (with the password masked)\n" << ran.describe;
  }
}

#endif  // store-agnostic tests

// Each store's binary (simba_cli_tests on SQLite, simba_cli_<store>_tests
// on the test servers, whose ctest fixtures start them) links these tests
// and names its store in CliStoreOfThisBinary(), so `ctest -L <store>`
// covers the CLI there while the tests compile once.
std::vector<CliTarget> TargetsOfThisBinary() {
  const std::string_view store = CliStoreOfThisBinary();
  for (CliTarget (*make)() : {SqliteTarget, RedisTarget, PostgresTarget, MysqlTarget,
                              ZookeeperTarget, EtcdTarget}) {
    if (CliTarget target = make(); target.name == store) return {target};
  }
  std::fprintf(stderr, "cli tests: no store named '%.*s'\n", static_cast<int>(store.size()),
               store.data());
  std::abort();
}

INSTANTIATE_TEST_SUITE_P(Stores, CliE2E, ::testing::ValuesIn(TargetsOfThisBinary()),
                         CliTargetName);

// The suites that apply to some stores only: each binary instantiates those
// its store has (an empty list generates no test).
std::vector<CliTarget> TargetsOfThisBinaryWhere(bool (*applies)(const CliTarget&)) {
  std::vector<CliTarget> out;
  for (CliTarget& target : TargetsOfThisBinary()) {
    if (applies(target)) out.push_back(std::move(target));
  }
  return out;
}
INSTANTIATE_TEST_SUITE_P(
    Stores, CliE2ESql,
    ::testing::ValuesIn(TargetsOfThisBinaryWhere([](const CliTarget& candidate) {
      return static_cast<bool>(candidate.sql_client);
    })),
    CliTargetName);
INSTANTIATE_TEST_SUITE_P(
    Stores, CliE2ENoSchema,
    ::testing::ValuesIn(TargetsOfThisBinaryWhere([](const CliTarget& candidate) {
      return !candidate.sql_client;
    })),
    CliTargetName);
INSTANTIATE_TEST_SUITE_P(
    Stores, CliE2EPassword,
    ::testing::ValuesIn(TargetsOfThisBinaryWhere([](const CliTarget& candidate) {
      return static_cast<bool>(candidate.password_uri);
    })),
    CliTargetName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CliE2ESql);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CliE2ENoSchema);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CliE2EPassword);

}  // namespace
}  // namespace simba::testing
