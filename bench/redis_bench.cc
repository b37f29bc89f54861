// simba-bench-redis: latency of Simba's Redis backend against the store's own
// round trips. A plain program (no benchmark framework): every figure is N
// timed iterations after a warm-up, reported as median / p90 / p99 in
// microseconds. See docs/benchmarks.md for what each row means and
// scripts/bench.sh for how it is run.
//
//   simba-bench-redis [options] URI
//     --iterations N      timed iterations of the latency rows (default 2000)
//     --warmup N          untimed iterations before each row (default 200)
//     --handoffs N        hand-offs timed per hand-off row (default 200)
//     --renew-mutexes N   mutexes of the renewal test; 0 skips it (default 10000)
//     --renew-seconds S   how long the factory renewal test watches (default 3)
//     --only LIST         run only these groups (comma-separated): wake, raw,
//                         backend, locker, handoff, child, renew (default all)
//
// The URI should carry restart_guard=off when the server was just started
// (see scripts/bench.sh). The exit status is non-zero only on errors (a store
// call that fails, a hand-off that never happens), never on a slow figure.
//
// Internal: `simba-bench-redis --child-waiter URI MUTEX` is the waiter
// process of the cross-process hand-off, driven through stdin/stdout.

#include <hiredis/hiredis.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backends/redis/redis_scripts.h"  // the raw-script baseline runs Simba's own Lua
#include "simba/backend.h"
#include "simba/backends/redis.h"
#include "simba/contend_service.h"
#include "simba/locker.h"
#include "simba/registry.h"
#include "simba/uri.h"

extern char** environ;

namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Any failure of the benchmark itself (not a slow figure): reported, exit 1.
struct BenchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename T>
T check(simba::Result<T> result, const std::string& what) {
  if (!result.ok()) throw BenchError(what + ": " + result.status().to_string());
  return std::move(result).value();
}
void check(const simba::Status& status, const std::string& what) {
  if (!status.ok()) throw BenchError(what + ": " + status.to_string());
}

double micros_since(SteadyClock::time_point start, SteadyClock::time_point end) {
  return std::chrono::duration<double, std::micro>(end - start).count();
}

struct Settings {
  std::string uri;
  int iterations = 2000;
  int warmup = 200;
  int handoffs = 200;
  int renew_mutexes = 10000;
  int renew_seconds = 3;
  // Groups to run; empty: all.
  std::vector<std::string> only;
  bool want(const std::string& group) const {
    return only.empty() || std::find(only.begin(), only.end(), group) != only.end();
  }
};

// ---------------------------------------------------------------------------
// Results.

struct Row {
  std::string name;
  std::vector<double> us;
};

double percentile(std::vector<double> sorted, double p) {
  if (sorted.empty()) return 0;
  std::sort(sorted.begin(), sorted.end());
  // Nearest rank.
  const auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}
double median(const std::vector<double>& v) { return percentile(v, 0.5); }

// Rows in the order they are printed (a deque: rows are referenced by
// pointer while others are added).
std::deque<Row> g_rows;
std::vector<std::string> g_notes;
// Wrong answers from the library (not slowness): each is noted, the
// iteration is left out of the figures, and the program exits non-zero.
int g_wrong_answers = 0;

Row* add_row(std::string name) {
  g_rows.push_back(Row{std::move(name), {}});
  return &g_rows.back();
}

void note(const std::string& line) {
  g_notes.push_back(line);
  std::fprintf(stderr, "  %s\n", line.c_str());
}

void print_table() {
  std::printf("\n%-52s %6s %9s %9s %9s\n", "benchmark (microseconds)", "n", "median", "p90", "p99");
  std::printf("%s\n", std::string(89, '-').c_str());
  for (const Row& row : g_rows) {
    if (row.us.empty()) continue;
    std::printf("%-52s %6zu %9.1f %9.1f %9.1f\n", row.name.c_str(), row.us.size(), median(row.us),
                percentile(row.us, 0.90), percentile(row.us, 0.99));
  }
  std::printf("\n");
  for (const std::string& note : g_notes) std::printf("%s\n", note.c_str());
  std::fflush(stdout);
}

const Row* find_row(const std::string& name) {
  for (const Row& row : g_rows) {
    if (row.name == name && !row.us.empty()) return &row;
  }
  return nullptr;
}

// One benchmark: `once` runs one iteration and returns its figures, one per
// row (so set-up and clean-up inside an iteration stay out of them).
struct Case {
  std::vector<Row*> rows;
  int iterations = 0;
  int warmup = 0;
  std::function<std::vector<double>()> once;
};

// Runs every case's warm-up, then the timed iterations in rounds: each round
// runs a slice of every case in turn, so a slow spell of the machine (this is
// a shared 2-core VM) spreads over all rows instead of landing on one.
void run_interleaved(std::vector<Case>& cases, int rounds) {
  for (Case& c : cases) {
    for (int i = 0; i < c.warmup; ++i) c.once();
  }
  for (int r = 0; r < rounds; ++r) {
    for (Case& c : cases) {
      const int from = c.iterations * r / rounds;
      const int to = c.iterations * (r + 1) / rounds;
      for (int i = from; i < to; ++i) {
        const std::vector<double> figures = c.once();
        // No figures: the iteration went wrong in a way already reported.
        if (figures.empty()) continue;
        for (std::size_t k = 0; k < c.rows.size(); ++k) c.rows[k]->us.push_back(figures[k]);
      }
    }
    std::fprintf(stderr, "  round %d/%d done\n", r + 1, rounds);
  }
}

// ---------------------------------------------------------------------------
// Raw hiredis: the store's own round trips.

struct RedisContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using RawContext = std::unique_ptr<redisContext, RedisContextDeleter>;
using RawReply = std::unique_ptr<redisReply, ReplyDeleter>;

RawReply raw_command(redisContext* c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<std::size_t> lengths;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lengths.push_back(a.size());
  }
  RawReply reply(static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lengths.data())));
  if (!reply) throw BenchError("hiredis: " + args[0] + ": " + c->errstr);
  if (reply->type == REDIS_REPLY_ERROR) {
    throw BenchError("hiredis: " + args[0] + ": " + std::string(reply->str, reply->len));
  }
  return reply;
}

RawContext raw_connect(const simba::RedisOptions& options) {
  const timeval timeout{3, 0};
  RawContext c(redisConnectWithTimeout(options.host.c_str(), options.port, timeout));
  if (!c || c->err) {
    throw BenchError("hiredis: cannot connect to " + options.host + ":" +
                     std::to_string(options.port) + (c ? std::string(": ") + c->errstr : ""));
  }
  // hiredis sets TCP_NODELAY on TCP connections itself, as Simba does.
  if (!options.password.empty()) {
    if (options.user.empty()) {
      raw_command(c.get(), {"AUTH", options.password});
    } else {
      raw_command(c.get(), {"AUTH", options.user, options.password});
    }
  }
  if (options.database != 0) raw_command(c.get(), {"SELECT", std::to_string(options.database)});
  return c;
}

std::string unique(const std::string& what) {
  return "bench-" + what + "-" + std::to_string(getpid());
}

// Every case keeps its connections, factories and services in a shared
// state that its `once` owns, so all cases stay set up while they take turns.

std::vector<double> us(std::initializer_list<double> values) { return values; }

void add_raw_cases(const Settings& s, const simba::RedisOptions& options,
                   std::vector<Case>& cases) {
  struct Raw {
    RawContext c;
    RawContext sub;
    RawContext waiter;
    RawContext waiter_sub;
    std::string key;
    std::string channel;
    std::string acquire_sha;
    std::string release_sha;
    std::vector<std::string> keys;
    std::string lock;

    std::string acquire(redisContext* ctx, const std::string& id) const {
      std::vector<std::string> args = {"EVALSHA", acquire_sha, "3"};
      args.insert(args.end(), keys.begin(), keys.end());
      args.insert(args.end(), {id, "10000", "6000", "0"});
      RawReply r = raw_command(ctx, args);
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 7) {
        throw BenchError("raw acquire script: unexpected reply");
      }
      return std::string(r->element[0]->str, r->element[0]->len);
    }
    bool release(redisContext* ctx, const std::string& id) const {
      std::vector<std::string> args = {"EVALSHA", release_sha, "3"};
      args.insert(args.end(), keys.begin(), keys.end());
      args.push_back(id);
      RawReply r = raw_command(ctx, args);
      if (r->type != REDIS_REPLY_INTEGER) throw BenchError("raw release script: unexpected reply");
      return r->integer == 1;
    }
    static void read_message(redisContext* ctx) {
      void* out = nullptr;
      if (redisGetReply(ctx, &out) != REDIS_OK || out == nullptr) {
        throw BenchError(std::string("hiredis: reading a pushed message: ") + ctx->errstr);
      }
      RawReply r(static_cast<redisReply*>(out));
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 3) {
        throw BenchError("hiredis: unexpected pushed message");
      }
    }
  };
  auto raw = std::make_shared<Raw>();
  raw->c = raw_connect(options);
  raw->key = "bench:raw:" + std::to_string(getpid());
  // Simba's own Lua scripts sent straight through hiredis: the server's share
  // of an acquire + release, without the backend's client-side work.
  raw->acquire_sha = raw_command(raw->c.get(), {"SCRIPT", "LOAD",
                                                std::string(simba::internal::redis::kLuaPrelude) +
                                                    simba::internal::redis::kLuaAcquire})
                         ->str;
  raw->release_sha = raw_command(raw->c.get(), {"SCRIPT", "LOAD",
                                                std::string(simba::internal::redis::kLuaPrelude) +
                                                    simba::internal::redis::kLuaRelease})
                         ->str;
  raw->lock = "benchraw:{" + unique("raw") + "}";
  raw->keys = {raw->lock, raw->lock + ":contender", raw->lock + ":fence"};
  raw->sub = raw_connect(options);
  raw->channel = "bench:chan:" + std::to_string(getpid());
  raw_command(raw->sub.get(), {"SUBSCRIBE", raw->channel});
  raw->waiter = raw_connect(options);
  raw->waiter_sub = raw_connect(options);
  raw_command(raw->waiter_sub.get(), {"SUBSCRIBE", raw->lock + ":waiter"});

  cases.push_back(Case{{add_row("raw PING")}, s.iterations, s.warmup, [raw] {
                         const auto t0 = SteadyClock::now();
                         RawReply r = raw_command(raw->c.get(), {"PING"});
                         return us({micros_since(t0, SteadyClock::now())});
                       }});
  cases.push_back(Case{
      {add_row("raw SET NX PX + DEL")}, s.iterations, s.warmup, [raw] {
        const auto t0 = SteadyClock::now();
        RawReply set = raw_command(raw->c.get(), {"SET", raw->key, "holder", "NX", "PX", "16000"});
        RawReply del = raw_command(raw->c.get(), {"DEL", raw->key});
        const auto t1 = SteadyClock::now();
        if (set->type != REDIS_REPLY_STATUS || del->type != REDIS_REPLY_INTEGER ||
            del->integer != 1) {
          throw BenchError("raw SET NX PX + DEL: unexpected reply");
        }
        return us({micros_since(t0, t1)});
      }});
  cases.push_back(
      Case{{add_row("raw EVALSHA simba acquire + release scripts")}, s.iterations, s.warmup, [raw] {
             const auto t0 = SteadyClock::now();
             const std::string outcome = raw->acquire(raw->c.get(), "holder");
             const bool released = raw->release(raw->c.get(), "holder");
             const auto t1 = SteadyClock::now();
             if (outcome != "acquired" || !released) {
               throw BenchError("raw scripts: expected acquired + released, got " + outcome);
             }
             return us({micros_since(t0, t1)});
           }});
  // Pub/sub: PUBLISH on one connection until the message is read on another.
  cases.push_back(
      Case{{add_row("raw PUBLISH -> message read by subscriber")}, s.iterations, s.warmup, [raw] {
             const auto t0 = SteadyClock::now();
             RawReply r = raw_command(raw->c.get(), {"PUBLISH", raw->channel, "released@@x"});
             Raw::read_message(raw->sub.get());
             return us({micros_since(t0, SteadyClock::now())});
           }});
  // The protocol's floor for a hand-off, in one thread without any of the
  // library's threads: the holder's release script publishes to the queued
  // waiter's channel, the waiter reads it and runs the acquire script.
  cases.push_back(Case{
      {add_row("raw scripts hand-off (release->push->acquire)")}, s.iterations, s.warmup, [raw] {
        if (raw->acquire(raw->c.get(), "holder") != "acquired" ||
            raw->acquire(raw->waiter.get(), "waiter") != "held") {
          throw BenchError("raw hand-off: unexpected set-up");
        }
        const auto t0 = SteadyClock::now();
        raw->release(raw->c.get(), "holder");
        Raw::read_message(raw->waiter_sub.get());
        const std::string outcome = raw->acquire(raw->waiter.get(), "waiter");
        const auto t1 = SteadyClock::now();
        if (outcome != "acquired" || !raw->release(raw->waiter.get(), "waiter")) {
          throw BenchError("raw hand-off: the waiter did not acquire (" + outcome + ")");
        }
        return us({micros_since(t0, t1)});
      }});
}

// The machine's own cost of handing work to another thread (a
// condition_variable notify until the waiting thread runs): the library
// moves each attempt across a few threads, and each such step costs this.
void add_wake_case(const Settings& s, std::vector<Case>& cases) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool go = false;
    bool done = false;
    bool stop = false;
    SteadyClock::time_point woke{};
    std::thread thread;
    ~State() {
      {
        std::lock_guard<std::mutex> lock(mu);
        stop = true;
      }
      cv.notify_all();
      thread.join();
    }
  };
  auto st = std::make_shared<State>();
  st->thread = std::thread([raw = st.get()] {
    std::unique_lock<std::mutex> lock(raw->mu);
    for (;;) {
      raw->cv.wait(lock, [&] { return raw->go || raw->stop; });
      if (raw->stop) return;
      raw->woke = SteadyClock::now();
      raw->go = false;
      raw->done = true;
      raw->cv.notify_all();
    }
  });
  cases.push_back(
      Case{{add_row("thread wake-up (condition_variable notify)")}, s.iterations, s.warmup, [st] {
             const auto t0 = SteadyClock::now();
             {
               std::lock_guard<std::mutex> lock(st->mu);
               st->go = true;
               st->done = false;
             }
             st->cv.notify_all();
             std::unique_lock<std::mutex> lock(st->mu);
             st->cv.wait(lock, [&] { return st->done; });
             return us({micros_since(t0, st->woke)});
           }});
}

// The server's own time per command (INFO commandstats), to tell the
// server's share of a figure from the network's and the client's.
void reset_server_stats(const simba::RedisOptions& options) {
  RawContext c = raw_connect(options);
  raw_command(c.get(), {"CONFIG", "RESETSTAT"});
}

void note_server_stats(const simba::RedisOptions& options) {
  RawContext c = raw_connect(options);
  RawReply info = raw_command(c.get(), {"INFO", "commandstats"});
  std::istringstream lines(std::string(info->str, info->len));
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    for (const char* command : {"ping", "set", "del", "evalsha", "publish"}) {
      const std::string prefix = std::string("cmdstat_") + command + ":";
      if (line.rfind(prefix, 0) != 0) continue;
      // calls=N,usec=N,usec_per_call=X,...
      std::string calls;
      std::string per_call;
      std::istringstream fields(line.substr(prefix.size()));
      for (std::string field; std::getline(fields, field, ',');) {
        if (field.rfind("calls=", 0) == 0) calls = field.substr(6);
        if (field.rfind("usec_per_call=", 0) == 0) per_call = field.substr(14);
      }
      note("server time per call (INFO commandstats): " + std::string(command) + " " + per_call +
           " us over " + calls + " calls (commands inside scripts count too)");
    }
  }
}

// ---------------------------------------------------------------------------
// Through the library.

simba::AcquireRequest request_for(const std::string& mutex, const std::string& id) {
  return simba::AcquireRequest{mutex, id, milliseconds(10000), milliseconds(6000)};
}

simba::Deadline call_deadline() { return SteadyClock::now() + std::chrono::seconds(3); }

void add_backend_cases(const Settings& s, std::vector<Case>& cases) {
  std::shared_ptr<simba::Backend> backend =
      check(simba::open_backend(s.uri), "opening the backend");
  const std::string mutex = unique("spi");
  const std::string renewed = unique("spi-renewed");
  const std::string id = "bench-holder";
  cases.push_back(
      Case{{add_row("backend acquire_or_renew (free mutex)"), add_row("backend release"),
            add_row("backend acquire_or_renew + release")},
           s.iterations,
           s.warmup,
           [backend, mutex, id] {
             const auto t0 = SteadyClock::now();
             auto acquired = backend->acquire_or_renew(request_for(mutex, id), call_deadline());
             const auto t1 = SteadyClock::now();
             auto released = backend->release(mutex, id, call_deadline());
             const auto t2 = SteadyClock::now();
             if (!check(std::move(acquired), "acquire_or_renew").owner.is_owner(id)) {
               throw BenchError("acquire_or_renew: a free mutex was not acquired");
             }
             if (!check(std::move(released), "release")) throw BenchError("release: not released");
             return us({micros_since(t0, t1), micros_since(t1, t2), micros_since(t0, t2)});
           }});
  check(backend->acquire_or_renew(request_for(renewed, id), call_deadline()), "acquire_or_renew");
  cases.push_back(Case{{add_row("backend acquire_or_renew (renewal)")},
                       s.iterations,
                       s.warmup,
                       [backend, renewed, id] {
                         const auto t0 = SteadyClock::now();
                         auto result =
                             backend->acquire_or_renew(request_for(renewed, id), call_deadline());
                         const auto t1 = SteadyClock::now();
                         if (!check(std::move(result), "renewal").owner.is_owner(id)) {
                           throw BenchError("renewal: lost the mutex");
                         }
                         return us({micros_since(t0, t1)});
                       }});
}

void add_locker_case(const Settings& s, std::vector<Case>& cases) {
  struct State {
    std::unique_ptr<simba::MutexContendServiceFactory> factory;
    std::unique_ptr<simba::Locker> locker;
    ~State() { locker.reset(); }  // before its factory
  };
  auto state = std::make_shared<State>();
  simba::FactoryOptions options;
  options.contend.ttl = milliseconds(10000);
  options.contend.transition = milliseconds(6000);
  state->factory =
      check(simba::MutexContendServiceFactory::open(s.uri, options), "opening a factory");
  state->locker =
      check(simba::Locker::create(*state->factory, unique("locker")), "creating a locker");
  cases.push_back(
      Case{{add_row("Locker try_acquire (free mutex)"), add_row("Locker release"),
            add_row("Locker try_acquire + release")},
           s.iterations,
           s.warmup,
           [state] {
             const auto t0 = SteadyClock::now();
             auto held = state->locker->try_acquire();
             const auto t1 = SteadyClock::now();
             simba::Status released = state->locker->release();
             const auto t2 = SteadyClock::now();
             check(released, "Locker::release");
             if (!check(std::move(held), "try_acquire")) {
               // Nobody else uses this mutex: "busy" is a wrong answer. Noted, left
               // out of the figures; the run goes on so the other rows still come.
               if (g_wrong_answers++ < 5) {
                 note("WRONG ANSWER: Locker::try_acquire returned false (busy) on a free mutex");
               }
               return std::vector<double>{};
             }
             return us({micros_since(t0, t1), micros_since(t1, t2), micros_since(t0, t2)});
           }});
}

// A contender that records what it is told, for the hand-off rows.
class Probe final : public simba::MutexContender {
 public:
  Probe(std::string mutex, std::string id) : MutexContender(std::move(mutex), std::move(id)) {}

  void on_owner(const simba::MutexState& state) override {
    const auto now = SteadyClock::now();
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_owner_ = state.after.owner_id;
      if (state.is_acquired(contender_id())) {
        ++acquisitions_;
        acquired_at_ = now;
      }
    }
    cv_.notify_all();
  }

  void reset() {
    std::lock_guard<std::mutex> lock(mu_);
    last_owner_.clear();
  }
  int acquisitions() const {
    std::lock_guard<std::mutex> lock(mu_);
    return acquisitions_;
  }
  // Waits until the service has applied `owner` as the owner.
  bool wait_owner(const std::string& owner, milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return last_owner_ == owner; });
  }
  // Waits for acquisition number `n`; returns when it was reported.
  std::optional<SteadyClock::time_point> wait_acquisition(int n, milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return acquisitions_ >= n; })) return std::nullopt;
    return acquired_at_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string last_owner_;
  int acquisitions_ = 0;
  SteadyClock::time_point acquired_at_{};
};

// Far below the poll a waiter that missed the push would fall back to (the
// end of the holder's lease, ttl + transition = 16 s): a hand-off that takes
// this long is reported as an error.
constexpr milliseconds kHandoffTimeout{5000};

simba::FactoryOptions handoff_options() {
  simba::FactoryOptions options;
  options.contend.ttl = milliseconds(10000);
  options.contend.transition = milliseconds(6000);
  return options;
}

struct Member {
  std::shared_ptr<Probe> probe;
  std::unique_ptr<simba::MutexContendService> service;
};

Member make_member(simba::MutexContendServiceFactory& factory, const std::string& mutex,
                   const std::string& id) {
  Member m;
  m.probe = std::make_shared<Probe>(mutex, id);
  m.service = check(factory.create_contend_service(m.probe), "creating a contend service");
  return m;
}

// Starts `m` on a free mutex and waits until it owns it.
void start_holder(Member& m) {
  const int before = m.probe->acquisitions();
  m.probe->reset();
  check(m.service->start(), "starting the holder");
  if (!m.probe->wait_acquisition(before + 1, kHandoffTimeout)) {
    throw BenchError("the holder did not acquire a free mutex within 5 s");
  }
}

// Holder and waiter in two factories (two backends: separate connections,
// as two processes would have); they swap roles after every hand-off.
void add_handoff_case(const Settings& s, std::vector<Case>& cases) {
  struct State {
    std::unique_ptr<simba::MutexContendServiceFactory> factory_a;
    std::unique_ptr<simba::MutexContendServiceFactory> factory_b;
    Member a;
    Member b;
    Member* holder = nullptr;
    Member* waiter = nullptr;
    int done = 0;
    ~State() {
      if (holder != nullptr && holder->service->running()) (void)holder->service->stop();
      a.service.reset();
      b.service.reset();
    }
  };
  auto st = std::make_shared<State>();
  st->factory_a =
      check(simba::MutexContendServiceFactory::open(s.uri, handoff_options()), "factory A");
  st->factory_b =
      check(simba::MutexContendServiceFactory::open(s.uri, handoff_options()), "factory B");
  const std::string mutex = unique("handoff");
  st->a = make_member(*st->factory_a, mutex, "bench-a");
  st->b = make_member(*st->factory_b, mutex, "bench-b");
  st->holder = &st->a;
  st->waiter = &st->b;
  start_holder(*st->holder);
  cases.push_back(Case{
      {add_row("hand-off in process: stop() -> on_acquired"), add_row("  holder's stop() returns"),
       add_row("  stop() returned -> waiter's on_acquired")},
      s.handoffs,
      s.warmup / 4,
      [st] {
        Member& holder = *st->holder;
        Member& waiter = *st->waiter;
        // The waiter contends once, finds the holder and joins the queue.
        const int before = waiter.probe->acquisitions();
        waiter.probe->reset();
        check(waiter.service->start(), "starting the waiter");
        if (!waiter.probe->wait_owner(holder.probe->contender_id(), kHandoffTimeout)) {
          throw BenchError("the waiter did not see the holder within 5 s");
        }
        const auto t0 = SteadyClock::now();
        simba::Status stopped = holder.service->stop();
        const auto t_stopped = SteadyClock::now();
        check(stopped, "stopping the holder");
        auto acquired = waiter.probe->wait_acquisition(before + 1, kHandoffTimeout);
        if (!acquired) {
          throw BenchError("hand-off " + std::to_string(st->done) +
                           ": the waiter did not acquire within 5 s of a clean release "
                           "(the push did not arrive; it would have waited for its poll)");
        }
        ++st->done;
        std::swap(st->holder, st->waiter);
        return us({micros_since(t0, *acquired), micros_since(t0, t_stopped),
                   micros_since(t_stopped, *acquired)});
      }});
}

// The waiter's share of a hand-off on its own: the holder is a plain
// hiredis connection running Simba's release script (no library threads on
// the holder's side), the waiter a contend service. Compare with the raw
// scripts' hand-off, where the waiter is plain hiredis too.
void add_raw_holder_handoff_case(const Settings& s, const simba::RedisOptions& options,
                                 std::vector<Case>& cases) {
  struct State {
    RawContext c;
    std::string acquire_sha;
    std::string release_sha;
    std::vector<std::string> keys;
    std::unique_ptr<simba::MutexContendServiceFactory> factory;
    Member waiter;
    ~State() {
      if (waiter.service && waiter.service->running()) (void)waiter.service->stop();
      waiter.service.reset();
    }
    std::string script(const std::string& sha, const std::vector<std::string>& args) {
      std::vector<std::string> command = {"EVALSHA", sha, "3"};
      command.insert(command.end(), keys.begin(), keys.end());
      command.insert(command.end(), args.begin(), args.end());
      RawReply r = raw_command(c.get(), command);
      if (r->type == REDIS_REPLY_INTEGER) return std::to_string(r->integer);
      if (r->type == REDIS_REPLY_ARRAY && r->elements == 7) {
        return std::string(r->element[0]->str, r->element[0]->len);
      }
      throw BenchError("raw holder: unexpected script reply");
    }
  };
  auto st = std::make_shared<State>();
  st->c = raw_connect(options);
  st->acquire_sha = raw_command(st->c.get(), {"SCRIPT", "LOAD",
                                              std::string(simba::internal::redis::kLuaPrelude) +
                                                  simba::internal::redis::kLuaAcquire})
                        ->str;
  st->release_sha = raw_command(st->c.get(), {"SCRIPT", "LOAD",
                                              std::string(simba::internal::redis::kLuaPrelude) +
                                                  simba::internal::redis::kLuaRelease})
                        ->str;
  const std::string mutex = unique("handoff-raw-holder");
  // The library's own keys for the mutex (see include/simba/backends/redis.h).
  const std::string lock = options.key_prefix + ":{" + mutex + "}";
  st->keys = {lock, lock + ":contender", lock + ":fence"};
  st->factory = check(simba::MutexContendServiceFactory::open(s.uri, handoff_options()), "factory");
  st->waiter = make_member(*st->factory, mutex, "bench-waiter");
  cases.push_back(
      Case{{add_row("hand-off, plain hiredis holder -> library waiter")},
           s.handoffs,
           s.warmup / 4,
           [st] {
             if (st->script(st->acquire_sha, {"raw-holder", "10000", "6000", "0"}) != "acquired") {
               throw BenchError("raw holder: could not acquire the free mutex");
             }
             const int before = st->waiter.probe->acquisitions();
             st->waiter.probe->reset();
             check(st->waiter.service->start(), "starting the waiter");
             if (!st->waiter.probe->wait_owner("raw-holder", kHandoffTimeout)) {
               throw BenchError("the waiter did not see the raw holder within 5 s");
             }
             const auto t0 = SteadyClock::now();
             if (st->script(st->release_sha, {"raw-holder"}) != "1") {
               throw BenchError("raw holder: release failed");
             }
             auto acquired = st->waiter.probe->wait_acquisition(before + 1, kHandoffTimeout);
             if (!acquired)
               throw BenchError("the waiter did not acquire within 5 s of a clean release");
             check(st->waiter.service->stop(), "stopping the waiter");
             return us({micros_since(t0, *acquired)});
           }});
}

// --- the waiter in a child process ------------------------------------------

std::string read_line(FILE* in) {
  std::string line;
  for (int c = std::fgetc(in); c != EOF && c != '\n'; c = std::fgetc(in)) {
    line.push_back(static_cast<char>(c));
  }
  return line;
}

void write_line(FILE* out, const std::string& line) {
  std::fprintf(out, "%s\n", line.c_str());
  std::fflush(out);
}

long long steady_nanos(SteadyClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// The child: for every "wait HOLDER" it contends until it has seen HOLDER as
// the owner ("queued"), then reports its acquisition ("acquired NANOS", on
// the steady clock, which is CLOCK_MONOTONIC and so shared by all processes
// of the host) and releases ("released").
int child_waiter(const std::string& uri, const std::string& mutex) {
  try {
    auto factory =
        check(simba::MutexContendServiceFactory::open(uri, handoff_options()), "child factory");
    Member me = make_member(*factory, mutex, "bench-child");
    for (;;) {
      const std::string line = read_line(stdin);
      if (line.rfind("wait ", 0) != 0) break;  // "quit" or EOF
      const int before = me.probe->acquisitions();
      me.probe->reset();
      check(me.service->start(), "starting the child waiter");
      if (!me.probe->wait_owner(line.substr(5), kHandoffTimeout)) {
        throw BenchError("child: did not see the holder within 5 s");
      }
      write_line(stdout, "queued");
      auto acquired = me.probe->wait_acquisition(before + 1, kHandoffTimeout);
      if (!acquired) throw BenchError("child: no hand-off within 5 s of the release");
      write_line(stdout, "acquired " + std::to_string(steady_nanos(*acquired)));
      check(me.service->stop(), "stopping the child");
      write_line(stdout, "released");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "simba-bench-redis (child): %s\n", e.what());
    write_line(stdout, "error");
    return 1;
  }
}

std::string self_path() {
  std::vector<char> buffer(4096);
  const ssize_t n = readlink("/proc/self/exe", buffer.data(), buffer.size() - 1);
  if (n <= 0) throw BenchError("cannot read /proc/self/exe");
  return std::string(buffer.data(), static_cast<std::size_t>(n));
}

// The holder in this process, the waiter in a child process (its own
// factory): always this direction, the child releases after each hand-off.
class ChildWaiterProcess {
 public:
  explicit ChildWaiterProcess(const std::string& uri, const std::string& mutex) {
    int to_child[2];
    int from_child[2];
    if (pipe(to_child) != 0) throw BenchError("pipe failed");
    if (pipe(from_child) != 0) {
      close(to_child[0]);
      close(to_child[1]);
      throw BenchError("pipe failed");
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, to_child[1]);
    posix_spawn_file_actions_addclose(&actions, from_child[0]);
    const std::string self = self_path();
    std::vector<std::string> args = {self, "--child-waiter", uri, mutex};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, self.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(to_child[0]);
    close(from_child[1]);
    out_ = fdopen(to_child[1], "w");
    in_ = fdopen(from_child[0], "r");
    if (rc != 0) {
      pid_ = 0;
      throw BenchError(std::string("posix_spawn: ") + std::strerror(rc));
    }
  }
  ~ChildWaiterProcess() { (void)finish(); }

  void send(const std::string& line) { write_line(out_, line); }
  std::string expect(const std::string& prefix) {
    const std::string line = read_line(in_);
    if (line.rfind(prefix, 0) != 0) {
      throw BenchError("the child waiter said '" + line + "', expected '" + prefix + "'");
    }
    return line.substr(prefix.size());
  }
  // Ends the child; true if it exited cleanly.
  bool finish() {
    if (out_ != nullptr) {
      std::fprintf(out_, "quit\n");
      std::fclose(out_);
      out_ = nullptr;
    }
    if (in_ != nullptr) {
      std::fclose(in_);
      in_ = nullptr;
    }
    if (pid_ == 0) return true;
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = 0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

 private:
  pid_t pid_ = 0;
  FILE* out_ = nullptr;
  FILE* in_ = nullptr;
};

void add_child_handoff_case(const Settings& s, std::vector<Case>& cases) {
  struct State {
    std::unique_ptr<ChildWaiterProcess> child;
    std::unique_ptr<simba::MutexContendServiceFactory> factory;
    Member holder;
    ~State() {
      holder.service.reset();
      if (child && !child->finish()) std::fprintf(stderr, "the child waiter failed\n");
    }
  };
  auto st = std::make_shared<State>();
  const std::string mutex = unique("handoff-child");
  st->child = std::make_unique<ChildWaiterProcess>(s.uri, mutex);
  st->factory =
      check(simba::MutexContendServiceFactory::open(s.uri, handoff_options()), "parent factory");
  st->holder = make_member(*st->factory, mutex, "bench-parent");
  cases.push_back(Case{{add_row("hand-off to a child process: stop() -> on_acquired")},
                       s.handoffs,
                       s.warmup / 4,
                       [st] {
                         start_holder(st->holder);
                         st->child->send("wait " + st->holder.probe->contender_id());
                         st->child->expect("queued");
                         const auto t0 = SteadyClock::now();
                         check(st->holder.service->stop(), "stopping the holder");
                         const long long t1 = std::stoll(st->child->expect("acquired "));
                         st->child->expect("released");
                         return us({static_cast<double>(t1 - steady_nanos(t0)) / 1000.0});
                       }});
}

// --- many mutexes --------------------------------------------------------------

void run_renewals(const Settings& s) {
  const int n = s.renew_mutexes;
  std::fprintf(stderr, "renewals, %d mutexes\n", n);
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.push_back(unique("renew") + "-" + std::to_string(i));

  // (a) The Backend SPI from two threads (a factory's default io_threads):
  // how long one round of renewals of every mutex takes on one backend.
  {
    auto backend = check(simba::open_backend(s.uri), "opening the backend");
    auto round = [&](const char* what, const std::function<void(const std::string&)>& call) {
      std::atomic<int> next{0};
      std::mutex error_mu;
      std::string error;
      auto work = [&] {
        try {
          for (int i = next++; i < n; i = next++) call(names[static_cast<std::size_t>(i)]);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(error_mu);
          error = e.what();
          next = n;
        }
      };
      const auto t0 = SteadyClock::now();
      std::thread t(work);
      work();
      t.join();
      const double ms = micros_since(t0, SteadyClock::now()) / 1000.0;
      if (!error.empty()) throw BenchError(error);
      char line[200];
      std::snprintf(line, sizeof(line),
                    "renewal test, Backend SPI, 2 threads: %-9s %d mutexes in %7.1f ms "
                    "(%5.1f us per call)",
                    what, n, ms, ms * 1000.0 / n);
      note(line);
    };
    auto acquire = [&](const std::string& m) {
      auto r = check(backend->acquire_or_renew(request_for(m, "bench-renewer"), call_deadline()),
                     "acquire");
      if (!r.owner.is_owner("bench-renewer"))
        throw BenchError("renewal test: " + m + " not acquired");
    };
    round("acquire", acquire);
    round("renew", acquire);
    round("renew", acquire);
    round("release", [&](const std::string& m) {
      if (!check(backend->release(m, "bench-renewer", call_deadline()), "release")) {
        throw BenchError("renewal test: " + m + " not released");
      }
    });
  }

  // (b) One factory holding all of them with ttl 1 s (so 10,000 renewals a
  // second at 10,000 mutexes): how late is each renewal against its due
  // time (the previous soft-lease end), by the store's clock?
  class Renewer final : public simba::MutexContender {
   public:
    Renewer(std::string mutex, std::string id, std::mutex* mu, std::vector<double>* lateness,
            std::atomic<int>* acquired, std::atomic<int>* lost, std::atomic<bool>* recording)
        : MutexContender(std::move(mutex), std::move(id)),
          mu_(mu),
          lateness_(lateness),
          acquired_(acquired),
          lost_(lost),
          recording_(recording) {}
    void on_owner(const simba::MutexState& state) override {
      if (state.is_acquired(contender_id())) ++*acquired_;
      if (state.is_released(contender_id())) ++*lost_;
      if (!state.is_changed() && state.after.is_owner(contender_id()) && *recording_) {
        const auto late = state.after.acquired_at - state.before.ttl_at;
        std::lock_guard<std::mutex> lock(*mu_);
        lateness_->push_back(static_cast<double>(late.count()));
      }
    }

   private:
    std::mutex* mu_;
    std::vector<double>* lateness_;
    std::atomic<int>* acquired_;
    std::atomic<int>* lost_;
    std::atomic<bool>* recording_;
  };
  // Declared before the factory: its callback threads may use them until it
  // is destroyed.
  std::mutex mu;
  std::vector<double> lateness_ms;
  std::atomic<int> acquired{0};
  std::atomic<int> lost{0};
  std::atomic<bool> recording{false};
  simba::FactoryOptions options;
  options.contend.ttl = milliseconds(1000);
  options.contend.transition = milliseconds(6000);
  auto factory =
      check(simba::MutexContendServiceFactory::open(s.uri, options), "opening a factory");
  std::vector<std::unique_ptr<simba::MutexContendService>> services;
  const auto t0 = SteadyClock::now();
  for (const std::string& m : names) {
    auto contender = std::make_shared<Renewer>(m, "bench-renewer-f", &mu, &lateness_ms, &acquired,
                                               &lost, &recording);
    services.push_back(check(factory->create_contend_service(contender), "creating a service"));
    check(services.back()->start(), "starting a service");
  }
  const auto t_started = SteadyClock::now();
  while (acquired < n && SteadyClock::now() - t0 < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  const auto t_acquired = SteadyClock::now();
  if (acquired < n) throw BenchError("renewal test: not every mutex was acquired within 60 s");
  char line[240];
  std::snprintf(line, sizeof(line),
                "renewal test, one factory: start() of %d services took %.0f ms; all owned "
                "after %.0f ms",
                n, micros_since(t0, t_started) / 1000.0, micros_since(t0, t_acquired) / 1000.0);
  note(line);
  // Skip the first second (the renewals of the start-up burst), then watch.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  recording = true;
  const auto w0 = SteadyClock::now();
  std::this_thread::sleep_for(std::chrono::seconds(s.renew_seconds));
  recording = false;
  const double seconds = micros_since(w0, SteadyClock::now()) / 1e6;
  const int lost_while_held = lost;
  std::vector<double> late;
  {
    std::lock_guard<std::mutex> lock(mu);
    late = lateness_ms;
  }
  std::snprintf(line, sizeof(line),
                "renewal test, one factory, ttl 1s: %.0f renewals/s (%d expected), "
                "renewal lateness vs. ttl_at median %.0f ms, p99 %.0f ms, max %.0f ms; "
                "leases lost: %d",
                static_cast<double>(late.size()) / seconds, n, median(late), percentile(late, 0.99),
                late.empty() ? 0.0 : *std::max_element(late.begin(), late.end()), lost_while_held);
  note(line);
  const auto s0 = SteadyClock::now();
  for (auto& service : services) check(service->stop(), "stopping a service");
  std::snprintf(line, sizeof(line), "renewal test, one factory: stop() of %d services took %.0f ms",
                n, micros_since(s0, SteadyClock::now()) / 1000.0);
  note(line);
  if (lost_while_held > 0) note("WARNING: leases were lost during the renewal test (see above)");
}

// ---------------------------------------------------------------------------

void targets() {
  // Each line: the figure, its budget and measured / budget (<= 1 meets).
  auto line = [&](const std::string& what, const Row* row, double budget) {
    if (row == nullptr || budget <= 0) return;
    const double m = median(row->us);
    char text[300];
    std::snprintf(text, sizeof(text), "target: %-56s %7.1f us, budget %6.1f us: %5.2fx budget, %s",
                  what.c_str(), m, budget, m / budget, m <= budget ? "meets" : "MISSES");
    note(text);
  };
  if (const Row* raw = find_row("raw SET NX PX + DEL")) {
    const double budget = 1.3 * median(raw->us);
    line("backend acquire+release <= 1.3 x raw SET NX PX + DEL",
         find_row("backend acquire_or_renew + release"), budget);
    line("Locker try_acquire+release <= 1.3 x raw SET NX PX + DEL",
         find_row("Locker try_acquire + release"), budget);
    // Two round trips of the store, for the hand-off: its own SET NX PX + DEL.
    line("hand-off in process <= 2 round trips (raw SET NX PX + DEL)",
         find_row("hand-off in process: stop() -> on_acquired"), median(raw->us));
    line("hand-off to a child <= 2 round trips (raw SET NX PX + DEL)",
         find_row("hand-off to a child process: stop() -> on_acquired"), median(raw->us));
  }
  if (const Row* floor = find_row("raw scripts hand-off (release->push->acquire)")) {
    line("hand-off in process vs. the raw scripts' hand-off",
         find_row("hand-off in process: stop() -> on_acquired"), median(floor->us));
  }
}

// Rounds of the interleaved latency rows.
constexpr int kRounds = 10;

int usage() {
  std::fprintf(
      stderr,
      "usage: simba-bench-redis [--iterations N] [--warmup N] [--handoffs N]\n"
      "                         [--renew-mutexes N] [--renew-seconds S]\n"
      "                         [--only wake,raw,backend,locker,handoff,child,renew] URI\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--child-waiter") return child_waiter(argv[2], argv[3]);
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto number = [&](int* out) {
      if (i + 1 >= argc) return false;
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 0 || v > 10'000'000) return false;
      *out = static_cast<int>(v);
      return true;
    };
    if (arg == "--iterations") {
      if (!number(&s.iterations) || s.iterations == 0) return usage();
    } else if (arg == "--warmup") {
      if (!number(&s.warmup)) return usage();
    } else if (arg == "--handoffs") {
      if (!number(&s.handoffs) || s.handoffs == 0) return usage();
    } else if (arg == "--renew-mutexes") {
      if (!number(&s.renew_mutexes)) return usage();
    } else if (arg == "--renew-seconds") {
      if (!number(&s.renew_seconds) || s.renew_seconds == 0) return usage();
    } else if (arg == "--only" && i + 1 < argc) {
      std::istringstream groups(argv[++i]);
      for (std::string g; std::getline(groups, g, ',');) {
        if (g != "wake" && g != "raw" && g != "backend" && g != "locker" && g != "handoff" &&
            g != "child" && g != "renew") {
          return usage();
        }
        s.only.push_back(g);
      }
    } else if (!arg.empty() && arg[0] != '-' && s.uri.empty()) {
      s.uri = arg;
    } else {
      return usage();
    }
  }
  if (s.uri.empty()) return usage();

  try {
    const simba::Uri uri = check(simba::Uri::parse(s.uri), "parsing the URI");
    const simba::RedisOptions options =
        check(simba::redis_options_from_uri(uri), "reading the URI");
    std::printf("simba-bench-redis: %s\n", uri.to_string().c_str());
    std::printf("iterations %d (warm-up %d), hand-offs %d, renewal mutexes %d\n", s.iterations,
                s.warmup, s.handoffs, s.renew_mutexes);
    std::fflush(stdout);
    {
      std::fprintf(stderr, "setting up\n");
      std::vector<Case> cases;
      if (s.want("wake")) add_wake_case(s, cases);
      if (s.want("raw")) add_raw_cases(s, options, cases);
      if (s.want("backend")) add_backend_cases(s, cases);
      if (s.want("locker")) add_locker_case(s, cases);
      if (s.want("handoff")) add_handoff_case(s, cases);
      if (s.want("handoff")) add_raw_holder_handoff_case(s, options, cases);
      if (s.want("child")) add_child_handoff_case(s, cases);
      std::fprintf(stderr, "latency rows, interleaved in %d rounds\n", kRounds);
      reset_server_stats(options);
      run_interleaved(cases, kRounds);
      note_server_stats(options);
    }  // every case's connections, factories and child process end here
    if (s.renew_mutexes > 0 && s.want("renew")) run_renewals(s);
    targets();
    if (g_wrong_answers > 0) {
      note("ERROR: " + std::to_string(g_wrong_answers) +
           " wrong answers from the library (see WRONG ANSWER above)");
    }
    print_table();
    return g_wrong_answers > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    print_table();
    std::fprintf(stderr, "simba-bench-redis: error: %s\n", e.what());
    return 1;
  }
}
