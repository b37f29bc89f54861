// The etcd backend on a real cluster: three members of Debian's etcd on
// 127.0.0.1, started per test by `scripts/servers/etcd.sh start DIR
// --members 3` (heartbeat 50 ms, election timeout 500 ms), whose members the
// tests kill, pause and restart by PID through the same script (kill-member,
// pause-member, restart-member, make-leader, leader).
//
// What is checked, on the cluster URI etcd://127.0.0.1:P1,P2,P3:
//   - the core cases (acquire, renew, hand-off by push, loss, fencing) with
//     two backends on different members;
//   - the leader killed, or paused, while an owner holds and a waiter waits
//     (the backends' connections on that leader: it is the first endpoint):
//     the owner keeps its hold (same key, same token) through the election,
//     never two owners (sampled every millisecond), and a release still
//     hands over by push;
//   - a holder that died just before the leader: etcd 3.4 gives every lease
//     its full TTL again on a leader change, so the waiter gets the mutex
//     later than without the leader change, within the bound stated there;
//   - a lost quorum (two members killed): the owner is told it lost within
//     its lease, nobody holds, and once a member is back someone holds again
//     within the bound stated there;
//   - `simba run` keeps its child running through a leader kill (exit 0);
//   - a TLS + client certificate + auth cluster: an owner keeps its key when
//     its first endpoint dies.
//
// The lease: ttl 1 s, transition 2 s (a 3 s etcd lease). The owner renews
// every ttl; a renewal that meets the election goes to the next member
// within its deadline, so it lands within the 2 s the transition leaves.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends/etcd/etcd_client.h"
#include "simba/backends/etcd.h"
#include "simba/contend_service.h"
#include "simba/contender.h"
#include "simba/registry.h"
#include "simba/uri.h"
#include "testing/status_matchers.h"
#include "testing/store_test_helpers.h"
#include "testing/subprocess.h"
#include "testing/test_servers.h"
#include "testing/test_util.h"

#ifndef SIMBA_CLI_PATH
#error "SIMBA_CLI_PATH comes from tests/CMakeLists.txt"
#endif

namespace simba::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr milliseconds kTtl{1000};
constexpr milliseconds kTransition{2000};
// The etcd lease of a contender with kTtl + kTransition.
constexpr milliseconds kLease = kTtl + kTransition;
// A new leader within this of the old one's death: followers notice after
// one election timeout (0.5 s, randomised up to 1 s), a vote takes a few
// heartbeats; the rest is margin for a loaded machine.
constexpr milliseconds kElectionBound{3000};
// The members' --election-timeout.
constexpr milliseconds kElectionTimeout{500};
// etcd's lessor looks for expired leases every 500 ms.
constexpr milliseconds kExpiryCheck{500};
// A release reaches the waiter by push (the watch) in a few round trips;
// margin for a loaded machine.
constexpr milliseconds kHandOffBound{2000};

struct StoreKv {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t lease = 0;
};

class EtcdCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    auto started = TestServer::start(
        "etcd", {"--members", "3", "--heartbeat-interval", "50", "--election-timeout", "500"});
    ASSERT_THAT(started, IsOk());
    cluster_ = std::move(started).value();
    auto parsed = Uri::parse(cluster_->uri());
    ASSERT_THAT(parsed, IsOk());
    for (const UriHost& host : parsed->hosts) {
      endpoints_.push_back({host.host, *host.port});
    }
    ASSERT_EQ(endpoints_.size(), 3u);
  }

  std::string query() const { return "?key_prefix=cluster&connect_timeout=500ms"; }
  // Every member, in order.
  std::string uri() const { return cluster_->uri() + query(); }
  // Member i (1-based) alone.
  std::string member_uri(int i) const {
    return "etcd://" + endpoints_[static_cast<std::size_t>(i - 1)].describe() + query();
  }

  std::string run(const std::string& command, int member = 0) {
    auto out =
        cluster_->command(command, member > 0 ? std::vector<std::string>{std::to_string(member)}
                                              : std::vector<std::string>{});
    EXPECT_THAT(out, IsOk()) << command << " " << member;
    return out.ok() ? *out : std::string();
  }
  // The member that leads, once one does (0 if none within the bound).
  int leader(milliseconds within = kElectionBound) {
    int found = 0;
    eventually(
        [&] {
          auto out = cluster_->command("leader");
          if (!out.ok()) return false;
          found = std::atoi(out->c_str());
          return found > 0;
        },
        within);
    return found;
  }
  void make_leader(int i) { run("make-leader", i); }
  void kill_member(int i) { run("kill-member", i); }
  void pause_member(int i) { run("pause-member", i); }
  void resume_member(int i) { run("resume-member", i); }
  void restart_member(int i) { run("restart-member", i); }

  // The keys of `mutex` in create order (the first is the owner's), read
  // from the first member that answers (a linearizable read).
  std::vector<StoreKv> keys(const std::string& mutex) {
    const std::string prefix = "cluster/" + mutex + "/";
    for (const internal::etcd::Endpoint& endpoint : endpoints_) {
      auto channel = internal::etcd::open_channel(endpoint, false, TlsOptions());
      if (!channel.ok()) continue;
      auto kv = etcdserverpb::KV::NewStub(*channel);
      etcdserverpb::RangeRequest request;
      request.set_key(prefix);
      request.set_range_end(internal::etcd::prefix_end(prefix));
      request.set_sort_order(etcdserverpb::RangeRequest::ASCEND);
      request.set_sort_target(etcdserverpb::RangeRequest::CREATE);
      etcdserverpb::RangeResponse reply;
      grpc::ClientContext context;
      context.set_deadline(internal::etcd::grpc_deadline(in(seconds(2))));
      if (!kv->Range(&context, request, &reply).ok()) continue;
      std::vector<StoreKv> kvs;
      for (const mvccpb::KeyValue& item : reply.kvs()) {
        kvs.push_back({item.key(), item.value(), item.create_revision(), item.lease()});
      }
      return kvs;
    }
    ADD_FAILURE() << "no member answered";
    return {};
  }

  void revoke(int member, std::int64_t lease) {
    auto channel = internal::etcd::open_channel(endpoints_[static_cast<std::size_t>(member - 1)],
                                                false, TlsOptions());
    ASSERT_THAT(channel, IsOk());
    auto stub = etcdserverpb::Lease::NewStub(*channel);
    etcdserverpb::LeaseRevokeRequest request;
    request.set_id(lease);
    etcdserverpb::LeaseRevokeResponse reply;
    grpc::ClientContext context;
    context.set_deadline(internal::etcd::grpc_deadline(in(seconds(5))));
    const grpc::Status status = stub->LeaseRevoke(&context, request, &reply);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }

  std::unique_ptr<TestServer> cluster_;
  std::vector<internal::etcd::Endpoint> endpoints_;
};

// Samples is_owner() of some services every millisecond: how often two (or
// more) believed they owned the mutex at once, and how often each did not.
class OwnerSampler {
 public:
  explicit OwnerSampler(std::vector<MutexContendService*> services)
      : services_(std::move(services)), not_owner_(services_.size()) {
    thread_ = std::thread([this] {
      while (running_) {
        int owners = 0;
        for (std::size_t i = 0; i < services_.size(); ++i) {
          if (services_[i]->is_owner()) {
            ++owners;
          } else {
            ++not_owner_[i];
          }
        }
        if (owners > 1) ++overlaps_;
        ++samples_;
        std::this_thread::sleep_for(milliseconds(1));
      }
    });
  }
  ~OwnerSampler() { stop(); }
  void stop() {
    running_ = false;
    if (thread_.joinable()) thread_.join();
  }
  long overlaps() const { return overlaps_; }
  long samples() const { return samples_; }
  long not_owner(std::size_t i) const { return not_owner_[i]; }

 private:
  std::vector<MutexContendService*> services_;
  std::atomic<bool> running_{true};
  std::atomic<long> overlaps_{0};
  std::atomic<long> samples_{0};
  std::vector<std::atomic<long>> not_owner_;
  std::thread thread_;
};

// The holds a timeline records never overlap: each "X acquired" comes when
// nobody holds, each "X released" ends X's hold.
void expect_holds_never_overlap(Timeline& timeline) {
  std::lock_guard<std::mutex> lock(timeline.mu);
  std::string holder;
  for (const auto& [event, at] : timeline.events) {
    const std::size_t space = event.find(' ');
    const std::string name = event.substr(0, space);
    if (event.substr(space + 1) == "acquired") {
      EXPECT_TRUE(holder.empty()) << name << " acquired while " << holder << " held";
      holder = name;
    } else if (holder == name) {
      holder.clear();
    }
  }
  // Each acquisition's token is above every earlier one's (DESIGN §2), also
  // an owner's that took back a hold its store outlived.
  for (std::size_t i = 1; i < timeline.tokens.size(); ++i) {
    EXPECT_GT(timeline.tokens[i], timeline.tokens[i - 1]) << "acquisition " << i;
  }
}

double secs(steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

// ---- the core cases, across members ---------------------------------------------------

// Backend A on member 1, backend B on member 2: acquire, renewal, hand-off by
// push (B's watch on member 2 sees A's release made through member 1), loss
// (B's lease revoked through member 3), and a forced release's fencing floor.
TEST_F(EtcdCluster, CoreCasesAcrossMembers) {
  auto fa = make_factory(member_uri(1), kTtl, kTransition);
  auto fb = make_factory(member_uri(2), kTtl, kTransition);
  ASSERT_TRUE(fa && fb);
  Timeline timeline;
  auto a = fa->create_contend_service(timeline.contender("core", "A")).value();
  auto b = fb->create_contend_service(timeline.contender("core", "B")).value();

  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  const std::uint64_t token_a = a->fencing_token();
  SIMBA_ASSERT_OK(b->start());
  ASSERT_TRUE(
      eventually([&] { return b->after_owner().owner_id == a->contender_id(); }, seconds(5)));
  // Renewals (every ttl) keep A's key and token.
  std::this_thread::sleep_for(kTtl + kTtl / 2);
  EXPECT_TRUE(a->is_owner());
  EXPECT_EQ(a->fencing_token(), token_a);
  EXPECT_FALSE(b->is_owner());
  std::vector<StoreKv> kvs = keys("core");
  ASSERT_EQ(kvs.size(), 2u);
  EXPECT_EQ(kvs[0].value, a->contender_id());
  EXPECT_EQ(static_cast<std::uint64_t>(kvs[0].create_revision), token_a);

  // Hand-off: A's release through member 1 wakes B through member 2.
  const auto stopped = steady_clock::now();
  SIMBA_ASSERT_OK(a->stop());
  ASSERT_TRUE(eventually([&] { return b->is_owner(); }, seconds(5)));
  EXPECT_LT(steady_clock::now() - stopped, scaled(kHandOffBound)) << "not by push";
  const std::uint64_t token_b = b->fencing_token();
  EXPECT_GT(token_b, token_a);

  // Loss: B's lease revoked through member 3; B is told at once (its watch).
  kvs = keys("core");
  ASSERT_EQ(kvs.size(), 1u);
  const auto revoked = steady_clock::now();
  revoke(3, kvs[0].lease);
  ASSERT_TRUE(eventually([&] { return timeline.when("B released").has_value(); }, seconds(5)));
  EXPECT_LT(*timeline.when("B released") - revoked, scaled(kHandOffBound));
  // B queues again with a new key: a greater token.
  ASSERT_TRUE(eventually([&] { return b->is_owner(); }, seconds(5)));
  const std::uint64_t token_b2 = b->fencing_token();
  EXPECT_GT(token_b2, token_b);

  // Fencing: a forced release through member 1; the next owner's token is
  // above its floor.
  auto forced = fa->backend()->force_release("core", in(seconds(5)));
  SIMBA_ASSERT_OK(forced);
  EXPECT_EQ(forced->previous.fencing_token, token_b2);
  ASSERT_TRUE(
      eventually([&] { return b->is_owner() && b->fencing_token() != token_b2; }, seconds(5)));
  EXPECT_GT(b->fencing_token(), forced->fencing_floor);
  SIMBA_EXPECT_OK(b->stop());
  expect_holds_never_overlap(timeline);
}

// ---- the leader killed or paused under an owner and a waiter ------------------------------

// Member 1 leads and is every backend's first endpoint (their request
// connections and watches are on it). It dies (`pause`: it hangs instead)
// while O holds and W waits. Through a whole lease after that, O keeps its
// hold (its renewals go to the next member within their deadline; same key,
// same token), W never gets the mutex, and never do both believe they own
// it. Then O's release hands over to W by push, with a greater token.
// simba doctor on the cluster: every member named, who leads, the lease
// reset. Through one member's URI it says the others are out of reach; with
// the leader paused (no quorum for an election yet, or one under way) the
// doctor fails or names a leader that is not the paused one.
TEST_F(EtcdCluster, DoctorNamesTheMembersAndTheLeader) {
  auto backend = open(uri());
  ASSERT_TRUE(backend);
  auto report = backend->inspect(in(seconds(10)));
  ASSERT_THAT(report, IsOk());
  const std::string all = all_findings(*report);
  EXPECT_FALSE(report->unsafe()) << all;
  EXPECT_THAT(findings_about(*report, "server"), HasSubstr("etcd 3.")) << all;
  const std::string members = findings_about(*report, "members");
  EXPECT_THAT(members, HasSubstr("ok: 3 voting member(s)")) << all;
  EXPECT_THAT(members, HasSubstr("survives losing 1")) << all;
  for (const internal::etcd::Endpoint& endpoint : endpoints_) {
    EXPECT_THAT(members, HasSubstr(endpoint.describe())) << all;
  }
  // etcd.sh names members m1..m3; the leader is one of them.
  const int lead = leader();
  ASSERT_GT(lead, 0);
  EXPECT_THAT(findings_about(*report, "leader"), HasSubstr("ok: m" + std::to_string(lead))) << all;
  EXPECT_THAT(findings_about(*report, "leases"), HasSubstr("full TTL again")) << all;
  EXPECT_THAT(findings_about(*report, "leases"), HasSubstr("etcd-io/etcd#15247")) << all;

  auto one = open(member_uri(1));
  ASSERT_TRUE(one);
  auto narrow = one->inspect(in(seconds(10)));
  ASSERT_THAT(narrow, IsOk());
  EXPECT_THAT(findings_about(*narrow, "members"), HasSubstr("the URI names 1 of the 3"))
      << all_findings(*narrow);
}

class EtcdClusterFailover : public EtcdCluster {
 public:
  void owner_rides_through(bool pause) {
    make_leader(1);
    auto fo = make_factory(uri(), kTtl, kTransition);
    auto fw = make_factory(uri(), kTtl, kTransition);
    ASSERT_TRUE(fo && fw);
    Timeline timeline;
    auto o = fo->create_contend_service(timeline.contender("failover", "O")).value();
    auto w = fw->create_contend_service(timeline.contender("failover", "W")).value();
    SIMBA_ASSERT_OK(o->start());
    ASSERT_TRUE(eventually([&] { return o->is_owner(); }, seconds(5)));
    SIMBA_ASSERT_OK(w->start());
    ASSERT_TRUE(
        eventually([&] { return w->after_owner().owner_id == o->contender_id(); }, seconds(5)));
    const std::uint64_t token = o->fencing_token();
    const std::vector<StoreKv> before = keys("failover");
    ASSERT_EQ(before.size(), 2u);

    OwnerSampler sampler({o.get(), w.get()});
    const auto failed_at = steady_clock::now();
    if (pause) {
      pause_member(1);
    } else {
      kill_member(1);
    }
    const int next = leader();
    const auto elected_at = steady_clock::now();
    ASSERT_NE(next, 0) << "no new leader within " << kElectionBound.count() << " ms";
    EXPECT_NE(next, 1);
    std::cout << "measured: new leader (member " << next << ") seen "
              << secs(elected_at - failed_at) << " s after the leader was "
              << (pause ? "paused" : "killed") << "\n";
    // A whole lease after the failure: without a renewal that went through,
    // O's lease would have ended by now and W would own the mutex.
    std::this_thread::sleep_until(failed_at + kLease + milliseconds(500));
    sampler.stop();
    EXPECT_EQ(sampler.overlaps(), 0) << "two owners at once";
    EXPECT_GT(sampler.samples(), 1000);
    EXPECT_EQ(sampler.not_owner(0), 0) << "the owner lost its hold through the failover";
    EXPECT_FALSE(timeline.when("O released").has_value());
    EXPECT_FALSE(timeline.when("W acquired").has_value()) << "the waiter took over";
    EXPECT_EQ(o->fencing_token(), token);
    const std::vector<StoreKv> after = keys("failover");
    ASSERT_EQ(after.size(), 2u);
    EXPECT_EQ(after[0].create_revision, before[0].create_revision) << "a new key";
    EXPECT_EQ(after[0].lease, before[0].lease) << "a new lease";
    EXPECT_EQ(after[1].value, w->contender_id());

    // O's release reaches W by push, through its watch on another member.
    OwnerSampler handoff({o.get(), w.get()});
    const auto stopped = steady_clock::now();
    SIMBA_ASSERT_OK(o->stop());
    ASSERT_TRUE(eventually([&] { return w->is_owner(); }, seconds(5)));
    std::cout << "measured: hand-off after the failover " << secs(steady_clock::now() - stopped)
              << " s\n";
    EXPECT_LT(steady_clock::now() - stopped, scaled(kHandOffBound));
    EXPECT_GT(w->fencing_token(), token);
    handoff.stop();
    EXPECT_EQ(handoff.overlaps(), 0);
    SIMBA_EXPECT_OK(w->stop());
    expect_holds_never_overlap(timeline);
    if (pause) resume_member(1);
  }
};

TEST_F(EtcdClusterFailover, OwnerHoldsThroughALeaderKill) { owner_rides_through(false); }

TEST_F(EtcdClusterFailover, OwnerHoldsThroughAPausedLeader) { owner_rides_through(true); }

// ---- the lease reset on a leader change -------------------------------------------------

// A holder H that stops renewing (a crash: its backend just stops calling)
// and a waiter W. Without a leader change W gets the mutex once H's lease
// ends (its 2 s, plus up to 0.5 s until etcd's lessor looks, plus the
// hand-off). With the leader killed 1 s into H's lease, etcd 3.4's new leader
// gives every lease its full TTL again ("lease TTL reset on leader change",
// etcd-io/etcd#9395): H's lease ends 2 s after the new leader took over, so
// W waits longer. Never before H's lease could have ended; within the bound
// election + full lease + expiry check + hand-off after the kill.
TEST_F(EtcdCluster, ADeadHoldersLeaseIsResetByALeaderChange) {
  const milliseconds dead_ttl{1000};
  const milliseconds dead_transition{1000};
  const milliseconds dead_lease = dead_ttl + dead_transition;
  make_leader(1);
  auto holder_backend = open(uri());
  ASSERT_TRUE(holder_backend);
  auto fw = make_factory(uri(), kTtl, kTransition);
  ASSERT_TRUE(fw);

  struct Round {
    steady_clock::duration free_after_acquire{};
    steady_clock::duration free_after_kill{};
  };
  auto round = [&](const std::string& mutex, bool kill_leader) -> Round {
    Round result;
    const auto sent = steady_clock::now();
    auto held = holder_backend->acquire_or_renew(request_for(mutex, "H", dead_ttl, dead_transition),
                                                 in(seconds(5)));
    EXPECT_THAT(held, IsOk());
    if (!held.ok()) return result;
    EXPECT_TRUE(held->owner.is_owner("H"));
    const std::uint64_t token = held->owner.fencing_token;
    Timeline timeline;
    auto w = fw->create_contend_service(timeline.contender(mutex, "W")).value();
    EXPECT_THAT(w->start(), IsOk());
    std::this_thread::sleep_until(sent + dead_ttl);
    const auto killed_at = steady_clock::now();
    if (kill_leader) kill_member(1);
    EXPECT_TRUE(timeline.acquired.wait(seconds(20))) << "the waiter never got the mutex";
    const auto acquired_at = *timeline.when("W acquired");
    // Never before H's lease could have ended (it was granted after `sent`).
    EXPECT_GE(acquired_at - sent, dead_lease);
    EXPECT_GT(w->fencing_token(), token);
    result.free_after_acquire = acquired_at - sent;
    result.free_after_kill = acquired_at - killed_at;
    EXPECT_THAT(w->stop(), IsOk());
    return result;
  };
  const Round calm = round("calm", false);
  const Round reset = round("reset", true);
  std::cout << "measured: a dead holder's 2 s lease freed the mutex "
            << secs(calm.free_after_acquire) << " s after its grant without a leader change; "
            << secs(reset.free_after_acquire) << " s with the leader killed 1 s in ("
            << secs(reset.free_after_kill) << " s after the kill)\n";
  EXPECT_LT(calm.free_after_acquire, scaled(dead_lease + kExpiryCheck + kHandOffBound));
  // The stated bound after a leader change: election + a full lease +
  // expiry check + hand-off, counted from the kill.
  EXPECT_LT(reset.free_after_kill,
            scaled(kElectionBound + dead_lease + kExpiryCheck + kHandOffBound));
}

// ---- a lost quorum ----------------------------------------------------------------------

// Two of three members killed: nothing can be renewed or granted. O is told
// it lost within its lease (measured from when the quorum was gone, before
// which its last renewal was sent), W never gets the mutex meanwhile, and never do both
// believe they own it. One member back: a quorum again, and someone holds
// within election + a full lease (the new leader's reset) + hand-off.
TEST_F(EtcdCluster, ALostQuorumEndsTheHoldWithinTheLease) {
  make_leader(1);
  auto fo = make_factory(uri(), kTtl, kTransition);
  auto fw = make_factory(uri(), kTtl, kTransition);
  ASSERT_TRUE(fo && fw);
  Timeline timeline;
  auto o = fo->create_contend_service(timeline.contender("quorum", "O")).value();
  auto w = fw->create_contend_service(timeline.contender("quorum", "W")).value();
  SIMBA_ASSERT_OK(o->start());
  ASSERT_TRUE(eventually([&] { return o->is_owner(); }, seconds(5)));
  SIMBA_ASSERT_OK(w->start());
  ASSERT_TRUE(
      eventually([&] { return w->after_owner().owner_id == o->contender_id(); }, seconds(5)));
  const std::uint64_t token = o->fencing_token();

  OwnerSampler sampler({o.get(), w.get()});
  kill_member(2);
  kill_member(3);
  // The quorum is gone by now (the script returns once the process is):
  // every renewal that went through was sent before this instant.
  const auto killed_at = steady_clock::now();
  ASSERT_TRUE(timeline.released.wait(kLease + seconds(2))) << "the owner was never told";
  const auto told_at = *timeline.when("O released");
  std::cout << "measured: without a quorum the owner was told it lost " << secs(told_at - killed_at)
            << " s after the quorum was gone (lease " << secs(kLease) << " s)\n";
  // Its lease ends at most kLease after its last renewal was sent. The
  // leader answers a keep-alive alone (no Raft entry), until CheckQuorum
  // makes it step down: at most two election timeouts after the quorum
  // went (measured here: told 3.46-3.54 s after, with a 3 s lease). A
  // little slack for the timer's thread.
  EXPECT_LT(told_at - killed_at, kLease + 2 * kElectionTimeout + scaled(milliseconds(300)));
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_FALSE(o->is_owner());
  EXPECT_FALSE(w->is_owner());
  EXPECT_FALSE(timeline.when("W acquired").has_value());

  const auto back_at = steady_clock::now();
  restart_member(2);
  ASSERT_TRUE(eventually([&] { return o->is_owner() || w->is_owner(); },
                         kElectionBound + kLease + kHandOffBound))
      << "nobody holds after the quorum came back";
  std::cout << "measured: someone held again " << secs(steady_clock::now() - back_at)
            << " s after a member came back\n";
  sampler.stop();
  EXPECT_EQ(sampler.overlaps(), 0) << "two owners at once";
  const std::uint64_t next = o->is_owner() ? o->fencing_token() : w->fencing_token();
  EXPECT_GT(next, token) << "a new hold under the lost hold's token";
  SIMBA_EXPECT_OK(o->stop());
  SIMBA_EXPECT_OK(w->stop());
  expect_holds_never_overlap(timeline);
}

// ---- TLS and auth ------------------------------------------------------------------------

// A cluster with TLS only, client certificates and auth (etcd.sh --tls
// --client-cert-auth --auth: certificates and users made once for all
// members). Its URI carries the user and the TLS keys; an owner keeps its
// key and token when its first endpoint is killed.
TEST(EtcdClusterTls, OwnerKeepsItsKeyWhenAMemberOfATlsClusterDies) {
  // The test CA (scripts/servers/test-ca.sh), removed at the end.
  TempDir certs_dir;
  const std::string certs = certs_dir.path() + "/certs";
  auto cluster =
      TestServer::start("etcd", {"--members", "3", "--tls", certs, "--client-cert-auth", "--auth",
                                 "--heartbeat-interval", "50", "--election-timeout", "500"});
  ASSERT_THAT(cluster, IsOk());
  const std::string uri = (*cluster)->uri();
  EXPECT_THAT(uri, HasSubstr("simba:simba-test@"));
  EXPECT_THAT(uri, HasSubstr("tls_cert="));
  auto backend = open(uri + "&key_prefix=tls&connect_timeout=500ms");
  ASSERT_TRUE(backend);
  EXPECT_EQ(backend->capabilities().transport, "TLS (verify), client certificate");
  auto first = backend->acquire_or_renew(request_for("m", "c", kTtl, kTransition), in(seconds(5)));
  SIMBA_ASSERT_OK(first);
  ASSERT_TRUE(first->owner.is_owner("c"));
  SIMBA_ASSERT_OK((*cluster)->command("kill-member", {"1"}));
  auto renewed =
      backend->acquire_or_renew(request_for("m", "c", kTtl, kTransition), in(seconds(3)));
  SIMBA_ASSERT_OK(renewed);
  EXPECT_TRUE(renewed->owner.is_owner("c"));
  EXPECT_EQ(renewed->owner.fencing_token, first->owner.fencing_token);
  auto released = backend->release("m", "c", in(seconds(3)));
  SIMBA_ASSERT_OK(released);
  EXPECT_TRUE(*released);
}

// ---- the CLI ----------------------------------------------------------------------------

CommandRun run_cli(const std::string& args) {
  return run_command_line(std::string(SIMBA_CLI_PATH) + " " + args);
}

// `simba run` holds the mutex for its child; the leader (its first endpoint)
// is killed 1.5 s in. The child runs to its end and simba exits with its
// status (0), not 69 (store unavailable) or 76 (lease lost).
TEST_F(EtcdCluster, SimbaRunKeepsItsChildThroughALeaderKill) {
  make_leader(1);
  CommandRun run;
  std::thread cli([&] {
    run = run_cli("run --store '" + uri() + "' --mutex cli --ttl 1s --transition 2s -- sleep 5");
  });
  ASSERT_TRUE(eventually([&] { return keys("cli").size() == 1; }, seconds(5)));
  std::this_thread::sleep_for(milliseconds(1500));
  kill_member(1);
  cli.join();
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, Not(HasSubstr("lost")));
  EXPECT_TRUE(keys("cli").empty()) << "released at the end";
}

// ---- a process started while the cluster has no quorum (issue #34) ----------------

// Two of three members are dead: no leader, nothing answers. A `simba run`
// whose --timeout is shorter than the outage exits 69 naming every member
// with the last cause it met there; one started with 30 s waits, and runs
// its command once a member is back (a quorum, a leader) instead of exiting
// on the first refusal.
TEST_F(EtcdCluster, AProcessStartedWithoutAQuorumWaitsForItWithinItsTimeout) {
  kill_member(2);
  kill_member(3);
  const std::string run_args =
      "run --store '" + uri() + "' --mutex fresh --ttl 1s --transition 2s --timeout ";
  const CommandRun short_run = run_cli(run_args + "1s -- true");
  EXPECT_EQ(short_run.exit_code, 69) << short_run.output;
  EXPECT_GE(short_run.elapsed, milliseconds(1000)) << short_run.output;
  EXPECT_THAT(short_run.output, HasSubstr("could not be reached")) << short_run.output;
  for (const internal::etcd::Endpoint& endpoint : endpoints_) {
    EXPECT_THAT(short_run.output, HasSubstr(endpoint.describe() + ": ")) << short_run.output;
  }
  std::future<CommandRun> waiting =
      start_command_line(std::string(SIMBA_CLI_PATH) + " " + run_args + "30s -- true");
  std::this_thread::sleep_for(milliseconds(2000));
  ASSERT_EQ(waiting.wait_for(milliseconds(0)), std::future_status::timeout)
      << "gave up while the cluster had no quorum: " << waiting.get().output;
  const auto restarted = steady_clock::now();
  restart_member(2);
  ASSERT_EQ(waiting.wait_for(seconds(30)), std::future_status::ready);
  const CommandRun waited = waiting.get();
  EXPECT_EQ(waited.exit_code, 0) << waited.output;
  std::cout << "measured: run after the member came back "
            << std::chrono::duration_cast<milliseconds>(steady_clock::now() - restarted).count()
            << " ms\n";
  restart_member(3);
}

}  // namespace
}  // namespace simba::testing
