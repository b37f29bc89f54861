// The one spelling of TLS options (simba/tls.h): what a URI's tls* keys
// mean, what is refused and how, and that no error shows a secret.
#include "simba/tls.h"

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

namespace simba {
namespace {

using ::simba::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

Result<TlsOptions> from(const std::string& uri, bool on_by_default = false) {
  auto parsed = Uri::parse(uri);
  if (!parsed.ok()) return parsed.status();
  return tls_options_from_uri(*parsed, "teststore", on_by_default);
}

class TlsOptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ca_ = dir_.path() + "/ca.pem";
    cert_ = dir_.path() + "/cert.pem";
    key_ = dir_.path() + "/key.pem";
    for (const std::string& path : {ca_, cert_, key_}) std::ofstream(path) << "PEM\n";
  }
  testing::TempDir dir_;
  std::string ca_, cert_, key_;
};

TEST_F(TlsOptionsTest, OffUnlessAskedFor) {
  auto tls = from("redis://127.0.0.1:6379");
  ASSERT_THAT(tls, testing::IsOk());
  EXPECT_EQ(tls->mode, TlsMode::kOff);
  EXPECT_EQ(tls->describe(), "plain text");
}

TEST_F(TlsOptionsTest, AnyTlsKeyOrTheSchemeTurnsOnFullVerification) {
  auto by_ca = from("redis://h?tls_ca=" + ca_);
  ASSERT_THAT(by_ca, testing::IsOk());
  EXPECT_EQ(by_ca->mode, TlsMode::kVerify);
  EXPECT_EQ(by_ca->ca, ca_);
  auto by_name = from("redis://h?tls_server_name=db.internal");
  ASSERT_THAT(by_name, testing::IsOk());
  EXPECT_EQ(by_name->mode, TlsMode::kVerify);
  EXPECT_EQ(by_name->server_name, "db.internal");
  auto by_scheme = from("rediss://h", /*on_by_default=*/true);
  ASSERT_THAT(by_scheme, testing::IsOk());
  EXPECT_EQ(by_scheme->mode, TlsMode::kVerify);
  EXPECT_EQ(by_scheme->describe(), "TLS (verify)");
}

TEST_F(TlsOptionsTest, TlsKeySaysWhichMode) {
  EXPECT_EQ(from("redis://h?tls=on")->mode, TlsMode::kOn);
  EXPECT_EQ(from("redis://h?tls=verify")->mode, TlsMode::kVerify);
  EXPECT_EQ(from("rediss://h?tls=off", true)->mode, TlsMode::kOff);
  auto mutual = from("redis://h?tls=on&tls_cert=" + cert_ + "&tls_key=" + key_);
  ASSERT_THAT(mutual, testing::IsOk());
  EXPECT_EQ(mutual->describe(), "TLS (on), client certificate");
  EXPECT_THAT(from("redis://h?tls=yes"),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("teststore"), HasSubstr("tls must be off, on or verify"),
                             HasSubstr("'yes'"))));
}

TEST_F(TlsOptionsTest, RefusesWhatCannotWork) {
  EXPECT_THAT(from("redis://h?tls_key=" + key_),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("tls_key needs tls_cert")));
  EXPECT_THAT(from("redis://h?tls_cert=" + cert_),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("tls_cert needs tls_key")));
  EXPECT_THAT(from("redis://h?tls=off&tls_ca=" + ca_),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("but tls is off")));
  EXPECT_THAT(from("redis://h?tls_ca="),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("tls_ca must not be empty")));
  EXPECT_THAT(from("redis://h?tls_ca=" + dir_.path() + "/missing.pem"),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("teststore: tls_ca"), HasSubstr("missing.pem"),
                             HasSubstr("cannot be read"))));
}

TEST_F(TlsOptionsTest, ASecretFileGivesItsFirstLineAndErrorsNeverItsContents) {
  const std::string path = dir_.path() + "/password";
  std::ofstream(path) << "s3cret-value\r\nsecond line\n";
  EXPECT_THAT(read_secret_file("teststore", "password_file", path),
              testing::IsOkAndHolds(std::string("s3cret-value")));
  EXPECT_THAT(read_secret_file("teststore", "password_file", dir_.path() + "/none"),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("teststore: password_file"), HasSubstr("cannot be read"))));
  const std::string empty = dir_.path() + "/empty";
  std::ofstream(empty) << "\n";
  EXPECT_THAT(read_secret_file("teststore", "password_file", empty),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("is empty"), Not(HasSubstr("s3cret")))));
}

}  // namespace
}  // namespace simba
