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

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto index = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(index, v.size() - 1)];
}

void Print(const char* name, const std::vector<double>& us) {
  std::printf("%-44s %6zu %9.1f %9.1f %9.1f\n", name, us.size(), Percentile(us, 0.5),
              Percentile(us, 0.9), Percentile(us, 0.99));
}

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "simba-bench-store: %s\n", what.c_str());
  std::exit(1);
}

// Waits for a flag set by a callback.
struct Signal {
  std::mutex mu;
  std::condition_variable cv;
  bool set = false;
  Clock::time_point at;
  void Set() {
    std::lock_guard<std::mutex> lock(mu);
    set = true;
    at = Clock::now();
    cv.notify_all();
  }
  bool Wait(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return set; });
  }
  void Reset() {
    std::lock_guard<std::mutex> lock(mu);
    set = false;
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

  auto backend = simba::OpenBackend(uri);
  if (!backend.ok()) Fail(backend.status().ToString());
  std::vector<double> pair;
  for (int i = 0; i < iterations + iterations / 10; ++i) {
    const auto start = Clock::now();
    auto got = (*backend)->acquire_or_renew(
        {"bench-free", "bench-a", std::chrono::seconds(10), std::chrono::seconds(6)}, far);
    if (!got.ok() || !got->owner.is_owner("bench-a")) Fail("acquire failed");
    auto released = (*backend)->release("bench-free", "bench-a", far);
    if (!released.ok() || !*released) Fail("release failed");
    if (i >= iterations / 10) pair.push_back(Micros(Clock::now() - start));
  }

  simba::FactoryOptions options;
  options.contend.ttl = std::chrono::seconds(10);
  options.contend.transition = std::chrono::seconds(6);
  auto factory_a = simba::MutexContendServiceFactory::open(uri, options);
  auto factory_b = simba::MutexContendServiceFactory::open(uri, options);
  if (!factory_a.ok() || !factory_b.ok()) Fail("cannot open the factories");

  std::vector<double> locker_pair;
  auto locker = simba::Locker::create(**factory_a, "bench-locker");
  if (!locker.ok()) Fail(locker.status().ToString());
  for (int i = 0; i < iterations / 2; ++i) {
    const auto start = Clock::now();
    auto held = (*locker)->try_acquire();
    if (!held.ok() || !*held) Fail("Locker::try_acquire of a free mutex failed");
    if (!(*locker)->release().ok()) Fail("Locker::release failed");
    locker_pair.push_back(Micros(Clock::now() - start));
  }

  // Hand-off: a holds, b waits; a stops; time until b's on_acquired. Then
  // the roles swap.
  Signal acquired[2];
  std::unique_ptr<simba::MutexContendService> services[2];
  for (int k = 0; k < 2; ++k) {
    auto contender = simba::MakeContender(
        "bench-handoff", [&, k](const simba::MutexState&) { acquired[k].Set(); }, nullptr);
    auto& factory = k == 0 ? *factory_a : *factory_b;
    auto service = factory->create_contend_service(contender);
    if (!service.ok()) Fail(service.status().ToString());
    services[k] = std::move(*service);
  }
  if (!services[0]->start().ok() || !acquired[0].Wait(std::chrono::seconds(30))) {
    Fail("the first holder never acquired");
  }
  std::vector<double> handoff;
  int holder = 0;
  for (int i = 0; i < handoffs; ++i) {
    const int waiter = 1 - holder;
    acquired[waiter].Reset();
    if (!services[waiter]->start().ok()) Fail("start failed");
    // The waiter has looked and knows who holds it.
    const auto looking = Clock::now();
    while (services[waiter]->after_owner().owner_id != services[holder]->contender_id()) {
      if (Clock::now() - looking > std::chrono::seconds(10)) Fail("the waiter never looked");
    }
    const auto start = Clock::now();
    if (!services[holder]->stop().ok()) Fail("stop failed");
    if (!acquired[waiter].Wait(std::chrono::seconds(5))) Fail("no hand-off within 5 s");
    handoff.push_back(Micros(acquired[waiter].at - start));
    holder = waiter;
  }
  (void)services[holder]->stop();

  std::printf("%-44s %6s %9s %9s %9s\n", "benchmark (us)", "n", "median", "p90", "p99");
  Print("backend acquire_or_renew + release", pair);
  Print("Locker try_acquire + release", locker_pair);
  Print("hand-off: stop() -> waiter's on_acquired", handoff);
  return 0;
}
