// simba-test-clustered-node: a node in a process of its own, for the
// cross-process clustered-lock case. It defines one clustered lock, locks it
// and reports on stdout, one line per event:
//   LOCKED <token>   this node holds the lock
//   LOST             this node's hold ended other than by unlock()
//   ERROR <status>   lock() failed or did not finish within 30 s
// then holds the lock (renewed in the background) until SIGTERM/SIGINT, when
// it unlocks and exits. SIGKILL is the point: a node that dies holding.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "simba/clustered_lock.h"
#include "testing/child_output.h"

namespace {

using simba::testing::emit_line;
using simba::testing::stop_requested;

int usage() {
  std::fprintf(stderr,
               "usage: simba-test-clustered-node --store URI --lock NAME [--ttl-ms N] "
               "[--transition-ms N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string store, name;
  simba::ContendOptions lease;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--store") {
      store = value;
    } else if (flag == "--lock") {
      name = value;
    } else if (flag == "--ttl-ms") {
      lease.ttl = std::chrono::milliseconds(std::atoll(value.c_str()));
    } else if (flag == "--transition-ms") {
      lease.transition = std::chrono::milliseconds(std::atoll(value.c_str()));
    } else {
      return usage();
    }
  }
  if (store.empty() || name.empty()) return usage();
  simba::testing::stop_on_signals();

  simba::ClusteredLockOptions options;
  options.lease = lease;
  auto manager = simba::ClusteredLockManager::open(store, options);
  if (!manager.ok()) {
    emit_line("ERROR " + manager.status().to_string());
    return 3;
  }
  if (auto defined = (*manager)->define(name); !defined.ok()) {
    emit_line("ERROR " + defined.status().to_string());
    return 3;
  }
  auto lock = (*manager)->get(name).value();
  lock->add_loss_listener([](const simba::Status&) { emit_line("LOST"); });
  auto locked = lock->lock();
  if (locked.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    emit_line("ERROR lock() did not finish within 30 s");
    return 4;
  }
  if (simba::Status s = locked.get(); !s.ok()) {
    emit_line("ERROR " + s.to_string());
    return 4;
  }
  emit_line("LOCKED " + std::to_string(lock->fencing_token()));
  while (!stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto unlocked = lock->unlock();
  (void)unlocked.wait_for(std::chrono::seconds(10));
  return 0;
}
