// `simba dashboard` end to end (docs/cli.md): the real binary, real `simba
// run` contenders, and the page in headless Chromium driven over W3C
// WebDriver (tests/dashboard/webdriver_client.h).
//
// The store comes from $SIMBA_DASHBOARD_STORE (sqlite when unset): ctest runs
// this program once per store (dashboard_<store>, tests/dashboard/
// CMakeLists.txt). DashboardServer.* need no browser and run on SQLite
// (dashboard_server).
//
// Every wait has a timeout (scaled by SIMBA_TEST_TIME_SCALE). Every process a
// test starts is ended by PID in TearDown: the `simba` processes by their
// Subprocess, the children `simba run` put in process groups of their own by
// the pid files they write, and Chromium (started by chromedriver) by the
// profile directory unique to this test.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "simba/backend.h"
#include "simba/registry.h"
#include "simba/uri.h"
#include "testing/subprocess.h"
#include "testing/test_servers.h"
#include "testing/test_util.h"
#include "tests/dashboard/webdriver_client.h"

#ifndef SIMBA_CLI_PATH
#error "SIMBA_CLI_PATH must name the simba binary"
#endif
#ifndef SIMBA_CHROMIUM_PATH
#define SIMBA_CHROMIUM_PATH "/usr/bin/chromium"
#endif
#ifndef SIMBA_CHROMEDRIVER_PATH
#define SIMBA_CHROMEDRIVER_PATH "/usr/bin/chromedriver"
#endif

namespace simba::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

const std::string kSimba = SIMBA_CLI_PATH;

// The contenders' lease: short, so that a killed holder's mutex moves on soon,
// but with a second of transition: Chromium starting up on a 2-core CI
// machine running other tests beside it starved a 1 s + 500 ms lease into
// being lost (a renewal has ttl..ttl+transition to come back).
constexpr milliseconds kTtl{2000};
constexpr milliseconds kTransition{1000};
// How long after the holder is killed the page must show the next owner: the
// lease runs out (ttl + transition at most after its last renewal), the waiter
// takes it at its next attempt, the dashboard's next poll (200 ms) and the
// page's next fetch (1 s) show it; 5 s covers the last three and a loaded
// machine.
constexpr milliseconds kHandOverBound = kTtl + kTransition + seconds(5);

std::string env(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

std::string store_kind() { return env("SIMBA_DASHBOARD_STORE", "sqlite"); }

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool is_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) != 0;
  });
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

int g_counter = 0;

// A unique name part for this test: keys, tables and roots on shared servers.
std::string unique_suffix() {
  return "t" + std::to_string(::getpid()) + "_" + std::to_string(++g_counter);
}

// The store URI for one test of `kind`, or "" (with a failure) when its
// server is missing.
std::string store_uri_for(const std::string& kind, const std::string& dir) {
  const std::string unique = unique_suffix();
  if (kind == "sqlite") return "sqlite://" + dir + "/dash.db";
  if (kind == "memory") return "memory://dash-" + unique;
  std::string server = shared_server_uri(kind);
  if (server.empty()) {
    ADD_FAILURE() << "no " << kind << " server (see the messages above)";
    return "";
  }
  if (kind == "redis" || kind == "etcd") return server + "?key_prefix=dash-" + unique;
  if (kind == "postgres" || kind == "mysql") return server + "?table=dash_" + unique;
  // docs/backends/zookeeper.md's advice: a session near 2 x (ttl + transition).
  if (kind == "zookeeper") {
    return server + "?root=/dash-" + unique +
           "&session_timeout=" + std::to_string(2 * (kTtl + kTransition).count()) + "ms";
  }
  ADD_FAILURE() << "unknown store kind '" << kind << "'";
  return "";
}

// ---- the dashboard process ---------------------------------------------------------

// `simba dashboard` with its port read from the line it prints.
struct Dashboard {
  std::unique_ptr<Subprocess> proc;
  int port = 0;
  std::string line;  // "simba: dashboard for ... at http://127.0.0.1:PORT/"
};

Dashboard start_dashboard(const std::string& uri, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {kSimba,     "dashboard",   "--store",   uri,
                                   "--listen", "127.0.0.1:0", "--refresh", "200ms"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Dashboard d;
  d.proc = std::make_unique<Subprocess>(argv);
  EXPECT_TRUE(d.proc->started());
  auto line = d.proc->wait_for_line("simba: dashboard for ", seconds(20));
  if (!line) {
    ADD_FAILURE() << "the dashboard did not print where it listens";
    return d;
  }
  d.line = *line;
  std::smatch m;
  if (std::regex_search(*line, m, std::regex(R"(at http://127\.0\.0\.1:(\d+)/$)"))) {
    d.port = std::stoi(m[1]);
  } else {
    ADD_FAILURE() << "unexpected line: " << *line;
  }
  return d;
}

// SIGTERM (or `signal`); expects a clean exit 0 within 10 s.
void stop_dashboard(Dashboard& d, int signal = SIGTERM) {
  if (!d.proc || !d.proc->started()) return;
  d.proc->signal(signal);
  const auto status = d.proc->wait_for(scaled(seconds(10)));
  ASSERT_TRUE(status.has_value()) << "the dashboard did not stop on signal " << signal;
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "the dashboard did not exit 0 on signal " << signal << " (wait status " << *status << ")";
}

HttpReply get(int port, const std::string& path, const std::string& method = "GET") {
  std::string error;
  auto reply = http_call(port, method, path, "", scaled(seconds(10)), &error);
  EXPECT_TRUE(reply.has_value()) << method << " " << path << ": " << error;
  return reply.value_or(HttpReply{});
}

std::optional<Json> get_state(int port) {
  const HttpReply reply = get(port, "/api/state");
  if (reply.status != 200) return std::nullopt;
  std::string error;
  auto doc = parse_json(reply.body, &error);
  EXPECT_TRUE(doc.has_value()) << error;
  return doc;
}

const Json* find_mutex(const Json& state, const std::string& name) {
  const Json* mutexes = state.get("mutexes");
  if (mutexes == nullptr) return nullptr;
  for (const auto& m : mutexes->array) {
    const Json* n = m.get("mutex");
    if (n != nullptr && n->string == name) return &m;
  }
  return nullptr;
}

std::string string_field(const Json* object, const std::string& key) {
  if (object == nullptr) return "";
  const Json* v = object->get(key);
  return v != nullptr && v->type == Json::Type::kString ? v->string : "";
}

// Checks the shape of /api/state (docs/cli.md).
void expect_well_formed_state(const Json& s) {
  ASSERT_EQ(s.type, Json::Type::kObject);
  for (const char* key : {"store", "scheme", "transport"}) {
    ASSERT_NE(s.get(key), nullptr) << key;
    EXPECT_EQ(s.get(key)->type, Json::Type::kString) << key;
  }
  for (const char* key : {"refreshed_at_ms", "refreshed_ms_ago", "polled_at_ms", "served_at_ms"}) {
    ASSERT_NE(s.get(key), nullptr) << key;
    EXPECT_TRUE(s.get(key)->is_null() || s.get(key)->is_integer()) << key;
  }
  ASSERT_NE(s.get("error"), nullptr);
  EXPECT_TRUE(s.get("error")->is_null() || s.get("error")->type == Json::Type::kString);
  ASSERT_NE(s.get("waiters_supported"), nullptr);
  EXPECT_EQ(s.get("waiters_supported")->type, Json::Type::kBool);
  ASSERT_NE(s.get("mutexes"), nullptr);
  ASSERT_EQ(s.get("mutexes")->type, Json::Type::kArray);
  for (const auto& m : s.get("mutexes")->array) {
    ASSERT_NE(m.get("mutex"), nullptr);
    ASSERT_NE(m.get("held"), nullptr);
    ASSERT_EQ(m.get("held")->type, Json::Type::kBool);
    ASSERT_NE(m.get("owner"), nullptr);
    EXPECT_EQ(m.get("owner")->type, Json::Type::kString);
    ASSERT_NE(m.get("fencing_token"), nullptr);
    EXPECT_TRUE(m.get("fencing_token")->is_integer());
    for (const char* key : {"acquired_ms_ago", "ttl_ends_in_ms", "lease_ends_in_ms"}) {
      ASSERT_NE(m.get(key), nullptr) << key;
      EXPECT_EQ(m.get(key)->is_integer(), m.get("held")->boolean) << key;
    }
    ASSERT_NE(m.get("waiters"), nullptr);
    EXPECT_TRUE(m.get("waiters")->is_null() || m.get("waiters")->type == Json::Type::kArray);
  }
  ASSERT_NE(s.get("handovers"), nullptr);
  ASSERT_EQ(s.get("handovers")->type, Json::Type::kArray);
  long long previous_at = 0;
  for (const auto& h : s.get("handovers")->array) {
    for (const char* key : {"mutex", "from", "to"}) {
      ASSERT_NE(h.get(key), nullptr) << key;
      EXPECT_EQ(h.get(key)->type, Json::Type::kString) << key;
    }
    ASSERT_NE(h.get("fencing_token"), nullptr);
    EXPECT_TRUE(h.get("fencing_token")->is_integer());
    ASSERT_NE(h.get("at_ms"), nullptr);
    ASSERT_TRUE(h.get("at_ms")->is_integer());
    if (previous_at != 0) {
      EXPECT_LE(h.get("at_ms")->as_int(), previous_at) << "not newest first";
    }
    previous_at = h.get("at_ms")->as_int();
  }
}

// Checks that every line of /metrics is a comment or a sample.
void expect_well_formed_metrics(const HttpReply& reply) {
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.header("Content-Type").rfind("text/plain; version=0.0.4", 0), 0u)
      << reply.header("Content-Type");
  EXPECT_EQ(reply.header("Cache-Control"), "no-store");
  const std::regex sample(
      R"(^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? -?[0-9.eE+]+(Inf|NaN)?$)");
  const std::regex comment(R"(^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$)");
  std::istringstream in(reply.body);
  int samples = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("#", 0) == 0) {
      EXPECT_TRUE(std::regex_match(line, comment)) << line;
    } else {
      EXPECT_TRUE(std::regex_match(line, sample)) << line;
      ++samples;
    }
  }
  EXPECT_GT(samples, 0);
  EXPECT_FALSE(reply.body.empty() || reply.body.back() != '\n');
}

// Kills (SIGKILL) the process whose pid is the first line of `path`, and its
// process group (`simba run` puts its child in a group of its own).
void kill_pid_file(const std::string& path) {
  std::istringstream in(read_file(path));
  long pid = 0;
  if (in >> pid && pid > 1) {
    ::kill(-static_cast<pid_t>(pid), SIGKILL);
    ::kill(static_cast<pid_t>(pid), SIGKILL);
  }
}

// Processes whose command line holds `marker` (Chromium, by its profile dir).
std::vector<pid_t> pids_with_argument(const std::string& marker) {
  std::vector<pid_t> pids;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* e = ::readdir(proc)) {
    const std::string name = e->d_name;
    if (!is_digits(name)) continue;
    std::string cmdline = read_file("/proc/" + name + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (contains(cmdline, marker)) pids.push_back(static_cast<pid_t>(std::stol(name)));
  }
  ::closedir(proc);
  return pids;
}

// The children of this process (orphans it adopted as a subreaper among them).
std::vector<pid_t> children_of_this_process() {
  std::vector<pid_t> pids;
  const std::string self = std::to_string(::getpid());
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* e = ::readdir(proc)) {
    const std::string name = e->d_name;
    if (!is_digits(name)) continue;
    const std::string stat = read_file("/proc/" + name + "/stat");
    const auto paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream fields(stat.substr(paren + 2));
    std::string state, ppid;
    if (fields >> state >> ppid && ppid == self)
      pids.push_back(static_cast<pid_t>(std::stol(name)));
  }
  ::closedir(proc);
  return pids;
}

// Reaps every child left once the test's own processes are gone: as a child
// subreaper this process adopts what Chromium and `simba run` leave behind
// (Chromium's crash handler double-forks), which would otherwise linger as
// zombies where init does not reap. What still runs after 3 s is killed.
void reap_orphans() {
  const auto start = Clock::now();
  while (Clock::now() - start < seconds(10)) {
    int status = 0;
    pid_t r = 0;
    while ((r = ::waitpid(-1, &status, WNOHANG)) > 0) {
    }
    if (r < 0 && errno == ECHILD) return;
    if (Clock::now() - start > seconds(3)) {
      for (const pid_t pid : children_of_this_process()) ::kill(pid, SIGKILL);
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
}

// ---- fast tests: the server without a browser ---------------------------------------

class DashboardServer : public ::testing::Test {
 protected:
  TempDir dir_;
};

TEST_F(DashboardServer, ServesThePageTheStateAndMetrics) {
  const std::string uri = "sqlite://" + dir_.path() + "/fast.db";
  // A holder in this process, so that the state has something to show.
  auto backend = open_backend(uri);
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  auto held = (*backend)->acquire_or_renew(
      AcquireRequest{"held-here", "dash-test-owner", seconds(60), seconds(10)},
      Clock::now() + seconds(10));
  ASSERT_TRUE(held.ok()) << held.status().message();
  ASSERT_EQ(held->owner.owner_id, "dash-test-owner");

  Dashboard d = start_dashboard(uri);
  ASSERT_GT(d.port, 0);
  EXPECT_TRUE(contains(d.line, "sqlite://" + dir_.path() + "/fast.db")) << d.line;

  // The page: self-contained HTML, no caching.
  const HttpReply page = get(d.port, "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.header("Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(page.header("Cache-Control"), "no-store");
  EXPECT_TRUE(contains(page.body, "<script>")) << "the script is not inline";
  EXPECT_TRUE(contains(page.body, "id=\"handovers\""));
  for (const char* external : {"src=", "href=", "@import", "http://", "https://"}) {
    EXPECT_FALSE(contains(page.body, external)) << "the page loads something: " << external;
  }
  EXPECT_FALSE(contains(page.body, "innerHTML")) << "data must reach the DOM as text only";
  const HttpReply head = get(d.port, "/", "HEAD");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.header("Content-Length"), std::to_string(page.body.size()));
  EXPECT_TRUE(head.body.empty());

  // The state, once the first poll is in.
  std::optional<Json> state;
  ASSERT_TRUE(eventually(
      [&] {
        state = get_state(d.port);
        return state && find_mutex(*state, "held-here") != nullptr;
      },
      seconds(10)))
      << "the held mutex never showed up";
  const HttpReply json = get(d.port, "/api/state");
  EXPECT_EQ(json.header("Content-Type"), "application/json");
  EXPECT_EQ(json.header("Cache-Control"), "no-store");
  expect_well_formed_state(*state);
  EXPECT_EQ(string_field(&*state, "scheme"), "sqlite");
  EXPECT_EQ(string_field(&*state, "transport"), "local file");
  EXPECT_TRUE(state->get("error")->is_null());
  const Json* m = find_mutex(*state, "held-here");
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->get("held")->boolean);
  EXPECT_EQ(string_field(m, "owner"), "dash-test-owner");
  EXPECT_EQ(m->get("fencing_token")->as_int(), static_cast<long long>(held->owner.fencing_token));
  EXPECT_GT(m->get("lease_ends_in_ms")->as_int(), 0);
  EXPECT_LE(m->get("lease_ends_in_ms")->as_int(), 70000);
  if (!state->get("waiters_supported")->boolean) {
    EXPECT_TRUE(m->get("waiters")->is_null());
  }

  // The query string is not part of the route.
  EXPECT_EQ(get(d.port, "/api/state?x=1").status, 200);

  const HttpReply metrics = get(d.port, "/metrics");
  expect_well_formed_metrics(metrics);
  EXPECT_TRUE(contains(metrics.body, "simba_store_up 1\n")) << metrics.body;
  EXPECT_TRUE(contains(metrics.body, "simba_mutex_held{mutex=\"held-here\"} 1\n")) << metrics.body;
  EXPECT_TRUE(contains(metrics.body, "simba_mutex_fencing_token{mutex=\"held-here\"} " +
                                         std::to_string(held->owner.fencing_token) + "\n"))
      << metrics.body;
  EXPECT_TRUE(contains(metrics.body, "# TYPE simba_dashboard_handovers_total counter\n"));

  // Unknown paths and other methods.
  EXPECT_EQ(get(d.port, "/nope").status, 404);
  EXPECT_EQ(get(d.port, "/api/state/").status, 404);
  const HttpReply post = get(d.port, "/api/state", "POST");
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(post.header("Allow"), "GET, HEAD");
  EXPECT_EQ(get(d.port, "/", "DELETE").status, 405);
  std::string error;
  auto garbage = http_raw(d.port, "GARBAGE\r\n\r\n", scaled(seconds(5)), &error);
  ASSERT_TRUE(garbage.has_value()) << error;
  EXPECT_EQ(garbage->status, 400);

  // A release is a hand-over to "free".
  auto released = (*backend)->release("held-here", "dash-test-owner", Clock::now() + seconds(10));
  ASSERT_TRUE(released.ok()) << released.status().message();
  ASSERT_TRUE(eventually(
      [&] {
        state = get_state(d.port);
        if (!state || state->get("handovers") == nullptr) return false;
        for (const auto& h : state->get("handovers")->array) {
          if (string_field(&h, "mutex") == "held-here" &&
              string_field(&h, "from") == "dash-test-owner" && string_field(&h, "to").empty()) {
            return true;
          }
        }
        return false;
      },
      seconds(10)))
      << "the release was not recorded as a hand-over";
  expect_well_formed_state(*state);
  EXPECT_FALSE(find_mutex(*state, "held-here")->get("held")->boolean);
  EXPECT_TRUE(contains(get(d.port, "/metrics").body,
                       "simba_dashboard_handovers_total{mutex=\"held-here\"} 1\n"));
  stop_dashboard(d);
}

// The sum of the samples of metric `name` (one per mutex) and their count.
std::pair<long long, std::size_t> sum_samples(const std::string& metrics, const std::string& name) {
  long long sum = 0;
  std::size_t count = 0;
  std::istringstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + "{", 0) != 0) continue;
    sum += std::stoll(line.substr(line.rfind(' ') + 1));
    ++count;
  }
  return {sum, count};
}

// docs/cli.md: "Per-mutex series are limited to the first 1,000 mutexes by
// name ...; the rest are left out ... and counted by
// simba_dashboard_mutexes_omitted. simba_mutexes counts them all."
TEST_F(DashboardServer, MetricsKeepPerMutexSeriesForTheFirst1000ByName) {
  constexpr int kMutexes = 1003;
  const std::string uri = "sqlite://" + dir_.path() + "/many.db";
  auto backend = open_backend(uri);
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  auto name = [](int i) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "m-%04d", i);
    return std::string(buf);
  };
  // Acquired last-name first: "first by name" is not the store's order.
  for (int i = kMutexes - 1; i >= 0; --i) {
    auto held = (*backend)->acquire_or_renew(
        AcquireRequest{name(i), "dash-test-owner", seconds(600), seconds(10)},
        Clock::now() + seconds(10));
    ASSERT_TRUE(held.ok()) << held.status().message();
  }
  Dashboard d = start_dashboard(uri);
  ASSERT_GT(d.port, 0);
  std::string metrics;
  ASSERT_TRUE(eventually(
      [&] {
        metrics = get(d.port, "/metrics").body;
        return contains(metrics,
                        "simba_mutexes{state=\"held\"} " + std::to_string(kMutexes) + "\n");
      },
      seconds(20)))
      << metrics.substr(0, 2000);
  EXPECT_TRUE(contains(metrics, "simba_mutexes{state=\"free\"} 0\n"));
  EXPECT_TRUE(contains(metrics, "simba_dashboard_mutexes_omitted 3\n"));
  for (const char* family : {"simba_mutex_held", "simba_mutex_fencing_token",
                             "simba_mutex_lease_seconds_left", "simba_dashboard_handovers_total"}) {
    SCOPED_TRACE(family);
    EXPECT_EQ(sum_samples(metrics, family).second, 1000u);
    EXPECT_TRUE(contains(metrics, std::string(family) + "{mutex=\"m-0000\"}"));
    EXPECT_TRUE(contains(metrics, std::string(family) + "{mutex=\"m-0999\"}"));
    for (int i = 1000; i < kMutexes; ++i) {
      EXPECT_FALSE(contains(metrics, std::string(family) + "{mutex=\"" + name(i) + "\"}"))
          << name(i) << " is beyond the first 1000 by name";
    }
  }
  EXPECT_EQ(sum_samples(metrics, "simba_mutex_held").first, 1000);
  // The state API is not limited: every mutex.
  auto state = get_state(d.port);
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->get("mutexes")->array.size(), static_cast<std::size_t>(kMutexes));
  stop_dashboard(d);
}

// docs/cli.md: "The latest 200 [hand-overs] are kept", newest first, while
// simba_dashboard_handovers_total counts every hand-over seen.
TEST_F(DashboardServer, KeepsTheLatest200HandOvers) {
  constexpr int kFirst = 150;
  constexpr int kSecond = 100;
  constexpr std::size_t kKept = 200;
  const std::string uri = "sqlite://" + dir_.path() + "/handovers.db";
  auto backend = open_backend(uri);
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  Dashboard d = start_dashboard(uri);
  ASSERT_GT(d.port, 0);
  std::optional<Json> state;
  // The first good read is the baseline: hand-overs are changes after it.
  ASSERT_TRUE(eventually(
      [&] {
        state = get_state(d.port);
        return state && state->get("refreshed_at_ms")->is_integer();
      },
      seconds(10)));
  // Each acquisition of a new mutex is one hand-over (free -> owner), in
  // whichever poll sees it; the second batch starts once a poll has seen
  // all of the first, so its hand-overs are the newer ones.
  auto acquire_batch = [&](const std::string& prefix, int count, std::size_t total) {
    for (int i = 0; i < count; ++i) {
      auto held = (*backend)->acquire_or_renew(
          AcquireRequest{prefix + std::to_string(i), "owner-" + prefix, seconds(600), seconds(10)},
          Clock::now() + seconds(10));
      ASSERT_TRUE(held.ok()) << held.status().message();
    }
    ASSERT_TRUE(eventually(
        [&] {
          state = get_state(d.port);
          return state && state->get("mutexes")->array.size() == total;
        },
        seconds(10)))
        << "the dashboard did not see the batch " << prefix;
  };
  acquire_batch("a-", kFirst, kFirst);
  acquire_batch("b-", kSecond, kFirst + kSecond);
  expect_well_formed_state(*state);
  const auto& handovers = state->get("handovers")->array;
  ASSERT_EQ(handovers.size(), kKept);
  for (std::size_t i = 0; i < handovers.size(); ++i) {
    const std::string mutex = string_field(&handovers[i], "mutex");
    // Newest first: the whole second batch, then the newest of the first.
    EXPECT_EQ(mutex.substr(0, 2), i < static_cast<std::size_t>(kSecond) ? "b-" : "a-")
        << "hand-over " << i << ": " << mutex;
    EXPECT_EQ(string_field(&handovers[i], "from"), "");
    EXPECT_EQ(string_field(&handovers[i], "to"), "owner-" + mutex.substr(0, 2));
  }
  // The counters count all of them.
  const std::string metrics = get(d.port, "/metrics").body;
  EXPECT_EQ(sum_samples(metrics, "simba_dashboard_handovers_total"),
            std::make_pair(static_cast<long long>(kFirst + kSecond),
                           static_cast<std::size_t>(kFirst + kSecond)))
      << metrics;
  stop_dashboard(d);
}

// A client that connects and sends nothing (or half a request) must not hold
// up the others; an oversized request is refused.
TEST_F(DashboardServer, SurvivesIdleSlowAndOversizedClients) {
  Dashboard d = start_dashboard("sqlite://" + dir_.path() + "/slow.db");
  ASSERT_GT(d.port, 0);
  auto connect_idle = [&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(d.port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    return fd;
  };
  std::string error;
  // More idle connections than the server keeps open at once (it drops the
  // oldest for a new one).
  {
    std::vector<int> crowd;
    for (int i = 0; i < 100; ++i) crowd.push_back(connect_idle());
    auto reply = http_call(d.port, "GET", "/api/state", "", scaled(seconds(2)), &error);
    ASSERT_TRUE(reply.has_value()) << "a crowd of idle clients blocked the others: " << error;
    EXPECT_EQ(reply->status, 200);
    for (const int fd : crowd) ::close(fd);
  }

  const int idle = connect_idle();
  const int partial = connect_idle();
  const std::string half = "GET / HTTP/1.1\r\nHost: x\r\n";
  ASSERT_EQ(::send(partial, half.data(), half.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(half.size()));
  const auto start = Clock::now();
  auto reply = http_call(d.port, "GET", "/api/state", "", scaled(seconds(2)), &error);
  ASSERT_TRUE(reply.has_value()) << "an idle client blocked the others: " << error;
  EXPECT_EQ(reply->status, 200);
  EXPECT_LT(Clock::now() - start, scaled(seconds(2)));

  // Oversized: a 20 KiB header.
  auto big = http_raw(
      d.port, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20 * 1024, 'a') + "\r\n\r\n",
      scaled(seconds(5)), &error);
  ASSERT_TRUE(big.has_value()) << error;
  EXPECT_EQ(big->status, 431);
  // A body announced larger than the limit.
  auto big_body =
      http_raw(d.port, "POST /api/state HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n",
               scaled(seconds(5)), &error);
  ASSERT_TRUE(big_body.has_value()) << error;
  EXPECT_EQ(big_body->status, 413);

  // The idle clients are dropped after the server's request timeout (5 s);
  // the half request gets 408.
  auto read_all = [](int fd, milliseconds timeout) -> std::optional<std::string> {
    timeval tv{};
    tv.tv_sec = static_cast<long>(timeout.count() / 1000);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string got;
    char buf[512];
    for (;;) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n == 0) return got;
      if (n < 0) return errno == ECONNRESET ? std::optional<std::string>(got) : std::nullopt;
      got.append(buf, static_cast<std::size_t>(n));
    }
  };
  const auto idle_got = read_all(idle, scaled(seconds(15)));
  ASSERT_TRUE(idle_got.has_value()) << "the server never closed an idle connection";
  EXPECT_EQ(*idle_got, "");
  const auto partial_got = read_all(partial, scaled(seconds(15)));
  ASSERT_TRUE(partial_got.has_value()) << "the server never closed a half request";
  EXPECT_EQ(partial_got->rfind("HTTP/1.1 408", 0), 0u) << *partial_got;
  ::close(idle);
  ::close(partial);
  EXPECT_EQ(get(d.port, "/metrics").status, 200);
  stop_dashboard(d, SIGINT);
}

// A URI with a password never shows it: not on stdout, the page, the JSON,
// the metrics, nor in the store error (the store cannot be reached here).
TEST_F(DashboardServer, MasksThePasswordAndShowsStoreErrors) {
  const std::string secret = "s3cr3t-pw";
#if SIMBA_DASHBOARD_HAVE_REDIS
  const std::string uri = "redis://:" + secret + "@127.0.0.1:1";
#elif SIMBA_DASHBOARD_HAVE_POSTGRES
  const std::string uri = "postgresql://u:" + secret + "@127.0.0.1:1/db";
#elif SIMBA_DASHBOARD_HAVE_MYSQL
  const std::string uri = "mysql://u:" + secret + "@127.0.0.1:1/db";
#else
  GTEST_SKIP() << "no store with a password in this build";
  const std::string uri;
#endif
  const std::string masked = Uri::parse(uri)->to_string();
  ASSERT_FALSE(contains(masked, secret));
  Dashboard d = start_dashboard(uri);
  ASSERT_GT(d.port, 0);
  EXPECT_TRUE(contains(d.line, masked)) << d.line;
  EXPECT_FALSE(contains(d.line, secret)) << d.line;

  std::optional<Json> state;
  ASSERT_TRUE(eventually(
      [&] {
        state = get_state(d.port);
        return state && state->get("error") != nullptr && !state->get("error")->is_null();
      },
      seconds(15)))
      << "an unreachable store shows no error";
  expect_well_formed_state(*state);
  EXPECT_EQ(string_field(&*state, "store"), masked);
  const std::string error = string_field(&*state, "error");
  EXPECT_TRUE(contains(error, masked)) << "the error does not name the store: " << error;
  EXPECT_TRUE(state->get("refreshed_at_ms")->is_null()) << "no good read yet";
  // The poll keeps going.
  const long long polled = state->get("polled_at_ms")->as_int();
  ASSERT_TRUE(eventually(
      [&] {
        state = get_state(d.port);
        return state && state->get("polled_at_ms")->is_integer() &&
               state->get("polled_at_ms")->as_int() > polled;
      },
      seconds(15)))
      << "the dashboard stopped polling after a store error";
  for (const char* path : {"/", "/api/state", "/metrics"}) {
    const HttpReply reply = get(d.port, path);
    EXPECT_EQ(reply.status, 200) << path;
    EXPECT_FALSE(contains(reply.body, secret)) << path << " shows the password:\n" << reply.body;
  }
  const std::string metrics = get(d.port, "/metrics").body;
  EXPECT_TRUE(contains(metrics, "simba_store_up 0\n")) << metrics;
  EXPECT_TRUE(contains(metrics, "simba_dashboard_info{store=\"" + masked + "\"")) << metrics;
  stop_dashboard(d);
}

// memory:// is one process: the dashboard's own store, empty. Still served.
TEST_F(DashboardServer, MemoryStoreIsEmpty) {
  Dashboard d = start_dashboard("memory://dash-empty");
  ASSERT_GT(d.port, 0);
  std::optional<Json> state;
  ASSERT_TRUE(eventually(
      [&] {
        state = get_state(d.port);
        return state && state->get("refreshed_at_ms") != nullptr &&
               state->get("refreshed_at_ms")->is_integer();
      },
      seconds(10)));
  expect_well_formed_state(*state);
  EXPECT_TRUE(state->get("error")->is_null());
  EXPECT_TRUE(state->get("mutexes")->array.empty());
  EXPECT_EQ(string_field(&*state, "scheme"), "memory");
  EXPECT_EQ(string_field(&*state, "transport"), "in process");
  expect_well_formed_metrics(get(d.port, "/metrics"));
  stop_dashboard(d);
}

TEST_F(DashboardServer, UsageErrorsExit64) {
  const std::vector<std::vector<std::string>> cases = {
      {"dashboard"},  // no store
      {"dashboard", "--store", "memory://x", "--listen", "nonsense"},
      {"dashboard", "--store", "memory://x", "--listen", "127.0.0.1:99999"},
      {"dashboard", "--store", "memory://x", "--listen", "::1:80"},
      {"dashboard", "--store", "memory://x", "--refresh", "0ms"},
      {"dashboard", "--store", "memory://x", "--refresh", "5"},
      {"dashboard", "--store", "memory://x", "--bogus"},
      {"dashboard", "--store", "nosuch://x"},
  };
  for (const auto& args : cases) {
    std::vector<std::string> argv = {"/usr/bin/env", "-u", "SIMBA_STORE", kSimba};
    argv.insert(argv.end(), args.begin(), args.end());
    Subprocess p(argv);
    const auto status = p.wait_for(scaled(seconds(10)));
    ASSERT_TRUE(status.has_value()) << argv.back();
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 64)
        << "wait status " << *status << " for: " << args.back();
  }
}

TEST_F(DashboardServer, WarnsWhenListeningBeyondLoopback) {
  const std::string err = dir_.path() + "/stderr";
  Subprocess p({"/bin/sh", "-c",
                "exec \"$0\" dashboard --store memory://x --listen 0.0.0.0:0 2>\"$1\"", kSimba,
                err});
  ASSERT_TRUE(p.wait_for_line("simba: dashboard for ", seconds(10)).has_value());
  EXPECT_TRUE(contains(read_file(err), "no authentication")) << read_file(err);
  p.signal(SIGTERM);
  const auto status = p.wait_for(scaled(seconds(10)));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
}

// ---- the browser test -------------------------------------------------------------------

class DashboardBrowser : public ::testing::Test {
 protected:
  // Orphans of the processes this test starts become its children, so that
  // TearDown can reap them.
  void SetUp() override { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }

  void TearDown() override {
    // The browser first (chromedriver ends Chromium when the session is
    // deleted), then every process by PID.
    if (driver_) {
      driver_->delete_session();
      driver_.reset();
    }
    if (chromedriver_ && chromedriver_->started()) {
      chromedriver_->signal(SIGTERM);
      if (!chromedriver_->wait_for(scaled(seconds(5)))) chromedriver_->signal(SIGKILL);
      chromedriver_.reset();
    }
    if (!profile_.empty()) {
      // Chromium outliving its driver: ours only, found by its profile dir.
      for (int round = 0; round < 50; ++round) {
        const auto pids = pids_with_argument("--user-data-dir=" + profile_);
        if (pids.empty()) break;
        for (const pid_t pid : pids) ::kill(pid, SIGKILL);
        std::this_thread::sleep_for(milliseconds(100));
      }
    }
    if (dashboard_.proc) stop_dashboard(dashboard_);
    for (auto* proc : {&b_, &a_}) {
      if (*proc && (*proc)->started()) {
        (*proc)->signal(SIGTERM);
        if (!(*proc)->wait_for(scaled(seconds(10)))) (*proc)->signal(SIGKILL);
        proc->reset();
      }
    }
    for (const char* name : {"a.pid", "b.pid"}) kill_pid_file(path(name));
    reap_orphans();
  }

  std::string path(const std::string& name) const { return dir_.path() + "/" + name; }

  // `simba run` whose child writes its contender id and pid, then sleeps.
  std::unique_ptr<Subprocess> start_contender(const std::string& uri, const std::string& tag) {
    auto proc = std::make_unique<Subprocess>(std::vector<std::string>{
        kSimba, "run", "--store", uri, "--mutex", mutex_, "--ttl",
        std::to_string(kTtl.count()) + "ms", "--transition",
        std::to_string(kTransition.count()) + "ms", "--", "sh", "-c",
        "echo $$ > " + path(tag + ".pid") + "; echo $SIMBA_CONTENDER_ID > " +
            path(tag + ".id.tmp") + "; mv " + path(tag + ".id.tmp") + " " + path(tag + ".id") +
            "; exec sleep 600"});
    EXPECT_TRUE(proc->started());
    return proc;
  }
  // The contender id `tag`'s child wrote ("" until it runs).
  std::string contender_id(const std::string& tag) const {
    std::string id = read_file(path(tag + ".id"));
    while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
    return id;
  }

  // The row of kMutex as the page shows it, or nullopt when there is none.
  struct Row {
    std::string owner, token, countdown, waiters;
    std::vector<std::string> waiter_ids;
    std::string marker;
  };
  std::optional<Row> read_row() {
    const std::string script =
        "const tr = document.querySelector('tr[data-mutex=\"' + CSS.escape(" + json_string(mutex_) +
        ") + '\"]');"
        "if (!tr) return null;"
        "const text = (sel) => { const e = tr.querySelector(sel); return e ? e.textContent : null; "
        "};"
        "return JSON.stringify({owner: text('.owner'), token: text('.token'),"
        "  countdown: text('.countdown'), waiters: text('.waiters'),"
        "  waiter_ids: [...tr.querySelectorAll('.waiters .waiter')].map((e) => e.textContent),"
        "  marker: String(window.__marker)});";
    const std::string json = driver_->execute_string(script);
    if (json.empty()) return std::nullopt;
    std::string error;
    auto doc = parse_json(json, &error);
    if (!doc) return std::nullopt;
    Row row;
    row.owner = string_field(&*doc, "owner");
    row.token = string_field(&*doc, "token");
    row.countdown = string_field(&*doc, "countdown");
    row.waiters = string_field(&*doc, "waiters");
    row.marker = string_field(&*doc, "marker");
    if (const Json* ids = doc->get("waiter_ids")) {
      for (const auto& id : ids->array) row.waiter_ids.push_back(id.string);
    }
    return row;
  }
  // The hand-overs the page lists, as (mutex, from, to).
  std::vector<std::vector<std::string>> read_timeline() {
    const std::string json = driver_->execute_string(
        "return JSON.stringify([...document.querySelectorAll('#handovers li')]"
        ".map((li) => [li.dataset.mutex, li.dataset.from, li.dataset.to]));");
    std::vector<std::vector<std::string>> out;
    std::string error;
    auto doc = parse_json(json, &error);
    if (!doc) return out;
    for (const auto& item : doc->array) {
      std::vector<std::string> fields;
      for (const auto& f : item.array) fields.push_back(f.string);
      if (fields.size() == 3) out.push_back(fields);
    }
    return out;
  }

  const std::string mutex_ = "dash-demo";
  TempDir dir_;
  // Chromium's profile: in memory where /dev/shm is (see the session setup).
  TempDir profile_dir_{::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : ""};
  std::string profile_;
  std::unique_ptr<Subprocess> a_, b_, chromedriver_;
  Dashboard dashboard_;
  std::unique_ptr<WebDriver> driver_;
};

TEST_F(DashboardBrowser, ShowsOwnerCountdownWaitersAndHandOverLive) {
  const std::string kind = store_kind();
  if (kind == "memory") {
    GTEST_SKIP() << "memory:// lives in one process: `simba run` contenders in other processes "
                    "cannot share it, so there is nothing for a browser to watch (the dashboard "
                    "on memory:// is covered by DashboardServer.MemoryStoreIsEmpty)";
  }
  const std::string chromium = env("SIMBA_CHROMIUM", SIMBA_CHROMIUM_PATH);
  const std::string chromedriver = env("SIMBA_CHROMEDRIVER", SIMBA_CHROMEDRIVER_PATH);
  ASSERT_EQ(::access(chromium.c_str(), X_OK), 0)
      << "no Chromium at " << chromium
      << ": install Debian's chromium and chromium-driver (or set SIMBA_CHROMIUM)";
  ASSERT_EQ(::access(chromedriver.c_str(), X_OK), 0)
      << "no ChromeDriver at " << chromedriver
      << ": install Debian's chromium-driver (or set SIMBA_CHROMEDRIVER)";
  const std::string uri = store_uri_for(kind, dir_.path());
  ASSERT_FALSE(uri.empty());
  SCOPED_TRACE("store " + Uri::parse(uri)->to_string());
  RecordProperty("store", kind);

  // 0. The browser first: a Chromium start is seconds of CPU on a 2-core
  // machine, and while it overlapped the contenders' short leases it starved
  // them into losing them. Started before them, it only loads the page later.
  const int driver_port = free_port();
  ASSERT_GT(driver_port, 0);
  chromedriver_ = std::make_unique<Subprocess>(
      std::vector<std::string>{chromedriver, "--port=" + std::to_string(driver_port),
                               "--log-path=" + path("chromedriver.log")});
  ASSERT_TRUE(chromedriver_->started());
  driver_ = std::make_unique<WebDriver>(driver_port);
  ASSERT_TRUE(eventually([&] { return driver_->ready(); }, seconds(20)))
      << "chromedriver did not become ready\n"
      << read_file(path("chromedriver.log"));
  // The profile and cache in memory: Chromium writes a lot while it starts,
  // and on CI that disk traffic stalled the fsyncing Redis and etcd servers
  // the other tests (and this one's contenders) were using.
  profile_ = profile_dir_.path() + "/profile";
  std::string args;
  for (const std::string& arg : std::vector<std::string>{
           "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
           "--disable-background-networking", "--disable-sync", "--disable-default-apps",
           "--disable-component-update", "--disk-cache-dir=" + profile_dir_.path() + "/cache",
           "--user-data-dir=" + profile_}) {
    args += (args.empty() ? "" : ",") + json_string(arg);
  }
  std::string error;
  ASSERT_TRUE(
      driver_->new_session("{\"browserName\":\"chrome\",\"goog:chromeOptions\":{"
                           "\"binary\":" +
                               json_string(chromium) + ",\"args\":[" + args + "]}}",
                           &error))
      << error << "\n"
      << read_file(path("chromedriver.log"));

  // 1. A holds the mutex.
  a_ = start_contender(uri, "a");
  ASSERT_TRUE(eventually([&] { return !contender_id("a").empty(); }, seconds(20)))
      << "A never acquired " << mutex_;
  const std::string a_id = contender_id("a");

  // 2. B waits for it.
  b_ = start_contender(uri, "b");

  // 3. The dashboard.
  dashboard_ = start_dashboard(uri);
  ASSERT_GT(dashboard_.port, 0);
  const int port = dashboard_.port;
  std::optional<Json> state;
  ASSERT_TRUE(eventually(
      [&] {
        state = get_state(port);
        return state && string_field(find_mutex(*state, mutex_), "owner") == a_id;
      },
      seconds(15)))
      << "/api/state never showed A as the owner";
  const bool waiters_supported = state->get("waiters_supported")->boolean;
  RecordProperty("waiters_supported", waiters_supported ? "true" : "false");
  if (waiters_supported) {
    ASSERT_TRUE(eventually(
        [&] {
          state = get_state(port);
          const Json* m = state ? find_mutex(*state, mutex_) : nullptr;
          return m != nullptr && m->get("waiters")->type == Json::Type::kArray &&
                 !m->get("waiters")->array.empty();
        },
        seconds(15)))
        << "the store keeps a queue, but B never showed up in it";
  }
  EXPECT_EQ(contender_id("b"), "") << "B ran while A held the mutex";

  // 4. The page.
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/";
  ASSERT_TRUE(driver_->navigate(url, &error)) << error;

  // 5. The row: A's id, a token, a countdown that ticks, the waiters.
  std::optional<Row> row;
  ASSERT_TRUE(eventually(
      [&] {
        row = read_row();
        return row && row->owner == a_id;
      },
      seconds(15)))
      << "the page never showed A (" << a_id
      << ") as the owner; the row: " << (row ? row->owner : "none");
  ASSERT_TRUE(is_digits(row->token)) << row->token;
  const long long a_token = std::stoll(row->token);
  EXPECT_GT(a_token, 0);
  EXPECT_EQ(driver_->execute_string("return document.getElementById('store').textContent;"),
            Uri::parse(uri)->to_string());
  EXPECT_EQ(driver_->execute_string("return document.getElementById('transport').textContent;"),
            kind == "sqlite"     ? "local file"
            : kind == "postgres" ? "TLS if the server offers it (sslmode=prefer)"
                                 : "plain text");
  // The countdown changes between fetches (the page fetches every second and
  // ticks every 100 ms): read it over about a second.
  std::set<std::string> countdowns;
  for (int i = 0; i < 5; ++i) {
    const auto r = read_row();
    ASSERT_TRUE(r.has_value());
    EXPECT_TRUE(std::regex_match(r->countdown, std::regex(R"(\d+\.\d s|expired)"))) << r->countdown;
    countdowns.insert(r->countdown);
    std::this_thread::sleep_for(milliseconds(250));
  }
  EXPECT_GE(countdowns.size(), 2u) << "the countdown does not tick";
  std::vector<std::string> waiting;
  if (waiters_supported) {
    ASSERT_TRUE(eventually(
        [&] {
          row = read_row();
          return row && !row->waiter_ids.empty();
        },
        seconds(10)))
        << "the page lists no waiter: " << (row ? row->waiters : "no row");
    waiting = row->waiter_ids;
    EXPECT_EQ(std::count(waiting.begin(), waiting.end(), a_id), 0) << "the owner is waiting";
  } else {
    EXPECT_EQ(row->waiters, "store cannot tell");
  }

  // 6. Kill A; the same page (no reload) shows B taking over.
  auto marker = driver_->execute("window.__marker = 1; return window.__marker;", &error);
  ASSERT_TRUE(marker.has_value()) << error;
  a_->signal(SIGKILL);
  ASSERT_TRUE(a_->wait_for(scaled(seconds(10))).has_value());
  kill_pid_file(path("a.pid"));
  const auto killed = Clock::now();
  std::string b_id;
  ASSERT_TRUE(eventually(
      [&] {
        b_id = contender_id("b");
        row = read_row();
        return !b_id.empty() && row && row->owner == b_id;
      },
      kHandOverBound))
      << "the page did not show B (" << (b_id.empty() ? "not acquired" : b_id)
      << ") as the owner within " << kHandOverBound.count() << " ms; it shows "
      << (row ? row->owner : "no row");
  RecordProperty(
      "handover_shown_ms",
      std::to_string(std::chrono::duration_cast<milliseconds>(Clock::now() - killed).count()));
  EXPECT_EQ(row->marker, "1") << "the page was reloaded";
  ASSERT_TRUE(is_digits(row->token)) << row->token;
  EXPECT_GT(std::stoll(row->token), a_token);
  if (waiters_supported) {
    EXPECT_EQ(std::count(waiting.begin(), waiting.end(), b_id), 1)
        << "B (" << b_id << ") was not among the waiters shown";
  }
  // The timeline: A -> B, or A -> free -> B.
  const auto timeline = read_timeline();
  auto has = [&](const std::string& from, const std::string& to) {
    return std::any_of(timeline.begin(), timeline.end(),
                       [&](const auto& h) { return h[0] == mutex_ && h[1] == from && h[2] == to; });
  };
  EXPECT_TRUE(has(a_id, b_id) || (has(a_id, "") && has("", b_id)))
      << "the timeline does not show A -> B; it has " << timeline.size() << " entries";

  // 7. The API and the metrics, directly.
  state = get_state(port);
  ASSERT_TRUE(state.has_value());
  expect_well_formed_state(*state);
  const Json* m = find_mutex(*state, mutex_);
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->get("held")->boolean);
  EXPECT_EQ(string_field(m, "owner"), b_id);
  EXPECT_TRUE(state->get("error")->is_null());
  const HttpReply metrics = get(port, "/metrics");
  expect_well_formed_metrics(metrics);
  EXPECT_TRUE(contains(metrics.body, "simba_mutex_held{mutex=\"dash-demo\"} 1\n")) << metrics.body;
  EXPECT_TRUE(contains(metrics.body, "simba_dashboard_handovers_total{mutex=\"dash-demo\"} "))
      << metrics.body;
  if (waiters_supported) {
    EXPECT_TRUE(contains(metrics.body, "simba_mutex_waiters{mutex=\"dash-demo\"} "))
        << metrics.body;
  }

  // No password anywhere (the MySQL fixture's URI has one; the others have
  // none, and DashboardServer.MasksThePasswordAndShowsStoreErrors covers it).
  const auto parsed = Uri::parse(uri);
  if (parsed->password && !parsed->password->empty()) {
    const std::string& password = *parsed->password;
    const std::string dom = driver_->execute_string("return document.documentElement.outerHTML;");
    ASSERT_FALSE(dom.empty());
    EXPECT_TRUE(contains(dom, "****")) << "the page does not show the masked store";
    EXPECT_FALSE(contains(dom, password)) << "the page shows the password";
    EXPECT_FALSE(contains(get(port, "/api/state").body, password));
    EXPECT_FALSE(contains(metrics.body, password));
    EXPECT_FALSE(contains(dashboard_.line, password));
  }

  // 8. Teardown (the rest in TearDown): the session first.
  EXPECT_TRUE(driver_->delete_session());
}

}  // namespace
}  // namespace simba::testing
