// simba-test-keyed-holder: holds one key in a process of its own, for the
// keyed suite's cross-process cases. It prints one line per event:
//   HELD <token>   it holds the key
//   LOST           the hold ended other than by release (watchdog, store)
//   ERROR <text>   acquiring failed
// SIGTERM/SIGINT release the key and exit; SIGKILL is the crash under test.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "simba/keyed_lock.h"
#include "testing/child_output.h"

namespace {

using simba::testing::emit_line;
using simba::testing::stop_requested;

int usage() {
  std::fprintf(stderr,
               "usage: simba-test-keyed-holder --store URI --key KEY [--max-hold-ms N] "
               "[--ttl-ms N] [--transition-ms N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string store;
  std::string key;
  long long max_hold_ms = 3'600'000;
  simba::KeyedLockOptions options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--store") {
      store = value;
    } else if (flag == "--key") {
      key = value;
    } else if (flag == "--max-hold-ms") {
      max_hold_ms = std::atoll(value);
    } else if (flag == "--ttl-ms") {
      options.lease.ttl = std::chrono::milliseconds(std::atoll(value));
    } else if (flag == "--transition-ms") {
      options.lease.transition = std::chrono::milliseconds(std::atoll(value));
    } else {
      return usage();
    }
  }
  if (store.empty() || key.empty()) return usage();
  simba::testing::stop_on_signals();
  auto provider = simba::KeyedLockProvider::open(store, options);
  if (!provider.ok()) {
    emit_line("ERROR " + provider.status().to_string());
    return 1;
  }
  auto lease = (*provider)->acquire(key, std::chrono::milliseconds(max_hold_ms));
  if (!lease.ok()) {
    emit_line("ERROR " + lease.status().to_string());
    return 1;
  }
  emit_line("HELD " + std::to_string(lease->fencing_token()));
  const std::stop_token lost = lease->lost_token();
  while (!stop_requested() && !lost.stop_requested()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (lost.stop_requested()) emit_line("LOST");
  (void)lease->release();
  return 0;
}
