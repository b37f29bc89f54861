// simba-fault-run: attacks one mutex on one store with faults and checks the
// history (issue #9; Jepsen's idea on one host).
//
//   simba-fault-run --store redis [--duration 30] [--workers 3] [--seed N]
//                   [--faults kill,pause,restart,...] [--out DIR]
//   simba-fault-run --topology etcd-3 --faults list   (the faults it takes)
//
// Workers contend for one mutex and, while they own it, write to a fenced
// resource that rejects stale tokens (testing/fault_worker.h). For a store
// other processes reach, every worker is a simba-fault-worker process; for a
// server store each reaches a private server (scripts/servers) through a
// TcpProxy of its own. For memory:// the workers are threads sharing one
// store on a ManualClock. Faults come one at a time, each followed by a
// quiet window of ttl + transition + 2.5 s in which the mutex must find an
// owner again:
//
//   kill           SIGKILL of the holder (a new worker replaces it)
//   pause          SIGSTOP of the holder for longer than its lease, then SIGCONT
//                  (both to the worker's whole process tree: with --api run,
//                  the worker's `simba run` and its command too)
//   restart        SIGKILL of the store server, then a restart on the same port
//   cut            the holder's connections reset (it must reconnect)
//   cut-all        every worker's connections reset
//   blackhole      the holder's proxy passes nothing for longer than its lease
//                  (a partition: the others take over while it hangs)
//   blackhole-all  nobody reaches the store for longer than the lease
//   crash       (memory) the holder's store calls fail and it vanishes
//   hang        (memory) the holder's store calls hang for longer than its lease
//   clock-jump  (memory) virtual time leaps past the lease
//
// `--volatile on` runs Redis without its append-only file, so that a restart
// forgets every lease and the backend's restart guard is what keeps two
// owners apart. With `--uri-query restart_guard=off` as well, nothing does.
// `--stretch-lease-ms N` (--api contend) makes every worker's backend report its
// leases N ms longer than the store grants them, so a hung holder keeps
// acting after a waiter took over; with `--hold-ms 60000,60000` workers hold
// until a fault takes the mutex away, and every hang on a holder makes two
// owners. Such runs are negative controls: `--expect-violations on` makes
// one pass only if the checker reports two owners (acted-after-takeover,
// overlap or stale-write) and no other rule (a stuck mutex, a crash or too
// little activity proves nothing about overlaps); `--expect-violations
// acted-after-takeover` requires that rule in particular.
//
// `--api keyed|clustered|run` holds the mutex through another API than the
// contend service: a KeyedLockProvider lease, a ClusteredLock, or `simba
// run` with the worker itself as the command (testing/fault_worker.h), each
// run a fresh process with `--run-timeout-ms` (default 1000) as its
// --timeout. A fault of a topology's store also starts a fresh worker in
// its first 1.5 s. An acquisition that ends on an error before its
// deadline (a `simba run` exiting 69 early, a keyed or clustered wait
// failing before it ran out) is a gave-up violation: a store that cannot
// be reached is waited for (issue #34).
// `--command-lingers-ms N` (run) makes that command act on for N ms after
// the CLI's SIGTERM (as one that finishes its batch before it exits), then
// end its hold as a release: a negative control.
//
// At the end the workers are stopped, the logs read and the checker
// (testing/fault_history.h) names every broken guarantee. A run must also
// have done enough to prove anything (Run::set_minimums): 5 accepted writes
// per second of run, half the slowest hand-over pace the workers allow (at
// least 2 acquisitions), and half of the faults aimed at a worker must have
// found it holding the mutex; below that it fails with too-little-activity.
// Exit status: 0 when the checker found nothing, 1 when it did, 2 for bad
// usage, 3 when the run could not be set up. The logs stay in --out (or a
// temporary directory that is kept when the check fails).

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fault_topology.h"
#include "simba/backends/memory.h"
#include "simba/contend_service.h"
#include "testing/fault_history.h"
#include "testing/fault_injecting_backend.h"
#include "testing/fault_worker.h"
#include "testing/subprocess.h"
#include "testing/tcp_proxy.h"
#include "testing/test_servers.h"
#include "testing/test_util.h"

#ifndef SIMBA_FAULT_WORKER_PATH
#define SIMBA_FAULT_WORKER_PATH "simba-fault-worker"
#endif

namespace simba::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

struct RunOptions {
  std::string store;
  // A replicated store (FaultTopology::names()), or empty: one server.
  std::string topology;
  // What the topology's failover adds to the takeover bound and to the
  // quiet window after each fault (FaultTopology::failover_allowance).
  milliseconds failover_allowance{0};
  seconds duration{30};
  int workers = 3;
  milliseconds ttl{1000};
  milliseconds transition{500};
  milliseconds op_timeout{1000};
  std::vector<std::string> faults;  // empty: all that apply to the store
  std::uint64_t seed = 0;
  std::string out;
  std::string worker_path = SIMBA_FAULT_WORKER_PATH;
  // The CLI, for --api run.
  std::string simba_path = SIMBA_CLI_PATH;
  // Redis without its append-only file: a restart forgets every lease and
  // the backend's restart guard must hold new ones back.
  bool volatile_store = false;
  // Appended to the workers' store URI ("restart_guard=off").
  std::string uri_query;
  // The run is meant to break mutual exclusion (a store set up unsafely):
  // exit 0 only if the checker reports two owners (acted-after-takeover,
  // overlap or stale-write) and nothing else. Proves the checker is not blind.
  bool expect_violations = false;
  // With expect_violations: this rule in particular must be among them
  // (`--expect-violations acted-after-takeover`); empty: any of the three.
  std::string expect_rule;
  // (contend) Every worker's backend reports each lease it is granted this
  // much longer than the store granted it (FaultInjectingBackend's lease
  // stretch): a holder cut off from the store keeps passing is_owner()
  // after the store gave the mutex to another. Unsafe on purpose, for the
  // negative control. Hangs then last the stretched lease + 0.2-1 s.
  milliseconds lease_stretch{0};
  // How long a worker holds the mutex before it lets go (uniform).
  milliseconds hold_min{300}, hold_max{1500};
  // What the workers hold the mutex through: the contend service (contend),
  // a KeyedLockProvider lease of the key (keyed), a ClusteredLock
  // (clustered), see PulledLock in testing/fault_worker.h; or `simba run`
  // (run), whose command acts until the CLI's SIGTERM and is told no
  // deadline (CheckOptions::deadline_promised).
  std::string api = "contend";
  // (keyed) Each lease's max_hold; one hold in five runs until its watchdog.
  milliseconds max_hold{2500};
  // (run) Each `simba run`'s --timeout: one that exits on a store error
  // before it ran out gave up (the checker's gave-up rule).
  milliseconds run_timeout{1000};
  // (run) The command acts on this long after the CLI's SIGTERM, then ends
  // its hold as if it had finished: a negative control, for
  // `--expect-violations on`.
  milliseconds command_linger{0};
};

// The longest a worker holds before the mutex is free again without a
// fault: keyed workers hold one lease in five until its max_hold.
milliseconds longest_hold(const RunOptions& options) {
  return options.api == "keyed" ? std::max(options.hold_max, options.max_hold) : options.hold_max;
}

std::vector<std::string> faults_for(const std::string& store, const std::string& topology = "") {
  if (!topology.empty()) {
    // The workers' own faults, then the store's: a member of a cluster
    // restarts as the cluster's own failover does, not as `restart` does
    // to a single server.
    std::vector<std::string> faults = {"kill", "pause"};
    if (FaultTopology::clients_dial_members(topology)) {
      faults.insert(faults.end(), {"cut", "blackhole"});
    }
    for (const std::string& f : FaultTopology::store_faults(topology)) faults.push_back(f);
    return faults;
  }
  if (store == "memory") return {"crash", "hang", "clock-jump"};
  if (store == "sqlite") return {"kill", "pause"};
  return {"kill", "pause", "restart", "cut", "cut-all", "blackhole", "blackhole-all"};
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, sep)) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

void say(const std::string& line) { std::cout << "fault-run: " << line << std::endl; }

// A host a URI names: an address and a port.
struct UriHost {
  std::string host;
  int port = 0;
};

// The hosts a URI names ("scheme://[user@]h:p,h:p/...").
std::vector<UriHost> uri_hosts(const std::string& uri) {
  std::vector<UriHost> found;
  std::string::size_type from = uri.find("://");
  if (from == std::string::npos) return found;
  from += 3;
  const auto end = uri.find_first_of("/?", from);
  std::string hosts = uri.substr(from, end == std::string::npos ? std::string::npos : end - from);
  if (const auto at = hosts.rfind('@'); at != std::string::npos) hosts = hosts.substr(at + 1);
  for (const std::string& host : split(hosts, ',')) {
    const auto colon = host.rfind(':');
    if (colon != std::string::npos) {
      found.push_back({host.substr(0, colon), std::atoi(host.c_str() + colon + 1)});
    }
  }
  return found;
}

// `uri` with host `from` replaced by 127.0.0.1:`to` (a port is followed by
// a comma, a slash, a question mark or the end, never by another digit).
std::string with_proxy(std::string uri, const UriHost& from, int to) {
  const std::string old = from.host + ":" + std::to_string(from.port);
  for (auto at = uri.find(old); at != std::string::npos; at = uri.find(old, at + 1)) {
    const auto after = at + old.size();
    if (after < uri.size() && std::isdigit(static_cast<unsigned char>(uri[after])) != 0) continue;
    const char before = at > 0 ? uri[at - 1] : '/';
    if (before != '/' && before != ',' && before != '@') continue;
    return uri.replace(at, old.size(), "127.0.0.1:" + std::to_string(to));
  }
  return uri;
}

// `uri` with its hosts ("scheme://[user@]h1,h2,h3/...") rotated left by
// `by`: h2,h3,h1 for 1.
std::string with_hosts_rotated(const std::string& uri, std::size_t by) {
  const auto scheme_end = uri.find("://");
  if (scheme_end == std::string::npos) return uri;
  auto from = scheme_end + 3;
  const auto end = std::min(uri.find_first_of("/?", from), uri.size());
  if (const auto at = uri.rfind('@', end); at != std::string::npos && at >= from) from = at + 1;
  std::vector<std::string> hosts = split(uri.substr(from, end - from), ',');
  if (hosts.size() < 2) return uri;
  std::rotate(hosts.begin(), hosts.begin() + static_cast<std::ptrdiff_t>(by % hosts.size()),
              hosts.end());
  std::string joined;
  for (const std::string& h : hosts) joined += (joined.empty() ? "" : ",") + h;
  return uri.substr(0, from) + joined + uri.substr(end);
}

// ---- the workers ---------------------------------------------------------------------------

// Workers of one run, as processes or threads; the harness's single thread
// drives it.
class Workers {
 public:
  virtual ~Workers() = default;
  virtual const Clock& clock() const = 0;
  // Starts worker `id`.
  virtual Status spawn(int id) = 0;
  // Ends worker `id` the hard way (no release, no last words); its fault.
  virtual FaultEvent kill(int id) = 0;
  // Keeps worker `id` from acting (or reaching the store) for `d`.
  virtual FaultEvent pause(int id, Clock::Duration d) = 0;
  // Stops every live worker and returns every worker's history.
  virtual std::vector<WorkerHistory> finish() = 0;
};

class ProcessWorkers final : public Workers {
 public:
  // Every worker reaches each of `members` (hosts of `uri`) through a
  // TcpProxy of its own, so one worker can be cut off while the others go
  // on, or every worker cut off from one member; none for an embedded
  // store. Members are told apart by port (distinct in every topology).
  ProcessWorkers(const RunOptions& options, std::string uri, std::vector<UriHost> members,
                 std::string dir, std::string socket)
      : options_(options),
        uri_(std::move(uri)),
        members_(std::move(members)),
        dir_(std::move(dir)),
        socket_(std::move(socket)) {}

  const Clock& clock() const override { return *clock_; }

  Status spawn(int id) override {
    const auto ms = [](milliseconds d) { return std::to_string(d.count()); };
    std::map<int, std::unique_ptr<TcpProxy>> proxies;
    std::string uri = uri_;
    if (options_.topology == "redis-sentinel") {
      // Each worker asks the sentinels in an order of its own, as clients
      // configured apart would: after a failover some hear of it first,
      // and a primary cut off with one sentinel keeps the clients that
      // ask that one (isolate-leader).
      uri = with_hosts_rotated(uri, static_cast<std::size_t>(id));
    }
    for (const UriHost& member : members_) {
      auto proxy = std::make_unique<TcpProxy>(member.host, member.port);
      const std::string before = uri;
      uri = with_proxy(uri, member, proxy->port());
      if (uri == before) {
        return internal_error("no " + member.host + ":" + std::to_string(member.port) + " in " +
                              uri);
      }
      proxies[member.port] = std::move(proxy);
    }
    std::vector<std::string> args{options_.worker_path};
    const auto flag = [&args](const char* name, std::string value) {
      args.emplace_back(name);
      args.push_back(std::move(value));
    };
    flag("--store", uri);
    flag("--id", std::to_string(id));
    flag("--log", log_path(id));
    flag("--resource", socket_);
    flag("--ttl-ms", ms(options_.ttl));
    flag("--transition-ms", ms(options_.transition));
    flag("--op-timeout-ms", ms(options_.op_timeout));
    flag("--hold-min-ms", ms(options_.hold_min));
    flag("--hold-max-ms", ms(options_.hold_max));
    flag("--api", options_.api);
    flag("--simba", options_.simba_path);
    flag("--cli-stderr", dir_ + "/cli-" + std::to_string(id) + ".stderr");
    flag("--linger-ms", ms(options_.command_linger));
    flag("--max-hold-ms", ms(options_.max_hold));
    flag("--run-timeout-ms", ms(options_.run_timeout));
    flag("--seed", std::to_string(options_.seed * 1000 + static_cast<std::uint64_t>(id)));
    if (options_.lease_stretch.count() > 0) flag("--stretch-lease-ms", ms(options_.lease_stretch));
    // A worker outlives no harness: if simba-fault-run dies (killed, a
    // ctest timeout), even while it starts workers, they go with it. Only
    // the main thread spawns, so the death signal is the process's.
    SpawnOptions spawn_options;
    spawn_options.die_with_parent = true;
    auto process = std::make_unique<Subprocess>(args, spawn_options);
    if (!process->started()) return unavailable_error("cannot start " + options_.worker_path);
    workers_[id] = {std::move(process), std::move(proxies), WorkerFate{}, false, {}};
    return ok_status();
  }

  // Network faults between the workers and the store: of one worker's
  // connections (`id` > 0) or of everyone's (`id` == 0).
  FaultEvent cut(int id) {
    const Nanos start = now_nanos(*clock_);
    for (TcpProxy* proxy : proxies(id)) proxy->cut_all();
    return {id > 0 ? "cut" : "cut-all", id, start, now_nanos(*clock_)};
  }
  FaultEvent blackhole(int id, Clock::Duration d) {
    const Nanos start = now_nanos(*clock_);
    for (TcpProxy* proxy : proxies(id)) proxy->set_blackhole(true);
    std::this_thread::sleep_for(d);
    for (TcpProxy* proxy : proxies(id)) proxy->set_blackhole(false);
    return {id > 0 ? "blackhole" : "blackhole-all", id, start, now_nanos(*clock_)};
  }
  // Stops worker `id` (with every process it started: a `simba run` and
  // its command) or lets it go on, for a pause the harness ends when
  // something else has happened (pause() ends after a time).
  void stop_worker(int id) { workers_.at(id).frozen = freeze_process_tree(workers_.at(id).pid()); }
  void continue_worker(int id) {
    Entry& w = workers_.at(id);
    signal_processes(w.frozen, SIGCONT);
    w.frozen.clear();
  }

  // Every worker's connections to the member on `port` pass nothing for
  // `d`: that member is cut off from the clients, not from its peers.
  FaultEvent partition_member(int port, Clock::Duration d) {
    const Nanos start = now_nanos(*clock_);
    for (TcpProxy* proxy : proxies(0, port)) proxy->set_blackhole(true);
    std::this_thread::sleep_for(d);
    for (TcpProxy* proxy : proxies(0, port)) proxy->set_blackhole(false);
    return {"partition-leader", 0, start, now_nanos(*clock_)};
  }

  // split-leader's clients: while `on`, the odd-numbered workers reach only
  // the member on `port` (the cut-off leader) and the others every member
  // but it; then everyone everything again.
  void split_clients(int port, bool on) {
    for (auto& [id, w] : workers_) {
      if (w.done) continue;
      for (auto& [member, proxy] : w.proxies) {
        proxy->set_blackhole(on && ((id % 2 == 1) != (member == port)));
      }
    }
  }

  // The worker's whole process tree at once (a `simba run` worker's simba
  // and command too): frozen first so that nothing in it acts, or forks,
  // after `at`.
  FaultEvent kill(int id) override {
    Entry& w = workers_.at(id);
    // The worker dies when it stops acting: once its tree is frozen, not
    // when we set out to freeze it (what it logged in between is its own,
    // not after its death).
    const std::vector<pid_t> tree = freeze_process_tree(w.pid());
    const Nanos at = now_nanos(*clock_);
    signal_processes(tree, SIGKILL);
    w.process->wait();
    w.fate.killed = true;
    w.done = true;
    return {"kill", id, at, at};
  }

  FaultEvent pause(int id, Clock::Duration d) override {
    Entry& w = workers_.at(id);
    // Paused from the moment the tree is frozen (see kill).
    const std::vector<pid_t> tree = freeze_process_tree(w.pid());
    const Nanos start = now_nanos(*clock_);
    std::this_thread::sleep_for(d);
    signal_processes(tree, SIGCONT);
    return {"pause", id, start, now_nanos(*clock_)};
  }

  std::vector<WorkerHistory> finish() override {
    for (auto& [id, w] : workers_) {
      if (!w.done) w.process->signal(SIGTERM);
    }
    std::vector<WorkerHistory> histories;
    for (auto& [id, w] : workers_) {
      if (!w.done) {
        // A clean stop releases the mutex: one store call, bounded by the
        // operation timeout.
        const auto status = w.process->wait_for(scaled(milliseconds(15000)));
        if (!status) {
          w.fate.detail = "did not exit within 15 s of SIGTERM (hung)";
          w.process->signal(SIGKILL);
          w.process->wait();
        } else if (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) {
          w.fate.exited_cleanly = true;
        } else if (WIFEXITED(*status)) {
          w.fate.detail = "exited with status " + std::to_string(WEXITSTATUS(*status));
        } else {
          w.fate.detail = "died of signal " + std::to_string(WTERMSIG(*status));
        }
        w.done = true;
      }
      WorkerHistory h;
      h.worker = id;
      h.fate = w.fate;
      std::ifstream in(log_path(id));
      std::string line;
      while (std::getline(in, line)) {
        if (auto e = parse_worker_event(line)) h.events.push_back(*e);
      }
      histories.push_back(std::move(h));
    }
    return histories;
  }

  // A worker that exited on its own while the run went on (a crash).
  void note_unexpected_exits() {
    for (auto& [id, w] : workers_) {
      if (w.done) continue;
      if (auto status = w.process->wait_for(milliseconds(0))) {
        w.done = true;
        w.fate.detail = "exited during the run (wait status " + std::to_string(*status) + ")";
        say("worker " + std::to_string(id) + " " + w.fate.detail);
      }
    }
  }

 private:
  struct Entry {
    pid_t pid() const { return process->pid(); }
    std::unique_ptr<Subprocess> process;
    std::map<int, std::unique_ptr<TcpProxy>> proxies;  // by member port; none if embedded
    WorkerFate fate;
    bool done = false;
    std::vector<pid_t> frozen;  // stopped by stop_worker()
  };
  // The proxies of worker `id` (0: of every live worker), to member `port`
  // (0: to every member).
  std::vector<TcpProxy*> proxies(int id, int port = 0) {
    std::vector<TcpProxy*> found;
    for (auto& [worker, w] : workers_) {
      if (w.done || (id != 0 && id != worker)) continue;
      for (auto& [member, proxy] : w.proxies) {
        if (port == 0 || port == member) found.push_back(proxy.get());
      }
    }
    return found;
  }
  std::string log_path(int id) const { return dir_ + "/worker-" + std::to_string(id) + ".log"; }

  const RunOptions& options_;
  std::string uri_;
  std::vector<UriHost> members_;
  std::string dir_, socket_;
  std::shared_ptr<Clock> clock_ = Clock::steady();
  std::map<int, Entry> workers_;
};

// memory://: threads on one ManualClock that a driver thread moves at about
// the pace of real time; each worker reaches the shared store through a
// FaultInjectingBackend of its own, so one of them can be cut off.
class ThreadWorkers final : public Workers {
 public:
  ThreadWorkers(const RunOptions& options, FencedResource* resource,
                std::shared_ptr<ManualClock> clock)
      : options_(options), resource_(resource), clock_(std::move(clock)) {
    store_ = new_memory_backend({"fault-run", clock_}).value();
    driver_ = std::thread([this] {
      while (!stop_driver_) {
        std::this_thread::sleep_for(milliseconds(2));
        clock_->advance(milliseconds(2));
      }
    });
  }
  ~ThreadWorkers() override {
    for (auto& [id, w] : workers_) {
      w->stop = true;
      if (w->thread.joinable()) w->thread.join();
    }
    stop_driver_ = true;
    driver_.join();
  }

  const Clock& clock() const override { return *clock_; }
  // Some worker thread never stopped: the process must end without joining.
  bool hung() const { return hung_; }

  Status spawn(int id) override {
    auto w = std::make_unique<Entry>();
    w->faults = std::make_shared<FaultInjectingBackend>(store_);
    w->faults->set_lease_stretch(options_.lease_stretch);
    FactoryOptions factory_options;
    factory_options.clock = clock_;
    factory_options.contend.ttl = options_.ttl;
    factory_options.contend.transition = options_.transition;
    factory_options.contend.operation_timeout = options_.op_timeout;
    auto factory = MutexContendServiceFactory::create(w->faults, factory_options);
    if (!factory.ok()) return factory.status();
    w->factory = std::move(*factory);
    FaultWorkerOptions worker_options;
    worker_options.id = id;
    worker_options.contend = factory_options.contend;
    worker_options.seed = options_.seed * 1000 + static_cast<std::uint64_t>(id);
    worker_options.hold_min = options_.hold_min;
    worker_options.hold_max = options_.hold_max;
    Entry* raw = w.get();
    w->thread = std::thread([this, raw, worker_options] {
      FaultWorker worker(
          raw->factory.get(), resource_,
          [raw](const std::string& line) {
            std::lock_guard<std::mutex> lock(raw->mu);
            if (!raw->dead) raw->lines.push_back(line);
          },
          worker_options);
      const Status status = worker.run([raw] { return raw->stop.load(); });
      std::lock_guard<std::mutex> lock(raw->mu);
      raw->status = status;
      raw->done = true;
      raw->done_cv.notify_all();
    });
    workers_[id] = std::move(w);
    return ok_status();
  }

  FaultEvent kill(int id) override {
    Entry& w = *workers_.at(id);
    const Nanos at = now_nanos(*clock_);
    {
      std::lock_guard<std::mutex> lock(w.mu);
      w.dead = true;  // nothing it does from now on is heard
    }
    w.faults->set_mode(FaultInjectingBackend::Mode::kFail);  // nor reaches the store
    w.stop = true;
    w.thread.join();
    w.factory.reset();
    w.killed = true;
    return {"crash", id, at, at};
  }

  FaultEvent pause(int id, Clock::Duration d) override {
    Entry& w = *workers_.at(id);
    const Nanos start = now_nanos(*clock_);
    w.faults->set_mode(FaultInjectingBackend::Mode::kHang);
    sleep_on(*clock_, d);
    w.faults->set_mode(FaultInjectingBackend::Mode::kPass);
    return {"hang", id, start, now_nanos(*clock_)};
  }

  FaultEvent jump(Clock::Duration d) {
    const Nanos start = now_nanos(*clock_);
    clock_->advance(d);
    return {"clock-jump", 0, start, now_nanos(*clock_)};
  }

  std::vector<WorkerHistory> finish() override {
    for (auto& [id, w] : workers_) w->stop = true;
    std::vector<WorkerHistory> histories;
    const auto give_up = std::chrono::steady_clock::now() + scaled(milliseconds(15000));
    for (auto& [id, w] : workers_) {
      bool finished;
      {
        std::unique_lock<std::mutex> lock(w->mu);
        finished = w->done_cv.wait_until(lock, give_up, [&worker = *w] { return worker.done; });
      }
      if (finished) {
        if (w->thread.joinable()) w->thread.join();
        w->factory.reset();
      } else {
        // A worker that does not stop is the finding; it cannot be joined,
        // so the run ends the process once the report is out (hung()).
        w->thread.detach();
        hung_ = true;
      }
      WorkerHistory h;
      h.worker = id;
      std::lock_guard<std::mutex> lock(w->mu);
      h.fate.killed = w->killed;
      h.fate.exited_cleanly = finished && !w->killed && w->status.ok();
      if (!finished) {
        h.fate.detail = "did not stop within 15 s of being asked (hung)";
      } else if (!w->killed && !w->status.ok()) {
        h.fate.detail = w->status.to_string();
      }
      for (const std::string& line : w->lines) {
        if (auto e = parse_worker_event(line)) h.events.push_back(*e);
      }
      histories.push_back(std::move(h));
    }
    return histories;
  }

  // The workers' logs as lines, for the run's directory.
  std::map<int, std::vector<std::string>> lines() {
    std::map<int, std::vector<std::string>> all;
    for (auto& [id, w] : workers_) {
      std::lock_guard<std::mutex> lock(w->mu);
      all[id] = w->lines;
    }
    return all;
  }

 private:
  struct Entry {
    std::shared_ptr<FaultInjectingBackend> faults;
    std::unique_ptr<MutexContendServiceFactory> factory;
    std::thread thread;
    std::atomic<bool> stop{false};
    std::mutex mu;
    std::vector<std::string> lines;  // guarded by mu
    bool dead = false;               // guarded by mu
    Status status;                   // guarded by mu
    bool done = false;               // guarded by mu: Run() returned
    std::condition_variable done_cv;
    bool killed = false;
  };

  const RunOptions& options_;
  FencedResource* resource_;
  std::shared_ptr<ManualClock> clock_;
  std::shared_ptr<Backend> store_;
  std::map<int, std::unique_ptr<Entry>> workers_;
  std::atomic<bool> stop_driver_{false};
  std::thread driver_;
  bool hung_ = false;
};

// ---- the run -------------------------------------------------------------------------------

class Run {
 public:
  explicit Run(RunOptions options) : options_(std::move(options)), random_(options_.seed) {}

  int main() {
    say("store " + options_.store + (options_.volatile_store ? " (volatile)" : "") +
        (options_.topology.empty() ? "" : ", topology " + options_.topology) +
        (options_.api == "contend" ? "" : ", api " + options_.api) + ", " +
        std::to_string(options_.workers) + " workers, ttl " + std::to_string(options_.ttl.count()) +
        " ms + transition " + std::to_string(options_.transition.count()) + " ms, " +
        std::to_string(options_.duration.count()) + " s, seed " + std::to_string(options_.seed) +
        ", logs in " + options_.out);
    if (Status s = set_up(); !s.ok()) {
      std::cerr << "fault-run: cannot set up: " << s.to_string() << "\n";
      return 3;
    }
    for (int i = 0; i < options_.workers; ++i) {
      if (Status s = workers_->spawn(++last_id_); !s.ok()) {
        std::cerr << "fault-run: " << s.to_string() << "\n";
        return 3;
      }
    }
    schedule();
    if (broken_) {
      std::cerr << "fault-run: the store could not be restarted or made whole again; no verdict\n";
      keep_server_logs();
      return 3;
    }
    const Nanos run_end = now_nanos(workers_->clock());
    std::vector<WorkerHistory> histories = workers_->finish();
    const std::vector<ResourceEvent> decisions = register_->decisions();
    write_logs(decisions, histories, run_end);
    const int status = judge(options_, histories, decisions, faults_, run_end);
    if (status != 0) keep_server_logs();
    if (threads_ != nullptr && threads_->hung()) {
      std::cout.flush();
      std::_Exit(status);
    }
    return status;
  }

  // A failed run keeps the servers' own logs (OUT/servers/...), which go
  // with their data directory otherwise: what a member did around a
  // violation is half of explaining it.
  void keep_server_logs() {
    std::string from;
    if (topology_ != nullptr) from = topology_->dir();
    if (server_ != nullptr) from = server_->dir();
    if (from.empty()) return;
    namespace fs = std::filesystem;
    std::error_code error;
    const fs::path to = fs::path(options_.out) / "servers";
    for (auto it = fs::recursive_directory_iterator(from, error);
         !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
      if (!it->is_regular_file(error) || it->path().extension() != ".log") continue;
      const fs::path target = to / fs::relative(it->path(), from, error);
      fs::create_directories(target.parent_path(), error);
      fs::copy_file(it->path(), target, fs::copy_options::overwrite_existing, error);
    }
    say("the servers' logs are kept in " + to.string());
  }

  // Checks a run, prints and saves the report; the exit status.
  static int judge(const RunOptions& options, const std::vector<WorkerHistory>& histories,
                   const std::vector<ResourceEvent>& decisions,
                   const std::vector<FaultEvent>& faults, Nanos run_end) {
    CheckOptions check;
    check.ttl = options.ttl;
    check.transition = options.transition;
    check.run_end = run_end;
    // A worker's loop blocks in stop() for one store call at most (it
    // releases before contending again), and a restarting server can hold
    // that call for its whole timeout.
    check.hang_after = scaled(milliseconds(3000)) + 2 * options.op_timeout;
    check.signal_slack = scaled(milliseconds(500));
    check.deadline_promised = options.api != "run";
    check.takeover_bound =
        options.ttl + options.transition + milliseconds(2000) + options.failover_allowance;
    set_minimums(options, histories, faults, run_end, &check);
    const CheckReport report = check_history(histories, decisions, faults, check);
    std::cout << report.summary();
    std::ofstream(options.out + "/report.txt") << report.summary();
    if (options.expect_violations) {
      // gave-up: workers that give up early make nothing else to prove
      // (a store that refuses every run has no owner at all).
      std::string unproven = options.expect_rule == "gave-up" ? "" : unproven_overlap(report);
      if (unproven.empty() && !options.expect_rule.empty() &&
          std::none_of(report.violations.begin(), report.violations.end(),
                       [&](const Violation& v) { return v.rule == options.expect_rule; })) {
        unproven = "no [" + options.expect_rule + "], which this run was set up to make";
      }
      const std::string made =
          options.expect_rule == "gave-up" ? "the workers that gave up early" : "the two owners";
      say(unproven.empty() ? "PASS: the checker caught " + made + " this run was set up to make"
                           : "FAIL: " + unproven + " (logs kept in " + options.out + ")");
      return unproven.empty() ? 0 : 1;
    }
    say(report.ok() ? "PASS" : "FAIL (logs kept in " + options.out + ")");
    return report.ok() ? 0 : 1;
  }

  // The least a run must do to prove anything (CheckOptions::min_*); a run
  // below it fails with too-little-activity. `span` is from the first
  // worker's start to the end of the run.
  static void set_minimums(const RunOptions& options, const std::vector<WorkerHistory>& histories,
                           const std::vector<FaultEvent>& faults, Nanos run_end,
                           CheckOptions* check) {
    Nanos first = run_end;
    for (const WorkerHistory& h : histories) {
      if (!h.events.empty()) first = std::min(first, h.events.front().t);
    }
    const double span = static_cast<double>(std::max<Nanos>(run_end - first, 0)) / 1e9;
    // Writes: 5 accepted per second of run. An owner writes every 25 ms
    // (40 a second); the mutex goes without an owner only between a fault
    // and its takeover (at most ttl + transition + 2 s = 3.5 s of each fault
    // cycle of 5.5 s or more) and for the few milliseconds of a hand-over,
    // so a working run accepts more than 13 a second (28-34 in the long runs
    // of docs/reliability.md): 5 is well below anything that wrote at all.
    check->min_writes_accepted = static_cast<int>(5 * span);
    // Acquisitions: half the slowest pace the workers' loop allows. A holder
    // lets go within its longest hold (hold_max; for keyed workers the
    // lease's max_hold), rests at most rest_max (300 ms), and the next
    // owner comes within the takeover bound even after a fault, so the mutex
    // changes hands at least once per hold_max + 0.3 s + bound (5.3 s with
    // the defaults; the long runs see one a second); at least 2, or the
    // mutex never changed hands.
    const double cycle =
        static_cast<double>(
            (longest_hold(options) + milliseconds(300) + *check->takeover_bound).count()) /
        1000;
    check->min_acquisitions = std::max(2, static_cast<int>(span / (2 * cycle)));
    // Faults aimed at a worker: at least half must find it holding the
    // mutex. The harness aims them at the worker whose write the fence
    // accepts next (waiting up to 3 s for one) and keeps that write's reply
    // back for 20 ms, so one misses only when no write came or its worker
    // died meanwhile; more than half missing means the faults tested
    // waiters, which any store survives.
    const auto aimed = std::count_if(faults.begin(), faults.end(),
                                     [](const FaultEvent& f) { return f.worker != 0; });
    check->min_holder_faults = static_cast<int>((aimed + 1) / 2);
  }

  // --check DIR: the checker again over the logs of an earlier run (after a
  // change to the checker, or to read a failure again).
  static int recheck(RunOptions options) {
    const std::string& dir = options.out;
    auto lines = [](const std::string& path) {
      std::vector<std::string> all;
      std::ifstream in(path);
      for (std::string line; std::getline(in, line);) all.push_back(line);
      return all;
    };
    Nanos run_end = 0;
    std::map<int, WorkerFate> fates;
    for (const std::string& line : lines(dir + "/run.log")) {
      std::map<std::string, std::string> w = line_words(line);
      if (w["ev"] == "run") {
        options.ttl = milliseconds(std::atoll(w["ttl_ms"].c_str()));
        options.transition = milliseconds(std::atoll(w["transition_ms"].c_str()));
        options.op_timeout = milliseconds(std::atoll(w["op_timeout_ms"].c_str()));
        options.failover_allowance =
            milliseconds(std::atoll(w["failover_allowance_ms"].c_str()));  // 0 if absent
        // (Only what the checker reads: keyed runs record their longest hold.)
        if (w["api"] == "run") options.api = "run";
        if (w.count("hold_max_ms") != 0) {
          options.hold_max = milliseconds(std::atoll(w["hold_max_ms"].c_str()));
        }
        if (w.count("expect_violations") != 0) {
          options.expect_violations = w["expect_violations"] == "1";
          options.expect_rule = w["expect_rule"];
        }
        run_end = std::atoll(w["run_end"].c_str());
      } else if (w["ev"] == "fate") {
        WorkerFate& f = fates[std::atoi(w["worker"].c_str())];
        f.killed = w["killed"] == "1";
        f.exited_cleanly = w["clean"] == "1";
        f.detail = w["detail"];
        std::replace(f.detail.begin(), f.detail.end(), '_', ' ');
      }
    }
    std::vector<FaultEvent> faults;
    for (const std::string& line : lines(dir + "/faults.log")) {
      if (auto e = parse_fault_event(line)) faults.push_back(*e);
    }
    std::vector<ResourceEvent> decisions;
    for (const std::string& line : lines(dir + "/resource.log")) {
      if (auto e = parse_resource_event(line)) decisions.push_back(*e);
    }
    std::vector<WorkerHistory> histories;
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
      const std::string name = entry.path().filename().string();
      int id = 0;
      if (std::sscanf(name.c_str(), "worker-%d.log", &id) != 1) continue;
      WorkerHistory h;
      h.worker = id;
      for (const std::string& line : lines(entry.path().string())) {
        if (auto e = parse_worker_event(line)) h.events.push_back(*e);
      }
      if (auto f = fates.find(id); f != fates.end()) {
        h.fate = f->second;
      } else {
        // No fate recorded (a run from before run.log): killed if a fault
        // says so, clean if its log ends with ev=exit.
        h.fate.killed = std::any_of(faults.begin(), faults.end(), [&](const FaultEvent& fault) {
          return fault.worker == id && (fault.kind == "kill" || fault.kind == "crash");
        });
        h.fate.exited_cleanly =
            !h.fate.killed && !h.events.empty() && h.events.back().kind == WorkerEvent::Kind::kExit;
        if (!h.fate.killed && !h.fate.exited_cleanly) h.fate.detail = "no ev=exit in its log";
      }
      histories.push_back(std::move(h));
    }
    std::sort(histories.begin(), histories.end(),
              [](const WorkerHistory& a, const WorkerHistory& b) { return a.worker < b.worker; });
    if (histories.empty()) {
      std::cerr << "fault-run: no worker-*.log in " << dir << "\n";
      return 3;
    }
    if (run_end == 0) {
      for (const WorkerHistory& h : histories) {
        if (!h.events.empty()) run_end = std::max(run_end, h.events.back().t);
      }
    }
    say("checking the logs in " + dir + " again (ttl " + std::to_string(options.ttl.count()) +
        " ms + transition " + std::to_string(options.transition.count()) + " ms)");
    return judge(options, histories, decisions, faults, run_end);
  }

 private:
  Status set_up() {
    if (options_.store == "memory") {
      // The resource lives on the workers' virtual clock.
      auto clock = std::make_shared<ManualClock>();
      register_ = std::make_unique<FencedRegister>(clock);
      auto threads = std::make_unique<ThreadWorkers>(options_, register_.get(), clock);
      threads_ = threads.get();
      workers_ = std::move(threads);
      return ok_status();
    }
    register_ = std::make_unique<FencedRegister>(Clock::steady());
    std::string uri;
    std::vector<UriHost> members;
    if (!options_.topology.empty()) {
      auto topology = FaultTopology::start(options_.topology);
      if (!topology.ok()) return topology.status();
      topology_ = std::move(*topology);
      uri = topology_->uri();
      if (FaultTopology::clients_dial_members(options_.topology)) members = uri_hosts(uri);
    } else if (options_.store == "sqlite") {
      uri = "sqlite://" + options_.out + "/store.db";
    } else {
      std::vector<std::string> extra;
      if (options_.store == "redis" && !options_.volatile_store) {
        extra = {"--appendonly", "yes", "--appendfsync", "always"};
      }
      auto server = TestServer::start(options_.store, extra);
      if (!server.ok()) return server.status();
      server_ = std::move(*server);
      uri = server_->uri();
      members = uri_hosts(uri);
      if (members.size() != 1 || members[0].port != server_->port()) {
        return internal_error("cannot tell the host of " + uri);
      }
    }
    std::string query = options_.uri_query;
    if (options_.store == "zookeeper" && query.find("session_timeout") == std::string::npos) {
      // As docs/backends/zookeeper.md advises for a short lease: the C client waits
      // 2/3 of the session timeout on a connection that reached a server
      // still starting, and 10 s (the default) would outlast the takeover
      // bound of a 1.5 s lease after a restart.
      const auto lease = options_.ttl + options_.transition;
      const auto whole_seconds = std::max<long long>(2, (2 * lease.count() + 999) / 1000);
      query += std::string(query.empty() ? "" : "&") +
               "session_timeout=" + std::to_string(whole_seconds) + "s";
    }
    if (!query.empty()) {
      uri += (uri.find('?') == std::string::npos ? "?" : "&") + query;
    }
    auto server = FencedRegisterServer::start(options_.out + "/resource.sock", register_.get());
    if (!server.ok()) return server.status();
    resource_server_ = std::move(*server);
    auto processes = std::make_unique<ProcessWorkers>(
        options_, uri, std::move(members), options_.out, options_.out + "/resource.sock");
    processes_ = processes.get();
    workers_ = std::move(processes);
    return ok_status();
  }

  Clock::Duration uniform(milliseconds lo, milliseconds hi) {
    return milliseconds(
        std::uniform_int_distribution<std::int64_t>(lo.count(), hi.count())(random_));
  }

  void sleep(Clock::Duration d) {
    sleep_on(workers_->clock(), d);
    if (processes_ != nullptr) processes_->note_unexpected_exits();
  }

  // The worker holding the mutex now. With worker processes the register
  // keeps the next accepted writer mid-write for 20 ms, and the fault
  // strikes in that time: a worker lets go only after a write returns, so
  // it is certainly holding. (Striking just after a write instead would
  // meet the holder's release after its last write about one time in 30,
  // and up to 300 ms after one, as this once did, far more often: enough
  // to fail short runs on too-little-activity.) Threads share the register
  // with their faults, so there it takes a write it saw land within 5 ms.
  // Waits up to 3 s for a write, then takes any live worker.
  int holder() {
    if (processes_ != nullptr) {
      const auto caught = register_->catch_next_writer(seconds(3), milliseconds(20));
      if (caught && live_.count(caught->worker) != 0) {
        victim_token_ = caught->token;
        return caught->worker;
      }
      return *live_.begin();
    }
    const Nanos give_up = now_nanos(workers_->clock()) + 3'000'000'000;
    const auto before = register_->last_accepted();
    while (now_nanos(workers_->clock()) < give_up) {
      const auto last = register_->last_accepted();
      const bool fresh = last && (!before || last->t != before->t || last->seq != before->seq);
      if (fresh && live_.count(last->worker) != 0 &&
          now_nanos(workers_->clock()) - last->t < 5'000'000) {
        victim_token_ = last->token;
        return last->worker;
      }
      sleep_on(workers_->clock(), milliseconds(1));
    }
    return *live_.begin();
  }

  void schedule() {
    for (int id = 1; id <= last_id_; ++id) live_.insert(id);
    std::vector<std::string> kinds =
        options_.faults.empty() ? faults_for(options_.store, options_.topology) : options_.faults;
    std::shuffle(kinds.begin(), kinds.end(), random_);
    if (!options_.topology.empty()) {
      // The store's faults first: a short run (CI's 45 s has room for about
      // four) then spends itself on what only a topology run can do; the
      // workers' own faults are what every single-server run covers.
      const std::vector<std::string> store = FaultTopology::store_faults(options_.topology);
      std::stable_partition(kinds.begin(), kinds.end(), [&](const std::string& k) {
        return std::find(store.begin(), store.end(), k) != store.end();
      });
    }
    const milliseconds lease = options_.ttl + options_.transition;
    const milliseconds window =
        lease + milliseconds(2000) + milliseconds(500) + options_.failover_allowance;
    const Nanos end =
        now_nanos(workers_->clock()) +
        std::chrono::duration_cast<std::chrono::nanoseconds>(options_.duration).count();
    sleep(milliseconds(1500));  // everyone started and contending
    for (std::size_t n = 0; now_nanos(workers_->clock()) < end && !broken_; ++n) {
      const std::string& kind = kinds[n % kinds.size()];
      victim_token_ = 0;
      FaultEvent fault = inject(kind, lease);
      std::string whom;
      if (fault.worker != 0) {
        whom = " of worker " + std::to_string(fault.worker);
        whom += victim_token_ != 0 ? " (the holder, token " + std::to_string(victim_token_) + ")"
                                   : " (no holder found: a waiter)";
      }
      say("fault " + kind + whom + ", healed after " +
          std::to_string((fault.end - fault.start) / 1'000'000) + " ms");
      faults_.push_back(fault);
      // The quiet window after a fault: the checker expects an owner in it.
      sleep(window);
    }
  }

  FaultEvent inject(const std::string& kind, milliseconds lease) {
    const Clock& clock = workers_->clock();
    if (kind == "kill" || kind == "crash") {
      const int victim = holder();
      FaultEvent f = workers_->kill(victim);
      live_.erase(victim);
      if (Status s = workers_->spawn(++last_id_); s.ok()) {
        live_.insert(last_id_);
      } else {
        say("cannot replace the killed worker: " + s.to_string());
      }
      return f;
    }
    if (kind == "pause" || kind == "hang") {
      // Longer than the lease the holder believes in (stretched or not).
      return workers_->pause(holder(), lease + options_.lease_stretch +
                                           uniform(milliseconds(200), milliseconds(1000)));
    }
    if (kind == "clock-jump" && threads_ != nullptr) {
      return threads_->jump(lease + uniform(milliseconds(100), milliseconds(1000)));
    }
    if (kind == "restart" && server_ != nullptr) {
      const Nanos start = now_nanos(clock);
      Status s = server_->kill();
      if (s.ok()) s = server_->restart();
      if (!s.ok()) s = server_->restart();  // once more: a port race, a slow start
      if (!s.ok()) {
        // Not the library's fault: the run cannot go on and says so (exit 3)
        // rather than blaming a store that is not there.
        say("restart failed: " + s.to_string());
        broken_ = true;
      }
      return {"restart", 0, start, now_nanos(clock)};
    }
    if (topology_ != nullptr &&
        (kind == "kill-leader" || kind == "pause-leader" || kind == "partition-leader" ||
         kind == "isolate-leader" || kind == "isolate-follower" || kind == "split-leader" ||
         kind == "failover" || kind == "lagging-failover" || kind == "rolling-restart")) {
      return store_fault(kind, lease);
    }
    const bool proxied =
        server_ != nullptr ||
        (topology_ != nullptr && FaultTopology::clients_dial_members(options_.topology));
    if ((kind == "cut" || kind == "cut-all") && proxied) {
      return processes_->cut(kind == "cut" ? holder() : 0);
    }
    if ((kind == "blackhole" || kind == "blackhole-all") && proxied) {
      const int whom = kind == "blackhole" ? holder() : 0;
      return processes_->blackhole(whom, lease + uniform(milliseconds(200), milliseconds(1000)));
    }
    say("fault " + kind + " does not apply to store " + options_.store + "; skipped");
    const Nanos now = now_nanos(clock);
    return {kind + "-skipped", 0, now, now};
  }

  // A fault of the replicated store itself (FaultTopology). Healed once the
  // topology serves again with every member back; if it cannot be made
  // whole, the run ends without a verdict (exit 3), as for a restart.
  FaultEvent store_fault(const std::string& kind, milliseconds lease) {
    const Clock& clock = workers_->clock();
    const auto beyond_lease = lease + uniform(milliseconds(200), milliseconds(1000));
    // Where the clients dial the members, their proxies cut the leader off;
    // elsewhere the topology's lab does (below).
    if (kind == "partition-leader" && FaultTopology::clients_dial_members(topology_->name())) {
      auto port = topology_->leader_port();
      if (port.ok()) return processes_->partition_member(*port, beyond_lease);
      say("no leader to partition: " + port.status().to_string());
      broken_ = true;
      const Nanos now = now_nanos(clock);
      return {kind, 0, now, now};
    }
    const Nanos start = now_nanos(clock);
    const auto down = std::chrono::duration_cast<milliseconds>(beyond_lease);
    if (kind == "lagging-failover") return lagging_failover(lease);
    if (kind == "split-leader") {
      auto port = topology_->leader_port();
      Result<std::string> done = port.status();
      if (port.ok()) {
        // Long enough for the majority to elect and a lease to run out
        // there while the minority still has clients (the allowance).
        const auto cut = down + options_.failover_allowance;
        done =
            topology_->isolate(true, cut, [&](bool on) { processes_->split_clients(*port, on); });
      }
      if (done.ok()) {
        say(kind + ": " + *done + ", the clients split with it");
      } else {
        say(kind + " failed: " + done.status().to_string());
        broken_ = true;
      }
      return {kind, 0, start, now_nanos(clock)};
    }
    // The fault runs on a thread of its own while this one starts a fresh
    // worker in its first moments: a new process whose first calls meet
    // the store failing over, and which must wait for it within its
    // deadline (the checker's gave-up rule). Spawned from this thread: a
    // worker's death signal follows the thread that started it.
    std::optional<Result<std::string>> outcome;
    std::thread fault([&] {
      outcome = kind == "kill-leader"        ? topology_->kill_leader(down)
                : kind == "pause-leader"     ? topology_->pause_leader(down)
                : kind == "isolate-leader"   ? topology_->isolate(true, down)
                : kind == "isolate-follower" ? topology_->isolate(false, down)
                : kind == "partition-leader" ? topology_->cut_leader_from_clients(down)
                : kind == "failover"         ? topology_->failover()
                                             : topology_->rolling_restart();
    });
    sleep(uniform(milliseconds(100), milliseconds(1500)));
    if (Status s = workers_->spawn(++last_id_); s.ok()) {
      live_.insert(last_id_);
      say("worker " + std::to_string(last_id_) + " started during " + kind);
    } else {
      say("cannot start a worker during " + kind + ": " + s.to_string());
    }
    fault.join();
    Result<std::string> done = std::move(*outcome);
    if (done.ok()) {
      say(kind + ": " + *done);
    } else {
      say(kind + " failed: " + done.status().to_string());
      broken_ = true;
    }
    return {kind, 0, start, now_nanos(clock)};
  }

  // Redis's lost-write window made certain. The replicas are cut off for
  // longer than a lease, so whoever holds the mutex then holds it under a
  // key no replica has (or has with an expiry that has passed). The holder
  // is stopped as the primary dies, and resumed once another worker has
  // written after the promotion (or a lease and a second after it), while
  // the new primary stalls for 500 ms: the holder cannot hear from the new
  // primary that it lost, as if a partition kept it from it. (A holder that
  // reaches the new primary hears it within a millisecond of the waiters,
  // whom the same failover wakes: too narrow a window to catch.) With
  // restart_guard=off (the negative control) a waiter takes the mutex on
  // the new primary at once, and the resumed holder acts within its old
  // lease after it; with the guard nobody acquires until that lease has
  // ended. The holder's stop is logged as a `pause` of it (the checker
  // allows for it as for any pause); the fault itself starts at the
  // primary's kill, since cutting the replicas off changes nothing the
  // clients see.
  FaultEvent lagging_failover(milliseconds lease) {
    const Clock& clock = workers_->clock();
    const auto lag = std::chrono::duration_cast<milliseconds>(
        lease + uniform(milliseconds(500), milliseconds(1000)));
    int victim = 0;
    Nanos killed_at = 0;
    FaultTopology::LaggingFailoverSteps steps;
    steps.before_kill = [&] {
      victim_token_ = 0;
      victim = holder();
      processes_->stop_worker(victim);
      killed_at = now_nanos(clock);
    };
    steps.after_promotion = [&] {
      if (victim == 0) return;
      const Nanos give_up =
          now_nanos(clock) +
          std::chrono::duration_cast<std::chrono::nanoseconds>(lease + seconds(1)).count();
      while (now_nanos(clock) < give_up) {
        const auto last = register_->last_accepted();
        if (last && last->worker != victim && last->t > killed_at) break;
        sleep_on(clock, milliseconds(5));
      }
    };
    steps.while_stalled = [&] {
      if (victim == 0) return;
      processes_->continue_worker(victim);
      faults_.push_back({"pause", victim, killed_at, now_nanos(clock)});
      const auto stopped_ms = (now_nanos(clock) - killed_at) / 1'000'000;
      // A holder stopped for longer than its lease knows on waking that it
      // lost: such a run cannot show the lost write, whatever the guard does.
      say("lagging-failover: worker " + std::to_string(victim) +
          (victim_token_ != 0 ? " (the holder, token " + std::to_string(victim_token_) + ")"
                              : " (no holder found: a waiter)") +
          " stopped for " + std::to_string(stopped_ms) + " ms from the primary's kill" +
          (stopped_ms >= lease.count() ? ", past its lease of " + std::to_string(lease.count()) +
                                             " ms: too late to act on it"
                                       : ""));
    };
    const Nanos began = now_nanos(clock);
    Result<std::string> done = topology_->lagging_failover(lag, milliseconds(500), steps);
    if (done.ok()) {
      say("lagging-failover: " + *done);
    } else {
      say("lagging-failover failed: " + done.status().to_string());
      broken_ = true;
    }
    return {"lagging-failover", 0, killed_at != 0 ? killed_at : began, now_nanos(clock)};
  }

  void write_logs(const std::vector<ResourceEvent>& decisions,
                  const std::vector<WorkerHistory>& histories, Nanos run_end) {
    std::ofstream run(options_.out + "/run.log");
    run << "ev=run store=" << options_.store
        << " topology=" << (options_.topology.empty() ? "none" : options_.topology)
        << " failover_allowance_ms=" << options_.failover_allowance.count()
        << " volatile=" << (options_.volatile_store ? 1 : 0) << " ttl_ms=" << options_.ttl.count()
        << " transition_ms=" << options_.transition.count()
        << " op_timeout_ms=" << options_.op_timeout.count() << " api=" << options_.api
        << " hold_max_ms=" << longest_hold(options_).count()
        << " lease_stretch_ms=" << options_.lease_stretch.count()
        << " expect_violations=" << (options_.expect_violations ? 1 : 0)
        << " expect_rule=" << options_.expect_rule << " seed=" << options_.seed
        << " run_end=" << run_end << "\n";
    for (const WorkerHistory& h : histories) {
      std::string detail = h.fate.detail;
      std::replace(detail.begin(), detail.end(), ' ', '_');
      run << "ev=fate worker=" << h.worker << " killed=" << (h.fate.killed ? 1 : 0)
          << " clean=" << (h.fate.exited_cleanly ? 1 : 0) << " detail=" << detail << "\n";
    }
    std::ofstream resource(options_.out + "/resource.log");
    for (const ResourceEvent& e : decisions) resource << format_resource_event(e) << "\n";
    std::ofstream faults(options_.out + "/faults.log");
    for (const FaultEvent& e : faults_) faults << format_fault_event(e) << "\n";
    if (threads_ != nullptr) {
      for (const auto& [id, lines] : threads_->lines()) {
        std::ofstream out(options_.out + "/worker-" + std::to_string(id) + ".log");
        for (const std::string& line : lines) out << line << "\n";
      }
    }
  }

  RunOptions options_;
  std::mt19937_64 random_;
  std::unique_ptr<FencedRegister> register_;
  std::unique_ptr<TestServer> server_;
  std::unique_ptr<FaultTopology> topology_;
  std::unique_ptr<FencedRegisterServer> resource_server_;
  std::unique_ptr<Workers> workers_;
  ProcessWorkers* processes_ = nullptr;
  ThreadWorkers* threads_ = nullptr;
  std::vector<FaultEvent> faults_;
  std::set<int> live_;
  int last_id_ = 0;
  std::uint64_t victim_token_ = 0;  // what the last Holder() held (0: none)
  bool broken_ = false;             // the harness itself failed (a restart)
};

int usage() {
  std::cerr
      << "usage: simba-fault-run --store memory|sqlite|redis|postgres|mysql|zookeeper|etcd\n"
         "       simba-fault-run --topology redis-sentinel|redis-cluster|etcd-3|zookeeper-3|\n"
         "                                  postgres-standby|mysql-replica\n"
         "         [--duration SECONDS] [--workers N] [--ttl-ms N] [--transition-ms N]\n"
         "         [--op-timeout-ms N] [--faults kill,pause,...|list] [--seed N]\n"
         "         [--out DIR] [--worker PATH] [--volatile on|off] [--uri-query K=V&...]\n"
         "         [--expect-violations on|off|acted-after-takeover|overlap|stale-write|gave-up]\n"
         "         [--hold-ms MIN,MAX] [--api contend|keyed|clustered|run] [--max-hold-ms N]\n"
         "         [--command-lingers-ms N] [--run-timeout-ms N]\n"
         "         [--stretch-lease-ms N]   (contend: an unsafe backend, for a control)\n"
         "       simba-fault-run --check DIR   (the checker again over a run's logs)\n";
  return 2;
}

}  // namespace
}  // namespace simba::testing

int main(int argc, char** argv) {
  using simba::testing::RunOptions;
  RunOptions options;
  options.seed = static_cast<std::uint64_t>(
      std::chrono::system_clock::now().time_since_epoch().count() % 1000000);
  if ((argc - 1) % 2 != 0) return simba::testing::usage();
  std::string check_dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    char* end = nullptr;
    const long long number = std::strtoll(value.c_str(), &end, 10);
    const bool numeric = !value.empty() && *end == '\0' && number > 0;
    auto on_off = [&](bool* out) {
      if (value != "on" && value != "off") {
        std::cerr << "fault-run: " << flag << " takes on or off\n";
        return false;
      }
      *out = value == "on";
      return true;
    };
    auto need_number = [&] {
      if (!numeric) std::cerr << "fault-run: " << flag << " needs a positive number\n";
      return numeric;
    };
    if (flag == "--store") {
      options.store = value;
    } else if (flag == "--topology") {
      options.topology = value;
    } else if (flag == "--duration") {
      if (!need_number()) return 2;
      options.duration = std::chrono::seconds(number);
    } else if (flag == "--workers") {
      if (!need_number()) return 2;
      options.workers = static_cast<int>(number);
    } else if (flag == "--ttl-ms") {
      if (!need_number()) return 2;
      options.ttl = std::chrono::milliseconds(number);
    } else if (flag == "--transition-ms") {
      if (!need_number()) return 2;
      options.transition = std::chrono::milliseconds(number);
    } else if (flag == "--op-timeout-ms") {
      if (!need_number()) return 2;
      options.op_timeout = std::chrono::milliseconds(number);
    } else if (flag == "--seed") {
      if (!need_number()) return 2;
      options.seed = static_cast<std::uint64_t>(number);
    } else if (flag == "--faults") {
      options.faults = simba::testing::split(value, ',');
    } else if (flag == "--out") {
      options.out = value;
    } else if (flag == "--worker") {
      options.worker_path = value;
    } else if (flag == "--volatile") {
      if (!on_off(&options.volatile_store)) return 2;
    } else if (flag == "--uri-query") {
      options.uri_query = value;
    } else if (flag == "--expect-violations") {
      if (value == "acted-after-takeover" || value == "overlap" || value == "stale-write" ||
          value == "gave-up") {
        options.expect_violations = true;
        options.expect_rule = value;
      } else if (!on_off(&options.expect_violations)) {
        std::cerr << "fault-run: (or acted-after-takeover, overlap, stale-write, gave-up)\n";
        return 2;
      }
    } else if (flag == "--stretch-lease-ms") {
      if (!need_number()) return 2;
      options.lease_stretch = std::chrono::milliseconds(number);
    } else if (flag == "--hold-ms") {
      const auto parts = simba::testing::split(value, ',');
      char* a_end = nullptr;
      char* b_end = nullptr;
      const long long lo = parts.size() == 2 ? std::strtoll(parts[0].c_str(), &a_end, 10) : 0;
      const long long hi = parts.size() == 2 ? std::strtoll(parts[1].c_str(), &b_end, 10) : 0;
      if (parts.size() != 2 || *a_end != '\0' || *b_end != '\0' || lo <= 0 || hi < lo) {
        std::cerr << "fault-run: --hold-ms takes MIN,MAX milliseconds\n";
        return 2;
      }
      options.hold_min = std::chrono::milliseconds(lo);
      options.hold_max = std::chrono::milliseconds(hi);
    } else if (flag == "--api") {
      if (value != "contend" && value != "keyed" && value != "clustered" && value != "run") {
        std::cerr << "fault-run: --api takes contend, keyed, clustered or run, not " << value
                  << "\n";
        return 2;
      }
      options.api = value;
    } else if (flag == "--command-lingers-ms") {
      if (!need_number()) return 2;
      options.command_linger = std::chrono::milliseconds(number);
    } else if (flag == "--max-hold-ms") {
      if (!need_number()) return 2;
      options.max_hold = std::chrono::milliseconds(number);
    } else if (flag == "--run-timeout-ms") {
      if (!need_number()) return 2;
      options.run_timeout = std::chrono::milliseconds(number);
    } else if (flag == "--check") {
      check_dir = value;
    } else {
      return simba::testing::usage();
    }
  }
  if (!check_dir.empty()) {
    options.out = check_dir;
    return simba::testing::Run::recheck(options);
  }
  static const std::set<std::string> kStores = {"memory", "sqlite",    "redis", "postgres",
                                                "mysql",  "zookeeper", "etcd"};
  if (!options.topology.empty()) {
    using simba::testing::FaultTopology;
    const auto& names = FaultTopology::names();
    if (std::find(names.begin(), names.end(), options.topology) == names.end()) {
      std::cerr << "fault-run: --topology " << options.topology << " is not one of:";
      for (const auto& n : names) std::cerr << " " << n;
      std::cerr << "\n";
      return 2;
    }
    const std::string store = options.topology.substr(0, options.topology.find('-'));
    if (!options.store.empty() && options.store != store) {
      std::cerr << "fault-run: --topology " << options.topology << " is a " << store
                << " topology, not --store " << options.store << "\n";
      return 2;
    }
    options.store = store;
  }
  if (kStores.count(options.store) == 0) return simba::testing::usage();
  if (options.api != "contend" && options.store == "memory") {
    // Memory workers are threads of the contend service on one ManualClock.
    std::cerr << "fault-run: --api " << options.api << " needs a store other processes reach\n";
    return 2;
  }
  if (options.command_linger.count() > 0 && options.api != "run") {
    std::cerr << "fault-run: --command-lingers-ms is for --api run\n";
    return 2;
  }
  if (options.api == "keyed" && options.store == "mysql") {
    std::cerr << "fault-run: --api keyed on mysql: GET_LOCK mints no fencing token, which the "
                 "fenced resource needs\n";
    return 2;
  }
  if (options.lease_stretch.count() > 0 && options.api != "contend") {
    std::cerr << "fault-run: --stretch-lease-ms is for --api contend (the workers' backends)\n";
    return 2;
  }
  if (!options.topology.empty()) {
    // After every option: the allowance follows the lease the run uses.
    options.failover_allowance = simba::testing::FaultTopology::failover_allowance(
        options.topology, options.ttl + options.transition);
  }
  if (options.volatile_store && (options.store != "redis" || !options.topology.empty())) {
    std::cerr << "fault-run: --volatile on is for redis (the other servers always write durably)\n";
    return 2;
  }
  auto applicable = simba::testing::faults_for(options.store, options.topology);
  if (options.faults == std::vector<std::string>{"list"}) {
    // For scripts/fault-runs.sh --per-fault: one run per fault (those a
    // run takes by default).
    for (const auto& a : applicable) std::cout << a << "\n";
    return 0;
  }
  for (const auto& f : simba::testing::FaultTopology::opt_in_faults(options.topology)) {
    applicable.push_back(f);
    if (std::find(options.faults.begin(), options.faults.end(), f) != options.faults.end() &&
        options.uri_query.find("min_replicas=") == std::string::npos) {
      std::cout << "fault-run: " << f << " on " << options.topology
                << " without min_replicas in --uri-query: the docs promise no safety through it "
                   "(expect violations)"
                << std::endl;
    }
  }
  for (const std::string& f : options.faults) {
    if (std::find(applicable.begin(), applicable.end(), f) == applicable.end()) {
      std::cerr << "fault-run: fault '" << f << "' does not apply to " << options.store
                << " (it takes:";
      for (const auto& a : applicable) std::cerr << " " << a;
      std::cerr << ")\n";
      return 2;
    }
  }
  bool temporary = false;
  if (options.out.empty()) {
    std::string pattern = simba::testing::scratch_parent() + "/simba-fault-run-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      return 3;
    }
    options.out = pattern;
    temporary = true;
  } else {
    // Workers append to their logs: a rerun into the same directory must
    // not read the last run's lines. Only files a run writes are removed.
    std::error_code error;
    std::filesystem::create_directories(options.out, error);
    for (const auto& entry : std::filesystem::directory_iterator(options.out, error)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("worker-", 0) == 0 || name.rfind("store.db", 0) == 0 ||
          name == "resource.log" || name == "faults.log" || name == "report.txt") {
        std::filesystem::remove(entry.path(), error);
      }
    }
  }
  const int status = simba::testing::Run(options).main();
  if (temporary && status == 0) {
    std::error_code error;
    std::filesystem::remove_all(options.out, error);
  }
  return status;
}
