// TLS of the MySQL/MariaDB backends against real MariaDB servers: a TLS-only
// server (the ctest fixture mysql_tls: `--require-secure-transport=ON`, its
// certificates made by scripts/servers/test-ca.sh) and the shared server
// without TLS (fixture mysql).
//
// The TLS-only server refuses every client that does not encrypt (checked
// below with ssl_mode=disabled), so a call that succeeds there went over TLS.
// Its certificate names localhost and 127.0.0.1 and is signed by ca.pem;
// other-ca.pem is an unrelated CA with the same subject. The user
// simba_x509 REQUIREs X509: it gets in only with a client certificate signed
// by ca.pem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mysql.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "simba/backends/mysql.h"
#include "simba/keyed_lock.h"
#include "testing/status_matchers.h"
#include "testing/store_test_helpers.h"
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

// The scripts' password for simba and simba_x509: no error may show it.
constexpr char kPassword[] = "simba-test";

// A call's deadline in these tests. Every failure here is local and decided
// in one or two round trips on loopback (a refused handshake, a certificate
// check), so it must come long before the deadline; a hang would run to it.
constexpr milliseconds kCallDeadline{5000};
// A call may end a little past its deadline: it closes its connection first.
constexpr milliseconds kDeadlineSlack{500};

struct TlsServer {
  std::string host_port;  // "127.0.0.1:PORT"
  std::string certs;      // test-ca.sh's directory
};

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The fixture's TLS-only server; run by hand (no SIMBA_TEST_SERVERS_DIR), a
// private one made the same way, once per process.
const TlsServer& tls() {
  static const TlsServer* server = [] {
    auto* s = new TlsServer;
    std::string uri;
    if (const char* dir = std::getenv("SIMBA_TEST_SERVERS_DIR"); dir != nullptr && dir[0] != 0) {
      uri = first_line(std::string(dir) + "/mysql_tls/uri");
      s->certs = std::string(dir) + "/mysql_tls-certs";
    }
    if (uri.empty()) {
      static TempDir certs;
      static auto started =
          TestServer::start("mysql", {"--tls", certs.path(), "--require-secure-transport=ON"});
      if (!started.ok()) {
        std::cerr << "cannot start a TLS MariaDB: " << started.status() << "\n";
        return s;
      }
      uri = (*started)->uri();
      s->certs = certs.path();
    }
    // mysql://simba:simba-test@127.0.0.1:PORT/simba
    const auto at = uri.find('@');
    const auto slash = uri.find('/', at);
    s->host_port = uri.substr(at + 1, slash - at - 1);
    return s;
  }();
  return *server;
}

std::string cert(const std::string& file) { return tls().certs + "/" + file; }

// A URI for `user` on the TLS server (or `host_port`), with `query`.
std::string tls_uri(const std::string& query, const std::string& user = "simba",
                    std::optional<std::string> host_port = std::nullopt) {
  return "mysql://" + user + ":" + kPassword + "@" + host_port.value_or(tls().host_port) +
         "/simba?table=tls_mutex&" + query;
}

// Acquires and releases a mutex through `uri`'s backend: OK or the first
// error. Also fails the test if the call ran past its deadline.
Status acquire_and_release(const std::string& uri) {
  auto backend = open_backend(uri);
  if (!backend.ok()) return backend.status();
  // The mutex is this test's own: ctest runs these tests side by side on
  // one server, and a shared name let one test's release free another's.
  const std::string mutex = unique_test_name("tls-");
  const auto start = steady_clock::now();
  auto acquired = (*backend)->acquire_or_renew(request_for(mutex, "c"), start + kCallDeadline);
  EXPECT_LT(steady_clock::now() - start, kCallDeadline + scaled(kDeadlineSlack)) << uri;
  if (!acquired.ok()) return acquired.status();
  if (acquired->owner.owner_id != "c") {
    return internal_error("not acquired: " + acquired->owner.owner_id);
  }
  auto released = (*backend)->release(mutex, "c", in(kCallDeadline));
  if (!released.ok()) return released.status();
  return *released ? ok_status() : internal_error("release found nothing to release");
}

// The error of a connection that must fail: names the store and the cause,
// never the password.
::testing::Matcher<std::string> names_store_and_cause(const std::string& host_port,
                                                      const std::string& cause) {
  return AllOf(HasSubstr("mysql at " + host_port), HasSubstr(cause), Not(HasSubstr(kPassword)));
}

// ---- the right CA ------------------------------------------------------------------

// verify_ca and verify_identity with the CA that signed the server's
// certificate: acquire + release work, and (the server being TLS-only) over
// TLS; the negative control shows that the server does refuse a plain client.
TEST(MysqlTls, TheRightCaConnectsEncryptedInEveryMode) {
  ASSERT_FALSE(tls().host_port.empty());
  for (const std::string mode : {"verify_ca", "verify_identity", "required"}) {
    SIMBA_EXPECT_OK(acquire_and_release(tls_uri("ssl_mode=" + mode + "&ssl_ca=" + cert("ca.pem"))))
        << mode;
  }
  // required without a CA: encrypted, the server not verified.
  SIMBA_EXPECT_OK(acquire_and_release(tls_uri("ssl_mode=required")));
  // The control: without TLS this server lets nobody in.
  EXPECT_THAT(acquire_and_release(tls_uri("ssl_mode=disabled")),
              StatusIs(StatusCode::kPermissionDenied));
}

// The server really encrypts what it accepts: a session set up as the
// backends' verify_identity is (CA, host name check) has a cipher, as the
// server reports it. And the keyed backend, whose connect code is the
// mutex backend's, holds and releases a key on this TLS-only server.
TEST(MysqlTls, TheSessionReportsACipher) {
  ASSERT_FALSE(tls().host_port.empty());
  MYSQL* m = mysql_init(nullptr);
  ASSERT_NE(m, nullptr);
  const my_bool on = 1;
  const std::string ca = cert("ca.pem");
  mysql_options(m, MYSQL_OPT_SSL_ENFORCE, &on);
  mysql_options(m, MYSQL_OPT_SSL_CA, ca.c_str());
  mysql_options(m, MYSQL_OPT_SSL_VERIFY_SERVER_CERT, &on);
  const auto colon = tls().host_port.find(':');
  const auto port = static_cast<unsigned int>(std::stoul(tls().host_port.substr(colon + 1)));
  ASSERT_NE(mysql_real_connect(m, "127.0.0.1", "simba", kPassword, "simba", port, nullptr, 0),
            nullptr)
      << mysql_error(m);
  ASSERT_EQ(mysql_query(m, "SHOW SESSION STATUS LIKE 'Ssl_cipher'"), 0) << mysql_error(m);
  MYSQL_RES* result = mysql_store_result(m);
  ASSERT_NE(result, nullptr);
  MYSQL_ROW row = mysql_fetch_row(result);
  ASSERT_NE(row, nullptr);
  ASSERT_NE(row[1], nullptr);
  EXPECT_STRNE(row[1], "");
  mysql_free_result(result);
  mysql_close(m);
  // The keyed backend over the same URI holds and releases a key there.
  auto provider =
      KeyedLockProvider::open(tls_uri("ssl_mode=verify_identity&ssl_ca=" + cert("ca.pem")));
  ASSERT_THAT(provider, IsOk());
  auto lease = (*provider)->try_acquire(unique_test_name("tls-key-"), milliseconds(0), seconds(10));
  ASSERT_THAT(lease, IsOk());
  ASSERT_TRUE(lease->has_value());
  SIMBA_EXPECT_OK((*lease)->release());
}

// ---- a wrong CA, a wrong name ------------------------------------------------------

// Verified against an unrelated CA (with the same subject name), the server
// is refused in every mode that verifies, by the deadline, with an error
// that names the store and the certificate.
TEST(MysqlTls, AWrongCaFailsClearly) {
  ASSERT_FALSE(tls().host_port.empty());
  for (const std::string mode : {"verify_ca", "verify_identity", "required"}) {
    const Status status =
        acquire_and_release(tls_uri("ssl_mode=" + mode + "&ssl_ca=" + cert("other-ca.pem")));
    EXPECT_THAT(status, StatusIs(StatusCode::kPermissionDenied,
                                 names_store_and_cause(tls().host_port, "certificate")))
        << mode;
    std::cout << mode << ": " << status << "\n";
  }
  // The keyed backend says the same.
  auto provider =
      KeyedLockProvider::open(tls_uri("ssl_mode=verify_ca&ssl_ca=" + cert("other-ca.pem")));
  if (provider.ok()) {  // it connects lazily
    auto lease =
        (*provider)->try_acquire(unique_test_name("tls-key-"), milliseconds(0), seconds(10));
    EXPECT_THAT(lease, StatusIs(StatusCode::kPermissionDenied,
                                names_store_and_cause(tls().host_port, "certificate")));
  } else {
    EXPECT_THAT(provider, StatusIs(StatusCode::kPermissionDenied,
                                   names_store_and_cause(tls().host_port, "certificate")));
  }
}

// "127.1" is 127.0.0.1 to the resolver but not a name in the certificate
// (which has DNS:localhost and IP:127.0.0.1): verify_ca, which checks only
// the chain, connects; verify_identity refuses the name.
TEST(MysqlTls, VerifyIdentityChecksTheHostNameAndVerifyCaDoesNot) {
  ASSERT_FALSE(tls().host_port.empty());
  const std::string port = tls().host_port.substr(tls().host_port.find(':'));
  const std::string other_name = "127.1" + port;
  const std::string ca = "&ssl_ca=" + cert("ca.pem");
  SIMBA_EXPECT_OK(acquire_and_release(tls_uri("ssl_mode=verify_ca" + ca, "simba", other_name)));
  const Status status =
      acquire_and_release(tls_uri("ssl_mode=verify_identity" + ca, "simba", other_name));
  EXPECT_THAT(status, StatusIs(StatusCode::kPermissionDenied,
                               names_store_and_cause(other_name, "certificate")));
  std::cout << "verify_identity to 127.1: " << status << "\n";
  // The same mode with a name the certificate has connects.
  SIMBA_EXPECT_OK(acquire_and_release(tls_uri("ssl_mode=verify_identity" + ca)));
}

// ---- a client certificate ----------------------------------------------------------

// simba_x509 REQUIREs X509: the server lets it in with the client
// certificate (ssl_cert + ssl_key), and without it refuses it.
TEST(MysqlTls, AClientCertificateIsSentWhenGiven) {
  ASSERT_FALSE(tls().host_port.empty());
  const std::string ca = "ssl_mode=verify_identity&ssl_ca=" + cert("ca.pem");
  SIMBA_EXPECT_OK(acquire_and_release(
      tls_uri(ca + "&ssl_cert=" + cert("client-cert.pem") + "&ssl_key=" + cert("client-key.pem"),
              "simba_x509")));
  const Status without = acquire_and_release(tls_uri(ca, "simba_x509"));
  EXPECT_THAT(without, StatusIs(StatusCode::kPermissionDenied,
                                names_store_and_cause(tls().host_port, "simba_x509")));
  std::cout << "without a client certificate: " << without << "\n";
  // The keyed backend sends it too.
  auto provider = KeyedLockProvider::open(
      tls_uri(ca + "&ssl_cert=" + cert("client-cert.pem") + "&ssl_key=" + cert("client-key.pem"),
              "simba_x509"));
  ASSERT_THAT(provider, IsOk());
  auto lease =
      (*provider)->try_acquire(unique_test_name("tls-x509-"), milliseconds(0), seconds(10));
  ASSERT_THAT(lease, IsOk());
  ASSERT_TRUE(lease->has_value());
  SIMBA_EXPECT_OK((*lease)->release());
}

// ---- a server without TLS ----------------------------------------------------------

// Every mode but disabled needs TLS: the shared server, which has none, is
// refused, by the deadline, naming the store and the cause; it never goes
// on in the clear.
TEST(MysqlTls, EveryTlsModeRefusesAServerWithoutTls) {
  const std::string uri = shared_server_uri("mysql");
  ASSERT_FALSE(uri.empty());
  const auto at = uri.find('@');
  const std::string host_port = uri.substr(at + 1, uri.find('/', at) - at - 1);
  const std::string ca = "&ssl_ca=" + cert("ca.pem");
  for (const std::string& query :
       {std::string("ssl_mode=required"), "ssl_mode=verify_ca" + ca,
        "ssl_mode=verify_identity" + ca, "ssl_mode=required" + ca, ca.substr(1),
        "ssl_cert=" + cert("client-cert.pem") + "&ssl_key=" + cert("client-key.pem")}) {
    const Status status = acquire_and_release(tls_uri(query, "simba", host_port));
    EXPECT_THAT(status,
                StatusIs(StatusCode::kPermissionDenied, names_store_and_cause(host_port, "TLS")))
        << query;
    std::cout << query << ": " << status << "\n";
  }
  // The keyed backend refuses it too.
  auto provider = KeyedLockProvider::open(tls_uri("ssl_mode=required", "simba", host_port));
  if (provider.ok()) {
    auto lease =
        (*provider)->try_acquire(unique_test_name("tls-key-"), milliseconds(0), seconds(10));
    EXPECT_THAT(lease,
                StatusIs(StatusCode::kPermissionDenied, names_store_and_cause(host_port, "TLS")));
  } else {
    EXPECT_THAT(provider,
                StatusIs(StatusCode::kPermissionDenied, names_store_and_cause(host_port, "TLS")));
  }
  // The control: without TLS the same server and user are fine.
  SIMBA_EXPECT_OK(acquire_and_release(tls_uri("ssl_mode=disabled", "simba", host_port)));
}

// ---- Simba's spelling: tls=, tls_* ---------------------------------------------------

// tls=verify and tls=on with tls_ca, and the client certificate as
// tls_cert/tls_key: the same as the ssl_* keys, over TLS (the server takes
// nothing else); Capabilities::transport says which mode, never a path.
TEST(MysqlTls, TheTlsSpellingConnects) {
  ASSERT_FALSE(tls().host_port.empty());
  const std::string ca = "tls_ca=" + cert("ca.pem");
  for (const std::string& query :
       {"tls=verify&" + ca, "tls=on&" + ca, ca, "ssl_mode=verify_ca&" + ca,
        "tls=verify&ssl_ca=" + cert("ca.pem")}) {
    SIMBA_EXPECT_OK(acquire_and_release(tls_uri(query))) << query;
  }
  SIMBA_EXPECT_OK(acquire_and_release(
      tls_uri(ca + "&tls_cert=" + cert("client-cert.pem") + "&tls_key=" + cert("client-key.pem"),
              "simba_x509")));
  auto verify = open_backend(tls_uri("tls=verify&" + ca));
  ASSERT_THAT(verify, IsOk());
  EXPECT_EQ((*verify)->capabilities().transport, "TLS (verify)");
  auto on = open_backend(tls_uri("tls=on&" + ca + "&tls_cert=" + cert("client-cert.pem") +
                                 "&tls_key=" + cert("client-key.pem")));
  ASSERT_THAT(on, IsOk());
  EXPECT_EQ((*on)->capabilities().transport, "TLS (on), client certificate");
  auto plain = open_backend(tls_uri("tls=off"));
  ASSERT_THAT(plain, IsOk());
  EXPECT_EQ((*plain)->capabilities().transport, "plain text");
  // The control: tls=off is refused by this server, the error saying why it
  // may be.
  const Status plain_text = acquire_and_release(tls_uri("tls=off"));
  EXPECT_THAT(plain_text, StatusIs(StatusCode::kPermissionDenied,
                                   names_store_and_cause(tls().host_port, "takes only TLS")));
  std::cout << "tls=off: " << plain_text << "\n";
}

// tls=verify checks the name (127.1 is not one of the certificate's to
// libmariadb), tls=on does not; a wrong CA is refused in both.
TEST(MysqlTls, TheTlsSpellingChecksNameAndCa) {
  ASSERT_FALSE(tls().host_port.empty());
  const std::string port = tls().host_port.substr(tls().host_port.find(':'));
  const std::string other_name = "127.1" + port;
  const std::string ca = "&tls_ca=" + cert("ca.pem");
  SIMBA_EXPECT_OK(acquire_and_release(tls_uri("tls=on" + ca, "simba", other_name)));
  const Status name = acquire_and_release(tls_uri("tls=verify" + ca, "simba", other_name));
  EXPECT_THAT(name, StatusIs(StatusCode::kPermissionDenied,
                             names_store_and_cause(other_name, "certificate")));
  std::cout << "tls=verify to 127.1: " << name << "\n";
  for (const std::string mode : {"on", "verify"}) {
    const Status wrong_ca =
        acquire_and_release(tls_uri("tls=" + mode + "&tls_ca=" + cert("other-ca.pem")));
    EXPECT_THAT(wrong_ca, StatusIs(StatusCode::kPermissionDenied,
                                   names_store_and_cause(tls().host_port, "certificate")))
        << mode;
  }
}

// A server whose certificate expired (in 2020), signed by the right CA:
// refused in every mode that verifies, by the deadline.
TEST(MysqlTls, AnExpiredServerCertificateIsRefused) {
  TempDir certs;
  auto expired = TestServer::start("mysql", {"--tls-expired", certs.path()});
  ASSERT_THAT(expired, IsOk());
  const std::string uri = (*expired)->uri();
  const auto at = uri.find('@');
  const std::string host_port = uri.substr(at + 1, uri.find('/', at) - at - 1);
  const std::string ca = certs.path() + "/ca.pem";
  for (const std::string& query : {"tls=on&tls_ca=" + ca, "tls=verify&tls_ca=" + ca,
                                   "ssl_mode=verify_identity&ssl_ca=" + ca}) {
    const Status status = acquire_and_release(tls_uri(query, "simba", host_port));
    EXPECT_THAT(status, StatusIs(StatusCode::kPermissionDenied,
                                 names_store_and_cause(host_port, "certificate has expired")))
        << query;
    std::cout << query << ": " << status << "\n";
  }
}

// password_file= reads the password from a file; one that cannot be read is
// named (its path, never contents), and the URI may not have a password too.
TEST(MysqlTls, APasswordFileServesForThePassword) {
  ASSERT_FALSE(tls().host_port.empty());
  TempDir dir;
  const std::string file = dir.path() + "/pw";
  {
    std::ofstream out(file);
    out << kPassword << "\n";
  }
  const std::string base = "mysql://simba@" + tls().host_port + "/simba?table=tls_mutex&";
  SIMBA_EXPECT_OK(
      acquire_and_release(base + "tls=verify&tls_ca=" + cert("ca.pem") + "&password_file=" + file));
  auto missing = open_backend(base + "password_file=" + dir.path() + "/none");
  EXPECT_THAT(missing, StatusIs(StatusCode::kInvalidArgument,
                                AllOf(HasSubstr("password_file"), HasSubstr("/none"))));
  auto both = open_backend(tls_uri("password_file=" + file));
  EXPECT_THAT(both, StatusIs(StatusCode::kInvalidArgument,
                             AllOf(HasSubstr("password_file"), Not(HasSubstr(kPassword)))));
  // A wrong password from a file: refused, and not shown.
  const std::string wrong = dir.path() + "/wrong";
  {
    std::ofstream out(wrong);
    out << "not-the-password-42\n";
  }
  const Status refused =
      acquire_and_release(base + "tls_ca=" + cert("ca.pem") + "&password_file=" + wrong);
  EXPECT_THAT(refused, StatusIs(StatusCode::kPermissionDenied,
                                AllOf(names_store_and_cause(tls().host_port, "Access denied"),
                                      Not(HasSubstr("not-the-password-42")))));
  std::cout << "wrong password: " << refused << "\n";
}

// The tls keys and the ssl_* ones must agree; tls_server_name is refused
// (libmariadb verifies only the host it connects to).
TEST(MysqlTlsUri, TheTlsSpellingAndItsContradictions) {
  auto uri =
      Uri::parse("mysql://u@h/db?tls=on&tls_ca=/dev/null&tls_cert=/dev/null&tls_key=/dev/null");
  ASSERT_THAT(uri, IsOk());
  auto options = mysql_options_from_uri(*uri);
  ASSERT_THAT(options, IsOk());
  ASSERT_TRUE(options->tls.has_value());
  EXPECT_EQ(options->tls->mode, TlsMode::kOn);
  const std::vector<std::pair<std::string, std::vector<std::string>>> bad = {
      {"mysql://h/db?tls=verify&ssl_mode=required", {"tls=verify", "ssl_mode=required"}},
      {"mysql://h/db?tls=verify&ssl_mode=disabled", {"tls=verify", "ssl_mode=disabled"}},
      {"mysql://h/db?tls=off&ssl_mode=verify_ca&ssl_ca=/dev/null", {"tls=off", "ssl_mode"}},
      {"mysql://h/db?tls_ca=/dev/null&ssl_ca=/other", {"tls_ca", "ssl_ca"}},
      {"mysql://h/db?tls_ca=/dev/null&tls_server_name=db", {"tls_server_name", "host"}},
      {"mysql://u:pw@h/db?password_file=/dev/null", {"password", "password_file"}},
      {"mysql://h/db?tls=maybe", {"tls", "maybe"}},
  };
  for (const auto& [text, named] : bad) {
    auto parsed = Uri::parse(text);
    ASSERT_THAT(parsed, IsOk()) << text;
    auto result = mysql_options_from_uri(*parsed);
    ASSERT_THAT(result, StatusIs(StatusCode::kInvalidArgument)) << text;
    for (const std::string& name : named) {
      EXPECT_THAT(result.status().message(), HasSubstr(name)) << text;
    }
  }
}

// ---- options -----------------------------------------------------------------------

TEST(MysqlTlsUri, ParsesTheTlsKeysAndNamesTheBadOne) {
  auto uri = Uri::parse(
      "mysql://u:pw@h/db?ssl_mode=verify_ca&ssl_ca=/c/ca.pem&ssl_cert=/c/cert.pem&"
      "ssl_key=/c/key.pem");
  ASSERT_THAT(uri, IsOk());
  auto options = mysql_options_from_uri(*uri);
  ASSERT_THAT(options, IsOk());
  EXPECT_EQ(options->ssl_mode, "verify_ca");
  EXPECT_EQ(options->ssl_ca, "/c/ca.pem");
  EXPECT_EQ(options->ssl_cert, "/c/cert.pem");
  EXPECT_EQ(options->ssl_key, "/c/key.pem");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"mysql://h/db?ssl_mode=verify_full", "ssl_mode"},
      {"mysql://h/db?ssl_mode=verify_ca", "ssl_ca"},
      {"mysql://h/db?ssl_key=/c/key.pem", "ssl_cert"},
  };
  for (const auto& [text, named] : bad) {
    auto parsed = Uri::parse(text);
    ASSERT_THAT(parsed, IsOk()) << text;
    EXPECT_THAT(mysql_options_from_uri(*parsed),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(named)))
        << text;
  }
  // The same checks on options built in code.
  MysqlOptions direct;
  direct.host = "h";
  direct.database = "db";
  direct.ssl_mode = "verify_ca";
  EXPECT_THAT(new_mysql_backend(direct),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("ssl_ca")));
  direct.ssl_mode = "required";
  direct.ssl_key = "/c/key.pem";
  EXPECT_THAT(new_mysql_backend(direct),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("ssl_cert")));
}

}  // namespace
}  // namespace simba::testing
