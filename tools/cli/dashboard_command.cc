// simba dashboard: a live status page for operators (docs/cli.md).
//
// Two threads: a poller reads the store every --refresh (list(), then
// waiters() of each held mutex) and publishes an immutable Snapshot; the
// main thread serves HTTP (tools/cli/http_server.h) from the latest one, so
// a slow or hung store never holds up a page load.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "simba/registry.h"
#include "simba/uri.h"
#include "tools/cli/cli.h"
#include "tools/cli/dashboard_page.h"
#include "tools/cli/http_server.h"

namespace simba::cli {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The hand-overs kept (newest first).
constexpr std::size_t kMaxHandovers = 200;
// Per-mutex metric series are limited to the first this many mutexes by
// name; the rest are counted in simba_dashboard_mutexes_omitted.
constexpr std::size_t kMaxMetricMutexes = 1000;
// Every store call of one poll shares this deadline.
constexpr milliseconds kPollTimeout{5000};

long long wall_ms() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct MutexView {
  std::string mutex;
  bool held = false;
  std::string owner;  // "" when free
  std::uint64_t fencing_token = 0;
  // Relative to the store's time of the read; meaningful when held.
  // nullopt: the store cannot know (ZooKeeper's JVM participants).
  std::optional<long long> acquired_ms_ago;
  std::optional<long long> ttl_ends_in_ms;
  std::optional<long long> lease_ends_in_ms;
  // nullopt: the store cannot tell (or the call failed).
  std::optional<std::vector<std::string>> waiters;
};

struct Handover {
  std::string mutex;
  std::string from;                 // "" = free
  std::string to;                   // "" = freed
  std::uint64_t fencing_token = 0;  // the new owner's (0 when freed)
  long long at_ms = 0;              // wall clock, when the poll saw it
};

// What the page shows; immutable once published.
struct Snapshot {
  // The last good read: what `mutexes` come from.
  std::optional<long long> refreshed_at_ms;  // wall clock
  Clock::time_point refreshed_at;            // the same, monotonic
  std::optional<long long> polled_at_ms;     // the last poll, good or not
  std::string error;                         // the last poll's; "" when good
  bool waiters_supported = false;
  std::vector<MutexView> mutexes;                        // by name
  std::deque<Handover> handovers;                        // newest first
  std::map<std::string, std::uint64_t> handovers_total;  // listed mutexes only
  std::uint64_t polls_ok = 0;
  std::uint64_t polls_failed = 0;
};

// Reads the store every `refresh` on a thread of its own.
class Poller {
 public:
  Poller(std::shared_ptr<Backend> backend, std::string store, milliseconds refresh)
      : backend_(std::move(backend)),
        store_(std::move(store)),
        refresh_(refresh),
        snapshot_(std::make_shared<Snapshot>()) {}
  ~Poller() { stop(); }

  void start() {
    thread_ = std::thread([this] { run(); });
  }
  // Returns once the poll in progress (if any) has ended: at most
  // kPollTimeout.
  void stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  std::shared_ptr<const Snapshot> snapshot() const {
    std::lock_guard lock(mu_);
    return snapshot_;
  }

 private:
  void run() {
    auto next = Clock::now();
    for (;;) {
      poll();
      next = std::max(next + refresh_, Clock::now());
      std::unique_lock lock(mu_);
      if (cv_.wait_until(lock, next, [this] { return stop_; })) return;
    }
  }

  void poll() {
    const Deadline deadline = Clock::now() + kPollTimeout;
    auto next = std::make_shared<Snapshot>(*snapshot());
    next->polled_at_ms = wall_ms();
    auto listed = backend_->list(deadline);
    if (!listed.ok()) {
      next->error = store_error(store_, listed.status());
      ++next->polls_failed;
      publish(std::move(next));
      return;
    }
    std::sort(listed->begin(), listed->end(),
              [](const ListedMutex& a, const ListedMutex& b) { return a.mutex < b.mutex; });
    std::vector<MutexView> views;
    views.reserve(listed->size());
    for (const auto& l : *listed) {
      const MutexOwner& o = l.record.owner;
      const StoreTime now = l.record.store_now;
      MutexView v;
      v.mutex = l.mutex;
      v.held = l.record.held();
      v.fencing_token = o.fencing_token;
      if (v.held) {
        v.owner = o.owner_id;
        if (o.acquired_at.count() != 0) v.acquired_ms_ago = (now - o.acquired_at).count();
        if (!l.record.owner_times_unknown()) {
          v.ttl_ends_in_ms = (o.ttl_at - now).count();
          v.lease_ends_in_ms = (o.transition_at - now).count();
        }
      }
      views.push_back(std::move(v));
    }
    std::string error = ask_waiters(views, deadline);
    const long long now_ms = wall_ms();

    // Hand-overs since the last good read (none on the first: no baseline).
    std::map<std::string, std::pair<std::string, std::uint64_t>> owners;
    for (const auto& v : views) owners[v.mutex] = {v.owner, v.held ? v.fencing_token : 0};
    if (have_previous_) {
      auto record = [&](const std::string& mutex, const std::string& from, const std::string& to,
                        std::uint64_t token) {
        next->handovers.push_front(Handover{mutex, from, to, token, now_ms});
        ++next->handovers_total[mutex];
      };
      for (const auto& [mutex, now_owner] : owners) {
        const auto it = previous_.find(mutex);
        const auto before =
            it == previous_.end() ? std::pair<std::string, std::uint64_t>() : it->second;
        if (before.first != now_owner.first ||
            (!now_owner.first.empty() && before.second != now_owner.second)) {
          record(mutex, before.first, now_owner.first, now_owner.second);
        }
      }
      for (const auto& [mutex, before] : previous_) {
        if (!before.first.empty() && owners.count(mutex) == 0) record(mutex, before.first, "", 0);
      }
      while (next->handovers.size() > kMaxHandovers) next->handovers.pop_back();
    }
    previous_ = std::move(owners);
    have_previous_ = true;
    for (auto it = next->handovers_total.begin(); it != next->handovers_total.end();) {
      it = previous_.count(it->first) == 0 ? next->handovers_total.erase(it) : std::next(it);
    }

    next->mutexes = std::move(views);
    next->refreshed_at_ms = now_ms;
    next->refreshed_at = Clock::now();
    next->error = std::move(error);
    next->waiters_supported = waiters_supported_.value_or(false);
    ++(next->error.empty() ? next->polls_ok : next->polls_failed);
    publish(std::move(next));
  }

  // Fills the waiters of each held mutex (an empty list for free ones) on
  // stores that can tell. Returns the error of a failed call ("" if none).
  std::string ask_waiters(std::vector<MutexView>& views, Deadline deadline) {
    // A store that cannot tell says so for any mutex: learn it once.
    if (!waiters_supported_.has_value() && !views.empty()) {
      auto probe = backend_->waiters(views.front().mutex, deadline);
      if (probe.ok()) {
        waiters_supported_ = true;
      } else if (probe.status().code() == StatusCode::kUnimplemented) {
        waiters_supported_ = false;
      } else {
        return store_error(store_, probe.status());
      }
    }
    if (!waiters_supported_.value_or(false)) return "";
    for (auto& v : views) {
      if (!v.held) {
        v.waiters.emplace();
        continue;
      }
      auto waiters = backend_->waiters(v.mutex, deadline);
      if (!waiters.ok()) return store_error(store_, waiters.status());  // the rest stay unknown
      v.waiters = std::move(*waiters);
    }
    return "";
  }

  void publish(std::shared_ptr<Snapshot> next) {
    std::lock_guard lock(mu_);
    snapshot_ = std::move(next);
  }

  const std::shared_ptr<Backend> backend_;
  const std::string store_;
  const milliseconds refresh_;
  // The poller thread's own.
  std::map<std::string, std::pair<std::string, std::uint64_t>> previous_;  // owner, token
  bool have_previous_ = false;
  std::optional<bool> waiters_supported_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                         // guarded by mu_
  std::shared_ptr<const Snapshot> snapshot_;  // guarded by mu_
  std::thread thread_;
};

// Everything the handler needs to render.
struct Site {
  std::string store;  // masked
  std::string scheme;
  // Capabilities::transport: "plain text", "TLS (verify)", ...
  std::string transport;
  milliseconds refresh;
  // The raw password (when the URI has one), scrubbed from store errors in
  // case a backend's message quoted it.
  std::string password;
  Poller* poller;
};

std::string scrub(std::string text, const std::string& password) {
  // A password of one or two characters would mangle every message; the
  // backends do not quote passwords anyway (this is a second line).
  if (password.size() < 3) return text;
  for (auto at = text.find(password); at != std::string::npos; at = text.find(password, at)) {
    text.replace(at, password.size(), "****");
  }
  return text;
}

std::string json_ms(const std::optional<long long>& ms) {
  return ms ? std::to_string(*ms) : "null";
}

long long ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t).count();
}

std::string state_json(const Site& site, const Snapshot& s) {
  std::string out =
      "{\"store\":" + json_string(site.store) + ",\"scheme\":" + json_string(site.scheme) +
      ",\"transport\":" + json_string(site.transport) +
      ",\"refresh_ms\":" + std::to_string(site.refresh.count()) +
      ",\"served_at_ms\":" + std::to_string(wall_ms()) +
      ",\"polled_at_ms\":" + json_ms(s.polled_at_ms) +
      ",\"refreshed_at_ms\":" + json_ms(s.refreshed_at_ms) + ",\"refreshed_ms_ago\":" +
      (s.refreshed_at_ms ? std::to_string(ms_since(s.refreshed_at)) : "null") +
      ",\"error\":" + (s.error.empty() ? "null" : json_string(scrub(s.error, site.password))) +
      ",\"waiters_supported\":" + (s.waiters_supported ? "true" : "false") + ",\"mutexes\":[";
  for (std::size_t i = 0; i < s.mutexes.size(); ++i) {
    const MutexView& m = s.mutexes[i];
    auto relative = [&](std::optional<long long> v) {
      return m.held && v ? std::to_string(*v) : "null";
    };
    out += i == 0 ? "{" : ",{";
    out += "\"mutex\":" + json_string(m.mutex) + ",\"held\":" + (m.held ? "true" : "false") +
           ",\"owner\":" + json_string(m.owner) +
           ",\"fencing_token\":" + std::to_string(m.fencing_token) +
           ",\"acquired_ms_ago\":" + relative(m.acquired_ms_ago) +
           ",\"ttl_ends_in_ms\":" + relative(m.ttl_ends_in_ms) +
           ",\"lease_ends_in_ms\":" + relative(m.lease_ends_in_ms) + ",\"waiters\":";
    if (m.waiters) {
      out += "[";
      for (std::size_t w = 0; w < m.waiters->size(); ++w) {
        out += (w == 0 ? "" : ",") + json_string((*m.waiters)[w]);
      }
      out += "]";
    } else {
      out += "null";
    }
    out += "}";
  }
  out += "],\"handovers\":[";
  for (std::size_t i = 0; i < s.handovers.size(); ++i) {
    const Handover& h = s.handovers[i];
    out += (i == 0 ? "{" : ",{");
    out += "\"mutex\":" + json_string(h.mutex) + ",\"from\":" + json_string(h.from) +
           ",\"to\":" + json_string(h.to) +
           ",\"fencing_token\":" + std::to_string(h.fencing_token) +
           ",\"at_ms\":" + std::to_string(h.at_ms) + "}";
  }
  out += "]}\n";
  return out;
}

// Prometheus text format 0.0.4.
std::string label_value(const std::string& v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string metrics(const Site& site, const Snapshot& s) {
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  auto sample = [&](const std::string& name, const std::string& labels, const std::string& v) {
    out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + v + "\n";
  };
  family("simba_dashboard_info", "gauge", "The store the dashboard reads (password masked).");
  sample("simba_dashboard_info",
         "store=\"" + label_value(site.store) + "\",scheme=\"" + label_value(site.scheme) +
             "\",transport=\"" + label_value(site.transport) + "\"",
         "1");
  family("simba_store_up", "gauge", "1 if the last poll of the store succeeded, else 0.");
  sample("simba_store_up", "", s.polled_at_ms && s.error.empty() ? "1" : "0");
  family("simba_store_last_success_timestamp_seconds", "gauge",
         "Wall-clock time of the last good read of the store.");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f",
                static_cast<double>(s.refreshed_at_ms.value_or(0)) / 1000.0);
  sample("simba_store_last_success_timestamp_seconds", "", buf);
  family("simba_dashboard_polls_total", "counter", "Polls of the store, by result.");
  sample("simba_dashboard_polls_total", "result=\"ok\"", std::to_string(s.polls_ok));
  sample("simba_dashboard_polls_total", "result=\"error\"", std::to_string(s.polls_failed));
  family("simba_store_waiters_supported", "gauge",
         "1 if the store can tell who waits for a mutex.");
  sample("simba_store_waiters_supported", "", s.waiters_supported ? "1" : "0");
  std::size_t held = 0;
  for (const auto& m : s.mutexes) held += m.held ? 1 : 0;
  family("simba_mutexes", "gauge", "Mutexes the store has a record of, by state.");
  sample("simba_mutexes", "state=\"held\"", std::to_string(held));
  sample("simba_mutexes", "state=\"free\"", std::to_string(s.mutexes.size() - held));
  const std::size_t shown = std::min(s.mutexes.size(), kMaxMetricMutexes);
  family("simba_dashboard_mutexes_omitted", "gauge",
         "Mutexes beyond the first 1000 by name, which have no per-mutex series.");
  sample("simba_dashboard_mutexes_omitted", "", std::to_string(s.mutexes.size() - shown));

  const long long age = s.refreshed_at_ms ? ms_since(s.refreshed_at) : 0;
  auto per_mutex = [&](const char* name, const char* type, const char* help,
                       const std::function<std::optional<std::string>(const MutexView&)>& value) {
    family(name, type, help);
    for (std::size_t i = 0; i < shown; ++i) {
      const MutexView& m = s.mutexes[i];
      if (auto v = value(m)) sample(name, "mutex=\"" + label_value(m.mutex) + "\"", *v);
    }
  };
  per_mutex("simba_mutex_held", "gauge", "1 if the mutex has an owner whose lease has not ended.",
            [](const MutexView& m) { return std::string(m.held ? "1" : "0"); });
  per_mutex("simba_mutex_fencing_token", "gauge", "The fencing token of the mutex's record.",
            [](const MutexView& m) { return std::to_string(m.fencing_token); });
  per_mutex("simba_mutex_lease_seconds_left", "gauge",
            "Seconds left of the owner's lease (ttl + transition); 0 when free.",
            [&](const MutexView& m) -> std::optional<std::string> {
              if (m.held && !m.lease_ends_in_ms) return std::nullopt;  // unknown
              const long long left = m.held ? std::max(0LL, *m.lease_ends_in_ms - age) : 0;
              char v[32];
              std::snprintf(v, sizeof v, "%.3f", static_cast<double>(left) / 1000.0);
              return std::string(v);
            });
  if (s.waiters_supported) {
    per_mutex("simba_mutex_waiters", "gauge", "Contenders waiting for the mutex.",
              [](const MutexView& m) -> std::optional<std::string> {
                if (!m.waiters) return std::nullopt;
                return std::to_string(m.waiters->size());
              });
  }
  per_mutex("simba_dashboard_handovers_total", "counter",
            "Changes of owner (including to free) the dashboard saw since it started.",
            [&](const MutexView& m) {
              const auto it = s.handovers_total.find(m.mutex);
              return std::to_string(it == s.handovers_total.end() ? 0 : it->second);
            });
  return out;
}

HttpResponse handle(const Site& site, const HttpRequest& request) {
  const bool known =
      request.path == "/" || request.path == "/api/state" || request.path == "/metrics";
  HttpResponse r;
  if (!known) {
    r.status = 404;
    r.body = "not found; try / or /api/state or /metrics\n";
    return r;
  }
  if (request.method != "GET" && request.method != "HEAD") {
    r.status = 405;
    r.body = "only GET and HEAD\n";
    r.headers.emplace_back("Allow", "GET, HEAD");
    return r;
  }
  const auto snapshot = site.poller->snapshot();
  if (request.path == "/") {
    r.content_type = "text/html; charset=utf-8";
    r.body = kDashboardPage;
    r.headers.emplace_back("Content-Security-Policy",
                           "default-src 'none'; script-src 'unsafe-inline'; "
                           "style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; "
                           "form-action 'none'; frame-ancestors 'none'");
    r.headers.emplace_back("Referrer-Policy", "no-referrer");
  } else if (request.path == "/api/state") {
    r.content_type = "application/json";
    r.body = state_json(site, *snapshot);
  } else {
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = metrics(site, *snapshot);
  }
  return r;
}

std::atomic<HttpServer*> g_server{nullptr};

void on_stop_signal(int) {
  if (HttpServer* server = g_server.load()) server->stop();
}

}  // namespace

int dashboard_command(const std::vector<std::string>& argv) {
  FlagSpec spec;
  spec.with_value = {"--store", "--listen", "--refresh"};
  auto parsed = parse_args(argv, spec);
  auto usage = [](const std::string& message) {
    print_error(message + " (see 'simba dashboard --help')");
    return kExitUsage;
  };
  if (!parsed.ok()) return usage(parsed.status().message());
  const Args& args = *parsed;
  if (args.has("--help")) {
    std::fputs(help_for("dashboard"), stdout);
    return kExitOk;
  }
  auto store = store_uri(args);
  if (!store.ok()) return usage(store.status().message());
  auto uri = Uri::parse(*store);
  if (!uri.ok()) return usage("--store: " + uri.status().message());
  auto refresh = args.duration("--refresh", std::chrono::seconds(1));
  if (!refresh.ok()) return usage(refresh.status().message());
  if (refresh->count() <= 0) return usage("--refresh must be > 0");
  auto listen = parse_listen_address(args.value("--listen").value_or("127.0.0.1:8080"));
  if (!listen.ok()) return usage(listen.status().message());

  Site site;
  site.store = uri->to_string();
  site.scheme = uri->scheme;
  site.refresh = *refresh;
  site.password = uri->password.value_or("");

  auto backend = open_backend(*store);
  if (!backend.ok()) {
    print_error(scrub(store_error(*store, backend.status()), site.password));
    return exit_code_for(backend.status());
  }
  site.transport = (*backend)->capabilities().transport;
  Poller poller(*backend, *store, *refresh);
  site.poller = &poller;

  HttpServer server([&site](const HttpRequest& request) { return handle(site, request); });
  if (Status s = server.listen(listen->first, listen->second); !s.ok()) {
    print_error(s.message());
    return s.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitUnavailable;
  }
  if (!server.loopback()) {
    print_error("warning: the dashboard has no authentication; anyone who can reach " +
                listen->first + ":" + std::to_string(server.port()) +
                " sees the store's mutexes and owners");
  }

  // SIGINT/SIGTERM end serve(); a client going away must not kill us.
  g_server.store(&server);
  struct sigaction stop {};
  stop.sa_handler = on_stop_signal;
  sigemptyset(&stop.sa_mask);
  ::sigaction(SIGINT, &stop, nullptr);
  ::sigaction(SIGTERM, &stop, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  const std::string host =
      listen->first.find(':') != std::string::npos ? "[" + listen->first + "]" : listen->first;
  std::printf("simba: dashboard for %s at http://%s:%u/\n", site.store.c_str(), host.c_str(),
              static_cast<unsigned>(server.port()));
  std::fflush(stdout);

  poller.start();
  server.serve();
  g_server.store(nullptr);
  poller.stop();
  return kExitOk;
}

}  // namespace simba::cli
