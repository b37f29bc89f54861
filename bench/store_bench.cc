// simba-bench-store URI: the latencies every store is held to, through the
// public API only, so any backend can be measured the same way:
//   * acquire + release of a free mutex through the Backend SPI;
//   * Locker try_acquire + release;
//   * hand-off after a clean release: the holder's stop() until the
//     waiter's on_acquired, holder and waiter in two factories (separate
//     connections, as two processes would have) with ttl 10 s / transition
//     6 s, so a waiter that missed the push would wait for seconds.
// Prints median / p90 / p99 in microseconds. Exits non-zero only on errors
// (never on a slow figure). See docs/benchmarks.md.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "simba/contend_service.h"
#include "simba/contender.h"
#include "simba/locker.h"
#include "simba/registry.h"

namespace {

using Clock = std::chrono::steady_clock;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto index = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(index, v.size() - 1)];
}

void print(const char* name, const std::vector<double>& us) {
  std::printf("%-44s %6zu %9.1f %9.1f %9.1f\n", name, us.size(), percentile(us, 0.5),
              percentile(us, 0.9), percentile(us, 0.99));
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "simba-bench-store: %s\n", what.c_str());
  std::exit(1);
}

// Waits for a flag set by a callback.
struct Signal {
  std::mutex mu;
  std::condition_variable cv;
  bool is_set = false;
  Clock::time_point at;
  void set() {
    std::lock_guard<std::mutex> lock(mu);
    is_set = true;
    at = Clock::now();
    cv.notify_all();
  }
  bool wait(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return is_set; });
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mu);
    is_set = false;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: simba-bench-store URI [iterations] [handoffs]\n");
    return 64;
  }
  const std::string uri = argv[1];
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 1000;
  const int handoffs = argc > 3 ? std::atoi(argv[3]) : 100;
  const simba::Deadline far = Clock::now() + std::chrono::hours(1);

  auto backend = simba::open_backend(uri);
  if (!backend.ok()) fail(backend.status().to_string());
  std::vector<double> pair;
  for (int i = 0; i < iterations + iterations / 10; ++i) {
    const auto start = Clock::now();
    auto got = (*backend)->acquire_or_renew(
        {"bench-free", "bench-a", std::chrono::seconds(10), std::chrono::seconds(6)}, far);
    if (!got.ok() || !got->owner.is_owner("bench-a")) fail("acquire failed");
    auto released = (*backend)->release("bench-free", "bench-a", far);
    if (!released.ok() || !*released) fail("release failed");
    if (i >= iterations / 10) pair.push_back(micros(Clock::now() - start));
  }

  simba::FactoryOptions options;
  options.contend.ttl = std::chrono::seconds(10);
  options.contend.transition = std::chrono::seconds(6);
  auto factory_a = simba::MutexContendServiceFactory::open(uri, options);
  auto factory_b = simba::MutexContendServiceFactory::open(uri, options);
  if (!factory_a.ok() || !factory_b.ok()) fail("cannot open the factories");

  std::vector<double> locker_pair;
  auto locker = simba::Locker::create(**factory_a, "bench-locker");
  if (!locker.ok()) fail(locker.status().to_string());
  for (int i = 0; i < iterations / 2; ++i) {
    const auto start = Clock::now();
    auto held = (*locker)->try_acquire();
    if (!held.ok() || !*held) fail("Locker::try_acquire of a free mutex failed");
    if (!(*locker)->release().ok()) fail("Locker::release failed");
    locker_pair.push_back(micros(Clock::now() - start));
  }

  // Hand-off: a holds, b waits; a stops; time until b's on_acquired. Then
  // the roles swap.
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
  if (!services[0]->start().ok() || !acquired[0].wait(std::chrono::seconds(30))) {
    fail("the first holder never acquired");
  }
  std::vector<double> handoff;
  int holder = 0;
  for (int i = 0; i < handoffs; ++i) {
    const int waiter = 1 - holder;
    acquired[waiter].reset();
    if (!services[waiter]->start().ok()) fail("start failed");
    // The waiter has looked and knows who holds it.
    const auto looking = Clock::now();
    while (services[waiter]->after_owner().owner_id != services[holder]->contender_id()) {
      if (Clock::now() - looking > std::chrono::seconds(10)) fail("the waiter never looked");
    }
    const auto start = Clock::now();
    if (!services[holder]->stop().ok()) fail("stop failed");
    if (!acquired[waiter].wait(std::chrono::seconds(5))) fail("no hand-off within 5 s");
    handoff.push_back(micros(acquired[waiter].at - start));
    holder = waiter;
  }
  (void)services[holder]->stop();

  std::printf("%-44s %6s %9s %9s %9s\n", "benchmark (us)", "n", "median", "p90", "p99");
  print("backend acquire_or_renew + release", pair);
  print("Locker try_acquire + release", locker_pair);
  print("hand-off: stop() -> waiter's on_acquired", handoff);
  return 0;
}
