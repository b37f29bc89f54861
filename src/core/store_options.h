// Option checks that several stores' URIs and options share: the key prefix
// (Redis, etcd) and the positive durations every store takes from its URI.
#ifndef SIMBA_CORE_STORE_OPTIONS_H_
#define SIMBA_CORE_STORE_OPTIONS_H_

#include <algorithm>
#include <chrono>
#include <string>
#include <string_view>

#include "simba/status.h"
#include "simba/uri.h"

namespace simba::internal {

// 'text': a name or value between single quotes, for error messages.
inline std::string in_quotes(std::string_view text) { return "'" + std::string(text) + "'"; }

// Plain characters only (1 to 128 of A-Z a-z 0-9 _ - . :): the prefix goes
// into key patterns (no glob characters), must not open a Redis hash tag (no
// braces), and on etcd is one segment of every key (no '/').
inline Status validate_key_prefix(std::string_view store, std::string_view prefix) {
  const bool plain = std::all_of(prefix.begin(), prefix.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.' || c == ':';
  });
  if (prefix.empty() || prefix.size() > 128 || !plain) {
    return invalid_argument_error(std::string(store) + ": key_prefix '" + std::string(prefix) +
                                  "' must be 1 to 128 characters from A-Z a-z 0-9 _ - . :");
  }
  return ok_status();
}

// The URI's query `key`, when given, into *out; it must be positive.
inline Status read_positive_duration(const Uri& uri, std::string_view store, std::string_view key,
                                     std::chrono::milliseconds* out) {
  const auto value = uri.query_value(key);
  if (!value) return ok_status();
  SIMBA_ASSIGN_OR_RETURN(*out, parse_duration(key, *value));
  if (*out <= std::chrono::milliseconds::zero()) {
    return invalid_argument_error(std::string(store) + ": " + std::string(key) +
                                  " must be positive");
  }
  return ok_status();
}

// A host and port given in options.
inline Status validate_host_port(std::string_view store, std::string_view host, int port) {
  if (host.empty()) return invalid_argument_error(std::string(store) + ": host must not be empty");
  if (port <= 0 || port > 65535) {
    return invalid_argument_error(std::string(store) + ": port must be in 1..65535");
  }
  return ok_status();
}

// What options with a connect timeout and a key prefix must have.
inline Status validate_timeout_and_prefix(std::string_view store,
                                          std::chrono::milliseconds connect_timeout,
                                          std::string_view key_prefix) {
  if (connect_timeout <= std::chrono::milliseconds::zero()) {
    return invalid_argument_error(std::string(store) + ": connect_timeout must be positive");
  }
  return validate_key_prefix(store, key_prefix);
}

// A URI of `scheme`.
inline Status check_scheme(const Uri& uri, std::string_view scheme) {
  if (uri.scheme == scheme) return ok_status();
  return invalid_argument_error(std::string(scheme) + ": URI scheme is '" + uri.scheme +
                                "', expected '" + std::string(scheme) + "'");
}

}  // namespace simba::internal

#endif  // SIMBA_CORE_STORE_OPTIONS_H_
