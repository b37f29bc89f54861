#include "fault_topology.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "backends/redis/redis_cluster.h"

namespace simba::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// How each topology starts (the script and its arguments) and what it
// takes. Redis runs durably (the failover guard, not a lucky disk, is what
// is tested); PostgreSQL and MariaDB replicate synchronously, as their docs
// require for a lock that survives a failover.
struct Spec {
  const char* name;
  const char* store;
  std::vector<std::string> args;
  std::vector<std::string> faults;
  bool clients_dial_members;
  // docs/backends/<store>.md, "Replicated deployment": what a failover
  // adds to ttl + transition + 2 s before a new owner, besides a guard.
  milliseconds allowance;
  // Whether a failover guard holds free mutexes back for a whole lease
  // after a promotion (Redis: restart_guard).
  bool guard_holds_lease = false;
  // How many hosts of a lab of network namespaces (scripts/servers/netns.sh)
  // the members run on, so that one can be cut off from its peers while
  // the clients still reach it (isolate-leader, isolate-follower); 0:
  // loopback. The script places the members (DIR/<member>/netns).
  int hosts = 0;
  // Faults it takes only when asked for (--faults): the default settings
  // promise no safety through them (docs/backends/<store>.md), so a run
  // with them is a negative control unless its URI asks for what the docs
  // say makes them safe.
  std::vector<std::string> opt_in_faults = {};
};

const std::vector<Spec>& specs() {
  static const auto* all = new std::vector<Spec>{
      // down-after 1 s + the sentinels' election and promotion (up to 4 s),
      // then the failover guard holds free mutexes back for ttl +
      // transition.
      // Three hosts: the primary and a sentinel, the replica and a
      // sentinel, a sentinel. A primary cut off with its sentinel, or
      // paused and resumed, keeps granting leases to the clients that still
      // reach it, until the others' failover makes it a replica: safe only
      // with min_replicas (docs/backends/redis.md).
      {"redis-sentinel",
       "redis",
       {"--sentinel", "--appendonly", "yes", "--appendfsync", "always"},
       {"kill-leader", "partition-leader", "failover", "lagging-failover", "isolate-follower",
        "rolling-restart"},
       false,
       milliseconds(5000),
       true,
       3,
       {"pause-leader", "isolate-leader"}},
      // cluster-node-timeout 1 s + the replica's election, then the guard.
      // A host per node.
      {"redis-cluster",
       "redis",
       {"--cluster", "--appendonly", "yes", "--appendfsync", "always"},
       {"kill-leader", "pause-leader", "partition-leader", "failover", "lagging-failover",
        "isolate-leader", "isolate-follower", "rolling-restart"},
       false,
       milliseconds(5000),
       true,
       6},
      // An election (about 1 s on loopback) and etcd's lease reset: a
      // lease lives its whole ttl again under a new leader.
      {"etcd-3",
       "etcd",
       {"--members", "3"},
       {"kill-leader", "pause-leader", "partition-leader", "isolate-leader", "isolate-follower",
        "split-leader", "rolling-restart"},
       true,
       milliseconds(4000),
       false,
       3},
      // An election and the session's move to another member, inside the
      // hold bound (2/3 of the session timeout).
      {"zookeeper-3",
       "zookeeper",
       {"--servers", "3"},
       {"kill-leader", "pause-leader", "partition-leader", "isolate-leader", "isolate-follower",
        "split-leader", "rolling-restart"},
       true,
       milliseconds(4000),
       false,
       3},
      // The primary's crash recovery or the promotion, and the sessions
      // found again on the new primary.
      // Two hosts: the primary cut off from its synchronous standby
      // (isolate-leader) holds every commit until the cut heals.
      {"postgres-standby",
       "postgres",
       {"--standby", "--sync"},
       {"kill-leader", "pause-leader", "partition-leader", "isolate-leader", "split-leader",
        "failover", "rolling-restart"},
       true,
       milliseconds(5000),
       false,
       2},
      // Two hosts: the primary cut off from its semi-synchronous replica
      // holds every commit until the cut heals (or rpl_semi_sync_master_
      // timeout, 60 s, passes).
      {"mysql-replica",
       "mysql",
       {"--replica", "--semi-sync"},
       {"kill-leader", "pause-leader", "partition-leader", "isolate-leader", "split-leader",
        "rolling-restart"},
       true,
       milliseconds(5000),
       false,
       2},
  };
  return *all;
}

const Spec* find_spec(const std::string& name) {
  for (const Spec& s : specs()) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string first_word(const std::string& s) { return s.substr(0, s.find_first_of(" \n")); }

// The slot of the fault run's mutex ("fault-run", the hash tag of every
// key of it) in a Redis Cluster.
std::string mutex_slot() { return std::to_string(internal::redis::key_slot("fault-run")); }

}  // namespace

const std::vector<std::string>& FaultTopology::names() {
  static const auto* all = [] {
    auto* v = new std::vector<std::string>;
    for (const Spec& s : specs()) v->push_back(s.name);
    return v;
  }();
  return *all;
}

std::vector<std::string> FaultTopology::store_faults(const std::string& name) {
  const Spec* s = find_spec(name);
  return s != nullptr ? s->faults : std::vector<std::string>{};
}

std::vector<std::string> FaultTopology::opt_in_faults(const std::string& name) {
  const Spec* s = find_spec(name);
  return s != nullptr ? s->opt_in_faults : std::vector<std::string>{};
}

bool FaultTopology::clients_dial_members(const std::string& name) {
  const Spec* s = find_spec(name);
  return s != nullptr && s->clients_dial_members;
}

Result<std::unique_ptr<FaultTopology>> FaultTopology::start(const std::string& name) {
  const Spec* s = find_spec(name);
  if (s == nullptr) return invalid_argument_error("no topology '" + name + "'");
  std::string lab;
  if (s->hosts > 0) {
    // Labs of runs that were killed before they took theirs down go first.
    (void)run_server_script("netns", {"sweep"});
    lab = "simba" + std::to_string(::getpid());
    auto made = run_server_script("netns", {"up", lab, std::to_string(s->hosts)});
    if (!made.ok()) {
      return unavailable_error(name + " needs a host per member (network namespaces, as root): " +
                               made.status().message());
    }
    ::setenv("SIMBA_NETNS", lab.c_str(), 1);
  }
  auto server = TestServer::start(s->store, s->args);
  ::unsetenv("SIMBA_NETNS");
  if (!server.ok()) {
    if (!lab.empty()) (void)run_server_script("netns", {"down", lab});
    return server.status();
  }
  return std::unique_ptr<FaultTopology>(
      new FaultTopology(name, s->store, std::move(*server), std::move(lab)));
}

FaultTopology::~FaultTopology() {
  // The members first: a namespace with a process in it outlives its name.
  server_.reset();
  if (!lab_.empty()) (void)run_server_script("netns", {"down", lab_});
}

Result<std::string> FaultTopology::isolate(bool the_leader, milliseconds cut_off,
                                           const std::function<void(bool)>& clients) {
  if (store_ == "redis") {
    // Sentinel and Cluster notice a primary gone only after down-after or
    // the node timeout, then elect and promote: a cut shorter than that
    // (the allowance) would end before anything fails over.
    if (const Spec* s = find_spec(name_); s != nullptr) cut_off += s->allowance;
  }
  return cut_host(the_leader, {"isolate", "heal", "its peers"}, cut_off, clients);
}

Result<std::string> FaultTopology::cut_leader_from_clients(milliseconds cut_off) {
  return cut_host(true, {"cut-clients", "heal-clients", "the clients"}, cut_off, {});
}

Result<std::string> FaultTopology::cut_host(bool the_leader, const HostCut& cut,
                                            milliseconds cut_off,
                                            const std::function<void(bool)>& clients) {
  if (lab_.empty()) return failed_precondition_error(name_ + "'s members share one host");
  auto members = members_leader_last();
  if (!members.ok()) return members.status();
  // The leader is last; a follower: the first.
  const std::string who = the_leader ? members->back() : members->front();
  auto host = host_of(who);
  if (!host.ok()) return host.status();
  if (Status s = run_server_script("netns", {cut.cut, lab_, *host}).status(); !s.ok()) return s;
  if (clients) clients(true);
  std::this_thread::sleep_for(cut_off);
  if (clients) clients(false);
  if (Status s = run_server_script("netns", {cut.heal, lab_, *host}).status(); !s.ok()) return s;
  return serving_after(std::string(the_leader ? "leader " : "follower ") + who + " (host " + *host +
                       ") cut off from " + cut.from + " for " + std::to_string(cut_off.count()) +
                       " ms");
}

Result<std::string> FaultTopology::host_of(const std::string& member) const {
  // Where the script placed it: DIR/<member's dir>/netns names LAB-HOST.
  const std::string member_dir = store_ == "etcd"                            ? "m" + member
                                 : store_ == "postgres" || store_ == "mysql" ? "n" + member
                                                                             : member;
  const std::string path = server_->dir() + "/" + member_dir + "/netns";
  std::ifstream in(path);
  std::string netns;
  if (!(in >> netns) || netns.find('-') == std::string::npos) {
    return unavailable_error("no host of " + name_ + " member " + member + " in " + path);
  }
  return netns.substr(netns.rfind('-') + 1);
}

milliseconds FaultTopology::failover_allowance(const std::string& name, milliseconds lease) {
  const Spec* s = find_spec(name);
  if (s == nullptr) return milliseconds(0);
  return s->allowance + (s->guard_holds_lease ? lease : milliseconds(0));
}

Result<std::string> FaultTopology::leader() {
  Result<std::string> out = unavailable_error("no leader");
  if (store_ == "redis" && name_ == "redis-cluster") {
    out = server_->command("primary-of", {mutex_slot()});
  } else if (store_ == "redis") {
    out = server_->command("member", {"primary"});
  } else if (store_ == "etcd" || store_ == "zookeeper") {
    out = server_->command("leader");
  } else {
    out = server_->command("primary");  // one number a line: the first
  }
  if (!out.ok()) return out.status();
  const std::string who = first_word(trimmed(*out));
  if (who.empty() || who == "?") return unavailable_error("no leader: '" + *out + "'");
  return who;
}

Result<std::vector<std::string>> FaultTopology::members_leader_last() {
  auto lead = leader();
  if (!lead.ok()) return lead.status();
  std::vector<std::string> all;
  if (name_ == "redis-cluster") {
    // The shard that holds the mutex: its replica, then its primary.
    auto replica = server_->command("member", {"replica-of-" + mutex_slot()});
    if (!replica.ok()) return replica.status();
    all = {trimmed(*replica)};
  } else if (store_ == "redis") {
    all = {"n1", "n2"};
  } else if (store_ == "postgres" || store_ == "mysql") {
    all = {"1", "2"};
  } else {
    all = {"1", "2", "3"};
  }
  all.erase(std::remove(all.begin(), all.end(), *lead), all.end());
  all.push_back(*lead);
  return all;
}

Status FaultTopology::member(const std::string& what, const std::string& member) {
  // The scripts' words for one member: etcd, PostgreSQL and MariaDB say
  // kill-member; ZooKeeper and Redis take the member after the command.
  std::string command = what;
  if (store_ == "etcd" || store_ == "postgres" || store_ == "mysql") {
    command = what + "-member";
    if (what == "restart" && store_ != "etcd") command = "start-member";
  }
  return server_->command(command, {member}).status();
}

Status FaultTopology::wait_serving() {
  const auto give_up = std::chrono::steady_clock::now() + seconds(60);
  std::string last;
  while (std::chrono::steady_clock::now() < give_up) {
    auto status = server_->command("status");
    auto lead = leader();
    if (status.ok() && lead.ok() && status->find("stopped") == std::string::npos) {
      // On Redis, serving is not yet whole: the sentinels or the cluster
      // may take seconds to make an old primary that is back (killed,
      // paused or cut off) a replica of its successor, and the next fault
      // must find a replica in sync to promote (redis.sh settle, 40 s).
      if (store_ != "redis") return ok_status();
      return server_->command("settle", {}).status();
    }
    last = status.ok() ? (lead.ok() ? *status : lead.status().to_string())
                       : status.status().to_string();
    std::this_thread::sleep_for(milliseconds(200));
  }
  return unavailable_error(name_ + " does not serve again within 60 s: " + last);
}

Result<std::string> FaultTopology::serving_after(const std::string& what) {
  if (Status s = wait_serving(); !s.ok()) return s;
  auto lead = leader();
  return what + "; " + (lead.ok() ? *lead : "nobody") + " leads now";
}

Result<std::string> FaultTopology::kill_leader(milliseconds down) {
  auto lead = leader();
  if (!lead.ok()) return lead.status();
  if (Status s = member("kill", *lead); !s.ok()) return s;
  std::this_thread::sleep_for(down);
  if (Status s = member("restart", *lead); !s.ok()) return s;
  return serving_after(*lead + " killed, restarted after " + std::to_string(down.count()) + " ms");
}

Result<std::string> FaultTopology::pause_leader(milliseconds pause) {
  auto lead = leader();
  if (!lead.ok()) return lead.status();
  if (Status s = member("pause", *lead); !s.ok()) return s;
  std::this_thread::sleep_for(pause);
  if (Status s = member("resume", *lead); !s.ok()) return s;
  return serving_after(*lead + " paused for " + std::to_string(pause.count()) + " ms");
}

Result<std::string> FaultTopology::failover() {
  auto lead = leader();
  if (!lead.ok()) return lead.status();
  if (name_ == "redis-cluster") {
    if (Status s = server_->command("failover", {"replica-of-" + mutex_slot()}).status(); !s.ok()) {
      return s;
    }
    return serving_after("CLUSTER FAILOVER of " + *lead + "'s replica");
  }
  if (name_ == "redis-sentinel") {
    // Planned, but the sentinels do not wait for the replica to catch up;
    // returns once the old primary replicates the new one.
    auto promoted = server_->command("failover", {});
    if (!promoted.ok()) return promoted.status();
    return serving_after("SENTINEL FAILOVER from " + *lead);
  }
  if (name_ != "postgres-standby") {
    return failed_precondition_error(name_ + " has no planned failover here");
  }
  // What a failover manager does: the primary is gone (killed here), the
  // standby promoted, the old primary rebuilt as the new one's standby.
  const std::string other = *lead == "1" ? "2" : "1";
  if (Status s = member("kill", *lead); !s.ok()) return s;
  if (Status s = server_->command("promote", {other}).status(); !s.ok()) return s;
  if (Status s = server_->command("rejoin", {*lead}).status(); !s.ok()) return s;
  return serving_after(*lead + " killed, " + other + " promoted, " + *lead + " its standby again");
}

Result<std::string> FaultTopology::lagging_failover(milliseconds lag, milliseconds stall,
                                                    const LaggingFailoverSteps& steps) {
  if (store_ != "redis") {
    return failed_precondition_error(name_ + ": a lagging failover is Redis's (asynchronous) case");
  }
  auto members = members_leader_last();
  if (!members.ok()) return members.status();
  const std::string old = members->back();
  const std::vector<std::string> replicas(members->begin(), members->end() - 1);
  for (const std::string& r : replicas) {
    if (Status s = member("pause", r); !s.ok()) return s;
  }
  // A paused replica still reads what was sent before, from its socket,
  // when it resumes: the links must drop for the writes to go nowhere.
  Status cut = server_->command("drop-replicas", {old}).status();
  if (cut.ok()) std::this_thread::sleep_for(lag);
  // From here every step runs, whatever fails: the holder is stopped and
  // must be resumed.
  if (cut.ok()) steps.before_kill();
  const auto killed = std::chrono::steady_clock::now();
  Status failed = cut.ok() ? member("kill", old) : cut;
  for (const std::string& r : replicas) {
    if (Status s = member("resume", r); !s.ok() && failed.ok()) failed = s;
  }
  std::string promoted;
  milliseconds promoted_after{0};
  if (cut.ok()) {
    const auto give_up = std::chrono::steady_clock::now() + seconds(30);
    while (failed.ok() && std::chrono::steady_clock::now() < give_up) {
      auto lead = leader();
      if (lead.ok() && *lead != old) {
        promoted = *lead;
        promoted_after =
            std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - killed);
        break;
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    if (failed.ok() && promoted.empty()) {
      failed = unavailable_error(name_ + ": no replica promoted within 30 s of killing " + old);
    }
    steps.after_promotion();
    const bool stalled = !promoted.empty() && member("pause", promoted).ok();
    steps.while_stalled();
    if (stalled) {
      std::this_thread::sleep_for(stall);
      if (Status s = member("resume", promoted); !s.ok() && failed.ok()) failed = s;
    }
    if (Status s = member("restart", old); !s.ok() && failed.ok()) failed = s;
  }
  if (!failed.ok()) return failed;
  return serving_after("replicas cut off for " + std::to_string(lag.count()) + " ms, " + old +
                       " killed, " + promoted + " promoted (seen " +
                       std::to_string(promoted_after.count()) +
                       " ms after the kill) and stalled for " + std::to_string(stall.count()) +
                       " ms, " + old + " restarted");
}

Result<std::string> FaultTopology::rolling_restart() {
  auto members = members_leader_last();
  if (!members.ok()) return members.status();
  std::string order;
  for (const std::string& m : *members) {
    if (Status s = member("stop", m); !s.ok()) return s;
    if (Status s = member("restart", m); !s.ok()) return s;
    if (Status s = wait_serving(); !s.ok()) return s;
    order += (order.empty() ? "" : ", ") + m;
  }
  return serving_after("restarted " + order);
}

Result<int> FaultTopology::leader_port() {
  if (!clients_dial_members(name_)) {
    return failed_precondition_error(name_ + "'s clients do not dial the members the URI names");
  }
  auto lead = leader();
  if (!lead.ok()) return lead.status();
  std::string port_file;
  if (store_ == "zookeeper") {
    auto port = server_->command("port", {*lead});
    if (!port.ok()) return port.status();
    return std::atoi(port->c_str());
  }
  port_file = server_->dir() + (store_ == "etcd" ? "/m" : "/n") + *lead + "/port";
  std::ifstream in(port_file);
  int port = 0;
  if (!(in >> port) || port <= 0) return unavailable_error("no port in " + port_file);
  return port;
}

}  // namespace simba::testing
