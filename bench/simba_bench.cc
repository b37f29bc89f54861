// simba-bench: what a store costs through Simba, next to the store's floor.
//
//   simba-bench --store URI [--scenario NAME] [--json] [--smoke] [sizes...]
//
// Scenarios (default: all of them, in this order):
//   floor        the store's cheapest round trip from the same client library
//   uncontended  acquire + release of a free mutex (Backend SPI) and of a
//                free keyed lock (KeyedLockProvider)
//   handoff      the holder releases, the waiter acquires: mutex services in
//                two factories (ttl 10 s / transition 6 s, so a missed push
//                would show as seconds) and keyed locks in two providers
//   contended    one hot key, C contenders as threads (each with a provider
//                of its own) and as processes: a read-modify-write of a
//                counter under the lock; ops/s, fairness, the count checked
//   failover     a holder process (mutex, then key) is SIGKILLed: time until
//                a waiter here holds it, against ttl + transition + 1 s
//   scale        N mutexes held by one factory, then N keys by one provider,
//                through a few renewal periods: threads, sockets, RSS, store
//                calls per second, renewal lag
// Sizes: --iterations N (1000) --handoffs N (100) --handoff-pause-ms MS (20:
//   the holder holds that long, its waiter queued and idle, before each
//   hand-off, and the hand-off rows are compared with the floor's round
//   trip after as long idle) --contenders 1,4,16
//   --modes threads,processes --seconds S (5, per contended case)
//   --failovers N (5) --failover-ttl-ms MS (2000) --failover-transition-ms MS
//   (1000) --failover-held-ms MS (300: how long the holder has held when it
//   is killed; a tenure is backed by the holder's session a few round trips
//   after its acquisition, where the store has that) --scale N (10000) --scale-ttl-ms MS (10000)
//   --scale-transition-ms MS (6000) --scale-seconds S (22). --smoke makes everything tiny (a
//   seconds-long check that every scenario runs; ctest runs it).
// Rows give p50/p99/max in µs, ops/s and the ratio of p50 to the floor's
// (two round trips for an acquire + release); --json prints one object per
// row for bench/report.py. A wrong count or a store error exits non-zero; a
// slow figure never does. Results: docs/benchmarks.md.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_floor.h"
#include "bench_processes.h"
#include "bench_report.h"
#include "bench_scale.h"
#include "simba/contend_service.h"
#include "simba/contender.h"
#include "simba/keyed_lock.h"
#include "simba/registry.h"
#include "simba/uri.h"

namespace {

using namespace simba::bench;
using Clock = BenchClock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// ---- scenarios ----

void floor(const Options& options, const simba::Uri& uri, Report& report) {
  auto floor = simba::bench::measure_floor(uri, options.iterations);
  if (!floor.ok()) {
    if (floor.status().code() == simba::StatusCode::kUnimplemented) {
      std::fprintf(stderr, "simba-bench: %s (no ratios)\n", floor.status().to_string().c_str());
      return;
    }
    fail("floor: " + floor.status().to_string());
  }
  // The first tenth warms the connection up.
  std::vector<double> micros(floor->micros.begin() + floor->micros.size() / 10,
                             floor->micros.end());
  report.set_floor(percentile(micros, 0.5));
  report.add({"floor", floor->what, micros, ops_per_second(micros), 1, {}});
}

// The floor of a hand-off: the same round trip after the hand-off's pause
// (Options::handoff_pause), once per hand-off. Its p50, or 0 without one.
double idle_floor(const Options& options, const simba::Uri& uri, Report& report) {
  auto floor = simba::bench::measure_floor(uri, options.handoffs, options.handoff_pause);
  if (!floor.ok()) return 0;
  const std::string what =
      floor->what + " after " + std::to_string(options.handoff_pause.count()) + " ms idle";
  report.add({"floor", what, floor->micros, 0, 1, {}});
  return percentile(floor->micros, 0.5);  // (which sorts its copy)
}

void uncontended(const Options& options, Report& report) {
  const simba::Deadline far = Clock::now() + std::chrono::hours(1);
  auto backend = simba::open_backend(options.store);
  if (!backend.ok()) fail(backend.status().to_string());
  std::vector<double> pair;
  for (int i = 0; i < options.iterations + options.iterations / 10; ++i) {
    const auto start = Clock::now();
    auto got =
        (*backend)->acquire_or_renew({"bench-free", "bench-a", seconds(10), seconds(6)}, far);
    if (!got.ok()) fail("mutex acquire failed: " + got.status().to_string());
    if (!got->owner.is_owner("bench-a")) {
      std::ostringstream said;
      said << "mutex acquire of a free mutex was refused after " << i << " pairs: owner "
           << got->owner << " at store time " << got->store_now.count();
      fail(said.str());
    }
    auto released = (*backend)->release("bench-free", "bench-a", far);
    if (!released.ok() || !*released) fail("mutex release failed");
    if (i >= options.iterations / 10) pair.push_back(micros(Clock::now() - start));
  }
  report.add({"uncontended",
              "mutex: acquire_or_renew + release (SPI)",
              pair,
              ops_per_second(pair),
              2,
              {}});

  auto provider = simba::KeyedLockProvider::open(options.store);
  if (!provider.ok()) fail(provider.status().to_string());
  std::vector<double> keyed;
  for (int i = 0; i < options.iterations + options.iterations / 10; ++i) {
    const auto start = Clock::now();
    auto lease = (*provider)->try_acquire("bench-key", milliseconds(0), seconds(30));
    if (!lease.ok() || !lease->has_value()) fail("keyed try_acquire of a free key failed");
    if (!(*lease)->release().ok()) fail("keyed release failed");
    if (i >= options.iterations / 10) keyed.push_back(micros(Clock::now() - start));
  }
  report.add({"uncontended",
              "keyed: try_acquire + release",
              keyed,
              ops_per_second(keyed),
              2,
              {Field::text("mechanism", (*provider)->capabilities().mechanism)}});
}

void mutex_handoff(const Options& options, double floor, Report& report) {
  simba::FactoryOptions factory_options;
  factory_options.contend.ttl = seconds(10);
  factory_options.contend.transition = seconds(6);
  auto factory_a = simba::MutexContendServiceFactory::open(options.store, factory_options);
  auto factory_b = simba::MutexContendServiceFactory::open(options.store, factory_options);
  if (!factory_a.ok() || !factory_b.ok()) fail("cannot open the factories");
  Signal acquired[2];
  std::unique_ptr<simba::MutexContendService> services[2];
  for (int k = 0; k < 2; ++k) {
    auto contender = simba::make_contender(
        "bench-handoff", [&, k](const simba::MutexState&) { acquired[k].set(); }, nullptr);
    auto& factory = k == 0 ? *factory_a : *factory_b;
    auto service = factory->create_contend_service(contender);
    if (!service.ok()) fail(service.status().to_string());
    services[k] = std::move(*service);
  }
  if (!services[0]->start().ok() || !acquired[0].wait(seconds(30))) {
    fail("the first holder never acquired");
  }
  // Without push a waiter moves at its next poll (the end of the holder's
  // transition, ~16 s here): a few samples say enough (one in a smoke run).
  const bool push = (*factory_a)->backend()->capabilities().push_release;
  const int handoffs = push ? options.handoffs : std::clamp(options.handoffs / 10, 1, 3);
  std::vector<double> handoff;
  int holder = 0;
  for (int i = 0; i < handoffs; ++i) {
    const int waiter = 1 - holder;
    acquired[waiter].reset();
    if (!services[waiter]->start().ok()) fail("start failed");
    const auto looking = Clock::now();
    while (services[waiter]->after_owner().owner_id != services[holder]->contender_id()) {
      if (Clock::now() - looking > seconds(10)) fail("the waiter never looked");
      // Not a yield loop: this lasts up to 1 s (kQueueReserve) when the
      // waiter is the service that released last (its first answer is the
      // row it handed on, free and reserved, until the reserve ends), and a
      // spinning thread took a CPU of two from the processes it waits for.
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    std::this_thread::sleep_for(options.handoff_pause);
    const auto start = Clock::now();
    if (!services[holder]->stop().ok()) fail("stop failed");
    if (!acquired[waiter].wait(seconds(20))) fail("no mutex hand-off within 20 s");
    handoff.push_back(micros(acquired[waiter].at() - start));
    holder = waiter;
  }
  (void)services[holder]->stop();
  report.add({"handoff",
              "mutex: stop() -> waiter's on_acquired",
              handoff,
              0,
              2,
              {Field::boolean("push", push)},
              floor});
}

void keyed_handoff(const Options& options, double floor, Report& report) {
  auto a = simba::KeyedLockProvider::open(options.store);
  auto b = simba::KeyedLockProvider::open(options.store);
  if (!a.ok() || !b.ok()) fail("cannot open the keyed providers");
  std::vector<double> handoff;
  for (int i = 0; i < options.handoffs; ++i) {
    auto& holder = i % 2 == 0 ? **a : **b;
    auto& waiter = i % 2 == 0 ? **b : **a;
    auto held = holder.acquire("bench-handoff-key", seconds(60));
    if (!held.ok()) fail(held.status().to_string());
    std::atomic<bool> waiting{false};
    Clock::time_point got_at;
    std::optional<simba::Lease> got;
    std::thread waiter_thread([&] {
      waiting = true;
      auto lease = waiter.try_acquire("bench-handoff-key", seconds(20), seconds(60));
      got_at = Clock::now();
      if (lease.ok() && lease->has_value()) got = std::move(**lease);
    });
    while (!waiting) std::this_thread::yield();
    // The waiter is queued at the store well within the default 20 ms.
    std::this_thread::sleep_for(options.handoff_pause);
    const auto released = Clock::now();
    if (!held->release().ok()) fail("keyed release failed");
    waiter_thread.join();
    if (!got.has_value()) fail("no keyed hand-off within 20 s");
    handoff.push_back(micros(got_at - released));
    (void)got->release();
  }
  report.add({"handoff",
              "keyed: release() -> waiter's try_acquire returns",
              handoff,
              0,
              2,
              {Field::boolean("push", (*a)->capabilities().push_handoff)},
              floor});
}

void contended_threads(const Options& options, int contenders, Report& report) {
  {
    std::vector<std::unique_ptr<simba::KeyedLockProvider>> providers;
    for (int i = 0; i < contenders; ++i) {
      auto provider = simba::KeyedLockProvider::open(options.store);
      if (!provider.ok()) fail(provider.status().to_string());
      providers.push_back(std::move(*provider));
    }
    std::atomic<long long> counter{0};
    std::atomic<bool> stop{false};
    std::atomic<int> errors{0};
    std::vector<long long> per_thread(static_cast<std::size_t>(contenders), 0);
    std::vector<std::vector<double>> waits(static_cast<std::size_t>(contenders));
    std::vector<std::thread> threads;
    const auto start = Clock::now();
    for (int t = 0; t < contenders; ++t) {
      threads.emplace_back([&, t] {
        auto& provider = *providers[static_cast<std::size_t>(t)];
        while (!stop) {
          const auto asked = Clock::now();
          auto lease = provider.try_acquire("bench-hot", seconds(30), seconds(30));
          if (!lease.ok() || !lease->has_value()) {
            ++errors;
            continue;
          }
          waits[static_cast<std::size_t>(t)].push_back(micros(Clock::now() - asked));
          // Read, then write: only the lock keeps increments from being lost.
          const long long seen = counter.load(std::memory_order_relaxed);
          counter.store(seen + 1, std::memory_order_relaxed);
          ++per_thread[static_cast<std::size_t>(t)];
          if (!(*lease)->release().ok()) ++errors;
        }
      });
    }
    std::this_thread::sleep_for(seconds(options.seconds));
    stop = true;
    for (auto& thread : threads) thread.join();
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    long long total = 0;
    long long least = per_thread.empty() ? 0 : per_thread[0];
    long long most = least;
    std::vector<double> all_waits;
    for (int t = 0; t < contenders; ++t) {
      total += per_thread[static_cast<std::size_t>(t)];
      least = std::min(least, per_thread[static_cast<std::size_t>(t)]);
      most = std::max(most, per_thread[static_cast<std::size_t>(t)]);
      const auto& w = waits[static_cast<std::size_t>(t)];
      all_waits.insert(all_waits.end(), w.begin(), w.end());
    }
    if (counter.load() != total) {
      fail("lost updates under the lock: counter " + std::to_string(counter.load()) + ", " +
           std::to_string(total) + " increments");
    }
    if (errors > 0) fail(std::to_string(errors.load()) + " acquisitions or releases failed");
    report.add({"contended",
                std::to_string(contenders) + " threads: wait for the hot key",
                all_waits,
                static_cast<double>(total) / elapsed,
                0,
                {Field::text("mode", "threads"), Field::integer("contenders", contenders),
                 Field::integer("count", total), Field::integer("least", least),
                 Field::integer("most", most)}});
  }
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) items.push_back(item);
  return items;
}

std::vector<int> parse_counts(const std::string& text) {
  std::vector<int> values;
  for (const auto& item : split(text)) {
    const int v = std::atoi(item.c_str());
    if (v < 1) fail("--contenders takes positive numbers, got '" + text + "'");
    values.push_back(v);
  }
  return values;
}

const char* const kScenarios[] = {"floor",     "uncontended", "handoff",
                                  "contended", "failover",    "scale"};

Options parse(int argc, char** argv) {
  Options options;
  bool smoke = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(flag + " needs a value");
      return argv[++i];
    };
    const auto number = [&](int least) { return std::max(least, std::atoi(value().c_str())); };
    if (flag == "--store") {
      options.store = value();
    } else if (flag == "--scenario") {
      options.scenario = value();
    } else if (flag == "--iterations") {
      options.iterations = number(10);
    } else if (flag == "--handoffs") {
      options.handoffs = number(1);
    } else if (flag == "--handoff-pause-ms") {
      options.handoff_pause = milliseconds(number(0));
    } else if (flag == "--contenders") {
      options.contenders = parse_counts(value());
    } else if (flag == "--modes") {
      const auto modes = split(value());
      options.contend_threads = std::find(modes.begin(), modes.end(), "threads") != modes.end();
      options.contend_processes = std::find(modes.begin(), modes.end(), "processes") != modes.end();
      if (modes.size() !=
              (options.contend_threads ? 1u : 0u) + (options.contend_processes ? 1u : 0u) ||
          modes.empty()) {
        fail("--modes takes threads, processes or threads,processes");
      }
    } else if (flag == "--seconds") {
      options.seconds = number(1);
    } else if (flag == "--failovers") {
      options.failovers = number(1);
    } else if (flag == "--failover-ttl-ms") {
      options.failover_ttl = milliseconds(number(100));
    } else if (flag == "--failover-transition-ms") {
      options.failover_transition = milliseconds(number(0));
    } else if (flag == "--failover-held-ms") {
      options.failover_held = milliseconds(number(0));
    } else if (flag == "--scale") {
      options.scale = number(1);
    } else if (flag == "--scale-ttl-ms") {
      options.scale_ttl = milliseconds(number(100));
    } else if (flag == "--scale-transition-ms") {
      options.scale_transition = milliseconds(number(0));
    } else if (flag == "--scale-seconds") {
      options.scale_seconds = number(1);
    } else if (flag == "--smoke") {
      smoke = true;
    } else if (flag == "--json") {
      options.json = true;
    } else {
      fail("unknown flag '" + flag + "' (see the comment at the top of bench/simba_bench.cc)");
    }
  }
  if (options.store.empty()) fail("--store URI is required");
  if (options.scenario != "all" && std::find(std::begin(kScenarios), std::end(kScenarios),
                                             options.scenario) == std::end(kScenarios)) {
    fail("unknown scenario '" + options.scenario +
         "' (all, floor, uncontended, handoff, contended, failover, scale)");
  }
  if (smoke) {
    // Every scenario once, small: seconds per store, not minutes.
    options.iterations = 20;
    options.handoffs = 3;
    options.contenders = {1, 3};
    options.seconds = 1;
    options.failovers = 1;
    options.scale = 200;
    options.scale_ttl = seconds(2);
    options.scale_transition = seconds(1);
    options.scale_seconds = 3;
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--child") return run_child(argc, argv);
  const Options options = parse(argc, argv);
  auto uri = simba::Uri::parse(options.store);
  if (!uri.ok()) fail(uri.status().to_string());
  Report report(uri->scheme, options.json);
  const auto runs = [&](const char* scenario) {
    return options.scenario == "all" || options.scenario == scenario;
  };
  // The floor is measured whatever the scenario, for the ratios.
  floor(options, *uri, report);
  if (runs("uncontended")) uncontended(options, report);
  if (runs("handoff")) {
    const double floor_after_pause = idle_floor(options, *uri, report);
    mutex_handoff(options, floor_after_pause, report);
    keyed_handoff(options, floor_after_pause, report);
  }
  if (runs("contended")) {
    for (const int contenders : options.contenders) {
      if (options.contend_threads) contended_threads(options, contenders, report);
      if (options.contend_processes) {
        contended_processes(options, contenders, /*locker=*/false, report);
        contended_processes(options, contenders, /*locker=*/true, report);
      }
    }
  }
  if (runs("failover")) {
    failover_mutex(options, report);
    failover_key(options, report);
  }
  if (runs("scale")) {
    scale_mutexes(options, report);
    scale_keys(options, report);
  }
  return 0;
}
