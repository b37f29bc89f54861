// TLS and authentication of the etcd backend against real etcd servers: the
// ctest fixture etcd_tls (scripts/servers/etcd.sh --tls CERTS
// --client-cert-auth --auth: https only, a client certificate required, auth
// enabled with the user simba, password simba-test), private servers for the
// expired certificate and short-lived tokens, and the shared plain server
// (fixture etcd) for TLS against a server without it.
//
// The fixture's server serves its client port over TLS only and refuses a
// client without a certificate signed by ca.pem, and with auth enabled it
// answers no request without a valid token: a call that succeeds there went
// over TLS, with the client certificate, authenticated. Its certificate
// names localhost and 127.0.0.1; other-ca.pem is an unrelated CA with the
// same subject.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "simba/backends/etcd.h"
#include "simba/contend_service.h"
#include "simba/registry.h"
#include "simba/uri.h"
#include "testing/status_matchers.h"
#include "testing/store_test_helpers.h"
#include "testing/subprocess.h"
#include "testing/test_servers.h"
#include "testing/test_util.h"

namespace simba::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// The script's password for simba (and root): no error may show it, nor
// the wrong one the negative cases send.
constexpr char kPassword[] = "simba-test";
constexpr char kWrongPassword[] = "hunter2-wrong";

// A call's deadline in these tests. Every failure here is local and decided
// in a round trip or two on loopback (a refused handshake, a certificate
// check, a refused password), so it must come long before the deadline; a
// hang would run to it.
constexpr milliseconds kCallDeadline{5000};
// A call may end a little past its deadline.
constexpr milliseconds kDeadlineSlack{500};

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// "127.0.0.1:PORT" of an etcd:// URI (with or without user info and query).
std::string host_port_of(const std::string& uri) {
  auto parsed = Uri::parse(uri);
  EXPECT_THAT(parsed, IsOk()) << uri;
  if (!parsed.ok() || parsed->hosts.empty()) return "";
  return parsed->hosts.front().host + ":" + std::to_string(parsed->hosts.front().port.value_or(0));
}

struct TlsServer {
  std::string host_port;  // "127.0.0.1:PORT"
  std::string certs;      // test-ca.sh's directory
};

// The fixture's server; run by hand (no SIMBA_TEST_SERVERS_DIR), a private
// one made the same way, once per process.
const TlsServer& tls() {
  static const TlsServer* server = [] {
    auto* s = new TlsServer;
    std::string uri;
    if (const char* dir = std::getenv("SIMBA_TEST_SERVERS_DIR"); dir != nullptr && dir[0] != 0) {
      uri = first_line(std::string(dir) + "/etcd_tls/uri");
      s->certs = std::string(dir) + "/etcd_tls-certs";
    }
    if (uri.empty()) {
      static TempDir certs;
      static auto started =
          TestServer::start("etcd", {"--tls", certs.path(), "--client-cert-auth", "--auth"});
      if (!started.ok()) {
        std::cerr << "cannot start a TLS etcd: " << started.status() << "\n";
        return s;
      }
      uri = (*started)->uri();
      s->certs = certs.path();
    }
    s->host_port = host_port_of(uri);
    return s;
  }();
  return *server;
}

std::string cert(const std::string& file) { return tls().certs + "/" + file; }

// A key prefix of this test's own.
std::string test_prefix() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string("tls-") + info->name() + "-" + std::to_string(::getpid());
}

// The query keys of the full set: CA, client certificate and key.
std::string full_tls() {
  return "tls_ca=" + cert("ca.pem") + "&tls_cert=" + cert("client-cert.pem") +
         "&tls_key=" + cert("client-key.pem");
}

// An etcd URI: `userinfo` ("simba:simba-test", or "" for none) at
// `host_port` (default the TLS server) with `query` and this test's prefix.
std::string etcd_uri(const std::string& query, const std::string& userinfo = "",
                     std::optional<std::string> host_port = std::nullopt) {
  const std::string user = userinfo.empty() ? "" : userinfo + "@";
  return "etcd://" + user + host_port.value_or(tls().host_port) + "?key_prefix=" + test_prefix() +
         (query.empty() ? "" : "&" + query);
}

// The fixture's server as simba with everything it asks for.
std::string secured_uri(const std::string& extra = "") {
  return etcd_uri(full_tls() + extra, std::string("simba:") + kPassword);
}

// Acquires and releases a mutex through `uri`'s backend: OK or the first
// error. Also fails the test if a call ran past its deadline.
Status acquire_and_release(const std::string& uri) {
  auto backend = open_backend(uri);
  if (!backend.ok()) return backend.status();
  const auto start = steady_clock::now();
  auto acquired = (*backend)->acquire_or_renew(request_for("tls", "c"), start + kCallDeadline);
  EXPECT_LT(steady_clock::now() - start, kCallDeadline + scaled(kDeadlineSlack)) << uri;
  if (!acquired.ok()) return acquired.status();
  if (acquired->owner.owner_id != "c") {
    return internal_error("not acquired: " + acquired->owner.owner_id);
  }
  auto released = (*backend)->release("tls", "c", 0, in(kCallDeadline));
  if (!released.ok()) return released.status();
  return *released ? ok_status() : internal_error("release found nothing to release");
}

// `text` without the test servers' directory (/dev/shm/simba-test-servers-*
// holds the certificates, and its name contains the password's letters).
std::string without_servers_dir(std::string text) {
  const std::string dir = "simba-test-servers";
  for (std::size_t at = text.find(dir); at != std::string::npos; at = text.find(dir, at)) {
    text.erase(at, dir.size());
  }
  return text;
}

// The error of a call that must fail: names the store at host:port and the
// cause, never a password.
::testing::Matcher<std::string> names_store_and_cause(const std::string& host_port,
                                                      const std::string& cause) {
  return AllOf(HasSubstr("etcd at " + host_port), HasSubstr(cause),
               ::testing::ResultOf(without_servers_dir, AllOf(Not(HasSubstr(kPassword)),
                                                              Not(HasSubstr(kWrongPassword)))));
}

::testing::Matcher<std::string> shows_no_password() {
  return ::testing::ResultOf(without_servers_dir, Not(HasSubstr(kPassword)));
}

// ---- working over TLS + client certificate + auth ------------------------------------

// Two contenders in two backends (two watches, like two processes): the
// first acquires, the second queues and takes over on release through its
// watch stream (not its poll 13 s later), with a greater fencing token; a
// forced release is pushed to the new owner as a loss. Everything over TLS
// with the client certificate, authenticated.
TEST(EtcdTls, AcquireHandOffLossAndFencingOverTlsWithAuth) {
  ASSERT_FALSE(tls().host_port.empty());
  const std::string uri = secured_uri();
  auto fa = make_factory(uri, seconds(10), seconds(5));
  auto fb = make_factory(uri, seconds(10), seconds(5));
  ASSERT_TRUE(fa && fb);
  EXPECT_EQ(fa->backend()->capabilities().transport, "TLS (verify), client certificate");
  Timeline ta;
  Timeline tb;
  auto a = fa->create_contend_service(ta.contender("handoff", "A")).value();
  auto b = fb->create_contend_service(tb.contender("handoff", "B")).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(ta.acquired.wait(seconds(10)));
  const std::uint64_t a_token = a->fencing_token();
  SIMBA_ASSERT_OK(b->start());
  ASSERT_TRUE(
      eventually([&] { return b->after_owner().owner_id == a->contender_id(); }, seconds(10)));
  const auto stopped = steady_clock::now();
  SIMBA_ASSERT_OK(a->stop());
  ASSERT_TRUE(tb.acquired.wait(seconds(5)));
  EXPECT_LT(steady_clock::now() - stopped, scaled(seconds(2))) << "not through the watch";
  const std::uint64_t b_token = b->fencing_token();
  EXPECT_GT(b_token, a_token);
  // A forced release (an operator, through the other backend) is pushed to
  // B as a loss, and the floor is above B's token.
  auto forced = fa->backend()->force_release("handoff", in(kCallDeadline));
  SIMBA_ASSERT_OK(forced);
  EXPECT_EQ(forced->previous.fencing_token, b_token);
  EXPECT_GT(forced->fencing_floor, b_token);
  ASSERT_TRUE(tb.released.wait(seconds(3)));
  SIMBA_EXPECT_OK(b->stop());
}

// The same URI keys through the registry's list() and read(); the password
// is nowhere in what the backend reports.
TEST(EtcdTls, ListAndReadWorkAndShowNoSecret) {
  ASSERT_FALSE(tls().host_port.empty());
  auto backend = open(secured_uri());
  ASSERT_TRUE(backend);
  auto acquired = backend->acquire_or_renew(request_for("listed", "c"), in(kCallDeadline));
  SIMBA_ASSERT_OK(acquired);
  auto listed = backend->list(in(kCallDeadline));
  SIMBA_ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->front().record.owner.owner_id, "c");
  auto read = backend->read("listed", in(kCallDeadline));
  SIMBA_ASSERT_OK(read);
  EXPECT_EQ(read->owner.owner_id, "c");
  EXPECT_THAT(backend->capabilities().transport, Not(HasSubstr(kPassword)));
  SIMBA_EXPECT_OK(backend->release("listed", "c", 0, in(kCallDeadline)).status());
}

// password_file= instead of the password in the URI.
TEST(EtcdTls, PasswordFileWorks) {
  ASSERT_FALSE(tls().host_port.empty());
  TempDir dir;
  const std::string file = dir.path() + "/etcd-password";
  std::ofstream(file) << kPassword << "\n";
  SIMBA_EXPECT_OK(acquire_and_release(etcd_uri(full_tls() + "&password_file=" + file, "simba")));
}

// tls=on verifies the chain but not the name: a name the certificate lacks
// connects, another CA does not. verify refuses that name.
TEST(EtcdTls, TlsOnChecksTheChainButNotTheName) {
  ASSERT_FALSE(tls().host_port.empty());
  const std::string user = std::string("simba:") + kPassword;
  SIMBA_EXPECT_OK(acquire_and_release(
      etcd_uri("tls=on&tls_server_name=elsewhere.invalid&" + full_tls(), user)));
  const Status wrong_ca = acquire_and_release(etcd_uri("tls=on&tls_ca=" + cert("other-ca.pem") +
                                                           "&tls_cert=" + cert("client-cert.pem") +
                                                           "&tls_key=" + cert("client-key.pem"),
                                                       user));
  EXPECT_THAT(wrong_ca, StatusIs(StatusCode::kPermissionDenied,
                                 names_store_and_cause(tls().host_port, "certificate")));
  std::cout << "tls=on, another CA: " << wrong_ca << "\n";
}

// ---- what must fail, clearly and within the deadline ---------------------------------

TEST(EtcdTls, EveryMisconfigurationIsAClearErrorWithinTheDeadline) {
  ASSERT_FALSE(tls().host_port.empty());
  const std::string plain = shared_server_uri("etcd");
  ASSERT_FALSE(plain.empty());
  const std::string plain_host_port = host_port_of(plain);
  const std::string user = std::string("simba:") + kPassword;
  const std::string client =
      "&tls_cert=" + cert("client-cert.pem") + "&tls_key=" + cert("client-key.pem");
  struct Case {
    std::string what;
    std::string uri;
    StatusCode code;
    std::string host_port;
    std::string cause;
  };
  const std::vector<Case> cases = {
      {"another CA", etcd_uri("tls_ca=" + cert("other-ca.pem") + client, user),
       StatusCode::kPermissionDenied, tls().host_port, "certificate verify failed"},
      {"a name the certificate lacks",
       etcd_uri(full_tls() + "&tls_server_name=elsewhere.invalid", user),
       StatusCode::kPermissionDenied, tls().host_port, "elsewhere.invalid"},
      // TLS 1.3: the server refuses us after the handshake, and gRPC says
      // only that it hung up, as a server that went away would.
      {"no client certificate", etcd_uri("tls_ca=" + cert("ca.pem"), user),
       StatusCode::kUnavailable, tls().host_port, "client certificate"},
      {"a wrong password", etcd_uri(full_tls(), std::string("simba:") + kWrongPassword),
       StatusCode::kPermissionDenied, tls().host_port, "authentication failed (user 'simba')"},
      {"an unknown user", etcd_uri(full_tls(), std::string("nobody:") + kPassword),
       StatusCode::kPermissionDenied, tls().host_port, "authentication failed (user 'nobody')"},
      {"no user on a server with auth", etcd_uri(full_tls()), StatusCode::kPermissionDenied,
       tls().host_port, "no user given"},
      {"plain text against the TLS server", etcd_uri("tls=off", user), StatusCode::kUnavailable,
       tls().host_port, "plain text"},
      {"TLS against a plain server",
       etcd_uri("tls_ca=" + cert("ca.pem") + client, "", plain_host_port), StatusCode::kUnavailable,
       plain_host_port, "TLS"},
  };
  for (const Case& c : cases) {
    const Status status = acquire_and_release(c.uri);
    EXPECT_THAT(status, StatusIs(c.code, names_store_and_cause(c.host_port, c.cause))) << c.what;
    std::cout << c.what << ": " << status << "\n";
  }
}

// A server with the expired certificate (valid only in January 2020, signed
// by the right CA) is refused by verify and by on.
TEST(EtcdTls, AnExpiredServerCertificateIsRefused) {
  ASSERT_FALSE(tls().host_port.empty());
  auto server = TestServer::start("etcd", {"--tls", tls().certs, "--expired-cert"});
  SIMBA_ASSERT_OK(server);
  const std::string host_port = host_port_of((*server)->uri());
  for (const std::string mode : {"verify", "on"}) {
    const Status status =
        acquire_and_release(etcd_uri("tls=" + mode + "&" + full_tls(), "", host_port));
    EXPECT_THAT(status, StatusIs(StatusCode::kPermissionDenied,
                                 names_store_and_cause(host_port, "certificate verify failed")))
        << mode;
    EXPECT_THAT(status.message(), HasSubstr("expired")) << mode;
    std::cout << "expired, tls=" << mode << ": " << status << "\n";
  }
}

// ---- tokens that expire ----------------------------------------------------------------

// etcd forgets a simple token after --auth-token-ttl of disuse: a renewal,
// a read and a hand-off through the watch after that still work (the
// backend authenticates again within the call).
TEST(EtcdTls, AnExpiredTokenIsReplacedWithinTheCall) {
  auto server = TestServer::start("etcd", {"--auth", "--auth-token-ttl", "1"});
  SIMBA_ASSERT_OK(server);
  const std::string uri =
      etcd_uri("", std::string("simba:") + kPassword, host_port_of((*server)->uri()));
  auto backend = open(uri);
  ASSERT_TRUE(backend);
  // A lease that outlives the waits below many times over: what expires
  // here is the token, never the lease (a 3 s lease ran out before the read
  // on a loaded machine, each call authenticating again first).
  const auto held = [] { return request_for("expiry", "c", seconds(20), seconds(10)); };
  auto first = backend->acquire_or_renew(held(), in(kCallDeadline));
  SIMBA_ASSERT_OK(first);
  ASSERT_EQ(first->owner.owner_id, "c");
  std::this_thread::sleep_for(milliseconds(2500));  // the token expires
  auto renewed = backend->acquire_or_renew(held(), in(kCallDeadline));
  SIMBA_ASSERT_OK(renewed);
  EXPECT_EQ(renewed->owner.fencing_token, first->owner.fencing_token);
  std::this_thread::sleep_for(milliseconds(2500));
  auto read = backend->read("expiry", in(kCallDeadline));
  SIMBA_ASSERT_OK(read);
  EXPECT_EQ(read->owner.owner_id, "c");
  SIMBA_EXPECT_OK(backend->release("expiry", "c", 0, in(kCallDeadline)).status());

  // The watch: its stream was opened with a token that expires while B
  // waits; the hand-off still comes through it.
  auto fa = make_factory(uri, seconds(10), seconds(5));
  auto fb = make_factory(uri, seconds(10), seconds(5));
  ASSERT_TRUE(fa && fb);
  Timeline ta;
  Timeline tb;
  auto a = fa->create_contend_service(ta.contender("expiry-watch", "A")).value();
  auto b = fb->create_contend_service(tb.contender("expiry-watch", "B")).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(ta.acquired.wait(seconds(10)));
  SIMBA_ASSERT_OK(b->start());
  ASSERT_TRUE(
      eventually([&] { return b->after_owner().owner_id == a->contender_id(); }, seconds(10)));
  std::this_thread::sleep_for(milliseconds(2500));
  const auto stopped = steady_clock::now();
  SIMBA_ASSERT_OK(a->stop());
  ASSERT_TRUE(tb.acquired.wait(seconds(5)));
  EXPECT_LT(steady_clock::now() - stopped, scaled(seconds(2))) << "not through the watch";
  SIMBA_EXPECT_OK(b->stop());
}

// ---- the CLI -----------------------------------------------------------------------------

CommandRun run_cli(const std::string& args) {
  return run_command_line(std::string(SIMBA_CLI_PATH) + " " + args);
}

std::string quoted(const std::string& text) { return "'" + text + "'"; }

// `simba run` and `simba status` with the TLS + auth URI; a wrong password
// is a clear failure; the password shows in no output.
TEST(EtcdTls, TheCliRunsWithTheTlsUri) {
  ASSERT_FALSE(tls().host_port.empty());
  const std::string uri = secured_uri();
  const CommandRun run = run_cli("run --store " + quoted(uri) +
                                 " --mutex cli -- sh -c 'echo token=$SIMBA_FENCING_TOKEN'");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("token="));
  EXPECT_THAT(run.output, shows_no_password());
  const CommandRun status = run_cli("status --store " + quoted(uri));
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_THAT(status.output, HasSubstr("cli"));
  EXPECT_THAT(status.output, HasSubstr(" over TLS (verify), client certificate\n"));
  EXPECT_THAT(status.output, shows_no_password());
  const CommandRun wrong =
      run_cli("run --no-wait --store " +
              quoted(etcd_uri(full_tls(), std::string("simba:") + kWrongPassword)) +
              " --mutex cli -- true");
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_THAT(wrong.output, names_store_and_cause(tls().host_port, "authentication failed"));
  std::cout << "CLI, wrong password: " << wrong.output;
}

// ---- URIs --------------------------------------------------------------------------------

TEST(EtcdTlsUri, ParsesTheTlsAndAuthKeysAndNamesTheBadOne) {
  auto uri = Uri::parse(
      "etcd://u:pw@h:2379?tls=verify&tls_ca=/c/ca.pem&tls_cert=/c/cert.pem&tls_key=/c/key.pem&"
      "tls_server_name=etcd.example");
  ASSERT_THAT(uri, IsOk());
  // The files need not exist to be parsed... but TlsOptions::validate reads
  // them: use real ones for the positive case.
  auto options = etcd_options_from_uri(*uri);
  EXPECT_THAT(options, StatusIs(StatusCode::kInvalidArgument, HasSubstr("/c/ca.pem")));
  auto real = Uri::parse("etcd://u:pw@h:2379?" + full_tls() + "&tls_server_name=etcd.example");
  ASSERT_THAT(real, IsOk());
  auto parsed = etcd_options_from_uri(*real);
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->user, "u");
  EXPECT_EQ(parsed->password, "pw");
  EXPECT_EQ(parsed->tls.mode, TlsMode::kVerify);
  EXPECT_EQ(parsed->tls.ca, cert("ca.pem"));
  EXPECT_EQ(parsed->tls.cert, cert("client-cert.pem"));
  EXPECT_EQ(parsed->tls.key, cert("client-key.pem"));
  EXPECT_EQ(parsed->tls.server_name, "etcd.example");

  TempDir dir;
  const std::string file = dir.path() + "/pw";
  std::ofstream(file) << "from-file\n";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"etcd://h?tls=maybe", "tls"},
      {"etcd://h?tls_key=" + cert("client-key.pem"), "tls_cert"},
      {"etcd://h?tls=off&tls_ca=" + cert("ca.pem"), "tls is off"},
      {"etcd://u@h", "password"},
      {"etcd://u:pw@h?password_file=" + file, "not both"},
      {"etcd://u@h?password_file=/nonexistent/pw", "/nonexistent/pw"},
      {"etcd://h?password_file=" + file, "user"},
  };
  for (const auto& [text, named] : bad) {
    auto bad_uri = Uri::parse(text);
    ASSERT_THAT(bad_uri, IsOk()) << text;
    auto result = etcd_options_from_uri(*bad_uri);
    EXPECT_THAT(result, StatusIs(StatusCode::kInvalidArgument, HasSubstr(named))) << text;
    EXPECT_THAT(result.status().message(),
                AllOf(Not(HasSubstr("from-file")), Not(HasSubstr("pw@"))))
        << text;
  }
  auto from_file = Uri::parse("etcd://u@h?password_file=" + file);
  ASSERT_THAT(from_file, IsOk());
  auto with_file = etcd_options_from_uri(*from_file);
  ASSERT_THAT(with_file, IsOk());
  EXPECT_EQ(with_file->password, "from-file");
  // The same checks on options built in code.
  EtcdOptions direct;
  direct.user = "u";
  EXPECT_THAT(new_etcd_backend(direct),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("password")));
  direct.user.clear();
  direct.tls.mode = TlsMode::kVerify;
  direct.tls.key = cert("client-key.pem");
  EXPECT_THAT(new_etcd_backend(direct),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("tls_cert")));
}

}  // namespace
}  // namespace simba::testing
