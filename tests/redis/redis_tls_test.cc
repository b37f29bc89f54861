// TLS and ACL authentication of the Redis backend against real redis-servers:
// a TLS-only server with an ACL user (the ctest fixture redis_tls:
// `scripts/servers/redis.sh start DIR --tls CERTS`, its certificates made by
// scripts/servers/test-ca.sh), private TLS servers for the expired
// certificate and for required client certificates, and the shared plain
// server (fixture redis).
//
// The TLS server listens on no plain-text port (`port 0`), so a call that
// succeeds there went over TLS; its default user needs the password too, so
// one that succeeds authenticated. Its certificate names localhost and
// 127.0.0.1 and is signed by ca.pem; other-ca.pem is an unrelated CA with the
// same subject.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/net/stream.h"
#include "core/net/tls_stream.h"
#include "simba/backends/redis.h"
#include "simba/registry.h"
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

// The script's password for simba and the default user: no error may show it.
constexpr char kPassword[] = "simba-acl-secret";

// A call's deadline in these tests. Every failure here but one is decided in
// a round trip or two on loopback (a refused handshake, a certificate check,
// AUTH); TLS against a plain server waits for an answer that never comes,
// until this deadline. A hang would run past it.
constexpr milliseconds kCallDeadline{2000};
// A call may end a little past its deadline: it closes its connection first.
constexpr milliseconds kDeadlineSlack{500};

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

struct TlsServer {
  std::string host_port;  // "127.0.0.1:PORT"
  std::string certs;      // test-ca.sh's directory
};

// The fixture's TLS server; run by hand (no SIMBA_TEST_SERVERS_DIR), a
// private one made the same way, once per process.
const TlsServer& tls() {
  static const TlsServer* server = [] {
    auto* s = new TlsServer;
    std::string uri;
    if (const char* dir = std::getenv("SIMBA_TEST_SERVERS_DIR"); dir != nullptr && dir[0] != 0) {
      uri = first_line(std::string(dir) + "/redis_tls/uri");
      s->certs = std::string(dir) + "/redis_tls-certs";
    }
    if (uri.empty()) {
      static TempDir certs;
      static auto started = TestServer::start(
          "redis", {"--tls", certs.path(), "--appendonly", "yes", "--appendfsync", "always"});
      if (!started.ok()) {
        std::cerr << "cannot start a TLS redis-server: " << started.status() << "\n";
        return s;
      }
      uri = (*started)->uri();
      s->certs = certs.path();
    }
    // rediss://simba:simba-acl-secret@127.0.0.1:PORT?tls_ca=...
    const auto at = uri.find('@');
    const auto query = uri.find('?', at);
    s->host_port = uri.substr(at + 1, query - at - 1);
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

// A URI for `userinfo` ("simba:PASSWORD", ":PASSWORD", "") at
// `host_port` (default: the TLS server), scheme `scheme`, with `query`.
std::string uri_for(const std::string& query,
                    const std::string& userinfo = "simba:simba-acl-secret",
                    std::optional<std::string> host_port = std::nullopt,
                    const std::string& scheme = "rediss") {
  return scheme + "://" + (userinfo.empty() ? "" : userinfo + "@") +
         host_port.value_or(tls().host_port) + "?key_prefix=" + test_prefix() +
         (query.empty() ? "" : "&" + query);
}

std::string good_uri(const std::string& more = "") {
  return uri_for("tls_ca=" + cert("ca.pem") + more);
}

// Acquires and releases a mutex through `uri`'s backend: OK or the first
// error. Also fails the test if the call ran past its deadline.
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
  auto released = (*backend)->release("tls", "c", in(kCallDeadline));
  if (!released.ok()) return released.status();
  return *released ? ok_status() : internal_error("release found nothing to release");
}

// The error of a connection that must fail: names the store and the cause,
// never the password.
::testing::Matcher<std::string> names_store_and_cause(const std::string& host_port,
                                                      const std::string& cause) {
  return AllOf(HasSubstr("redis at " + host_port), HasSubstr(cause), Not(HasSubstr(kPassword)));
}

// Collects the events of a subscription.
struct EventLog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<MutexEvent> events;
  std::function<void(const MutexEvent&)> listener() {
    return [this](const MutexEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(e);
      cv.notify_all();
    };
  }
  bool wait_for(milliseconds timeout, const std::function<bool(const MutexEvent&)>& match) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, scaled(timeout),
                       [&] { return std::any_of(events.begin(), events.end(), match); });
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu);
    events.clear();
  }
};

// A private TLS server started with `args` after `--tls CERTS`: its
// "127.0.0.1:PORT", or empty (the test then fails).
struct PrivateTlsServer {
  std::unique_ptr<TestServer> server;
  std::string host_port;
};
PrivateTlsServer start_private_tls(std::vector<std::string> args) {
  args.insert(args.begin(), {"--tls", tls().certs});
  // Durable, so the restart guard does not hold the first leases back.
  args.insert(args.end(), {"--appendonly", "yes", "--appendfsync", "always"});
  auto started = TestServer::start("redis", args);
  EXPECT_THAT(started, IsOk());
  if (!started.ok()) return {};
  PrivateTlsServer s;
  s.host_port = "127.0.0.1:" + std::to_string((*started)->port());
  s.server = std::move(*started);
  return s;
}

// ---- over TLS, as an ACL user ------------------------------------------------------

// Acquire, a hand-off pushed to a waiter over the subscriber connection (TLS
// too), fencing tokens that grow, and a forced release told to its holder,
// all as the ACL user simba over TLS (verify), on the TLS-only server.
TEST(RedisTls, AcquireHandOffLossAndFencingOverTlsAsAnAclUser) {
  ASSERT_FALSE(tls().host_port.empty());
  const std::string uri = good_uri();
  auto holder = open(uri);
  auto waiter = open(uri);
  ASSERT_TRUE(holder && waiter);
  EXPECT_EQ(holder->capabilities().transport, "TLS (verify)");

  auto held = holder->acquire_or_renew(request_for("m", "a"), in(seconds(5)));
  ASSERT_THAT(held, IsOk());
  ASSERT_EQ(held->owner.owner_id, "a");

  // The waiter listens; once the server confirms its channel, it is woken
  // once to look again (a release may have gone by): then it is listening.
  EventLog waiter_events;
  auto waiter_sub = waiter->subscribe("m", "b", waiter_events.listener());
  ASSERT_THAT(waiter_sub, IsOk());
  ASSERT_TRUE(waiter_events.wait_for(seconds(5), [](const MutexEvent&) { return true; }));
  waiter_events.clear();
  auto queued = waiter->acquire_or_renew(request_for("m", "b"), in(seconds(5)));
  ASSERT_THAT(queued, IsOk());
  EXPECT_EQ(queued->owner.owner_id, "a");

  // The release is pushed to the waiter, naming the releaser.
  ASSERT_THAT(holder->release("m", "a", in(seconds(5))), IsOkAndHolds(true));
  EXPECT_TRUE(waiter_events.wait_for(seconds(3), [](const MutexEvent& e) {
    return e.kind == MutexEvent::Kind::kReleased && e.owner_id == "a";
  }));
  auto taken = waiter->acquire_or_renew(request_for("m", "b"), in(seconds(5)));
  ASSERT_THAT(taken, IsOk());
  ASSERT_EQ(taken->owner.owner_id, "b");
  EXPECT_GT(taken->owner.fencing_token, held->owner.fencing_token);

  // An operator's forced release reaches the holder as a loss, at once.
  EventLog b_events;
  auto b_sub = waiter->subscribe("m", "b", b_events.listener());
  ASSERT_THAT(b_sub, IsOk());
  auto forced = holder->force_release("m", in(seconds(5)));
  ASSERT_THAT(forced, IsOk());
  EXPECT_EQ(forced->previous.owner_id, "b");
  EXPECT_TRUE(b_events.wait_for(seconds(3), [](const MutexEvent& e) {
    return e.kind == MutexEvent::Kind::kLost && e.owner_id == "b" && e.forced;
  }));

  // The next holder's token is greater still.
  auto again = holder->acquire_or_renew(request_for("m", "a"), in(seconds(5)));
  ASSERT_THAT(again, IsOk());
  ASSERT_EQ(again->owner.owner_id, "a");
  EXPECT_GT(again->owner.fencing_token, taken->owner.fencing_token);
  ASSERT_THAT(holder->release("m", "a", in(seconds(5))), IsOkAndHolds(true));
}

// The forms of authentication and TLS the URI offers, each working on the
// TLS server: the default user by password alone, tls=on (chain only) with
// a name the certificate lacks, tls=verify spelled out, localhost by name,
// and the password read from password_file.
TEST(RedisTls, EveryWayOfSayingTlsAndAuthConnects) {
  ASSERT_FALSE(tls().host_port.empty());
  const std::string ca = "tls_ca=" + cert("ca.pem");
  SIMBA_EXPECT_OK(acquire_and_release(uri_for(ca, std::string(":") + kPassword)));
  SIMBA_EXPECT_OK(acquire_and_release(uri_for(ca + "&tls=on&tls_server_name=elsewhere.invalid")));
  SIMBA_EXPECT_OK(acquire_and_release(
      uri_for("tls=verify&" + ca, "simba:simba-acl-secret", tls().host_port, "redis")));
  const std::string port = tls().host_port.substr(tls().host_port.find(':'));
  SIMBA_EXPECT_OK(acquire_and_release(uri_for(ca, "simba:simba-acl-secret", "localhost" + port)));
  TempDir dir;
  const std::string password_file = dir.path() + "/password";
  std::ofstream(password_file) << kPassword << "\n";
  SIMBA_EXPECT_OK(acquire_and_release(uri_for(ca + "&password_file=" + password_file, "simba")));
  // A client certificate is fine where it is optional.
  SIMBA_EXPECT_OK(acquire_and_release(
      good_uri("&tls_cert=" + cert("client-cert.pem") + "&tls_key=" + cert("client-key.pem"))));
}

// ---- refused, each clearly and by the deadline -----------------------------------

TEST(RedisTls, AWrongCaIsRefused) {
  ASSERT_FALSE(tls().host_port.empty());
  for (const std::string mode : {"verify", "on"}) {
    const Status status =
        acquire_and_release(uri_for("tls=" + mode + "&tls_ca=" + cert("other-ca.pem")));
    EXPECT_THAT(status,
                StatusIs(StatusCode::kPermissionDenied,
                         names_store_and_cause(tls().host_port, "certificate verify failed")))
        << mode;
    std::cout << mode << ": " << status << "\n";
  }
  // Without tls_ca, the system's CAs do not know the test CA either.
  EXPECT_THAT(acquire_and_release(uri_for("")),
              StatusIs(StatusCode::kPermissionDenied,
                       names_store_and_cause(tls().host_port, "certificate verify failed")));
}

TEST(RedisTls, AWrongHostNameIsRefused) {
  ASSERT_FALSE(tls().host_port.empty());
  const Status status = acquire_and_release(good_uri("&tls_server_name=elsewhere.invalid"));
  EXPECT_THAT(status, StatusIs(StatusCode::kPermissionDenied,
                               names_store_and_cause(tls().host_port, "hostname mismatch")));
  EXPECT_THAT(status.message(), HasSubstr("elsewhere.invalid"));
  std::cout << status << "\n";
}

TEST(RedisTls, AnExpiredServerCertificateIsRefused) {
  ASSERT_FALSE(tls().host_port.empty());
  PrivateTlsServer expired = start_private_tls({"--tls-cert-name", "expired"});
  ASSERT_TRUE(expired.server);
  const Status status = acquire_and_release(
      uri_for("tls_ca=" + cert("ca.pem"), "simba:simba-acl-secret", expired.host_port));
  EXPECT_THAT(status, StatusIs(StatusCode::kPermissionDenied,
                               names_store_and_cause(expired.host_port,
                                                     "TLS handshake: certificate verify failed: "
                                                     "certificate has expired")));
  std::cout << status << "\n";
}

// A server with `tls-auth-clients yes` lets us in with the client
// certificate and refuses us without one.
TEST(RedisTls, AMissingClientCertificateIsRefusedWhenTheServerRequiresOne) {
  ASSERT_FALSE(tls().host_port.empty());
  PrivateTlsServer strict = start_private_tls({"--tls-auth-clients", "yes"});
  ASSERT_TRUE(strict.server);
  const std::string ca = "tls_ca=" + cert("ca.pem");
  const Status status =
      acquire_and_release(uri_for(ca, "simba:simba-acl-secret", strict.host_port));
  EXPECT_THAT(status, StatusIs(StatusCode::kPermissionDenied,
                               names_store_and_cause(strict.host_port, "certificate required")));
  std::cout << status << "\n";
  SIMBA_EXPECT_OK(acquire_and_release(
      uri_for(ca + "&tls_cert=" + cert("client-cert.pem") + "&tls_key=" + cert("client-key.pem"),
              "simba:simba-acl-secret", strict.host_port)));
}

// The same, deterministically, at the layer below: the server refuses us
// after the handshake and closes; our write finds the connection reset, and
// the error still gives the server's reason (its alert, read after the
// failed write), not just "Connection reset by peer".
TEST(RedisTls, AWriteThatFindsTheConnectionResetReportsTheServersAlert) {
  ASSERT_FALSE(tls().host_port.empty());
  PrivateTlsServer strict = start_private_tls({"--tls-auth-clients", "yes"});
  ASSERT_TRUE(strict.server);
  TlsOptions options;
  options.mode = TlsMode::kVerify;
  options.ca = cert("ca.pem");
  auto context = internal::TlsContext::create(options, "redis");
  ASSERT_THAT(context, IsOk());
  const std::string where = "redis at " + strict.host_port;
  auto plain = internal::connect_tcp("127.0.0.1", static_cast<std::uint16_t>(strict.server->port()),
                                     where, in(seconds(5)));
  ASSERT_THAT(plain, IsOk());
  auto stream = internal::start_tls(std::move(*plain), **context, "127.0.0.1", in(seconds(5)));
  ASSERT_THAT(stream, IsOk());
  // The server has read our (empty) certificate, sent its alert and closed.
  std::this_thread::sleep_for(milliseconds(300));
  Status status = ok_status();
  for (int i = 0; i < 20 && status.ok(); ++i) {
    status = (*stream)->write_all("PING\r\n", in(seconds(2)));
    if (status.ok()) std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_THAT(status,
              StatusIs(StatusCode::kPermissionDenied, AllOf(HasSubstr(where + ": write: TLS:"),
                                                            HasSubstr("certificate required"))));
  std::cout << status << "\n";
}

// Which TLS failures are permanent, without a server: a verification that
// failed on either side (kPermissionDenied: a retry meets the same
// certificates), told from what a retry may get past.
TEST(RedisTlsErrors, VerificationFailuresAreToldApartFromTheRest) {
  using internal::is_verification_failure;
  const auto ssl = [](int reason) { return ERR_PACK(ERR_LIB_SSL, 0, reason); };
  // Our check of the server's certificate: the verify result decides,
  // whatever OpenSSL queued.
  for (const long verify :  // NOLINT(google-runtime-int): OpenSSL's type
       {X509_V_ERR_CERT_HAS_EXPIRED, X509_V_ERR_CERT_NOT_YET_VALID, X509_V_ERR_HOSTNAME_MISMATCH,
        X509_V_ERR_IP_ADDRESS_MISMATCH, X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN,
        X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY, X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT}) {
    EXPECT_TRUE(is_verification_failure(ssl(SSL_R_CERTIFICATE_VERIFY_FAILED), verify)) << verify;
    EXPECT_TRUE(is_verification_failure(0, verify)) << verify;
  }
  EXPECT_TRUE(is_verification_failure(ssl(SSL_R_CERTIFICATE_VERIFY_FAILED), X509_V_OK));
  // The server's alerts refusing our certificate (or its absence), in the
  // handshake (TLS 1.2) or at the first read or write after it (TLS 1.3).
  for (const int alert :
       {SSL_R_SSLV3_ALERT_BAD_CERTIFICATE, SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE,
        SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED, SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED,
        SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN, SSL_R_TLSV1_ALERT_UNKNOWN_CA,
        SSL_R_TLSV1_ALERT_ACCESS_DENIED, SSL_R_TLSV1_ALERT_DECRYPT_ERROR,
        SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED}) {
    EXPECT_TRUE(is_verification_failure(ssl(alert), X509_V_OK)) << alert;
    // The same number from another library is not the alert.
    EXPECT_FALSE(is_verification_failure(ERR_PACK(ERR_LIB_X509, 0, alert), X509_V_OK)) << alert;
  }
  // Nothing queued (the server closed or reset the connection), a
  // plain-text server, an alert that is not about certificates, a system
  // error: may pass.
  EXPECT_FALSE(is_verification_failure(0, X509_V_OK));
  for (const int reason : {SSL_R_WRONG_VERSION_NUMBER, SSL_R_PACKET_LENGTH_TOO_LONG,
                           SSL_R_UNEXPECTED_EOF_WHILE_READING, SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE,
                           SSL_R_TLSV1_ALERT_INTERNAL_ERROR, SSL_R_TLSV1_ALERT_PROTOCOL_VERSION}) {
    EXPECT_FALSE(is_verification_failure(ssl(reason), X509_V_OK)) << reason;
  }
  EXPECT_FALSE(is_verification_failure(ERR_SYSTEM_FLAG | ECONNRESET, X509_V_OK));
}

TEST(RedisTls, AWrongPasswordOrUserIsRefused) {
  ASSERT_FALSE(tls().host_port.empty());
  const std::string ca = "tls_ca=" + cert("ca.pem");
  const Status wrong_password = acquire_and_release(uri_for(ca, "simba:not-the-password"));
  EXPECT_THAT(wrong_password,
              StatusIs(StatusCode::kPermissionDenied,
                       AllOf(names_store_and_cause(tls().host_port, "WRONGPASS"),
                             HasSubstr("user 'simba'"), Not(HasSubstr("not-the-password")))));
  std::cout << wrong_password << "\n";
  const Status wrong_user = acquire_and_release(uri_for(ca, "nobody:simba-acl-secret"));
  EXPECT_THAT(wrong_user, StatusIs(StatusCode::kPermissionDenied,
                                   AllOf(names_store_and_cause(tls().host_port, "WRONGPASS"),
                                         HasSubstr("user 'nobody'"))));
  std::cout << wrong_user << "\n";
  // No password at all: the server says it wants one.
  EXPECT_THAT(
      acquire_and_release(uri_for(ca, "")),
      StatusIs(StatusCode::kPermissionDenied, names_store_and_cause(tls().host_port, "NOAUTH")));
}

// Plain text to the TLS-only port: the server drops the connection at once.
TEST(RedisTls, PlainTextToATlsOnlyServerIsRefused) {
  ASSERT_FALSE(tls().host_port.empty());
  for (const std::string query : {"", "tls=off"}) {
    const Status status =
        acquire_and_release(uri_for(query, "simba:simba-acl-secret", std::nullopt, "redis"));
    EXPECT_THAT(status,
                StatusIs(StatusCode::kUnavailable, names_store_and_cause(tls().host_port, "TLS")))
        << query;
    std::cout << status << "\n";
  }
}

// TLS to the shared plain server: it takes our hello for the start of a
// command and waits for the rest, so the handshake ends at the deadline,
// saying what probably happened.
TEST(RedisTls, TlsToAPlainServerFailsByTheDeadline) {
  const std::string plain = shared_server_uri("redis");
  ASSERT_FALSE(plain.empty());
  const std::string host_port = plain.substr(plain.find("//") + 2);
  const Status status =
      acquire_and_release(uri_for("tls_ca=" + cert("ca.pem"), "simba:simba-acl-secret", host_port));
  EXPECT_THAT(status, StatusIs(StatusCode::kDeadlineExceeded,
                               names_store_and_cause(host_port, "TLS handshake timed out")));
  EXPECT_THAT(status.message(), HasSubstr("serving TLS"));
  std::cout << status << "\n";
}

// An encrypted client key is refused when the backend is made, naming the
// key and its path (never asked for: OpenSSL's default would prompt on the
// terminal); a key that is not the certificate's likewise.
TEST(RedisTls, AnEncryptedOrMismatchedClientKeyIsRefusedWhenTheBackendIsMade) {
  ASSERT_FALSE(tls().host_port.empty());
  TempDir dir;
  const std::string encrypted = dir.path() + "/encrypted-key.pem";
  ASSERT_EQ(std::system(("openssl pkey -in '" + cert("client-key.pem") +
                         "' -aes256 -passout pass:k3y-secret -out '" + encrypted + "'")
                            .c_str()),
            0);
  const Status status =
      open_backend(good_uri("&tls_cert=" + cert("client-cert.pem") + "&tls_key=" + encrypted))
          .status();
  EXPECT_THAT(status, StatusIs(StatusCode::kInvalidArgument,
                               AllOf(HasSubstr("tls_key"), HasSubstr(encrypted),
                                     HasSubstr("encrypted key"), Not(HasSubstr("k3y-secret")))));
  std::cout << status << "\n";
  const Status mismatched = open_backend(good_uri("&tls_cert=" + cert("client-cert.pem") +
                                                  "&tls_key=" + cert("server-key.pem")))
                                .status();
  EXPECT_THAT(mismatched, StatusIs(StatusCode::kInvalidArgument,
                                   AllOf(HasSubstr("tls_key"), HasSubstr("mismatch"))));
}

// ---- the simba command ------------------------------------------------------------
#ifdef SIMBA_CLI_PATH

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CliRun run_cli(const std::vector<std::string>& args) {
  std::string command = "exec '" SIMBA_CLI_PATH "'";
  for (const std::string& arg : args) command += " '" + arg + "'";
  command += " 2>&1";
  Subprocess child({"/bin/sh", "-c", command});
  CliRun run;
  while (auto line = child.read_line(seconds(20))) run.output += *line + "\n";
  const int status = child.wait();
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// `simba run` and `simba status` with a rediss:// URI: the child holds the
// mutex (it gets a fencing token), status shows the owner, and neither says
// the password. A wrong CA is exit 69 with the cause.
TEST(RedisTls, TheCliRunsWithARedissUri) {
  ASSERT_FALSE(tls().host_port.empty());
  const std::string uri = good_uri();
  const CliRun run = run_cli({"run", "--store", uri, "--mutex", "cli-tls", "--", "/bin/sh", "-c",
                              "echo token=$SIMBA_FENCING_TOKEN"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("token="));
  EXPECT_THAT(run.output, Not(HasSubstr("token=\n")));
  EXPECT_THAT(run.output, Not(HasSubstr(kPassword)));

  const CliRun status = run_cli({"status", "--store", uri, "cli-tls"});
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_THAT(status.output, HasSubstr("cli-tls"));
  EXPECT_THAT(status.output, HasSubstr(" over TLS (verify)\n"));
  EXPECT_THAT(status.output, Not(HasSubstr(kPassword)));

  const CliRun refused = run_cli({"run", "--store", uri_for("tls_ca=" + cert("other-ca.pem")),
                                  "--mutex", "cli-tls", "--", "true"});
  EXPECT_EQ(refused.exit_code, 69) << refused.output;
  EXPECT_THAT(refused.output, names_store_and_cause(tls().host_port, "certificate verify failed"));
  std::cout << refused.output;
}
#endif  // SIMBA_CLI_PATH

// ---- options -----------------------------------------------------------------------

TEST(RedisTlsUri, ParsesTlsAndPasswordFile) {
  auto parse = [](const std::string& text) -> Result<RedisOptions> {
    auto uri = Uri::parse(text);
    if (!uri.ok()) return uri.status();
    return redis_options_from_uri(*uri);
  };
  TempDir dir;
  const std::string ca = dir.path() + "/ca.pem";
  std::ofstream(ca) << "a CA\n";
  auto rediss = parse("rediss://u:pw@h?tls_ca=" + ca);
  ASSERT_THAT(rediss, IsOk());
  EXPECT_EQ(rediss->tls.mode, TlsMode::kVerify);
  EXPECT_EQ(rediss->tls.ca, ca);
  EXPECT_EQ(rediss->user, "u");
  EXPECT_EQ(rediss->password, "pw");
  EXPECT_EQ(rediss->tls.describe(), "TLS (verify)");
  auto on = parse("redis://h:6380?tls=on");
  ASSERT_THAT(on, IsOk());
  EXPECT_EQ(on->tls.mode, TlsMode::kOn);
  auto plain = parse("redis://h");
  ASSERT_THAT(plain, IsOk());
  EXPECT_FALSE(plain->tls.enabled());
  auto off = parse("rediss://h?tls=off");
  ASSERT_THAT(off, IsOk());
  EXPECT_FALSE(off->tls.enabled());
  auto named = parse("rediss://h?tls_server_name=redis.internal");
  ASSERT_THAT(named, IsOk());
  EXPECT_EQ(named->tls.server_name, "redis.internal");

  const std::string file = dir.path() + "/pw";
  std::ofstream(file) << "from-file\n";
  auto from_file = parse("rediss://u@h?password_file=" + file);
  ASSERT_THAT(from_file, IsOk());
  EXPECT_EQ(from_file->password, "from-file");

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"rediss://h?tls=maybe", "tls must be"},
      {"rediss://h?tls_key=" + file, "tls_cert"},
      {"redis://h?tls=off&tls_ca=" + ca, "tls is off"},
      {"rediss://h?tls_ca=" + dir.path() + "/missing.pem", "cannot be read"},
      {"rediss://u:pw@h?password_file=" + file, "password_file"},
      {"rediss://u@h?password_file=" + dir.path() + "/missing", "cannot be read"},
      {"rediss://h?tls_ca=", "tls_ca"},
      {"redisx://h", "'redis' or 'rediss'"},
  };
  for (const auto& [text, named_key] : bad) {
    EXPECT_THAT(parse(text), StatusIs(StatusCode::kInvalidArgument,
                                      AllOf(HasSubstr(named_key), Not(HasSubstr("from-file")))))
        << text;
  }
  // A CA file that is not PEM: named by path when the backend is made.
  const std::string junk = dir.path() + "/junk.pem";
  std::ofstream(junk) << "not a certificate\n";
  EXPECT_THAT(open_backend("rediss://h?tls_ca=" + junk),
              StatusIs(StatusCode::kInvalidArgument, AllOf(HasSubstr("tls_ca"), HasSubstr(junk))));
  // Plain text says so.
  auto plain_backend = open_backend("redis://127.0.0.1:1");
  ASSERT_THAT(plain_backend, IsOk());
  EXPECT_EQ((*plain_backend)->capabilities().transport, "plain text");
}

}  // namespace
}  // namespace simba::testing
