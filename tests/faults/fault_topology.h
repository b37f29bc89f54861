// A replicated store for simba-fault-run --topology: a cluster that
// scripts/servers starts (testing/test_servers.h), each member on a host
// of its own in a lab of network namespaces (netns.sh; needs root), and the
// store-level faults the harness injects on it. Each fault returns once it
// has healed, that is once the topology serves again with every member
// back, so the next fault finds it whole.
//
//   kill-leader       SIGKILL of the leader or primary; it stays down for the
//                     given time (its peers elect or promote meanwhile where
//                     they do so themselves), then is started again
//   pause-leader      SIGSTOP of the leader or primary for the given time
//   failover          a planned change of primary: PostgreSQL's primary is
//                     killed, its standby promoted and the old primary made
//                     a standby of it again (pg_basebackup); a Redis
//                     Cluster replica takes over its primary's slots
//                     (CLUSTER FAILOVER)
//   rolling-restart   every member stopped and started again, one by one,
//                     the leader last, each back and serving before the next
//   lagging-failover  (Redis) the replicas stopped (SIGSTOP) and their links
//                     dropped (CLIENT KILL TYPE replica) for a while, so
//                     what the primary writes meanwhile reaches none of
//                     them; then the primary killed and the replicas
//                     resumed: the one promoted lacks those writes, as
//                     after a replication lag. Once a replica leads it
//                     stalls briefly (the harness resumes the old holder
//                     then, cut off from the new primary as by a
//                     partition), and the old primary is started again and
//                     rejoins as a replica
//   isolate-leader    the leader cut off from its peers (not from the
//                     clients) for the given time (on Redis, longer by the
//                     allowance: nothing fails over sooner), by blackhole
//                     routes between its host and the others
//   isolate-follower  the same for a member that does not lead: clients
//                     that reach the store through it get no answers
//   split-leader      (with the harness) isolate-leader, and the clients
//                     split with it: half reach only the cut-off leader,
//                     half only its peers (where the clients dial members)
//   partition-leader  the leader cut off from the clients (not from its
//                     peers) for the given time: where the clients dial the
//                     members the URI names, by the harness (their
//                     connections to the leader's client port pass
//                     nothing); on Sentinel and Cluster, whose clients are
//                     told the data nodes' addresses by the servers, by a
//                     blackhole route from the leader's host to the clients'
//                     side of the lab (cut_leader_from_clients)
#ifndef SIMBA_TESTS_FAULTS_FAULT_TOPOLOGY_H_
#define SIMBA_TESTS_FAULTS_FAULT_TOPOLOGY_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "simba/status.h"
#include "testing/test_servers.h"

namespace simba::testing {

class FaultTopology {
 public:
  // The topologies simba-fault-run takes: redis-sentinel, redis-cluster,
  // etcd-3, zookeeper-3, postgres-standby, mysql-replica.
  static const std::vector<std::string>& names();
  // The store faults `name` takes (a subset of those above).
  static std::vector<std::string> store_faults(const std::string& name);
  // Store faults `name` takes only when asked for by name: the default
  // settings promise no safety through them (redis-sentinel's
  // isolate-leader, safe with min_replicas only).
  static std::vector<std::string> opt_in_faults(const std::string& name);
  // Whether the clients dial the members the URI names (so a proxy per
  // member stands between each client and the store).
  static bool clients_dial_members(const std::string& name);
  // What the backend documents on top of ttl + transition + 2 s for a new
  // owner after one of topology `name`'s faults healed: its own failure
  // detection and election or promotion, and its failover guard, which
  // holds free mutexes back for a whole `lease` (ttl + transition).
  static std::chrono::milliseconds failover_allowance(const std::string& name,
                                                      std::chrono::milliseconds lease);

  // Starts topology `name`; kInvalidArgument for an unknown name.
  static Result<std::unique_ptr<FaultTopology>> start(const std::string& name);
  ~FaultTopology();
  FaultTopology(const FaultTopology&) = delete;
  FaultTopology& operator=(const FaultTopology&) = delete;

  const std::string& name() const { return name_; }
  // The store kind (redis, etcd, zookeeper, postgres, mysql).
  const std::string& store() const { return store_; }
  std::string uri() const { return server_->uri(); }
  // The directory the members' data and logs are in (removed when this
  // topology ends).
  const std::string& dir() const { return server_->dir(); }

  // Each says what it did and who leads after it ("n1 killed, restarted
  // after 1900 ms; n2 leads now").
  Result<std::string> kill_leader(std::chrono::milliseconds down);
  Result<std::string> pause_leader(std::chrono::milliseconds pause);
  Result<std::string> failover();
  Result<std::string> rolling_restart();
  // isolate-leader (`the_leader`) or isolate-follower. `clients`, if
  // given, runs with true right after the cut and with false right before
  // it heals (split-leader: the harness splits the clients too).
  Result<std::string> isolate(bool the_leader, std::chrono::milliseconds cut_off,
                              const std::function<void(bool)>& clients = {});
  // partition-leader where the clients do not dial the members: the
  // leader's host answers no client for `cut_off` and still reaches its
  // peers (so nothing fails over).
  Result<std::string> cut_leader_from_clients(std::chrono::milliseconds cut_off);
  // What the harness does at each step of a lagging failover.
  struct LaggingFailoverSteps {
    std::function<void()> before_kill;      // stops the holder
    std::function<void()> after_promotion;  // waits for a new owner (or not)
    std::function<void()> while_stalled;    // resumes the holder
  };
  // lagging-failover: the replicas stopped and cut off for `lag`; then
  // before_kill, the primary killed and the replicas resumed; once a
  // replica leads, after_promotion; then the new primary stalled (SIGSTOP)
  // for `stall`, with while_stalled run at its start; then the old primary
  // started again. Every step given runs, whatever fails.
  Result<std::string> lagging_failover(std::chrono::milliseconds lag,
                                       std::chrono::milliseconds stall,
                                       const LaggingFailoverSteps& steps);
  // The client port of the member that leads now.
  Result<int> leader_port();

 private:
  FaultTopology(std::string name, std::string store, std::unique_ptr<TestServer> server,
                std::string lab)
      : name_(std::move(name)),
        store_(std::move(store)),
        server_(std::move(server)),
        lab_(std::move(lab)) {}

  // A cut of one host of the lab: netns.sh's commands to make and heal it,
  // and what the host is cut off from (for the report).
  struct HostCut {
    std::string cut;
    std::string heal;
    std::string from;
  };
  // Cuts the leader's host (or a follower's) with `cut` for `cut_off`;
  // `clients` as for isolate().
  Result<std::string> cut_host(bool the_leader, const HostCut& cut,
                               std::chrono::milliseconds cut_off,
                               const std::function<void(bool)>& clients);
  // The member that leads or is primary now, as the script names members.
  Result<std::string> leader();
  // Every member the script may restart, in the order of a rolling restart
  // (the leader last).
  Result<std::vector<std::string>> members_leader_last();
  Status member(const std::string& what, const std::string& member);
  // The number of the lab host `member` runs on (netns.sh's I).
  Result<std::string> host_of(const std::string& member) const;
  // Waits (up to 60 s) until the topology serves again: a leader or primary
  // that answers, and every member of members_leader_last() running; on
  // Redis, then until redis.sh settle finds it whole (40 s more at most).
  Status wait_serving();
  // wait_serving(), then `what` and who leads.
  Result<std::string> serving_after(const std::string& what);

  std::string name_;
  std::string store_;
  std::unique_ptr<TestServer> server_;
  // The lab of network namespaces the members run in (empty: loopback).
  std::string lab_;
};

}  // namespace simba::testing

#endif  // SIMBA_TESTS_FAULTS_FAULT_TOPOLOGY_H_
