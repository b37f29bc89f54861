// The ZooKeeper backend beyond the conformance suite: Curator's layout and a
// scripted JVM (Curator LeaderLatch) participant, leases over sessions, a
// cut connection and an expired session, a restarted server, and 50
// contenders in one queue. Every test runs against a real ZooKeeper server;
// what the test itself does to it goes through the C client's synchronous
// API.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zookeeper/zookeeper.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends/zookeeper/zookeeper_errors.h"
#include "backends/zookeeper/zookeeper_sockets.h"
#include "simba/backends/zookeeper.h"
#include "simba/contend_service.h"
#include "simba/contender.h"
#include "simba/registry.h"
#include "testing/latch.h"
#include "testing/status_matchers.h"
#include "testing/store_test_helpers.h"
#include "testing/tcp_proxy.h"
#include "testing/test_servers.h"
#include "testing/test_util.h"

namespace simba::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;
using ::testing::HasSubstr;

// A root node of this test's own on the shared server.
std::string test_root() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string root = std::string("/zt-") + info->name() + "-" + std::to_string(getpid());
  return root;
}

std::string with_root(const std::string& uri) { return uri + "?root=" + test_root(); }
std::string shared_uri() { return with_root(shared_server_uri("zookeeper")); }

// "zookeeper://127.0.0.1:P" -> "127.0.0.1:P".
std::string hosts_of(const std::string& uri) {
  std::string hosts = uri.substr(std::string("zookeeper://").size());
  return hosts.substr(0, hosts.find('?'));
}

int port_of(const std::string& uri) {
  const std::string hosts = hosts_of(uri);
  return std::stoi(hosts.substr(hosts.rfind(':') + 1));
}

// The C client's synchronous API, for what the test itself does.
class RawZk {
 public:
  explicit RawZk(const std::string& uri) {
    zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR);
    zh_ = zookeeper_init(hosts_of(uri).c_str(), nullptr, 10000, nullptr, nullptr, 0);
    for (int i = 0; i < 500 && zh_ != nullptr && zoo_state(zh_) != ZOO_CONNECTED_STATE; ++i) {
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  ~RawZk() {
    if (zh_ != nullptr) zookeeper_close(zh_);
  }
  bool ok() const { return zh_ != nullptr && zoo_state(zh_) == ZOO_CONNECTED_STATE; }

  std::vector<std::string> children(const std::string& path) {
    String_vector names{};
    std::vector<std::string> out;
    if (zoo_get_children(zh_, path.c_str(), 0, &names) == ZOK) {
      for (int i = 0; i < names.count; ++i) out.emplace_back(names.data[i]);
      deallocate_String_vector(&names);
    }
    std::sort(out.begin(), out.end(), [](const std::string& a, const std::string& b) {
      return a.substr(a.rfind("latch-")) < b.substr(b.rfind("latch-"));
    });
    return out;
  }
  // The node's data ("" if missing) and stat.
  std::string get(const std::string& path, Stat* stat = nullptr) {
    char buffer[1024];
    int length = sizeof buffer;
    Stat local{};
    if (zoo_get(zh_, path.c_str(), 0, buffer, &length, stat != nullptr ? stat : &local) != ZOK) {
      return "";
    }
    return std::string(buffer, static_cast<std::size_t>(std::max(length, 0)));
  }
  // Creates `path` (its parents as containers); the name it got ("" on
  // failure).
  std::string create(const std::string& path, const std::string& data, int mode) {
    for (std::size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1)) {
      zoo_create(zh_, path.substr(0, at).c_str(), nullptr, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_CONTAINER,
                 nullptr, 0);
    }
    char created[512];
    if (zoo_create(zh_, path.c_str(), data.data(), static_cast<int>(data.size()),
                   &ZOO_OPEN_ACL_UNSAFE, mode, created, sizeof created) != ZOK) {
      return "";
    }
    const std::string full = created;
    return full.substr(full.rfind('/') + 1);
  }
  int delete_node(const std::string& path) { return zoo_delete(zh_, path.c_str(), -1); }
  zhandle_t* handle() const { return zh_; }

 private:
  zhandle_t* zh_ = nullptr;
};

// Creates the persistent node `path` (its parent must exist); ZOK or the
// C client's error.
int create_persistent(RawZk& raw, const std::string& path) {
  return zoo_create(raw.handle(), path.c_str(), nullptr, -1, &ZOO_OPEN_ACL_UNSAFE, 0, nullptr, 0);
}

// A server statistic from the `mntr` four-letter word.
long long mntr(int port, const std::string& key) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      ::write(fd, "mntr", 4) == 4) {
    char buffer[4096];
    ssize_t n;
    while ((n = ::read(fd, buffer, sizeof buffer)) > 0) reply.append(buffer, n);
  }
  ::close(fd);
  const std::size_t at = reply.find(key + "\t");
  return at == std::string::npos ? -1 : std::stoll(reply.substr(at + key.size() + 1));
}

// ---- layout and JVM interop -------------------------------------------------------

TEST(ZookeeperLayout, CuratorNamesContenderDataAndZxidTokens) {
  auto backend = open(shared_uri());
  ASSERT_TRUE(backend);
  auto first = backend->acquire_or_renew(request_for("m", "cpp-a"), in(seconds(5)));
  ASSERT_THAT(first, IsOk());
  EXPECT_EQ(first->owner.owner_id, "cpp-a");
  EXPECT_EQ(first->owner.ttl_at - first->store_now, milliseconds(2000));
  EXPECT_EQ(first->owner.transition_at - first->store_now, milliseconds(3000));
  RawZk raw(shared_server_uri("zookeeper"));
  ASSERT_TRUE(raw.ok());
  const auto children = raw.children(test_root() + "/m");
  ASSERT_EQ(children.size(), 1u);
  // _c_<version-8 uuid carrying ttl 2000 = 0x7d0, transition 1000 = 0x3e8>-latch-<10 digits>
  EXPECT_THAT(children[0],
              ::testing::MatchesRegex(
                  "_c_000007d0-0000-83e8-[89ab][0-9a-f]{3}-[0-9a-f]{12}-latch-[0-9]{10}"));
  Stat stat{};
  EXPECT_EQ(raw.get(test_root() + "/m/" + children[0], &stat), "cpp-a");
  EXPECT_NE(stat.ephemeralOwner, 0);
  EXPECT_EQ(first->owner.fencing_token, static_cast<std::uint64_t>(stat.czxid));
  // The lease lives in the session's heartbeat node, written at most once
  // per half ttl for all of the session's mutexes.
  char session[17];
  std::snprintf(session, sizeof session, "%016llx",
                static_cast<unsigned long long>(stat.ephemeralOwner));
  Stat heartbeat{};
  raw.get(test_root() + "-sessions/" + session, &heartbeat);
  EXPECT_EQ(heartbeat.ephemeralOwner, stat.ephemeralOwner);
  // A renewal reads, writes nothing within half a ttl, and keeps the token.
  auto renewed = backend->acquire_or_renew(request_for("m", "cpp-a"), in(seconds(5)));
  ASSERT_THAT(renewed, IsOk());
  EXPECT_EQ(renewed->owner.fencing_token, first->owner.fencing_token);
  Stat after{};
  raw.get(test_root() + "/m/" + children[0], &after);
  EXPECT_EQ(after.version, stat.version);
  // After half a ttl, the next call writes the heartbeat again.
  std::this_thread::sleep_for(milliseconds(1100));
  ASSERT_THAT(backend->acquire_or_renew(request_for("m", "cpp-a"), in(seconds(5))), IsOk());
  Stat later{};
  raw.get(test_root() + "-sessions/" + session, &later);
  EXPECT_GT(later.version, heartbeat.version);
  // A waiter joins behind and sees the owner; the next owner's token is
  // greater.
  auto waiter = backend->acquire_or_renew(request_for("m", "cpp-b"), in(seconds(5)));
  ASSERT_THAT(waiter, IsOk());
  EXPECT_EQ(waiter->owner.owner_id, "cpp-a");
  EXPECT_EQ(waiter->owner.fencing_token, first->owner.fencing_token);
  EXPECT_EQ(raw.children(test_root() + "/m").size(), 2u);
  ASSERT_THAT(backend->release("m", "cpp-a", in(seconds(5))), IsOkAndHolds(true));
  auto next = backend->acquire_or_renew(request_for("m", "cpp-b"), in(seconds(5)));
  ASSERT_THAT(next, IsOk());
  EXPECT_EQ(next->owner.owner_id, "cpp-b");
  EXPECT_GT(next->owner.fencing_token, first->owner.fencing_token);
  ASSERT_THAT(backend->release("m", "cpp-b", in(seconds(5))), IsOkAndHolds(true));
  EXPECT_TRUE(raw.children(test_root() + "/m").empty());
}

// A JVM Simba contender is a Curator LeaderLatch participant: a protected
// ephemeral sequential node with a random (version-4) uuid and its id as
// data, never rewritten. The test plays it with raw calls.
TEST(ZookeeperJvmInterop, CuratorParticipantLeadsWaitsAndIsNeverEvicted) {
  RawZk jvm(shared_server_uri("zookeeper"));
  ASSERT_TRUE(jvm.ok());
  const std::string parent = test_root() + "/shared";
  const std::string jvm_node =
      jvm.create(parent + "/_c_0f8e5a3c-2d1b-4c6e-9a7f-123456789abc-latch-", "jvm-contender",
                 ZOO_EPHEMERAL_SEQUENTIAL);
  ASSERT_FALSE(jvm_node.empty());

  auto factory = make_factory(shared_uri(), milliseconds(500), milliseconds(300));
  ASSERT_TRUE(factory);
  Timeline timeline;
  auto service =
      factory->create_contend_service(timeline.contender("shared", "cpp", "cpp")).value();
  SIMBA_ASSERT_OK(service->start());
  // The C++ contender knows who leads, and many of its leases pass without
  // it evicting the JVM leader (whose session is its lease).
  ASSERT_TRUE(
      eventually([&] { return service->after_owner().owner_id == "jvm-contender"; }, seconds(10)));
  std::this_thread::sleep_for(seconds(3));
  EXPECT_FALSE(service->is_owner());
  EXPECT_EQ(jvm.children(parent).front(), jvm_node);
  // The JVM leader leaves (LeaderLatch.close deletes its node): the C++
  // contender, watching it, leads at once.
  ASSERT_EQ(jvm.delete_node(parent + "/" + jvm_node), ZOK);
  ASSERT_TRUE(eventually([&] { return service->is_owner(); }, seconds(2)));

  // Now the JVM side joins behind the C++ leader: by Curator's rule (lowest
  // sequence leads) it is not the leader; the C++ node is first.
  const std::string second = jvm.create(parent + "/_c_1f8e5a3c-2d1b-4c6e-9a7f-123456789abc-latch-",
                                        "jvm-contender", ZOO_EPHEMERAL_SEQUENTIAL);
  auto children = jvm.children(parent);
  ASSERT_EQ(children.size(), 2u);
  EXPECT_EQ(children.back(), second);
  EXPECT_EQ(jvm.get(parent + "/" + children.front()), "cpp");
  // The C++ contender stops: its node goes, the JVM participant is first.
  SIMBA_ASSERT_OK(service->stop());
  children = jvm.children(parent);
  ASSERT_EQ(children.size(), 1u);
  EXPECT_EQ(children.front(), second);
}

// A C++ node whose session keeps no heartbeat (its process is stuck, but
// its session lives on) is evicted after its lease, counted from when a
// waiter first saw it in front. (With a heartbeat, the conformance suite's
// failing-renewal case covers it.)
TEST(ZookeeperLeases, AnOwnerThatStopsRenewingIsEvictedAfterItsLease) {
  RawZk stuck(shared_server_uri("zookeeper"));
  ASSERT_TRUE(stuck.ok());
  const std::string parent = test_root() + "/stuck";
  // ttl 400 ms (0x190), transition 200 ms (0xc8), never written after its
  // creation.
  const std::string node = stuck.create(parent + "/_c_00000190-0000-80c8-8000-000000000001-latch-",
                                        "stuck-owner", ZOO_EPHEMERAL_SEQUENTIAL);
  ASSERT_FALSE(node.empty());
  auto backend = open(shared_uri());
  ASSERT_TRUE(backend);
  auto seen = backend->acquire_or_renew(request_for("stuck", "cpp", seconds(2), seconds(1)),
                                        in(seconds(5)));
  ASSERT_THAT(seen, IsOk());
  EXPECT_EQ(seen->owner.owner_id, "stuck-owner");
  const auto first_seen = steady_clock::now();
  // Its lease (600 ms) is counted from when we first saw it in front (it
  // was never written); once over, our next attempt evicts it and leads.
  std::optional<OwnerRecord> owned;
  while (steady_clock::now() - first_seen < seconds(5)) {
    auto r = backend->acquire_or_renew(request_for("stuck", "cpp", seconds(2), seconds(1)),
                                       in(seconds(5)));
    ASSERT_THAT(r, IsOk());
    if (r->owner.owner_id == "cpp") {
      owned = *r;
      break;
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_TRUE(owned.has_value());
  EXPECT_GE(steady_clock::now() - first_seen, milliseconds(600));
  EXPECT_EQ(stuck.children(parent).size(), 1u);
  EXPECT_EQ(stuck.get(parent + "/" + node), "") << "the stuck node is gone";
}

// ---- sessions ----------------------------------------------------------------------

// The owner's connection is black-holed (a network partition): its client
// notices the silence after 2/3 of the session timeout and the owner stops
// acting as owner at once (Curator's SUSPENDED); only when the server ends
// the session (after the whole timeout) can the waiter take over. Healed,
// the first contender finds its session expired and joins again with a new
// one.
//
// What is promised, and asserted: A is told within 2/3 of the session
// timeout of the cut (plus delivery); A is no longer an owner by its own
// state when B is told it owns the mutex (the protocol puts a third of the
// session timeout, ~667 ms here, between the two); B's token is greater.
// The two callbacks' times are not compared: they run on two factories'
// callback threads, whose scheduling orders nothing.
TEST(ZookeeperSessions, PartitionedOwnerIsToldBeforeTheSessionExpiresAndRejoins) {
  const std::string server = shared_server_uri("zookeeper");
  TcpProxy proxy(port_of(server));
  constexpr milliseconds kSessionTimeout{2000};
  const std::string proxied = "zookeeper://127.0.0.1:" + std::to_string(proxy.port()) +
                              "?root=" + test_root() + "&session_timeout=2s";
  // Long leases: only the session can decide here.
  auto a_factory = make_factory(proxied, seconds(20), seconds(10));
  auto b_factory = make_factory(shared_uri(), seconds(20), seconds(10));
  ASSERT_TRUE(a_factory && b_factory);
  Timeline timeline;
  auto a = a_factory->create_contend_service(timeline.contender("partition", "a", "a")).value();
  MutexContendService* a_service = a.get();
  // A's own state at the moment B is told it owns the mutex.
  std::atomic<int> a_owner_when_b_acquired{-1};
  std::atomic<std::uint64_t> b_token{0};
  auto b_contender = make_contender(
      "partition",
      [&, a_service](const MutexState& s) {
        a_owner_when_b_acquired = a_service->is_owner() ? 1 : 0;
        b_token = s.after.fencing_token;
      },
      nullptr, "b");
  auto b = b_factory->create_contend_service(b_contender).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(10)));
  const std::uint64_t a_token = a->fencing_token();
  SIMBA_ASSERT_OK(b->start());
  ASSERT_TRUE(eventually([&] { return b->after_owner().owner_id == "a"; }, seconds(10)));

  const auto cut = steady_clock::now();
  proxy.set_blackhole(true);
  ASSERT_TRUE(eventually([&] { return b->is_owner(); }, seconds(10)));
  ASSERT_TRUE(eventually([&] { return a_owner_when_b_acquired.load() >= 0; }, seconds(5)));
  EXPECT_EQ(a_owner_when_b_acquired.load(), 0) << "A still acted as owner when B took over";
  const auto a_released = timeline.when("a released");
  ASSERT_TRUE(a_released.has_value());
  // The C client gives up a connection silent for 2/3 of the session
  // timeout (it last heard from the server at or before the cut); the kLost
  // then crosses two threads. 400 ms of margin for those and a loaded
  // machine, still below the session timeout itself (1733 < 2000 ms).
  EXPECT_LT(*a_released - cut, scaled(kSessionTimeout * 2 / 3 + milliseconds(400)))
      << "not told within 2/3 of the session timeout";
  EXPECT_GT(b_token.load(), a_token);
  EXPECT_EQ(b->fencing_token(), b_token.load());
  EXPECT_FALSE(a->is_owner());

  // Healed: A's old session is gone; it joins the queue again behind B.
  proxy.set_blackhole(false);
  proxy.cut_all();
  RawZk raw(server);
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(eventually([&] { return raw.children(test_root() + "/partition").size() == 2; },
                         seconds(15)));
  EXPECT_EQ(raw.get(test_root() + "/partition/" + raw.children(test_root() + "/partition").back()),
            "a");
  SIMBA_ASSERT_OK(b->stop());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  EXPECT_GT(a->fencing_token(), a_token);
  SIMBA_ASSERT_OK(a->stop());
}

// A release whose connection goes silent under it (the C client gives the
// connection up after 2/3 of the session timeout and fails the call with
// ZOPERATIONTIMEOUT; a server still starting after a restart does the same)
// is asked again once the session is back, within the call's deadline, and
// deletes the node itself. It once failed stop() with "operation timeout
// (-7)" while the deadline had seconds left.
TEST(ZookeeperSessions, AReleaseCutOffMidCallIsAskedAgainOnTheSameSession) {
  const std::string server = shared_server_uri("zookeeper");
  TcpProxy proxy(port_of(server));
  // 6 s: the connection is given up after 4 s of silence, and the session
  // outlives that by 2 s, time enough to come back.
  const std::string proxied = "zookeeper://127.0.0.1:" + std::to_string(proxy.port()) +
                              "?root=" + test_root() + "&session_timeout=6s";
  auto backend = open(proxied);
  ASSERT_NE(backend, nullptr);
  auto held = backend->acquire_or_renew(request_for("cutoff", "a"), in(seconds(10)));
  ASSERT_THAT(held, IsOk());
  ASSERT_TRUE(held->owner.is_owner("a"));
  const int dialed = proxy.accepted();
  proxy.set_blackhole(true);
  std::optional<Result<bool>> released;
  std::thread releasing([&] {
    released = backend->release("cutoff", "a", held->owner.fencing_token, in(seconds(15)));
  });
  // The client dials again once it gave the silent connection up (and
  // failed the delete): let that connection through.
  EXPECT_TRUE(eventually([&] { return proxy.accepted() > dialed; }, seconds(10)));
  proxy.set_blackhole(false);
  releasing.join();
  ASSERT_TRUE(released.has_value());
  ASSERT_THAT(*released, IsOk());
  // (Whether it returns true depends on which delete the server applied:
  // the proxy passes the first one's held bytes on when it opens, and the
  // second then finds no node.)
  RawZk raw(server);
  ASSERT_TRUE(raw.ok());
  EXPECT_TRUE(raw.children(test_root() + "/cutoff").empty());
}

// The server is killed and restarted while a lease is held: the owner
// stops acting as owner when the connection drops, and after the restart
// there is one owner again (the same session may survive a quick restart),
// never two at once.
TEST(ZookeeperFailures, RestartWhileALeaseIsHeldKeepsOneOwner) {
  auto server = TestServer::start("zookeeper");
  ASSERT_THAT(server, IsOk());
  const std::string uri = (*server)->uri() + "?root=" + test_root() + "&session_timeout=4s";
  auto a_factory = make_factory(uri, seconds(2), seconds(1));
  auto b_factory = make_factory(uri, seconds(2), seconds(1));
  ASSERT_TRUE(a_factory && b_factory);
  Timeline timeline;
  auto a = a_factory->create_contend_service(timeline.contender("restart", "a", "a")).value();
  auto b = b_factory->create_contend_service(timeline.contender("restart", "b", "b")).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(10)));
  SIMBA_ASSERT_OK(b->start());
  std::atomic<bool> stop{false};
  std::atomic<int> both{0};
  std::thread sampler([&] {
    while (!stop) {
      if (a->is_owner() && b->is_owner()) ++both;
      std::this_thread::sleep_for(milliseconds(1));
    }
  });
  SIMBA_ASSERT_OK((*server)->kill());
  ASSERT_TRUE(eventually([&] { return !a->is_owner(); }, seconds(5)))
      << "the owner went on as owner without its server";
  std::this_thread::sleep_for(seconds(1));
  SIMBA_ASSERT_OK((*server)->restart());
  ASSERT_TRUE(eventually([&] { return a->is_owner() || b->is_owner(); }, seconds(20)));
  std::this_thread::sleep_for(seconds(2));
  stop = true;
  sampler.join();
  EXPECT_EQ(both.load(), 0) << "two owners at once";
  EXPECT_NE(a->is_owner(), b->is_owner());
  SIMBA_EXPECT_OK(a->stop());
  SIMBA_EXPECT_OK(b->stop());
}

// ---- hand-off ----------------------------------------------------------------------

TEST(ZookeeperHandOff, WaiterTakesOverWithinRoundTripsOfTheRelease) {
  auto a_factory = make_factory(shared_uri(), seconds(10), seconds(6));
  auto b_factory = make_factory(shared_uri(), seconds(10), seconds(6));
  ASSERT_TRUE(a_factory && b_factory);
  Recorder a, b;
  auto sa = a_factory->create_contend_service(a.contender("handoff", "a")).value();
  auto sb = b_factory->create_contend_service(b.contender("handoff", "b")).value();
  SIMBA_ASSERT_OK(sa->start());
  ASSERT_TRUE(a.acquired.wait(seconds(10)));
  SIMBA_ASSERT_OK(sb->start());
  ASSERT_TRUE(eventually([&] { return sb->after_owner().owner_id == "a"; }, seconds(10)));
  const auto released = steady_clock::now();
  SIMBA_ASSERT_OK(sa->stop());
  // With a 10 s lease, only the watch can make this fast.
  ASSERT_TRUE(b.acquired.wait(seconds(5)));
  EXPECT_LT(b.acquired_at() - released, milliseconds(500));
  SIMBA_EXPECT_OK(sb->stop());
}

// 50 contenders (in 5 processes' worth of factories) queue for one mutex:
// they lead one at a time in the order they joined, and each hand-off
// costs the server a few requests, not one per waiter.
// Contenders joining and leaving one queue as fast as they can: a waiter's
// predecessor often leaves between the listing and the watch on it. That is
// the queue moving, not an error (it once came back as INTERNAL "no node").
TEST(ZookeeperHandOff, APredecessorLeavingMidAcquireIsNoError) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 150;
  const std::string uri = shared_uri();
  std::atomic<int> errors{0};
  std::string first_error;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto backend = open(uri);  // a session of its own, like a process
      if (!backend) {
        ++errors;
        return;
      }
      const std::string id = "churn-" + std::to_string(t);
      for (int i = 0; i < kRounds; ++i) {
        auto joined = backend->acquire_or_renew(request_for("churn", id), in(seconds(10)));
        auto left = backend->release("churn", id, in(seconds(10)));
        if (!joined.ok() || !left.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (errors++ == 0) {
            first_error = (!joined.ok() ? joined.status() : left.status()).to_string();
          }
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(errors.load(), 0) << first_error;
}

TEST(ZookeeperHandOff, FiftyContendersQueueInOrderWithoutAHerd) {
  constexpr int kFactories = 5;
  constexpr int kContenders = 50;
  // A server of its own: its request count is ours alone.
  auto server = TestServer::start("zookeeper");
  ASSERT_THAT(server, IsOk());
  std::vector<std::unique_ptr<MutexContendServiceFactory>> factories;
  for (int i = 0; i < kFactories; ++i) {
    factories.push_back(make_factory(with_root((*server)->uri()), seconds(20), seconds(10)));
    ASSERT_TRUE(factories.back());
  }
  std::vector<std::unique_ptr<MutexContendService>> services(kContenders);
  for (int i = 0; i < kContenders; ++i) {
    auto c = make_contender("queue", nullptr, nullptr, "c" + std::to_string(i));
    services[i] = factories[i % kFactories]->create_contend_service(c).value();
    SIMBA_ASSERT_OK(services[i]->start());
    // Join in order: wait until this one has its place in the queue.
    ASSERT_TRUE(
        eventually([&] { return !services[i]->after_owner().owner_id.empty(); }, seconds(10)));
  }
  const auto owners = [&] {
    return std::count_if(services.begin(), services.end(),
                         [](const auto& s) { return s->is_owner(); });
  };
  const int port = (*server)->port();
  std::this_thread::sleep_for(milliseconds(200));
  const long long before = mntr(port, "zk_packets_received");
  ASSERT_GE(before, 0) << "mntr is not answered";
  // Each owner in turn stops; the next one in line leads, alone.
  for (int i = 0; i < kContenders; ++i) {
    ASSERT_TRUE(eventually([&] { return services[i]->is_owner(); }, seconds(5)))
        << "contender " << i << " did not lead in turn";
    EXPECT_EQ(owners(), 1);
    SIMBA_ASSERT_OK(services[i]->stop());
  }
  const long long after = mntr(port, "zk_packets_received");
  const double per_handoff = static_cast<double>(after - before) / kContenders;
  RecordProperty("packets_per_handoff", std::to_string(per_handoff));
  // A release (1), the next one's listing, owner read, claim and watches
  // (about 5), plus the own-node watch: a handful, where a herd would be
  // one listing per waiter (up to 49).
  EXPECT_LT(per_handoff, 12.0);
}

// ---- names and URIs ------------------------------------------------------------------

TEST(ZookeeperUri, ParsesHostsChrootAndOptions) {
  auto uri = Uri::parse("zookeeper://h1:2181,h2/apps/x?root=/locks&session_timeout=4s");
  ASSERT_THAT(uri, IsOk());
  auto options = zookeeper_options_from_uri(*uri);
  ASSERT_THAT(options, IsOk());
  EXPECT_EQ(options->connect_string, "h1:2181,h2:2181/apps/x");
  EXPECT_EQ(options->root, "/locks");
  EXPECT_EQ(options->session_timeout, seconds(4));
  auto backend = open(shared_uri());
  ASSERT_TRUE(backend);
  EXPECT_THAT(backend->acquire_or_renew(request_for("a/b", "c"), in(seconds(5))),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("'/'")));
  EXPECT_THAT(backend->acquire_or_renew(request_for("..", "c"), in(seconds(5))),
              StatusIs(StatusCode::kInvalidArgument));
}

// ---- several hosts and a chroot ----------------------------------------------------

// A host list whose first or second entry is dead (a closed port): the
// client tries the hosts in a random order and moves past the refused one,
// so a session opens either way.
TEST(ZookeeperHosts, ADeadHostInTheListIsSkipped) {
  const std::string live = hosts_of(shared_server_uri("zookeeper"));
  for (const std::string& hosts : {"127.0.0.1:1," + live, live + ",127.0.0.1:1"}) {
    auto backend = open("zookeeper://" + hosts + "?root=" + test_root() + "&connect_timeout=3s");
    ASSERT_TRUE(backend);
    auto acquired = backend->acquire_or_renew(request_for("m", "c"), in(seconds(5)));
    ASSERT_THAT(acquired, IsOk()) << hosts;
    EXPECT_EQ(acquired->owner.owner_id, "c") << hosts;
    EXPECT_THAT(backend->release("m", "c", in(seconds(5))), IsOkAndHolds(true)) << hosts;
  }
}

// Two hosts (two proxies in front of the one server); the one the session
// uses dies (the proxy goes away: its connections reset, its port refuses).
// The client moves the session to the other host well within the session
// timeout, so the session, and with it the owner's node and token, survive:
// the owner keeps its hold throughout (a disconnection is not a loss while
// the session is sure to live: 2/3 of the session timeout after the server
// last heard from us, and within the lease), renews through the other host
// with the same token, and the waiter never gets the mutex.
TEST(ZookeeperHosts, TheSessionMovesToTheNextHostWhenItsHostDies) {
  const int port = port_of(shared_server_uri("zookeeper"));
  std::vector<std::unique_ptr<TcpProxy>> proxies;
  proxies.push_back(std::make_unique<TcpProxy>(port));
  proxies.push_back(std::make_unique<TcpProxy>(port));
  // Session timeout 4 s: the client gives a silent connection up after
  // 2/3 of it; a reset is noticed at once and the next host dialled.
  const std::string uri = "zookeeper://127.0.0.1:" + std::to_string(proxies[0]->port()) +
                          ",127.0.0.1:" + std::to_string(proxies[1]->port()) +
                          "?root=" + test_root() + "&session_timeout=4s";
  // Long leases: the session alone decides here.
  auto owner_factory = make_factory(uri, seconds(20), seconds(10));
  auto waiter_factory = make_factory(shared_uri(), seconds(20), seconds(10));
  ASSERT_TRUE(owner_factory && waiter_factory);
  Timeline timeline;
  auto owner = owner_factory->create_contend_service(timeline.contender("hosts", "o", "o")).value();
  auto waiter =
      waiter_factory->create_contend_service(timeline.contender("hosts", "w", "w")).value();
  SIMBA_ASSERT_OK(owner->start());
  ASSERT_TRUE(eventually([&] { return owner->is_owner(); }, seconds(10)));
  const std::uint64_t token = owner->fencing_token();
  SIMBA_ASSERT_OK(waiter->start());
  ASSERT_TRUE(eventually([&] { return waiter->after_owner().owner_id == "o"; }, seconds(10)));
  RawZk raw(shared_server_uri("zookeeper"));
  ASSERT_TRUE(raw.ok());
  const auto before = raw.children(test_root() + "/hosts");
  ASSERT_EQ(before.size(), 2u);
  // The one session's connection goes through exactly one of the proxies.
  ASSERT_EQ(proxies[0]->connections() + proxies[1]->connections(), 1);
  const std::size_t used = proxies[0]->connections() == 1 ? 0 : 1;
  std::atomic<bool> stop{false};
  std::atomic<int> not_owner{0};
  std::thread sampler([&] {
    while (!stop) {
      if (!owner->is_owner()) ++not_owner;
      std::this_thread::sleep_for(milliseconds(1));
    }
  });
  proxies[used].reset();
  // The session moves to the other host: the reset is seen at once and the
  // other host answers in a round trip, far inside the hold bound (2/3 of
  // the 4 s session timeout after the last contact, which the backend's
  // keepalive keeps within a third of it).
  ASSERT_TRUE(eventually([&] { return proxies[1 - used]->connections() == 1; }, seconds(5)));
  // A renewal goes through the new connection (the core renews at once on
  // the store's "look again" after a reconnection).
  std::this_thread::sleep_for(seconds(1));
  stop = true;
  sampler.join();
  EXPECT_EQ(not_owner.load(), 0) << "the owner stopped acting as owner during the move";
  EXPECT_FALSE(timeline.when("o released").has_value()) << "the move was reported as a loss";
  EXPECT_TRUE(owner->is_owner());
  EXPECT_EQ(owner->fencing_token(), token) << "a new node: the session did not survive";
  EXPECT_EQ(raw.children(test_root() + "/hosts"), before);
  EXPECT_FALSE(timeline.when("w acquired").has_value()) << "the waiter took over";
  SIMBA_ASSERT_OK(owner->stop());
  ASSERT_TRUE(eventually([&] { return waiter->is_owner(); }, seconds(5)));
  EXPECT_GT(waiter->fencing_token(), token);
  SIMBA_EXPECT_OK(waiter->stop());
}

// The URI's path is the client's chroot: every node the backend makes lives
// under it, and two chroots on one server are two stores that never see
// each other's mutexes.
TEST(ZookeeperHosts, AChrootKeepsTheNodesUnderIt) {
  const std::string server = shared_server_uri("zookeeper");
  RawZk raw(server);
  ASSERT_TRUE(raw.ok());
  const std::string chroot_a = test_root() + "-a";
  const std::string chroot_b = test_root() + "-b";
  // A chroot must exist (the client does not create it).
  ASSERT_EQ(create_persistent(raw, chroot_a), ZOK);
  ASSERT_EQ(create_persistent(raw, chroot_b), ZOK);
  // The root: a name of this test's own, so that its absence outside the
  // chroots means something on the shared server.
  const std::string root = test_root() + "-root";
  auto a = open(server + chroot_a + "?root=" + root);
  auto b = open(server + chroot_b + "?root=" + root);
  ASSERT_TRUE(a && b);
  // Both own "m" at once: different stores.
  auto owned_a = a->acquire_or_renew(request_for("m", "in-a"), in(seconds(5)));
  auto owned_b = b->acquire_or_renew(request_for("m", "in-b"), in(seconds(5)));
  ASSERT_THAT(owned_a, IsOk());
  ASSERT_THAT(owned_b, IsOk());
  EXPECT_EQ(owned_a->owner.owner_id, "in-a");
  EXPECT_EQ(owned_b->owner.owner_id, "in-b");
  ASSERT_THAT(a->acquire_or_renew(request_for("only-a", "in-a"), in(seconds(5))), IsOk());
  // The nodes, seen without a chroot: under <chroot><root>, and nothing
  // at <root>.
  const auto nodes_a = raw.children(chroot_a + root + "/m");
  const auto nodes_b = raw.children(chroot_b + root + "/m");
  ASSERT_EQ(nodes_a.size(), 1u);
  ASSERT_EQ(nodes_b.size(), 1u);
  EXPECT_EQ(raw.get(chroot_a + root + "/m/" + nodes_a[0]), "in-a");
  EXPECT_EQ(raw.get(chroot_b + root + "/m/" + nodes_b[0]), "in-b");
  EXPECT_EQ(raw.children(chroot_a + root + "-sessions").size(), 1u) << "the heartbeat node";
  Stat stat{};
  EXPECT_EQ(zoo_exists(raw.handle(), root.c_str(), 0, &stat), ZNONODE);
  // Each store lists only its own mutexes.
  auto listed_a = a->list(in(seconds(5)));
  auto listed_b = b->list(in(seconds(5)));
  ASSERT_THAT(listed_a, IsOk());
  ASSERT_THAT(listed_b, IsOk());
  std::vector<std::string> names_a, names_b;
  for (const auto& m : *listed_a) names_a.push_back(m.mutex);
  for (const auto& m : *listed_b) names_b.push_back(m.mutex);
  std::sort(names_a.begin(), names_a.end());
  EXPECT_EQ(names_a, (std::vector<std::string>{"m", "only-a"}));
  EXPECT_EQ(names_b, (std::vector<std::string>{"m"}));
  EXPECT_THAT(a->release("m", "in-a", in(seconds(5))), IsOkAndHolds(true));
  EXPECT_THAT(a->release("only-a", "in-a", in(seconds(5))), IsOkAndHolds(true));
  EXPECT_THAT(b->release("m", "in-b", in(seconds(5))), IsOkAndHolds(true));
  EXPECT_TRUE(raw.children(chroot_a + root + "/m").empty());
}

TEST(ZookeeperErrors, ResultCodesAreTransientRefusedOrBroken) {
  using internal::zookeeper::status_code_of;
  // What may pass: retried within the caller's deadline.
  for (const int rc : {ZCONNECTIONLOSS, ZOPERATIONTIMEOUT, ZSESSIONEXPIRED, ZCLOSING, ZINVALIDSTATE,
                       ZSESSIONMOVED, ZNOTREADONLY}) {
    EXPECT_EQ(status_code_of(rc), StatusCode::kUnavailable) << zerror(rc);
    EXPECT_TRUE(is_retryable(Status(status_code_of(rc), "x"))) << zerror(rc);
  }
  // Refusals: the caller is told at once.
  for (const int rc : {ZNOAUTH, ZAUTHFAILED}) {
    EXPECT_EQ(status_code_of(rc), StatusCode::kPermissionDenied) << zerror(rc);
  }
  // The rest: the server rejected the request itself.
  for (const int rc : {ZBADARGUMENTS, ZNONODE, ZBADVERSION, ZNODEEXISTS, ZNOTEMPTY, ZSYSTEMERROR}) {
    EXPECT_EQ(status_code_of(rc), StatusCode::kInternal) << zerror(rc);
  }
}

// ---- leaving a member that does not answer (zookeeper_sockets.h) -----------------

TEST(ZookeeperMembers, TheClientsErrorLinesNameTheMemberAndTheCause) {
  using internal::zookeeper::member_cause_of_log_line;
  const auto refused = member_cause_of_log_line(
      "2026-11-28 17:00:00,123:4242(0x7f00):ZOO_ERROR@handle_socket_error_msg@2041: Socket "
      "127.0.0.1:2181 zk retcode=-4, errno=111(Connection refused): server refused to accept "
      "the client\n");
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->first, "127.0.0.1:2181");
  EXPECT_EQ(refused->second, "server refused to accept the client (Connection refused)");
  const auto timed_out = member_cause_of_log_line(
      "ZOO_ERROR@handle_socket_error_msg@2041: Socket [::1]:2182 zk retcode=-7, "
      "errno=110(Connection "
      "timed out): connection to [::1]:2182 timed out (exceeded timeout by 0ms)");
  ASSERT_TRUE(timed_out.has_value());
  EXPECT_EQ(timed_out->first, "[::1]:2182");
  EXPECT_EQ(timed_out->second,
            "connection to [::1]:2182 timed out (exceeded timeout by 0ms) (Connection timed out)");
  const auto no_errno = member_cause_of_log_line(
      "Socket 10.0.0.2:2181 zk retcode=-4, errno=0(Success): session expired");
  ASSERT_TRUE(no_errno.has_value());
  EXPECT_EQ(no_errno->second, "session expired");
  EXPECT_FALSE(member_cause_of_log_line("ZOO_INFO@check_events@2992: initiated connection to "
                                        "server 127.0.0.1:2181")
                   .has_value());
  EXPECT_FALSE(member_cause_of_log_line("Socket  zk retcode=-4, errno=1(x): y").has_value());
}

TEST(ZookeeperMembers, PeersParseAsTheClientFormatsThem) {
  using internal::zookeeper::parse_peer;
  const auto v4 = parse_peer("127.0.0.1:2181");
  ASSERT_TRUE(v4.has_value());
  EXPECT_FALSE(v4->v6);
  EXPECT_EQ(v4->port, 2181);
  EXPECT_EQ(v4->address[0], 127);
  EXPECT_EQ(v4->address[3], 1);
  const auto bracketed = parse_peer("[::1]:2182");
  ASSERT_TRUE(bracketed.has_value());
  EXPECT_TRUE(bracketed->v6);
  EXPECT_EQ(bracketed->address[15], 1);
  EXPECT_TRUE(parse_peer("::1:2182").has_value());
  for (const char* bad : {"", "127.0.0.1", "127.0.0.1:", ":2181", "host:2181", "127.0.0.1:0",
                          "127.0.0.1:70000", "127.0.0.1:21x"}) {
    EXPECT_FALSE(parse_peer(bad).has_value()) << bad;
  }
}

TEST(ZookeeperMembers, ProcNetTcpRowsAreMatchedByTheirRemoteEnd) {
  using internal::zookeeper::inodes_connected_to;
  using internal::zookeeper::parse_peer;
  // 127.0.0.1:2181 is 0100007F:0885 as the kernel prints it; states 01
  // (established) and 02 (connecting) count, 0A (listening) and 06 do not.
  const std::string table =
      "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
      "timeout inode\n"
      "   0: 0100007F:C350 0100007F:0885 01 00000000:00000000 00:00000000 00000000     0        "
      "0 1111 1 0000000000000000 20 4 30 10 -1\n"
      "   1: 0100007F:C351 0100007F:0885 02 00000000:00000000 00:00000000 00000000     0        "
      "0 2222 1 0000000000000000 20 4 30 10 -1\n"
      "   2: 0100007F:0885 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        "
      "0 3333 1 0000000000000000 20 4 30 10 -1\n"
      "   3: 0100007F:C352 0100007F:0886 01 00000000:00000000 00:00000000 00000000     0        "
      "0 4444 1 0000000000000000 20 4 30 10 -1\n"
      "   4: 0100007F:C353 0100007F:0885 06 00000000:00000000 00:00000000 00000000     0        "
      "0 5555 1 0000000000000000 20 4 30 10 -1\n";
  EXPECT_EQ(inodes_connected_to(table, *parse_peer("127.0.0.1:2181")),
            (std::vector<std::uint64_t>{1111, 2222}));
  EXPECT_EQ(inodes_connected_to(table, *parse_peer("127.0.0.1:2182")),
            (std::vector<std::uint64_t>{4444}));
  EXPECT_TRUE(inodes_connected_to(table, *parse_peer("127.0.0.2:2181")).empty());
  EXPECT_TRUE(inodes_connected_to("", *parse_peer("127.0.0.1:2181")).empty());
}

// A loopback listener and its port.
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 || listen(fd, 8) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      return;
    }
    port = ntohs(address.sin_port);
  }
  ~Listener() { close(fd); }
  // A connected client socket (the kernel accepts it into the backlog, as a
  // paused server's does).
  int dial() const {
    const int client = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    if (connect(client, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) return -1;
    return client;
  }
};

// Whether `fd` reads end-of-stream now (its connection was shut down).
bool reads_end(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 1000) != 1) return false;
  char byte;
  return recv(fd, &byte, 1, MSG_DONTWAIT) == 0;
}

TEST(ZookeeperMembers, OnlyTheConnectionsToTheSilentMemberAreShutDown) {
  Listener silent;
  Listener live;
  ASSERT_NE(silent.port, 0);
  ASSERT_NE(live.port, 0);
  const int to_silent_a = silent.dial();
  const int to_silent_b = silent.dial();
  const int to_live = live.dial();
  ASSERT_GE(to_silent_a, 0);
  ASSERT_GE(to_silent_b, 0);
  ASSERT_GE(to_live, 0);
  const auto peer = internal::zookeeper::parse_peer("127.0.0.1:" + std::to_string(silent.port));
  ASSERT_TRUE(peer.has_value());
  EXPECT_EQ(internal::zookeeper::shut_down_connections_to(*peer), 2);
  EXPECT_TRUE(reads_end(to_silent_a));
  EXPECT_TRUE(reads_end(to_silent_b));
  // Shut down, not closed: the descriptors stay their owner's to close.
  EXPECT_EQ(fcntl(to_silent_a, F_GETFD), 0);
  pollfd p{to_live, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 100), 0) << "the live member's connection was touched";
  close(to_silent_a);
  close(to_silent_b);
  close(to_live);
}

TEST(ZookeeperUri, AnUnreachableEnsembleFailsByTheDeadline) {
  auto backend = open("zookeeper://127.0.0.1:1?connect_timeout=300ms");
  ASSERT_TRUE(backend);
  const auto start = steady_clock::now();
  // The member is named with what the client met there.
  EXPECT_THAT(backend->acquire_or_renew(request_for("m", "c"), in(seconds(5))),
              StatusIs(StatusCode::kUnavailable,
                       HasSubstr("members tried: 127.0.0.1:1: server refused to accept the client "
                                 "(Connection refused)")));
  EXPECT_LT(steady_clock::now() - start, seconds(2));
}

}  // namespace
}  // namespace simba::testing
