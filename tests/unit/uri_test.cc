#include "simba/uri.h"

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace simba {

// So that a failing EXPECT shows the URI instead of bytes.
void PrintTo(const Uri& uri, std::ostream* os) {
  *os << "Uri{" << uri.scheme << ", user=" << uri.user.value_or("<none>")
      << ", password=" << (uri.password ? "<set>" : "<none>") << ", hosts=[";
  for (const UriHost& h : uri.hosts) {
    *os << h.host;
    if (h.port) *os << ":" << *h.port;
    *os << " ";
  }
  *os << "], path=" << uri.path << ", query={";
  for (const auto& [k, v] : uri.query) *os << k << "=" << v << " ";
  *os << "}}";
}

namespace {

using ::std::chrono::milliseconds;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

using ::simba::testing::StatusIs;

// ---------------------------------------------------------------------------
// Valid URIs

struct ValidCase {
  std::string text;
  std::string scheme;
  std::optional<std::string> user;
  std::optional<std::string> password;
  std::vector<UriHost> hosts;
  std::string path;
  std::map<std::string, std::string> query;
  std::string to_string;  // what to_string() gives back
};

void PrintTo(const ValidCase& c, std::ostream* os) { *os << c.text; }

class ValidUriTest : public ::testing::TestWithParam<ValidCase> {};

TEST_P(ValidUriTest, ParsesIntoFields) {
  const ValidCase& c = GetParam();
  const Result<Uri> uri = Uri::parse(c.text);
  ASSERT_TRUE(uri.ok()) << uri.status();
  EXPECT_EQ(uri->scheme, c.scheme);
  EXPECT_EQ(uri->user, c.user);
  EXPECT_EQ(uri->password, c.password);
  EXPECT_EQ(uri->hosts, c.hosts);
  EXPECT_EQ(uri->path, c.path);
  EXPECT_EQ(uri->query, c.query);
  EXPECT_EQ(uri->to_string(), c.to_string);
}

TEST_P(ValidUriTest, ToStringParsesBackToTheSameUri) {
  const Result<Uri> uri = Uri::parse(GetParam().text);
  ASSERT_TRUE(uri.ok()) << uri.status();
  const Result<Uri> again = Uri::parse(uri->to_string());
  ASSERT_TRUE(again.ok()) << again.status();
  // Secrets come back as "****", by design; everything else exactly.
  Uri expected = *uri;
  if (expected.password.has_value()) expected.password = "****";
  if (expected.query.count("password") != 0) expected.query["password"] = "****";
  EXPECT_EQ(*again, expected);
}

INSTANTIATE_TEST_SUITE_P(
    Uri, ValidUriTest,
    ::testing::Values(
        // One for every scheme in DESIGN.md.
        ValidCase{"memory://orders", "memory", {}, {}, {{"orders", {}}}, "", {}, "memory://orders"},
        ValidCase{"sqlite:///abs/path.db",
                  "sqlite",
                  {},
                  {},
                  {},
                  "/abs/path.db",
                  {},
                  "sqlite:///abs/path.db"},
        ValidCase{
            "sqlite://rel/x.db", "sqlite", {}, {}, {{"rel", {}}}, "/x.db", {}, "sqlite://rel/x.db"},
        ValidCase{"sqlite:///var/lib/app/simba.db?busy_timeout=2s",
                  "sqlite",
                  {},
                  {},
                  {},
                  "/var/lib/app/simba.db",
                  {{"busy_timeout", "2s"}},
                  "sqlite:///var/lib/app/simba.db?busy_timeout=2s"},
        ValidCase{"postgresql://user:pw@h:5432/db?sslmode=require",
                  "postgresql",
                  "user",
                  "pw",
                  {{"h", 5432}},
                  "/db",
                  {{"sslmode", "require"}},
                  "postgresql://user:****@h:5432/db?sslmode=require"},
        ValidCase{"mysql://u@h:3306/db",
                  "mysql",
                  "u",
                  {},
                  {{"h", 3306}},
                  "/db",
                  {},
                  "mysql://u@h:3306/db"},
        ValidCase{"redis://:secret@127.0.0.1:6379/0",
                  "redis",
                  {},
                  "secret",
                  {{"127.0.0.1", 6379}},
                  "/0",
                  {},
                  "redis://:****@127.0.0.1:6379/0"},
        ValidCase{"zookeeper://h1:2181,h2:2181/chroot",
                  "zookeeper",
                  {},
                  {},
                  {{"h1", 2181}, {"h2", 2181}},
                  "/chroot",
                  {},
                  "zookeeper://h1:2181,h2:2181/chroot"},
        ValidCase{"etcd://h1:2379,h2:2379",
                  "etcd",
                  {},
                  {},
                  {{"h1", 2379}, {"h2", 2379}},
                  "",
                  {},
                  "etcd://h1:2379,h2:2379"},
        // IPv6.
        ValidCase{
            "redis://[::1]:6379", "redis", {}, {}, {{"::1", 6379}}, "", {}, "redis://[::1]:6379"},
        ValidCase{"etcd://[2001:db8::1]:2379,[::ffff:10.0.0.1],h3",
                  "etcd",
                  {},
                  {},
                  {{"2001:db8::1", 2379}, {"::ffff:10.0.0.1", {}}, {"h3", {}}},
                  "",
                  {},
                  "etcd://[2001:db8::1]:2379,[::ffff:10.0.0.1],h3"},
        // Scheme case and characters; host case is kept.
        ValidCase{"MEMORY://Orders", "memory", {}, {}, {{"Orders", {}}}, "", {}, "memory://Orders"},
        ValidCase{"x-y+z.1://h_1~a", "x-y+z.1", {}, {}, {{"h_1~a", {}}}, "", {}, "x-y+z.1://h_1~a"},
        // Empty and near-empty parts.
        ValidCase{"memory://", "memory", {}, {}, {}, "", {}, "memory://"},
        ValidCase{"redis://h", "redis", {}, {}, {{"h", {}}}, "", {}, "redis://h"},
        ValidCase{"redis://h/", "redis", {}, {}, {{"h", {}}}, "/", {}, "redis://h/"},
        ValidCase{"redis://h/0?", "redis", {}, {}, {{"h", {}}}, "/0", {}, "redis://h/0"},
        ValidCase{
            "redis://h?db=1", "redis", {}, {}, {{"h", {}}}, "", {{"db", "1"}}, "redis://h?db=1"},
        ValidCase{"redis://h/0?a=1&&b=&",
                  "redis",
                  {},
                  {},
                  {{"h", {}}},
                  "/0",
                  {{"a", "1"}, {"b", ""}},
                  "redis://h/0?a=1&b="},
        ValidCase{"redis://u:pw@/0", "redis", "u", "pw", {}, "/0", {}, "redis://u:****@/0"},
        ValidCase{"redis://u:@h", "redis", "u", "", {{"h", {}}}, "", {}, "redis://u:****@h"},
        ValidCase{"redis://@h", "redis", {}, {}, {{"h", {}}}, "", {}, "redis://h"},
        // Port limits and leading zeros.
        ValidCase{"redis://h:1", "redis", {}, {}, {{"h", 1}}, "", {}, "redis://h:1"},
        ValidCase{"redis://h:65535", "redis", {}, {}, {{"h", 65535}}, "", {}, "redis://h:65535"},
        ValidCase{"redis://h:06379", "redis", {}, {}, {{"h", 6379}}, "", {}, "redis://h:6379"},
        // Percent-decoding in user, password, path, query keys and values.
        ValidCase{"postgresql://us%40er:p%3Aw%2Fd@h/db%20x?k%31=v%26w%3D",
                  "postgresql",
                  "us@er",
                  "p:w/d",
                  {{"h", {}}},
                  "/db x",
                  {{"k1", "v&w="}},
                  "postgresql://us%40er:****@h/db%20x?k1=v%26w="},
        ValidCase{"sqlite:///tmp/%25done%3F.db",
                  "sqlite",
                  {},
                  {},
                  {},
                  "/tmp/%done?.db",
                  {},
                  "sqlite:///tmp/%25done%3F.db"},
        // '+' is not a space outside HTML forms.
        ValidCase{"redis://h/0?k=a+b",
                  "redis",
                  {},
                  {},
                  {{"h", {}}},
                  "/0",
                  {{"k", "a+b"}},
                  "redis://h/0?k=a+b"},
        // An unescaped '@' or ':' in the password still parses (last '@').
        ValidCase{"redis://u:p@ss:w@h:1/0",
                  "redis",
                  "u",
                  "p@ss:w",
                  {{"h", 1}},
                  "/0",
                  {},
                  "redis://u:****@h:1/0"},
        // '@' outside the authority is not user info.
        ValidCase{"sqlite:///tmp/a@b.db",
                  "sqlite",
                  {},
                  {},
                  {},
                  "/tmp/a@b.db",
                  {},
                  "sqlite:///tmp/a@b.db"},
        ValidCase{"redis://h/0?email=a@b",
                  "redis",
                  {},
                  {},
                  {{"h", {}}},
                  "/0",
                  {{"email", "a@b"}},
                  "redis://h/0?email=a@b"},
        ValidCase{"redis://h/0?k=a=b",
                  "redis",
                  {},
                  {},
                  {{"h", {}}},
                  "/0",
                  {{"k", "a=b"}},
                  "redis://h/0?k=a=b"},
        // A raw space in a file path is accepted, shown escaped.
        ValidCase{"sqlite:///tmp/my file.db",
                  "sqlite",
                  {},
                  {},
                  {},
                  "/tmp/my file.db",
                  {},
                  "sqlite:///tmp/my%20file.db"},
        // A secret query value is hidden like the password.
        ValidCase{"postgresql://h/db?password=pw&sslmode=require",
                  "postgresql",
                  {},
                  {},
                  {{"h", {}}},
                  "/db",
                  {{"password", "pw"}, {"sslmode", "require"}},
                  "postgresql://h/db?password=****&sslmode=require"}));

// ---------------------------------------------------------------------------
// Invalid URIs: always kInvalidArgument, with a message naming the problem.

struct InvalidCase {
  std::string text;
  std::string fragment;  // expected in the message
};

void PrintTo(const InvalidCase& c, std::ostream* os) { *os << c.text; }

class InvalidUriTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidUriTest, IsRejectedWithAClearMessage) {
  const InvalidCase& c = GetParam();
  EXPECT_THAT(Uri::parse(c.text), StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.fragment)));
}

INSTANTIATE_TEST_SUITE_P(
    Uri, InvalidUriTest,
    ::testing::Values(
        InvalidCase{"", "empty store URI"}, InvalidCase{"memory:orders", "missing \"://\""},
        InvalidCase{"/var/lib/simba.db", "missing \"://\" (expected scheme://"},
        InvalidCase{"://h", "empty scheme"}, InvalidCase{"1redis://h", "invalid scheme '1redis'"},
        InvalidCase{"re dis://h", "invalid scheme 're dis'"},
        InvalidCase{"redis_x://h", "invalid scheme 'redis_x'"},
        InvalidCase{"redis://h:0", "port '0' is out of range"},
        InvalidCase{"redis://h:65536", "port '65536' is out of range"},
        InvalidCase{"redis://h:99999999999999999999", "port '99999999999999999999' is out"},
        InvalidCase{"redis://h:abc", "invalid port 'abc'"},
        InvalidCase{"redis://h:-1", "invalid port '-1'"},
        InvalidCase{"redis://h:+1", "invalid port '+1'"},
        InvalidCase{"redis://h:", "empty port after ':' in host 'h:'"},
        InvalidCase{"redis://:6379", "port without a host name: ':6379'"},
        InvalidCase{"redis://h1,,h2", "empty entry in host list 'h1,,h2'"},
        InvalidCase{"redis://h1,", "empty entry in host list"},
        InvalidCase{"redis://::1:6379", "has more than one ':'"},
        InvalidCase{"redis://[::1", "missing ']'"},
        InvalidCase{"redis://[zz]:1", "invalid IPv6 address 'zz'"},
        InvalidCase{"redis://[]:1", "invalid IPv6 address ''"},
        InvalidCase{"redis://[::1]x", "unexpected text 'x' after ']'"},
        InvalidCase{"redis://[::1]:0", "port '0' is out of range"},
        InvalidCase{"redis://ho st", "invalid character in host name 'ho st'"},
        InvalidCase{"redis://h%41", "invalid character in host name 'h%41'"},
        InvalidCase{"sqlite:///a%zzb", "bad percent-escape '%zz' in the path"},
        InvalidCase{"sqlite:///a%4", "bad percent-escape '%4'"},
        InvalidCase{"sqlite:///a%", "bad percent-escape '%'"},
        InvalidCase{"sqlite:///a%00b", "'%00' (a NUL byte) is not allowed in the path"},
        InvalidCase{"redis://u%zz@h", "bad percent-escape '%zz' in the user name"},
        InvalidCase{"redis://h/0?a=1&a=2", "duplicate query key 'a'"},
        InvalidCase{"redis://h/0?a=1&%61=2", "duplicate query key '%61'"},
        InvalidCase{"redis://h/0?flag", "query parameter 'flag' has no value"},
        InvalidCase{"redis://h/0?=v", "query parameter '=v' has an empty key"},
        InvalidCase{"redis://h/0?k=%G1", "'%G1' in the value of query key 'k'"},
        InvalidCase{"redis://h/0?k%=1", "in a query key"},
        InvalidCase{"redis://h\n", "control character \\x0a at byte 9"},
        InvalidCase{"sqlite:///tmp/x.db\r", "control character \\x0d"},
        // Every message quotes the URI, for context.
        InvalidCase{"redis://h:0/1", "in store URI 'redis://h:0/1'"}));

// ---------------------------------------------------------------------------
// The password never shows, in to_string() or in any error.

constexpr char kPassword[] = "Zq7s3cr3tPW";

// No 4-character run of the password may appear: a partial leak is a leak.
void expect_no_password_in(const std::string& text) {
  const std::string password = kPassword;
  for (std::size_t i = 0; i + 4 <= password.size(); ++i) {
    EXPECT_THAT(text, Not(HasSubstr(password.substr(i, 4)))) << "leaks the password";
  }
}

std::string with_password(std::string pattern) {
  const std::size_t at = pattern.find("PW");
  pattern.replace(at, 2, kPassword);
  return pattern;
}

class PasswordInErrorTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PasswordInErrorTest, NeverAppears) {
  const std::string text = with_password(GetParam());
  const Result<Uri> uri = Uri::parse(text);
  ASSERT_FALSE(uri.ok()) << text;
  EXPECT_EQ(uri.status().code(), StatusCode::kInvalidArgument);
  expect_no_password_in(uri.status().message());
  // The message still shows where the URI went wrong.
  EXPECT_THAT(uri.status().message(), HasSubstr("in store URI '"));
}

INSTANTIATE_TEST_SUITE_P(
    Uri, PasswordInErrorTest,
    ::testing::Values("redis://:PW@h:99999", "redis://u:PW@h:abc/0", "redis://u:PW@h/0?a=1&a=2",
                      "redis://u:PW@h1,,h2", "redis://u:PW@[::1", "redis://u:PW@:1",
                      "redis://u:PW@h/%zz", "redis://u:PW@h\n", "1redis://u:PW@h",
                      // Bad escapes and NULs inside the password itself.
                      "redis://u:%zzPW@h", "redis://u:PW%00@h", "redis://u:PW%4@h",
                      // A password with an unescaped '/' or '?' ends the authority early.
                      "redis://u:Zq7s/3cr3tPW@h", "redis://:Zq7s/3cr3tPW@h:1",
                      "redis://u:Zq7s?3cr3tPW@h", "redis://u:Zq7s3cr3tPW/@h:1/0?a=1&a=2",
                      // Without a proper "://".
                      "redis:/u:PW@h", "redis//u:PW@h", "u:PW@h", "redis:u:PW@h",
                      // '@' also in the query: more is hidden, nothing leaks.
                      "redis://u:PW@h:0/0?e=a@b",
                      // Secret query values.
                      "postgresql://h/db?password=PW&password=x", "postgresql://h:0/db?password=PW",
                      "postgresql://h/db?sslpassword=%zzPW", "postgresql://h/db?password=PW%00",
                      "postgresql://h/db?password=PW&x=%zz", "redis://h/0?auth_token=PW&flag"));

TEST(UriTest, UnescapedSlashInPasswordGetsAHint) {
  const Result<Uri> uri = Uri::parse(with_password("redis://u:Zq7s/3cr3tPW@h"));
  EXPECT_THAT(uri, StatusIs(StatusCode::kInvalidArgument,
                            AllOf(HasSubstr("in store URI 'redis://u:****@h'"),
                                  HasSubstr("write them as %2F, %3F and %25"))));
  expect_no_password_in(uri.status().message());
}

TEST(UriTest, ToStringHidesThePasswordAndSecretQueryValues) {
  const Result<Uri> uri = Uri::parse(
      with_password("redis://user:PW@h:6379/0?password=x&token=y&client_secret=z&pwd=w&db=1"));
  ASSERT_TRUE(uri.ok()) << uri.status();
  EXPECT_EQ(uri->password, kPassword);
  EXPECT_EQ(uri->query_value("token"), "y");
  EXPECT_EQ(uri->to_string(),
            "redis://user:****@h:6379/0?client_secret=****&db=1&password=****&pwd=****&token=****");
  expect_no_password_in(uri->to_string());
}

TEST(UriTest, CheckQueryKeysErrorHidesThePassword) {
  const Result<Uri> uri = Uri::parse(with_password("redis://u:PW@h/0?password=PW"));
  ASSERT_TRUE(uri.ok()) << uri.status();
  const Status status = uri->check_query_keys({"db"});
  EXPECT_THAT(status, StatusIs(StatusCode::kInvalidArgument, HasSubstr("'password'")));
  expect_no_password_in(status.message());
}

// ---------------------------------------------------------------------------
// Query and CheckQueryKeys

TEST(UriTest, QueryReturnsTheValueOrNothing) {
  const Result<Uri> uri = Uri::parse("sqlite:///x.db?busy_timeout=2s&empty=");
  ASSERT_TRUE(uri.ok()) << uri.status();
  EXPECT_EQ(uri->query_value("busy_timeout"), "2s");
  EXPECT_EQ(uri->query_value("empty"), "");
  EXPECT_EQ(uri->query_value("missing"), std::nullopt);
  EXPECT_EQ(uri->query_value("BUSY_TIMEOUT"), std::nullopt);
}

TEST(UriTest, CheckQueryKeysAcceptsKnownKeys) {
  const Result<Uri> uri = Uri::parse("redis://h/0?lease=10s&prefix=app");
  ASSERT_TRUE(uri.ok()) << uri.status();
  EXPECT_TRUE(uri->check_query_keys({"prefix", "lease", "op_timeout"}).ok());
  const Result<Uri> bare = Uri::parse("redis://h/0");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_TRUE(bare->check_query_keys({}).ok());
}

TEST(UriTest, CheckQueryKeysNamesTheTypoAndTheKnownKeys) {
  const Result<Uri> uri = Uri::parse("sqlite:///x.db?busy_timeut=2s");
  ASSERT_TRUE(uri.ok()) << uri.status();
  EXPECT_THAT(uri->check_query_keys({"lease", "busy_timeout"}),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("unknown query key 'busy_timeut'"),
                             HasSubstr("'sqlite:///x.db?busy_timeut=2s'"),
                             HasSubstr("sqlite:// accepts: busy_timeout, lease"),
                             HasSubstr("did you mean 'busy_timeout'?"))));
}

TEST(UriTest, CheckQueryKeysListsEveryUnknownKey) {
  const Result<Uri> uri = Uri::parse("redis://h?zzz=1&lease=1s&yyy=2");
  ASSERT_TRUE(uri.ok()) << uri.status();
  EXPECT_THAT(uri->check_query_keys({"lease"}),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("unknown query keys 'yyy', 'zzz'"),
                             HasSubstr("accepts: lease"), Not(HasSubstr("did you mean")))));
}

TEST(UriTest, CheckQueryKeysWithNoKnownKeys) {
  const Result<Uri> uri = Uri::parse("memory://m?lease=1s");
  ASSERT_TRUE(uri.ok()) << uri.status();
  EXPECT_THAT(uri->check_query_keys({}),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'lease'"), HasSubstr("memory:// takes no query keys"))));
}

TEST(UriTest, ToStringOfAHandBuiltUri) {
  Uri uri;
  uri.scheme = "redis";
  uri.user = "a:b";
  uri.hosts = {{"::1", 6379}, {"h", {}}};
  uri.path = "0";  // no leading '/'
  uri.query = {{"k&=", "v&="}};
  EXPECT_EQ(uri.to_string(), "redis://a%3Ab@[::1]:6379,h/0?k%26%3D=v%26=");
}

// ---------------------------------------------------------------------------
// Durations

struct DurationCase {
  std::string text;
  milliseconds value;
};

void PrintTo(const DurationCase& c, std::ostream* os) { *os << c.text; }

class ValidDurationTest : public ::testing::TestWithParam<DurationCase> {};

TEST_P(ValidDurationTest, Parses) {
  const Result<milliseconds> d = parse_duration("ttl", GetParam().text);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, GetParam().value);
}

INSTANTIATE_TEST_SUITE_P(
    Duration, ValidDurationTest,
    ::testing::Values(
        DurationCase{"0ms", milliseconds(0)}, DurationCase{"0h", milliseconds(0)},
        DurationCase{"250ms", milliseconds(250)}, DurationCase{"1500ms", milliseconds(1500)},
        DurationCase{"10s", milliseconds(10'000)}, DurationCase{"010s", milliseconds(10'000)},
        DurationCase{"2m", milliseconds(120'000)}, DurationCase{"1h", milliseconds(3'600'000)},
        DurationCase{"876000h", milliseconds(3'153'600'000'000)},
        DurationCase{"3153600000000ms", milliseconds(3'153'600'000'000)}));

struct BadDurationCase {
  std::string text;
  std::string problem;
};

void PrintTo(const BadDurationCase& c, std::ostream* os) { *os << "'" << c.text << "'"; }

class InvalidDurationTest : public ::testing::TestWithParam<BadDurationCase> {};

TEST_P(InvalidDurationTest, NamesTheParameterTheTextAndTheUnits) {
  const BadDurationCase& c = GetParam();
  EXPECT_THAT(parse_duration("op_timeout", c.text),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("op_timeout: '" + c.text + "'"), HasSubstr(c.problem),
                             HasSubstr("ms, s, m, h"))));
}

INSTANTIATE_TEST_SUITE_P(
    Duration, InvalidDurationTest,
    ::testing::Values(BadDurationCase{"", "is empty"}, BadDurationCase{"10", "has no unit"},
                      BadDurationCase{"0", "has no unit"}, BadDurationCase{"-5s", "is negative"},
                      BadDurationCase{"+5s", "does not start with a number"},
                      BadDurationCase{" 5s", "does not start with a number"},
                      BadDurationCase{"s", "does not start with a number"},
                      BadDurationCase{"1.5s", "is not a whole number"},
                      BadDurationCase{"1,5s", "is not a whole number"},
                      BadDurationCase{"1500us", "unknown unit 'us'"},
                      BadDurationCase{"10S", "unknown unit 'S'"},
                      BadDurationCase{"10 s", "unknown unit ' s'"},
                      BadDurationCase{"10sec", "unknown unit 'sec'"},
                      BadDurationCase{"1d", "unknown unit 'd'"},
                      BadDurationCase{"1h30m", "unknown unit 'h30m'"},
                      BadDurationCase{"876001h", "is too large (at most 876000h"},
                      BadDurationCase{"3153600000001ms", "is too large"},
                      BadDurationCase{"99999999999999999999999999h", "is too large"}));

TEST(DurationTest, FormatPicksTheLargestExactUnit) {
  EXPECT_EQ(format_duration(milliseconds(0)), "0ms");
  EXPECT_EQ(format_duration(milliseconds(1)), "1ms");
  EXPECT_EQ(format_duration(milliseconds(1500)), "1500ms");
  EXPECT_EQ(format_duration(milliseconds(10'000)), "10s");
  EXPECT_EQ(format_duration(milliseconds(61'000)), "61s");
  EXPECT_EQ(format_duration(milliseconds(90'000)), "90s");
  EXPECT_EQ(format_duration(milliseconds(120'000)), "2m");
  EXPECT_EQ(format_duration(milliseconds(5'400'000)), "90m");
  EXPECT_EQ(format_duration(milliseconds(3'600'000)), "1h");
  EXPECT_EQ(format_duration(milliseconds(-1500)), "-1500ms");
  EXPECT_EQ(format_duration(milliseconds(-10'000)), "-10s");
  EXPECT_EQ(format_duration(milliseconds::min()), "-9223372036854775808ms");
  EXPECT_EQ(format_duration(milliseconds::max()), "9223372036854775807ms");
}

TEST(DurationTest, FormatThenParseRoundTrips) {
  for (const std::int64_t ms :
       {0LL, 1LL, 999LL, 1000LL, 1001LL, 59'999LL, 60'000LL, 61'000LL, 3'599'999LL, 3'600'000LL,
        7'200'000LL, 86'400'000LL, 3'153'600'000'000LL}) {
    const Result<milliseconds> parsed = parse_duration("d", format_duration(milliseconds(ms)));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->count(), ms);
  }
}

TEST(DurationTest, ParseThenFormatIsCanonical) {
  const std::map<std::string, std::string> canonical = {
      {"10000ms", "10s"}, {"60s", "1m"}, {"120s", "2m"},  {"90s", "90s"},
      {"60m", "1h"},      {"0s", "0ms"}, {"007ms", "7ms"}};
  for (const auto& [text, expected] : canonical) {
    const Result<milliseconds> parsed = parse_duration("d", text);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(format_duration(*parsed), expected) << text;
  }
}

}  // namespace
}  // namespace simba
