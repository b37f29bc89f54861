// File: simba/uri.h
//
// Store URIs and duration strings, shared by the registry, the backends'
// option parsers and the CLI.
//
//   scheme://[user[:password]@]host[:port][,host[:port]...][/path][?k=v&k2=v2]
//
// Examples:
//   memory://orders                       host "orders"
//   sqlite:///var/lib/app/simba.db        no host, path "/var/lib/app/simba.db"
//   sqlite://relative/dir/simba.db?busy_timeout=2s
//                                         host "relative", path "/dir/simba.db":
//                                         the sqlite backend joins them again
//   redis://:secret@127.0.0.1:6379/0
//   zookeeper://h1:2181,h2:2181/chroot
//   redis://[::1]:6379                    IPv6 host "::1" (stored without brackets)
//
// Percent-escapes (%41) are decoded in user, password, path and query keys and
// values, not in host names. A password may hold ':' and '@' as they are, but
// '/', '?' and '%' must be escaped (%2F, %3F, %25), or the URI will not mean
// what it seems to.
//
// Secrets: to_string() never shows the password ("****"), nor the value of a
// query key that names a secret (containing "password", "passwd", "secret" or
// "token", or equal to "pass", "pwd" or "auth"). Parse errors quote the URI
// the same way, and may hide more than that when the URI is malformed.
//
// Durations carry units: "250ms", "10s", "2m", "1h". A bare number is rejected
// (to avoid guessing), and so is "1500us" (whole milliseconds only).
//
// Thread safety: values.

#ifndef SIMBA_URI_H_
#define SIMBA_URI_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "simba/status.h"

namespace simba {

struct UriHost {
  std::string host;
  std::optional<std::uint16_t> port;
  friend bool operator==(const UriHost&, const UriHost&) = default;
};

struct Uri {
  std::string scheme;  // lower-cased
  // Absent when the URI has none or an empty one ("redis://:pw@host").
  std::optional<std::string> user;
  // Present (maybe empty) whenever the user info has a ':'.
  std::optional<std::string> password;
  std::vector<UriHost> hosts;  // empty for "sqlite:///abs/path"
  std::string path;            // including the leading '/', decoded
  std::map<std::string, std::string> query;

  // Parses `text`. Errors (kInvalidArgument) name what is wrong and quote the
  // offending part (never a secret): a missing "://", an empty or invalid
  // scheme, a bad host, a port outside 1..65535, a bad or NUL (%00) escape, a
  // query parameter without '=', a duplicate query key, a control character.
  static Result<Uri> parse(std::string_view text);

  // The URI with the password and secret query values replaced by "****"
  // (safe to log). For a Uri that parse() returned and that holds no
  // secret, parse(to_string()) gives it back.
  std::string to_string() const;

  // The query value for `key`, if present.
  std::optional<std::string> query_value(std::string_view key) const;

  // Errors (kInvalidArgument) if the query has a key not in `known`, naming
  // the key and the known ones: typos must not be silently ignored.
  Status check_query_keys(const std::vector<std::string_view>& known) const;

  friend bool operator==(const Uri&, const Uri&) = default;
};

// Parses "250ms", "10s", "2m", "1h": one non-negative whole number and one
// unit (ms, s, m, h), nothing else, at most 876000h (100 years). Errors
// (kInvalidArgument) name the parameter, quote the text and list the units:
// parse_duration("ttl", "10") -> "ttl: '10' has no unit; write a whole ...".
Result<std::chrono::milliseconds> parse_duration(std::string_view parameter, std::string_view text);

// Formats a duration the way ParseDuration reads it, in the largest unit that
// divides it exactly (1500ms -> "1500ms", 10000ms -> "10s", 0 -> "0ms"). A
// negative duration gets a '-', which ParseDuration does not accept.
std::string format_duration(std::chrono::milliseconds d);

}  // namespace simba

#endif  // SIMBA_URI_H_
