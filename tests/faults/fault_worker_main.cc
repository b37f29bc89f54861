// simba-fault-worker: one worker of a fault run (see simba-fault-run) in a
// process of its own. It contends for a mutex on --store, writes to the
// fenced resource served on --resource while it owns it, and appends its
// history (testing/fault_history.h) to --log, one write(2) per line so a
// SIGKILL tears at most the last line. SIGTERM/SIGINT stop it cleanly: it
// releases the mutex, logs ev=exit and exits 0. The harness starts it with
// a death signal (SpawnOptions::die_with_parent): it dies with the harness.
//
// With --api run it holds the mutex through the CLI instead: it runs
// `simba run` (--simba PATH) over and over, with itself as the command
// (--api run-child), which logs the hold to the same log and acts on it
// until the CLI's SIGTERM (a loss) or SIGINT (the worker's stop).

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "simba/clustered_lock.h"
#include "simba/contend_service.h"
#include "simba/keyed_lock.h"
#include "simba/registry.h"
#include "testing/child_output.h"
#include "testing/fault_injecting_backend.h"
#include "testing/fault_worker.h"

namespace {

int usage() {
  std::fprintf(
      stderr,
      "usage: simba-fault-worker --store URI --id N --log FILE --resource SOCKET\n"
      "         [--mutex NAME] [--ttl-ms N] [--transition-ms N] [--op-timeout-ms N]\n"
      "         [--hold-min-ms N] [--hold-max-ms N] [--seed N]\n"
      "         [--api contend|keyed|clustered|run] [--max-hold-ms N]\n"
      "         [--simba PATH [--cli-stderr FILE] [--linger-ms N] (--api run)]\n"
      "         [--stretch-lease-ms N] (--api contend: an unsafe backend, for a control)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string store, log_path, resource_path;
  std::string api = "contend";
  // (keyed) Each lease's max_hold: holds that run until the lock ends them
  // end here, by the watchdog.
  std::chrono::milliseconds max_hold{2500};
  std::string simba_path;
  std::string cli_stderr;
  // (run, run-child) How long the command acts on after the CLI's SIGTERM
  // (a negative control; 0: it stops at once).
  std::string linger_ms = "0";
  // (contend) The backend reports every lease it grants this much longer
  // than the store holds it: an unsafe library, for a negative control.
  std::chrono::milliseconds lease_stretch{0};
  simba::testing::FaultWorkerOptions options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    const long long number = std::atoll(value.c_str());
    if (flag == "--store") {
      store = value;
    } else if (flag == "--id") {
      options.id = static_cast<int>(number);
    } else if (flag == "--log") {
      log_path = value;
    } else if (flag == "--resource") {
      resource_path = value;
    } else if (flag == "--mutex") {
      options.mutex = value;
    } else if (flag == "--ttl-ms") {
      options.contend.ttl = std::chrono::milliseconds(number);
    } else if (flag == "--transition-ms") {
      options.contend.transition = std::chrono::milliseconds(number);
    } else if (flag == "--op-timeout-ms") {
      options.contend.operation_timeout = std::chrono::milliseconds(number);
    } else if (flag == "--hold-min-ms") {
      options.hold_min = std::chrono::milliseconds(number);
    } else if (flag == "--hold-max-ms") {
      options.hold_max = std::chrono::milliseconds(number);
    } else if (flag == "--seed") {
      options.seed = static_cast<std::uint64_t>(number);
    } else if (flag == "--api" && (value == "contend" || value == "keyed" || value == "clustered" ||
                                   value == "run" || value == "run-child")) {
      api = value;
    } else if (flag == "--simba") {
      simba_path = value;
    } else if (flag == "--cli-stderr") {
      cli_stderr = value;
    } else if (flag == "--linger-ms" && number >= 0) {
      linger_ms = value;
    } else if (flag == "--max-hold-ms" && number > 0) {
      max_hold = std::chrono::milliseconds(number);
    } else if (flag == "--run-timeout-ms" && number >= 0) {
      options.run_timeout = std::chrono::milliseconds(number);
    } else if (flag == "--stretch-lease-ms" && number > 0) {
      lease_stretch = std::chrono::milliseconds(number);
    } else {
      return usage();
    }
  }
  if ((argc - 1) % 2 != 0 || store.empty() || log_path.empty() || resource_path.empty() ||
      options.id <= 0 || (api == "run" && simba_path.empty()) ||
      (lease_stretch.count() > 0 && api != "contend")) {
    return usage();
  }
  // The command of a `simba run` (--api run below): the CLI is its parent,
  // and its reaper kills it if the CLI dies. Its signals are taken before
  // any other thread exists.
  std::unique_ptr<simba::testing::PulledLock> command_lock;
  if (api == "run-child") {
    auto made =
        simba::testing::cli_command_lock(std::chrono::milliseconds(std::atoll(linger_ms.c_str())));
    if (!made.ok()) {
      std::fprintf(stderr, "fault worker %d: %s\n", options.id, made.status().to_string().c_str());
      return 3;
    }
    command_lock = std::move(*made);
  }
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    std::perror(log_path.c_str());
    return 3;
  }
  if (api != "run-child") simba::testing::stop_on_signals();

  auto fail = [&](const simba::Status& status) {
    std::fprintf(stderr, "fault worker %d: %s\n", options.id, status.to_string().c_str());
    return 3;
  };
  simba::testing::FencedRegisterClient resource(resource_path);
  auto log = [log_fd](const std::string& line) {
    const std::string out = line + "\n";
    const ssize_t ignored = ::write(log_fd, out.data(), out.size());
    (void)ignored;
  };
  auto stop = [] { return simba::testing::stop_requested(); };
  simba::Status status;
  const auto ms = [](std::chrono::milliseconds d) { return std::to_string(d.count()) + "ms"; };
  if (api == "run") {
    // The command is this program again, with the flags it needs (each
    // command mixes its pid into the seed: a hold length of its own).
    char self[4096];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return fail(simba::internal_error("cannot read /proc/self/exe"));
    self[n] = '\0';
    const std::vector<std::string> run_flags = {"--store",      store,
                                                "--mutex",      options.mutex,
                                                "--ttl",        ms(options.contend.ttl),
                                                "--transition", ms(options.contend.transition),
                                                "--timeout",    ms(options.run_timeout),
                                                "--kill-after", "2s"};
    const std::vector<std::string> command = {self,
                                              "--api",
                                              "run-child",
                                              "--store",
                                              store,
                                              "--id",
                                              std::to_string(options.id),
                                              "--log",
                                              log_path,
                                              "--resource",
                                              resource_path,
                                              "--hold-min-ms",
                                              std::to_string(options.hold_min.count()),
                                              "--hold-max-ms",
                                              std::to_string(options.hold_max.count()),
                                              "--seed",
                                              std::to_string(options.seed),
                                              "--linger-ms",
                                              linger_ms};
    simba::testing::FaultWorker worker(nullptr, &resource, log, options);
    status = worker.run_cli(simba_path, run_flags, command, cli_stderr, stop);
  } else if (api == "run-child") {
    // One hold: from the token the CLI passed to SIGTERM, SIGINT or the
    // end of the hold; no rest after it (the worker rests between runs).
    options.lifecycle_events = false;
    options.rest_max = std::chrono::milliseconds(0);
    // Each command draws its own hold length.
    options.seed = options.seed * 7919 + static_cast<std::uint64_t>(::getpid());
    // Sequence numbers of its own: from the microsecond it starts, past any
    // an earlier command of the worker used (one write per 20 ms at most).
    options.first_seq = simba::testing::now_nanos(*simba::Clock::steady()) / 1000;
    simba::testing::FaultWorker worker(nullptr, &resource, log, options);
    status = worker.run_pulled(*command_lock, [] { return simba::testing::cli_command_done(); });
  } else if (api == "contend") {
    simba::FactoryOptions factory_options;
    factory_options.contend = options.contend;
    simba::Result<std::unique_ptr<simba::MutexContendServiceFactory>> factory =
        simba::internal_error("no factory");
    if (lease_stretch.count() > 0) {
      auto backend = simba::open_backend(store);
      if (!backend.ok()) return fail(backend.status());
      auto stretched = std::make_shared<simba::testing::FaultInjectingBackend>(*backend);
      stretched->set_lease_stretch(lease_stretch);
      factory = simba::MutexContendServiceFactory::create(stretched, factory_options);
    } else {
      factory = simba::MutexContendServiceFactory::open(store, factory_options);
    }
    if (!factory.ok()) return fail(factory.status());
    simba::testing::FaultWorker worker(factory->get(), &resource, log, options);
    status = worker.run(stop);
  } else {
    std::unique_ptr<simba::testing::PulledLock> lock;
    if (api == "keyed") {
      simba::KeyedLockOptions keyed_options;
      keyed_options.lease = options.contend;
      auto provider = simba::KeyedLockProvider::open(store, keyed_options);
      if (!provider.ok()) return fail(provider.status());
      lock = simba::testing::keyed_pulled_lock(std::move(*provider), options.mutex, max_hold);
      options.hold_until_lost = true;
    } else {
      simba::ClusteredLockOptions clustered_options;
      clustered_options.lease = options.contend;
      clustered_options.node_id = "fault-worker-" + std::to_string(options.id) + "-" +
                                  simba::MutexContender::generate_uuid_contender_id().substr(0, 8);
      auto manager = simba::ClusteredLockManager::open(store, clustered_options);
      if (!manager.ok()) return fail(manager.status());
      auto made = simba::testing::clustered_pulled_lock(std::move(*manager), options.mutex);
      if (!made.ok()) return fail(made.status());
      lock = std::move(*made);
    }
    simba::testing::FaultWorker worker(nullptr, &resource, log, options);
    status = worker.run_pulled(*lock, stop);
  }
  if (!status.ok()) return fail(status);
  return 0;
}
