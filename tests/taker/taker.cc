// simba-test-taker: a contender in a process of its own, for the
// cross-process conformance cases (DistributedLock's "taker" idea). It
// contends for one mutex and reports on stdout, one line per event:
//   ACQUIRED <token>   it became the owner
//   RELEASED           it stopped being the owner (lease lost or stop)
//   VIOLATION <text>   is_owner() was true after the last lease deadline it
//                      had itself reported for this tenure: the local lease
//                      check is broken
// It samples is_owner() every millisecond, so a pause (SIGSTOP) that outlives
// the lease is caught the moment the process resumes. SIGTERM/SIGINT stop it
// cleanly.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "simba/contend_service.h"
#include "testing/child_output.h"

namespace {

using simba::testing::emit_line;
using simba::testing::stop_requested;

int usage() {
  std::fprintf(
      stderr,
      "usage: simba-test-taker --store URI --mutex NAME [--ttl-ms N] [--transition-ms N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string store, mutex;
  simba::ContendOptions options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--store") {
      store = value;
    } else if (flag == "--mutex") {
      mutex = value;
    } else if (flag == "--ttl-ms") {
      options.ttl = std::chrono::milliseconds(std::atoll(value.c_str()));
    } else if (flag == "--transition-ms") {
      options.transition = std::chrono::milliseconds(std::atoll(value.c_str()));
    } else {
      return usage();
    }
  }
  if (store.empty() || mutex.empty()) return usage();
  simba::testing::stop_on_signals();

  simba::FactoryOptions factory_options;
  factory_options.contend = options;
  auto factory = simba::MutexContendServiceFactory::open(store, factory_options);
  if (!factory.ok()) {
    std::fprintf(stderr, "taker: %s\n", factory.status().to_string().c_str());
    return 3;
  }
  // How many times on_acquired came: the last lease deadline the service
  // reported is remembered per tenure.
  static std::atomic<std::uint64_t> tenures{0};
  auto contender = simba::make_contender(
      mutex,
      [](const simba::MutexState& s) {
        ++tenures;
        emit_line("ACQUIRED " + std::to_string(s.after.fencing_token));
      },
      [](const simba::MutexState&) { emit_line("RELEASED"); });
  auto service = (*factory)->create_contend_service(contender);
  if (!service.ok()) {
    std::fprintf(stderr, "taker: %s\n", service.status().to_string().c_str());
    return 3;
  }
  if (auto s = (*service)->start(); !s.ok()) {
    std::fprintf(stderr, "taker: %s\n", s.to_string().c_str());
    return 3;
  }
  const auto clock = (*factory)->clock();
  std::uint64_t deadline_tenure = 0;
  // max(): none reported yet in this tenure.
  simba::Clock::TimePoint last_deadline = simba::Clock::TimePoint::max();
  while (!stop_requested()) {
    const std::uint64_t tenure = tenures;
    // Read the deadline after the ownership check: a renewal in between can
    // only move it later, never make a true violation look fine.
    const auto before = clock->now();
    const bool owner = (*service)->is_owner();
    const auto deadline = (*service)->lease_deadline();
    if (tenure != deadline_tenure) {
      deadline_tenure = tenure;
      last_deadline = simba::Clock::TimePoint::max();
    }
    if (deadline) last_deadline = *deadline;
    // Judged against the last deadline the service reported in this tenure:
    // an is_owner() that stopped reading the clock still passes once
    // lease_deadline() has gone quiet, and that is the violation.
    if (owner && before >= last_deadline) {
      emit_line("VIOLATION is_owner() true after the lease deadline");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  (void)(*service)->stop();
  return 0;
}
