#include "simba/uri.h"

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <utility>

namespace simba {
namespace {

constexpr std::string_view kHidden = "****";

bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_control(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u < 0x20 || u == 0x7f;
}
char to_lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string lower_cased(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = to_lower(c);
  return out;
}

// RFC 3986 "unreserved": a host name outside brackets is limited to these so
// that a stray space, quote or '%' is reported instead of reaching a resolver.
bool is_host_char(char c) {
  return is_alpha(c) || is_digit(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

// libpq and others accept credentials as query parameters; their values get
// the same protection as the password.
bool is_secret_query_key(std::string_view key) {
  const std::string lower = lower_cased(key);
  for (std::string_view word : {"password", "passwd", "secret", "token"}) {
    if (lower.find(word) != std::string::npos) return true;
  }
  return lower == "pass" || lower == "pwd" || lower == "auth";
}

// `s` with each byte for which `escape` holds written as `format` (a printf
// format for the byte).
template <class Pred>
std::string escape(std::string_view s, const char* format, Pred escape) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (escape(c)) {
      char buf[8];
      std::snprintf(buf, sizeof buf, format, static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

// Control characters are shown escaped so that, e.g., a newline read from a
// config file is visible in the message instead of breaking it.
std::string printable(std::string_view s) { return escape(s, "\\x%02x", is_control); }

// Percent-encodes what would otherwise be read back differently (`reserved`),
// '%', blanks and control characters; everything else stays readable.
std::string encode(std::string_view s, std::string_view reserved) {
  return escape(s, "%%%02X", [reserved](char c) {
    return static_cast<unsigned char>(c) <= 0x20 || is_control(c) || c == '%' ||
           reserved.find(c) != std::string_view::npos;
  });
}

// Calls `item` with each piece of `list` between `separator`s, empty ones
// included, until it returns an error.
template <class Fn>
Status for_each_item(std::string_view list, char separator, Fn item) {
  for (;;) {
    const std::size_t end = list.find(separator);
    SIMBA_RETURN_IF_ERROR(item(list.substr(0, end)));
    if (end == std::string_view::npos) return ok_status();
    list.remove_prefix(end + 1);
  }
}

bool is_valid_scheme(std::string_view scheme) {
  if (scheme.empty() || !is_alpha(scheme.front())) return false;
  return std::all_of(scheme.begin(), scheme.end(), [](char c) {
    return is_alpha(c) || is_digit(c) || c == '+' || c == '-' || c == '.';
  });
}

std::string join_quoted(const std::vector<std::string_view>& items) {
  std::string out;
  for (std::string_view item : items) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out;
}

// Levenshtein distance, for "did you mean" on a mistyped query key.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// Parses one URI. Its main job besides parsing is keeping secrets out of
// error messages: every message quotes the URI with the password (and secret
// query values) hidden, and never quotes a fragment that overlaps them.
class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) { find_secrets(); }

  Result<Uri> parse();

 private:
  struct Range {
    std::size_t begin;
    std::size_t end;
    bool password;  // else a secret query value
  };

  void find_secrets();
  void hide(std::string_view piece, bool password);
  // The hidden range `piece` overlaps, if any.
  const Range* hidden_range(std::string_view piece) const;
  std::string redacted() const;

  // "<what> '<piece>'<detail> in store URI '<redacted>'", leaving the piece
  // out when it may contain a secret.
  Status fail(std::string_view what, std::string_view piece = {},
              std::string_view detail = {}) const;

  // `secret`: quote nothing from `raw` in errors.
  Result<std::string> decode(std::string_view raw, std::string_view where,
                             bool secret = false) const;
  Status parse_hosts(std::string_view host_list, Uri& uri) const;
  Status parse_host(std::string_view entry, Uri& uri) const;
  Result<std::uint16_t> parse_port(std::string_view port, std::string_view entry) const;
  Status parse_query(std::string_view query, Uri& uri) const;

  std::string_view text_;
  std::vector<Range> hidden_;
};

void Parser::hide(std::string_view piece, bool password) {
  const auto begin = static_cast<std::size_t>(piece.data() - text_.data());
  hidden_.push_back({begin, begin + piece.size(), password});
}

const Parser::Range* Parser::hidden_range(std::string_view piece) const {
  if (piece.empty()) return nullptr;
  const auto begin = static_cast<std::size_t>(piece.data() - text_.data());
  const std::size_t end = begin + piece.size();
  const auto it = std::find_if(hidden_.begin(), hidden_.end(),
                               [&](const Range& r) { return begin < r.end && r.begin < end; });
  return it == hidden_.end() ? nullptr : &*it;
}

// Works on the raw text, before (and whether or not) it parses, and errs on
// the side of hiding: a password holding an unescaped '/' or '?' would end
// the authority early, so the password is taken to run from the first ':'
// after "://" to the LAST '@' anywhere. Without a usable "://" the search
// starts at the beginning, which covers "redis:/:pw@host" typos.
void Parser::find_secrets() {
  std::size_t start = 0;
  if (const std::size_t sep = text_.find("://"); sep != std::string_view::npos) {
    const std::string_view scheme = text_.substr(0, sep);
    if (scheme.find_first_of(":@") == std::string_view::npos) start = sep + 3;
  }
  if (const std::size_t at = text_.rfind('@'); at != std::string_view::npos && at >= start) {
    if (const std::size_t colon = text_.find(':', start); colon < at) {
      hide(text_.substr(colon + 1, at - colon - 1), /*password=*/true);
    }
  }
  if (const std::size_t q = text_.find('?', start); q != std::string_view::npos) {
    (void)for_each_item(text_.substr(q + 1), '&', [this](std::string_view item) {
      if (const std::size_t eq = item.find('='); eq != std::string_view::npos) {
        // The raw key is good enough here: "pass%77ord" is not worth decoding.
        if (is_secret_query_key(item.substr(0, eq))) hide(item.substr(eq + 1), /*password=*/false);
      }
      return ok_status();
    });
  }
  std::sort(hidden_.begin(), hidden_.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
}

std::string Parser::redacted() const {
  std::string out;
  std::size_t pos = 0;
  for (const Range& r : hidden_) {
    if (r.end <= pos) continue;
    if (r.begin > pos) out += printable(text_.substr(pos, r.begin - pos));
    out += kHidden;
    pos = r.end;
  }
  if (pos < text_.size()) out += printable(text_.substr(pos));
  return out;
}

Status Parser::fail(std::string_view what, std::string_view piece, std::string_view detail) const {
  std::string message(what);
  const Range* hidden = hidden_range(piece);
  if (piece.data() != nullptr && hidden == nullptr) {
    message += " '";
    message += printable(piece);
    message += "'";
  }
  message += detail;
  message += " in store URI '";
  message += redacted();
  message += "'";
  if (hidden != nullptr && hidden->password) {
    // Only a password holding an unescaped '/' or '?' (or an '@' in the path
    // or query) makes a parsed piece run into the password.
    message += "; if the password has '/', '?' or '%' in it, write them as %2F, %3F and %25";
  }
  return invalid_argument_error(std::move(message));
}

Result<std::string> Parser::decode(std::string_view raw, std::string_view where,
                                   bool secret) const {
  std::string out;
  out.reserve(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '%') {
      out += raw[i];
      continue;
    }
    const std::string_view escape = raw.substr(i, 3);
    const int hi = escape.size() == 3 ? hex_value(escape[1]) : -1;
    const int lo = escape.size() == 3 ? hex_value(escape[2]) : -1;
    if (hi < 0 || lo < 0) {
      return fail("bad percent-escape", secret ? std::string_view() : escape,
                  std::string(" in ") + std::string(where) +
                      " (expected '%' and two hex digits; write a literal '%' as %25)");
    }
    if (hi == 0 && lo == 0) {
      // C clients would silently cut the string at the NUL.
      return fail("'%00' (a NUL byte) is not allowed in " + std::string(where));
    }
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

Result<std::uint16_t> Parser::parse_port(std::string_view port, std::string_view entry) const {
  if (port.empty()) return fail("empty port after ':' in host", entry);
  if (!std::all_of(port.begin(), port.end(), is_digit)) {
    return fail("invalid port", port, " (expected a number from 1 to 65535)");
  }
  std::uint32_t value = 0;
  const auto parsed = std::from_chars(port.data(), port.data() + port.size(), value);
  if (parsed.ec != std::errc() || value == 0 || value > 65535) {
    return fail("port", port, " is out of range (expected a number from 1 to 65535)");
  }
  return static_cast<std::uint16_t>(value);
}

Status Parser::parse_host(std::string_view entry, Uri& uri) const {
  UriHost host;
  std::string_view port;
  bool has_port = false;
  if (entry.front() == '[') {
    const std::size_t close = entry.find(']');
    if (close == std::string_view::npos) return fail("missing ']' after IPv6 address", entry);
    const std::string_view address = entry.substr(1, close - 1);
    const bool valid = address.find(':') != std::string_view::npos &&
                       std::all_of(address.begin(), address.end(), [](char c) {
                         return hex_value(c) >= 0 || c == ':' || c == '.';
                       });
    if (!valid) return fail("invalid IPv6 address", address);
    host.host = std::string(address);
    const std::string_view after = entry.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') {
        return fail("unexpected text", after, " after ']' (expected ':port')");
      }
      port = after.substr(1);
      has_port = true;
    }
  } else {
    const std::size_t colon = entry.find(':');
    const std::string_view name = entry.substr(0, colon);
    if (colon != std::string_view::npos) {
      if (entry.find(':', colon + 1) != std::string_view::npos) {
        return fail("host", entry,
                    " has more than one ':' (write an IPv6 address in brackets, e.g. "
                    "[::1]:6379)");
      }
      port = entry.substr(colon + 1);
      has_port = true;
      if (name.empty()) return fail("port without a host name:", entry);
    }
    if (const auto bad = std::find_if_not(name.begin(), name.end(), is_host_char);
        bad != name.end()) {
      return fail("invalid character in host name", name,
                  " (host names use letters, digits, '-', '.', '_' and '~')");
    }
    host.host = std::string(name);
  }
  if (has_port) {
    SIMBA_ASSIGN_OR_RETURN(host.port, parse_port(port, entry));
  }
  uri.hosts.push_back(std::move(host));
  return ok_status();
}

Status Parser::parse_hosts(std::string_view host_list, Uri& uri) const {
  if (host_list.empty()) return ok_status();
  return for_each_item(host_list, ',', [&](std::string_view entry) {
    if (entry.empty()) return fail("empty entry in host list", host_list);
    return parse_host(entry, uri);
  });
}

Status Parser::parse_query(std::string_view query, Uri& uri) const {
  return for_each_item(query, '&', [&](std::string_view item) -> Status {
    // Empty items ("a=1&&b=2", a trailing '&') carry no meaning to get wrong.
    if (item.empty()) return ok_status();
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return fail("query parameter", item, " has no value (expected key=value)");
    }
    if (eq == 0) return fail("query parameter", item, " has an empty key");
    const std::string_view raw_key = item.substr(0, eq);
    SIMBA_ASSIGN_OR_RETURN(std::string key, decode(raw_key, "a query key"));
    SIMBA_ASSIGN_OR_RETURN(
        std::string value,
        decode(item.substr(eq + 1), "the value of query key '" + printable(key) + "'",
               is_secret_query_key(key)));
    if (uri.query.contains(key)) return fail("duplicate query key", raw_key);
    uri.query.emplace(std::move(key), std::move(value));
    return ok_status();
  });
}

Result<Uri> Parser::parse() {
  if (text_.empty()) return invalid_argument_error("empty store URI (expected scheme://...)");
  if (const auto bad = std::find_if(text_.begin(), text_.end(), is_control); bad != text_.end()) {
    return fail("control character " + printable(std::string_view(&*bad, 1)) + " at byte " +
                std::to_string(bad - text_.begin()));
  }
  const std::size_t sep = text_.find("://");
  if (sep == std::string_view::npos) {
    return fail(
        "missing \"://\" (expected scheme://[user[:password]@]host[:port][/path][?key=value])");
  }
  const std::string_view scheme = text_.substr(0, sep);
  if (scheme.empty()) return fail("empty scheme before \"://\"");
  if (!is_valid_scheme(scheme)) {
    return fail("invalid scheme", scheme,
                " (a scheme starts with a letter and has only letters, digits, '+', '-' and "
                "'.')");
  }

  Uri uri;
  uri.scheme = lower_cased(scheme);

  std::string_view rest = text_.substr(sep + 3);
  const std::size_t authority_end = rest.find_first_of("/?");
  std::string_view authority = rest.substr(0, authority_end);
  rest.remove_prefix(std::min(authority_end, rest.size()));

  // The last '@', so that an unescaped '@' in the password still parses.
  if (const std::size_t at = authority.rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = authority.substr(0, at);
    authority.remove_prefix(at + 1);
    const std::size_t colon = userinfo.find(':');
    SIMBA_ASSIGN_OR_RETURN(std::string user, decode(userinfo.substr(0, colon), "the user name"));
    if (!user.empty()) uri.user = std::move(user);
    if (colon != std::string_view::npos) {
      SIMBA_ASSIGN_OR_RETURN(uri.password,
                             decode(userinfo.substr(colon + 1), "the password", /*secret=*/true));
    }
  }
  SIMBA_RETURN_IF_ERROR(parse_hosts(authority, uri));

  const std::size_t question = rest.find('?');
  SIMBA_ASSIGN_OR_RETURN(uri.path, decode(rest.substr(0, question), "the path"));
  if (question != std::string_view::npos) {
    SIMBA_RETURN_IF_ERROR(parse_query(rest.substr(question + 1), uri));
  }
  return uri;
}

}  // namespace

Result<Uri> Uri::parse(std::string_view text) { return Parser(text).parse(); }

std::string Uri::to_string() const {
  std::string out = scheme + "://";
  if (user.has_value() || password.has_value()) {
    if (user.has_value()) out += encode(*user, ":@/?");
    if (password.has_value()) {
      out += ':';
      out += kHidden;
    }
    out += '@';
  }
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    if (i > 0) out += ',';
    const bool bracket = hosts[i].host.find(':') != std::string::npos;
    if (bracket) out += '[';
    out += hosts[i].host;
    if (bracket) out += ']';
    if (hosts[i].port.has_value()) out += ':' + std::to_string(*hosts[i].port);
  }
  if (!path.empty() && path.front() != '/') out += '/';
  out += encode(path, "?");
  char separator = '?';
  for (const auto& [key, value] : query) {
    out += separator;
    separator = '&';
    out += encode(key, "&=");
    out += '=';
    out += is_secret_query_key(key) ? std::string(kHidden) : encode(value, "&");
  }
  return out;
}

std::optional<std::string> Uri::query_value(std::string_view key) const {
  const auto it = query.find(std::string(key));
  if (it == query.end()) return std::nullopt;
  return it->second;
}

Status Uri::check_query_keys(const std::vector<std::string_view>& known) const {
  std::vector<std::string_view> unknown;
  for (const auto& entry : query) {
    if (std::find(known.begin(), known.end(), entry.first) == known.end()) {
      unknown.push_back(entry.first);
    }
  }
  if (unknown.empty()) return ok_status();

  std::string message = unknown.size() == 1 ? "unknown query key '" : "unknown query keys '";
  for (std::size_t i = 0; i < unknown.size(); ++i) {
    if (i > 0) message += "', '";
    message += printable(unknown[i]);
  }
  message += "' in store URI '" + printable(to_string()) + "'; ";
  if (known.empty()) {
    message += scheme + ":// takes no query keys";
  } else {
    std::vector<std::string_view> sorted = known;
    std::sort(sorted.begin(), sorted.end());
    message += scheme + ":// accepts: " + join_quoted(sorted);
    // A suggestion only for a single near miss: with several unknown keys
    // the list above says enough.
    if (unknown.size() == 1) {
      std::string_view best;
      std::size_t best_distance = 3;  // more than 2 edits is not a typo
      for (std::string_view candidate : sorted) {
        if (const std::size_t d = edit_distance(unknown[0], candidate); d < best_distance) {
          best = candidate;
          best_distance = d;
        }
      }
      if (!best.empty()) message += " (did you mean '" + std::string(best) + "'?)";
    }
  }
  return invalid_argument_error(std::move(message));
}

namespace {

struct DurationUnit {
  std::string_view suffix;
  std::int64_t millis;
};

// Largest first, for FormatDuration.
constexpr DurationUnit kDurationUnits[] = {
    {"h", 3'600'000}, {"m", 60'000}, {"s", 1'000}, {"ms", 1}};

// 100 years. Anything larger is a mistake, and the cap keeps `now + d` far
// from overflowing steady_clock's nanoseconds.
constexpr std::int64_t kMaxDurationMillis = 876'000LL * 3'600'000;

constexpr std::string_view kDurationHelp =
    "write a whole number followed by one of the units ms, s, m, h (e.g. \"250ms\", \"10s\", "
    "\"2m\", \"1h\")";

}  // namespace

Result<std::chrono::milliseconds> parse_duration(std::string_view parameter,
                                                 std::string_view text) {
  const auto fail = [&](std::string_view problem) {
    return invalid_argument_error(std::string(parameter) + ": '" + printable(text) + "' " +
                                  std::string(problem) + "; " + std::string(kDurationHelp));
  };
  if (text.empty()) return fail("is empty");
  if (text.front() == '-') return fail("is negative");
  const std::size_t digits =
      static_cast<std::size_t>(std::find_if_not(text.begin(), text.end(), is_digit) - text.begin());
  if (digits == 0) return fail("does not start with a number");
  const std::string_view number = text.substr(0, digits);
  const std::string_view unit_text = text.substr(digits);
  if (!unit_text.empty() && (unit_text.front() == '.' || unit_text.front() == ',')) {
    return fail("is not a whole number");
  }
  if (unit_text.empty()) return fail("has no unit");
  const auto unit = std::find_if(std::begin(kDurationUnits), std::end(kDurationUnits),
                                 [&](const DurationUnit& u) { return u.suffix == unit_text; });
  if (unit == std::end(kDurationUnits)) {
    return fail("has an unknown unit '" + printable(unit_text) + "'");
  }
  const std::int64_t limit = kMaxDurationMillis / unit->millis;
  std::int64_t value = 0;
  for (char c : number) {
    value = value * 10 + (c - '0');
    if (value > limit) {
      return fail("is too large (at most " +
                  format_duration(std::chrono::milliseconds(kMaxDurationMillis)) +
                  ", about 100 years)");
    }
  }
  return std::chrono::milliseconds(value * unit->millis);
}

std::string format_duration(std::chrono::milliseconds d) {
  const std::int64_t count = d.count();
  if (count == 0) return "0ms";
  // Unsigned, so that the most negative value has a magnitude too.
  const std::uint64_t magnitude =
      count < 0 ? 0 - static_cast<std::uint64_t>(count) : static_cast<std::uint64_t>(count);
  const std::string sign = count < 0 ? "-" : "";
  for (const DurationUnit& unit : kDurationUnits) {
    const auto unit_millis = static_cast<std::uint64_t>(unit.millis);
    if (magnitude % unit_millis == 0) {
      return sign + std::to_string(magnitude / unit_millis) + std::string(unit.suffix);
    }
  }
  return sign + std::to_string(magnitude) + "ms";  // unreachable: "ms" divides all
}

}  // namespace simba
