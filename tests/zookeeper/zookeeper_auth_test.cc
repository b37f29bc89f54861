// ZooKeeper digest authentication and the ACLs of the nodes Simba creates
// (docs/backends/zookeeper.md, "TLS and authentication"), against real
// servers: the shared one (every test under a root of its own) and, for a
// server that refuses the digest scheme, a private one. What the test itself
// does to the server goes through the C client's synchronous API, with or
// without credentials of its own.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zookeeper/zookeeper.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "simba/backends/zookeeper.h"
#include "simba/registry.h"
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
using ::testing::Not;

// A password no message may contain.
const std::string kPassword = "Zk" + std::to_string(::getpid()) + "pW9q";
const std::string kWrongPassword = "Zk" + std::to_string(::getpid()) + "nOpe";

std::string test_root() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string("/za-") + info->name() + "-" + std::to_string(getpid());
}

// "zookeeper://127.0.0.1:P" -> "127.0.0.1:P".
std::string hosts_of(const std::string& uri) {
  return uri.substr(std::string("zookeeper://").size());
}
int port_of(const std::string& uri) {
  const std::string hosts = hosts_of(uri);
  return std::stoi(hosts.substr(hosts.rfind(':') + 1));
}

// zookeeper://USER:PASSWORD@hosts?root=<test root><extra>; no user: none.
std::string uri_as(const std::string& server, const std::string& user, const std::string& password,
                   const std::string& extra = "") {
  const std::string credentials = user.empty() ? "" : user + ":" + password + "@";
  return "zookeeper://" + credentials + hosts_of(server) + "?root=" + test_root() + extra;
}
std::string shared() { return shared_server_uri("zookeeper"); }

// The C client's synchronous API, authenticated as `credentials`
// ("user:password") when given.
class RawZk {
 public:
  explicit RawZk(const std::string& server, const std::string& credentials = "") {
    zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR);
    zh_ = zookeeper_init(hosts_of(server).c_str(), nullptr, 10000, nullptr, nullptr, 0);
    if (zh_ != nullptr && !credentials.empty()) {
      zoo_add_auth(zh_, "digest", credentials.data(), static_cast<int>(credentials.size()),
                   &RawZk::on_auth, &auth_rc_);
    }
    for (int i = 0; i < 500 && zh_ != nullptr && !ok(); ++i) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    for (int i = 0; i < 500 && !credentials.empty() && auth_rc_ == kPending; ++i) {
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  ~RawZk() {
    if (zh_ != nullptr) zookeeper_close(zh_);
  }
  bool ok() const { return zh_ != nullptr && zoo_state(zh_) == ZOO_CONNECTED_STATE; }
  int auth_rc() const { return auth_rc_; }

  std::vector<std::string> children(const std::string& path, int* rc = nullptr) {
    String_vector names{};
    std::vector<std::string> out;
    const int result = zoo_get_children(zh_, path.c_str(), 0, &names);
    if (rc != nullptr) *rc = result;
    if (result == ZOK) {
      for (int i = 0; i < names.count; ++i) out.emplace_back(names.data[i]);
      deallocate_String_vector(&names);
    }
    return out;
  }
  int get(const std::string& path, std::string* data = nullptr) {
    char buffer[1024];
    int length = sizeof buffer;
    Stat stat{};
    const int rc = zoo_get(zh_, path.c_str(), 0, buffer, &length, &stat);
    if (rc == ZOK && data != nullptr) data->assign(buffer, static_cast<std::size_t>(length));
    return rc;
  }
  int set(const std::string& path) { return zoo_set(zh_, path.c_str(), "x", 1, -1); }
  int remove(const std::string& path) { return zoo_delete(zh_, path.c_str(), -1); }
  int create_child(const std::string& parent) {
    return zoo_create(zh_, (parent + "/intruder").c_str(), "x", 1, &ZOO_OPEN_ACL_UNSAFE,
                      ZOO_EPHEMERAL, nullptr, 0);
  }
  // The node's ACL as "scheme:id/perms" entries, the digest's hash cut off
  // ("digest:alice/31"); empty on an error.
  std::vector<std::string> acl(const std::string& path) {
    ACL_vector acl{};
    Stat stat{};
    std::vector<std::string> out;
    if (zoo_get_acl(zh_, path.c_str(), &acl, &stat) != ZOK) return out;
    for (int i = 0; i < acl.count; ++i) {
      std::string id = acl.data[i].id.id;
      if (std::string(acl.data[i].id.scheme) == "digest") id = id.substr(0, id.find(':'));
      out.push_back(std::string(acl.data[i].id.scheme) + ":" + id + "/" +
                    std::to_string(acl.data[i].perms));
    }
    deallocate_ACL_vector(&acl);
    return out;
  }

 private:
  static constexpr int kPending = 1;
  static void on_auth(int rc, const void* data) {
    static_cast<std::atomic<int>*>(const_cast<void*>(data))->store(rc);
  }
  zhandle_t* zh_ = nullptr;
  std::atomic<int> auth_rc_{kPending};
};

const std::string kCreatorAll = "digest:alice/" + std::to_string(ZOO_PERM_ALL);
const std::string kWorldRead = "world:anyone/" + std::to_string(ZOO_PERM_READ);

// The participants of `mutex` under the test root, in sequence order.
std::vector<std::string> participants(RawZk& raw, const std::string& mutex) {
  auto names = raw.children(test_root() + "/" + mutex);
  std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    return a.substr(a.rfind("latch-")) < b.substr(b.rfind("latch-"));
  });
  return names;
}

// An error that names the store and the cause and never the password, by
// the deadline.
void expect_refused(const Status& status, steady_clock::duration took, milliseconds deadline,
                    const std::string& cause) {
  std::printf("refused: %s\n", status.message().c_str());
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status;
  EXPECT_THAT(status.message(), HasSubstr("zookeeper at 127.0.0.1:"));
  EXPECT_THAT(status.message(), HasSubstr(cause));
  EXPECT_THAT(status.message(), Not(HasSubstr(kPassword)));
  EXPECT_THAT(status.message(), Not(HasSubstr(kWrongPassword)));
  EXPECT_LT(took, deadline + milliseconds(500));
}

// ---- one user: the protocol as without credentials ----------------------------------

// Two backends (two sessions) of one user: every node gets "all for alice"
// and nothing else; acquisition, hand-off, eviction of a holder whose lease
// ended (a delete of another session's node), the loss pushed to it,
// growing tokens and a forced release all work as without ACLs.
TEST(ZookeeperAuth, OneUserContendsAsBeforeAndItsNodesAreCreatorOnly) {
  auto a = open(uri_as(shared(), "alice", kPassword));
  auto b = open(uri_as(shared(), "alice", kPassword));
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->capabilities().transport, "plain text");
  auto owned = a->acquire_or_renew(request_for("m", "a"), in(seconds(5)));
  ASSERT_THAT(owned, IsOk());
  EXPECT_EQ(owned->owner.owner_id, "a");
  // B's node carries a 500 ms lease in its name (so A may evict it soon).
  const AcquireRequest b_request = request_for("m", "b", milliseconds(300), milliseconds(200));
  auto waiting = b->acquire_or_renew(b_request, in(seconds(5)));
  ASSERT_THAT(waiting, IsOk());
  EXPECT_EQ(waiting->owner.owner_id, "a");

  RawZk raw(shared(), "alice:" + kPassword);
  ASSERT_TRUE(raw.ok());
  ASSERT_EQ(raw.auth_rc(), ZOK);
  const auto nodes = participants(raw, "m");
  ASSERT_EQ(nodes.size(), 2u);
  const std::vector<std::string> creator_only = {kCreatorAll};
  for (const std::string& path : {test_root(), test_root() + "/m", test_root() + "/m/" + nodes[0],
                                  test_root() + "/m/" + nodes[1], test_root() + "-sessions"}) {
    EXPECT_EQ(raw.acl(path), creator_only) << path;
  }
  for (const std::string& heartbeat : raw.children(test_root() + "-sessions")) {
    EXPECT_EQ(raw.acl(test_root() + "-sessions/" + heartbeat), creator_only) << heartbeat;
  }

  // Hand-off: A leaves, B (its waiter) owns with a greater token.
  ASSERT_THAT(a->release("m", "a", owned->owner.fencing_token, in(seconds(5))), IsOk());
  auto b_owns = b->acquire_or_renew(b_request, in(seconds(5)));
  ASSERT_THAT(b_owns, IsOk());
  EXPECT_EQ(b_owns->owner.owner_id, "b");
  EXPECT_GT(b_owns->owner.fencing_token, owned->owner.fencing_token);

  // Loss: B stops renewing its 500 ms lease; A, queued behind it, evicts
  // B's node (another session's, same user) and owns; B is told.
  std::atomic<bool> b_lost{false};
  auto subscription = b->subscribe("m", "b", [&](const MutexEvent& event) {
    if (event.kind == MutexEvent::Kind::kLost) b_lost = true;
  });
  ASSERT_THAT(subscription, IsOk());
  auto a_waits = a->acquire_or_renew(request_for("m", "a"), in(seconds(5)));
  ASSERT_THAT(a_waits, IsOk());
  EXPECT_EQ(a_waits->owner.owner_id, "b");
  Result<OwnerRecord> a_again = a_waits;
  ASSERT_TRUE(eventually(
      [&] {
        a_again = a->acquire_or_renew(request_for("m", "a"), in(seconds(5)));
        return a_again.ok() && a_again->owner.owner_id == "a";
      },
      seconds(5)));
  EXPECT_GT(a_again->owner.fencing_token, b_owns->owner.fencing_token);
  EXPECT_TRUE(eventually([&] { return b_lost.load(); }, seconds(3)));
  auto b_sees = b->acquire_or_renew(request_for("m", "b"), in(seconds(5)));
  ASSERT_THAT(b_sees, IsOk());
  EXPECT_EQ(b_sees->owner.owner_id, "a");

  // A forced release by the same user (B's backend) takes every node.
  auto forced = b->force_release("m", in(seconds(5)));
  ASSERT_THAT(forced, IsOk());
  EXPECT_EQ(forced->previous.owner_id, "a");
  EXPECT_GE(forced->fencing_floor, a_again->owner.fencing_token);
  EXPECT_TRUE(participants(raw, "m").empty());
  auto after = b->acquire_or_renew(request_for("m", "b"), in(seconds(5)));
  ASSERT_THAT(after, IsOk());
  EXPECT_EQ(after->owner.owner_id, "b");
  EXPECT_GT(after->owner.fencing_token, forced->fencing_floor);
}

// ---- other users -----------------------------------------------------------------------

// read_acl=creator (the default): anybody else — no credentials, another
// user, alice with a wrong password — can neither read, write, delete nor
// join alice's nodes; Simba backends of theirs get a clear error by the
// deadline that never shows a password.
TEST(ZookeeperAuth, OthersCannotReadWriteDeleteOrJoinCreatorOnlyNodes) {
  auto alice = open(uri_as(shared(), "alice", kPassword));
  ASSERT_TRUE(alice);
  ASSERT_THAT(alice->acquire_or_renew(request_for("m", "a"), in(seconds(5))), IsOk());
  RawZk owner(shared(), "alice:" + kPassword);
  const auto nodes = participants(owner, "m");
  ASSERT_EQ(nodes.size(), 1u);
  const std::string mutex_node = test_root() + "/m";
  const std::string node = mutex_node + "/" + nodes[0];

  for (const std::string& credentials :
       {std::string(), "bob:" + kPassword, "alice:" + kWrongPassword}) {
    SCOPED_TRACE("as '" + credentials.substr(0, credentials.find(':')) + "'");
    RawZk other(shared(), credentials);
    ASSERT_TRUE(other.ok());
    // The digest scheme takes any password: the nodes refuse it.
    if (!credentials.empty()) {
      EXPECT_EQ(other.auth_rc(), ZOK);
    }
    EXPECT_EQ(other.remove(node), ZNOAUTH);
    EXPECT_EQ(other.set(node), ZNOAUTH);
    EXPECT_EQ(other.set(mutex_node), ZNOAUTH);
    EXPECT_EQ(other.create_child(mutex_node), ZNOAUTH);
    EXPECT_EQ(other.get(node), ZNOAUTH);
    int rc = ZOK;
    other.children(mutex_node, &rc);
    EXPECT_EQ(rc, ZNOAUTH);
  }
  std::string data;
  EXPECT_EQ(owner.get(node, &data), ZOK);
  EXPECT_EQ(data, "a");

  // Simba as another user, as nobody, and as alice with a wrong password.
  // Ample on a loaded 2-core machine: the refusal comes in one round trip,
  // so an error by timeout instead would be a different failure.
  const milliseconds deadline{5000};
  struct Case {
    std::string user, password, cause;
  };
  for (const Case& c : {Case{"bob", kPassword, "authentication failed"},
                        Case{"alice", kWrongPassword, "authentication failed"},
                        Case{"", "", "give user:password@ in the URI"}}) {
    SCOPED_TRACE("as '" + c.user + "'");
    auto other = open(uri_as(shared(), c.user, c.password));
    ASSERT_TRUE(other);
    auto start = steady_clock::now();
    auto joined = other->acquire_or_renew(request_for("m", "x"), in(deadline));
    expect_refused(joined.status(), steady_clock::now() - start, deadline, c.cause);
    if (!c.user.empty()) {
      EXPECT_THAT(joined.status().message(), HasSubstr("'" + c.user + "'"));
    }
    start = steady_clock::now();
    auto forced = other->force_release("m", in(deadline));
    expect_refused(forced.status(), steady_clock::now() - start, deadline, c.cause);
    start = steady_clock::now();
    auto read = other->read("m", in(deadline));
    expect_refused(read.status(), steady_clock::now() - start, deadline, c.cause);
  }
  // Still alice's, untouched.
  EXPECT_EQ(participants(owner, "m"), nodes);
  auto still = alice->acquire_or_renew(request_for("m", "a"), in(seconds(5)));
  ASSERT_THAT(still, IsOk());
  EXPECT_EQ(still->owner.owner_id, "a");
}

// read_acl=anyone: everybody may read (a status or a dashboard without
// credentials), still nobody else may change, delete or join.
TEST(ZookeeperAuth, ReadAclAnyoneLetsOthersReadButNotChange) {
  auto alice = open(uri_as(shared(), "alice", kPassword, "&read_acl=anyone"));
  ASSERT_TRUE(alice);
  ASSERT_THAT(alice->acquire_or_renew(request_for("m", "a"), in(seconds(5))), IsOk());
  RawZk owner(shared(), "alice:" + kPassword);
  const auto nodes = participants(owner, "m");
  ASSERT_EQ(nodes.size(), 1u);
  const std::string node = test_root() + "/m/" + nodes[0];
  const std::vector<std::string> creator_and_read = {kCreatorAll, kWorldRead};
  EXPECT_EQ(owner.acl(node), creator_and_read);
  EXPECT_EQ(owner.acl(test_root() + "/m"), creator_and_read);

  RawZk anonymous(shared());
  ASSERT_TRUE(anonymous.ok());
  std::string data;
  EXPECT_EQ(anonymous.get(node, &data), ZOK);
  EXPECT_EQ(data, "a");
  EXPECT_EQ(anonymous.remove(node), ZNOAUTH);
  EXPECT_EQ(anonymous.set(node), ZNOAUTH);
  EXPECT_EQ(anonymous.create_child(test_root() + "/m"), ZNOAUTH);

  auto reader = open(uri_as(shared(), "", ""));
  ASSERT_TRUE(reader);
  auto seen = reader->read("m", in(seconds(5)));
  ASSERT_THAT(seen, IsOk());
  EXPECT_EQ(seen->owner.owner_id, "a");
  // Ample on a loaded 2-core machine: the refusal comes in one round trip,
  // so an error by timeout instead would be a different failure.
  const milliseconds deadline{5000};
  auto start = steady_clock::now();
  auto joined = reader->acquire_or_renew(request_for("m", "x"), in(deadline));
  expect_refused(joined.status(), steady_clock::now() - start, deadline, "not authenticated");
  start = steady_clock::now();
  auto forced = reader->force_release("m", in(deadline));
  expect_refused(forced.status(), steady_clock::now() - start, deadline, "not authenticated");
}

// ---- the session ------------------------------------------------------------------------

// The C client sends the credentials again when it reconnects (the same
// session, through a proxy whose connections are cut): nodes created after
// the reconnection still get alice's ACL (an `auth` ACL without credentials
// would be refused: ZINVALIDACL).
TEST(ZookeeperAuth, CredentialsAreSentAgainAfterAReconnection) {
  TcpProxy proxy(port_of(shared()));
  const std::string proxied = "zookeeper://127.0.0.1:" + std::to_string(proxy.port());
  auto backend = open(uri_as(proxied, "alice", kPassword, "&session_timeout=6s"));
  ASSERT_TRUE(backend);
  auto first = backend->acquire_or_renew(request_for("m1", "a"), in(seconds(5)));
  ASSERT_THAT(first, IsOk());
  ASSERT_EQ(first->owner.owner_id, "a");
  const int accepted = proxy.accepted();
  proxy.cut_all();
  ASSERT_TRUE(eventually([&] { return proxy.accepted() > accepted; }, seconds(10)))
      << "no reconnection";
  Result<OwnerRecord> second = first;
  ASSERT_TRUE(eventually(
      [&] {
        second = backend->acquire_or_renew(request_for("m2", "a"), in(seconds(2)));
        return second.ok() && second->owner.owner_id == "a";
      },
      seconds(10)))
      << second.status();
  // The same session: the same node and token for m1.
  auto renewed = backend->acquire_or_renew(request_for("m1", "a"), in(seconds(5)));
  ASSERT_THAT(renewed, IsOk());
  EXPECT_EQ(renewed->owner.fencing_token, first->owner.fencing_token);
  RawZk raw(shared(), "alice:" + kPassword);
  const auto nodes = participants(raw, "m2");
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(raw.acl(test_root() + "/m2/" + nodes[0]), std::vector<std::string>{kCreatorAll});
}

// After the session expired (behind a black-holed proxy), the next call
// opens a new session, which authenticates again: its nodes get alice's ACL.
TEST(ZookeeperAuth, ANewSessionAfterAnExpiryAuthenticatesAgain) {
  TcpProxy proxy(port_of(shared()));
  const std::string proxied = "zookeeper://127.0.0.1:" + std::to_string(proxy.port());
  auto backend = open(uri_as(proxied, "alice", kPassword, "&session_timeout=1s"));
  ASSERT_TRUE(backend);
  auto first = backend->acquire_or_renew(request_for("m1", "a"), in(seconds(5)));
  ASSERT_THAT(first, IsOk());
  ASSERT_EQ(first->owner.owner_id, "a");
  RawZk raw(shared(), "alice:" + kPassword);
  ASSERT_EQ(participants(raw, "m1").size(), 1u);
  proxy.set_blackhole(true);
  // The server ends the silent session (its timeout is 1 s).
  ASSERT_TRUE(eventually([&] { return participants(raw, "m1").empty(); }, seconds(10)));
  proxy.set_blackhole(false);
  proxy.cut_all();
  Result<OwnerRecord> again = first;
  ASSERT_TRUE(eventually(
      [&] {
        again = backend->acquire_or_renew(request_for("m1", "a"), in(seconds(2)));
        return again.ok() && again->owner.owner_id == "a";
      },
      seconds(10)))
      << again.status();
  // A new node (so a new session), made with the credentials in force.
  EXPECT_GT(again->owner.fencing_token, first->owner.fencing_token);
  const auto nodes = participants(raw, "m1");
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(raw.acl(test_root() + "/m1/" + nodes[0]), std::vector<std::string>{kCreatorAll});
}

// A server that refuses the digest scheme (DigestAuthenticationProvider
// disabled): the session ends in AUTH_FAILED and the call says
// "authentication failed" by its deadline. (ZooKeeper's digest scheme never
// refuses a password by itself: see the tests above.)
TEST(ZookeeperAuth, ARefusedAuthenticationFailsClearlyByTheDeadline) {
  auto server = TestServer::start("zookeeper", {"DigestAuthenticationProvider.enabled=false"});
  ASSERT_THAT(server, IsOk());
  auto backend = open(uri_as((*server)->uri(), "alice", kPassword));
  ASSERT_TRUE(backend);
  // Ample on a loaded 2-core machine: the refusal comes in one round trip,
  // so an error by timeout instead would be a different failure.
  const milliseconds deadline{5000};
  const auto start = steady_clock::now();
  auto result = backend->acquire_or_renew(request_for("m", "a"), in(deadline));
  expect_refused(result.status(), steady_clock::now() - start, deadline,
                 "authentication failed (digest scheme, user 'alice')");
  // A server that accepts no credentials still takes a client without any.
  auto anonymous = open(uri_as((*server)->uri(), "", ""));
  ASSERT_TRUE(anonymous);
  EXPECT_THAT(anonymous->acquire_or_renew(request_for("m", "a"), in(seconds(5))), IsOk());
}

// ---- URIs -------------------------------------------------------------------------------

TEST(ZookeeperAuthUri, UserPasswordPasswordFileAndReadAcl) {
  auto parsed = [](const std::string& text) {
    auto uri = Uri::parse(text);
    EXPECT_THAT(uri, IsOk()) << text;
    return zookeeper_options_from_uri(*uri);
  };
  auto plain = parsed("zookeeper://127.0.0.1:2181");
  ASSERT_THAT(plain, IsOk());
  EXPECT_TRUE(plain->user.empty());
  auto with = parsed("zookeeper://alice:" + kPassword + "@127.0.0.1:2181/apps?read_acl=anyone");
  ASSERT_THAT(with, IsOk());
  EXPECT_EQ(with->user, "alice");
  EXPECT_EQ(with->password, kPassword);
  EXPECT_EQ(with->read_acl, ZookeeperOptions::ReadAcl::kAnyone);
  EXPECT_EQ(with->connect_string, "127.0.0.1:2181/apps");
  EXPECT_EQ(parsed("zookeeper://alice:p@h")->read_acl, ZookeeperOptions::ReadAcl::kCreator);

  TempDir dir;
  const std::string file = dir.path() + "/zk-password";
  std::ofstream(file) << kPassword << "\n";
  auto from_file = parsed("zookeeper://alice@127.0.0.1:2181?password_file=" + file);
  ASSERT_THAT(from_file, IsOk());
  EXPECT_EQ(from_file->password, kPassword);

  struct Bad {
    std::string uri, says;
  };
  for (const Bad& bad : {
           Bad{"zookeeper://alice@h", "has no password"},
           Bad{"zookeeper://:" + kPassword + "@h", "needs a user"},
           Bad{"zookeeper://h?password_file=" + file, "needs a user"},
           Bad{"zookeeper://alice:" + kPassword + "@h?password_file=" + file, "not both"},
           Bad{"zookeeper://alice@h?password_file=" + dir.path() + "/missing", "cannot be read"},
           Bad{"zookeeper://h?read_acl=anyone", "read_acl needs a user"},
           Bad{"zookeeper://alice:" + kPassword + "@h?read_acl=world", "creator or anyone"},
           Bad{"zookeeper://alice:" + kPassword + "@h?tabel=x", "tabel"},
       }) {
    auto result = parsed(bad.uri);
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument) << bad.uri;
    EXPECT_THAT(result.status().message(), HasSubstr(bad.says)) << bad.uri;
    EXPECT_THAT(result.status().message(), Not(HasSubstr(kPassword))) << bad.uri;
  }
  // Options too: a user needs a password.
  ZookeeperOptions options;
  options.user = "alice";
  EXPECT_EQ(new_zookeeper_backend(options).status().code(), StatusCode::kInvalidArgument);
}

// No TLS in Debian's C client: tls=on|verify and the tls_* keys are refused
// with the reason, tls=off is plain text.
TEST(ZookeeperAuthUri, TlsIsRefusedWithTheReason) {
  for (const std::string query : {"tls=on", "tls=verify", "tls_ca=/etc/ssl/certs/ca.pem",
                                  "tls_cert=c.pem&tls_key=k.pem", "tls=verify&tls_ca=/none"}) {
    auto result = open_backend("zookeeper://alice:" + kPassword + "@127.0.0.1:2181?" + query);
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument) << query;
    EXPECT_THAT(result.status().message(), HasSubstr("TLS is not supported")) << query;
    EXPECT_THAT(result.status().message(), HasSubstr("without OpenSSL")) << query;
    EXPECT_THAT(result.status().message(), Not(HasSubstr(kPassword))) << query;
  }
  auto off = open_backend("zookeeper://127.0.0.1:2181?tls=off");
  ASSERT_THAT(off, IsOk());
  EXPECT_EQ((*off)->capabilities().transport, "plain text");
  ZookeeperOptions options;
  options.tls.mode = TlsMode::kVerify;
  EXPECT_THAT(new_zookeeper_backend(options).status().message(), HasSubstr("TLS is not supported"));
}

// ---- the command line ---------------------------------------------------------------------
// (Built with the CLI only: SIMBA_CLI_PATH names the simba binary.)
#ifdef SIMBA_CLI_PATH

struct Ran {
  int code = -1;
  std::string err;
};

// `simba ARGS` with SIMBA_LOG=debug (the C client's log too), stderr kept.
Ran simba_cli(const std::string& args) {
  TempDir dir;
  const std::string err = dir.path() + "/err";
  const std::string command =
      "SIMBA_LOG=debug '" + std::string(SIMBA_CLI_PATH) + "' " + args + " >/dev/null 2>" + err;
  Ran ran;
  const int status = std::system(command.c_str());
  ran.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err);
  std::stringstream text;
  text << in.rdbuf();
  ran.err = text.str();
  return ran;
}

TEST(ZookeeperAuthCli, RunWithUserAndPasswordAndAWrongPasswordNeverShowsIt) {
  const std::string store = uri_as(shared(), "alice", kPassword);
  TempDir dir;
  const std::string token = dir.path() + "/token";
  const Ran ok =
      simba_cli("run --store '" + store +
                "' --mutex cli --verbose -- sh -c 'echo $SIMBA_FENCING_TOKEN > " + token + "'");
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_THAT(ok.err, HasSubstr("Authentication scheme digest succeeded"));
  EXPECT_THAT(ok.err, Not(HasSubstr(kPassword)));
  std::ifstream in(token);
  std::string written;
  in >> written;
  EXPECT_FALSE(written.empty()) << "the command did not run";
  RawZk raw(shared(), "alice:" + kPassword);
  EXPECT_EQ(raw.acl(test_root() + "/cli"), std::vector<std::string>{kCreatorAll});

  const Ran wrong = simba_cli("run --store '" + uri_as(shared(), "alice", kWrongPassword) +
                              "' --mutex cli --timeout 3s -- true");
  EXPECT_NE(wrong.code, 0) << wrong.err;
  EXPECT_THAT(wrong.err, HasSubstr("authentication failed"));
  EXPECT_THAT(wrong.err, HasSubstr("alice:****@"));
  EXPECT_THAT(wrong.err, Not(HasSubstr(kWrongPassword)));
}
#endif  // SIMBA_CLI_PATH

}  // namespace
}  // namespace simba::testing
