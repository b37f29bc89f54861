#include "simba/registry.h"

#include <algorithm>
#include <utility>

#include "simba/keyed_lock.h"

// BackendRegistry::global(), open_backend() and register_builtin_backends() are
// in src/registry/builtin_backends.cc: they depend on the optional backends,
// which link against simba_core, so they cannot live in simba_core itself.

namespace simba {
namespace {

// The same rule as Uri::parse applies, so that every registered scheme is
// reachable by some URI.
bool is_valid_scheme(std::string_view scheme) {
  const auto is_alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  if (scheme.empty() || !is_alpha(scheme.front())) return false;
  return std::all_of(scheme.begin(), scheme.end(), [&](char c) {
    return is_alpha(c) || (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.';
  });
}

}  // namespace

Status BackendRegistry::add(std::string scheme, Opener opener) {
  return add(std::move(scheme), StoreEntry{std::move(opener), nullptr, nullptr});
}

Status BackendRegistry::add(std::string scheme, StoreEntry entry) {
  if (!is_valid_scheme(scheme)) {
    return invalid_argument_error("invalid store scheme '" + scheme +
                                  "': a scheme starts with a letter and has only letters, "
                                  "digits, '+', '-' and '.'");
  }
  std::transform(scheme.begin(), scheme.end(), scheme.begin(), [](char c) {
    return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  });
  if (!entry.open) {
    return invalid_argument_error("no opener given for store scheme '" + scheme + "'");
  }
  const std::lock_guard<std::mutex> lock(mu_);
  if (entries_.contains(scheme)) {
    return already_exists_error("store scheme '" + scheme + "' is registered already");
  }
  entries_.emplace(std::move(scheme), std::move(entry));
  return ok_status();
}

Result<BackendRegistry::StoreEntry> BackendRegistry::find(const Uri& uri) const {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    const auto it = entries_.find(uri.scheme);
    if (it != entries_.end()) return it->second;
  }
  // schemes() takes the lock again; it is not held here.
  const std::vector<std::string> schemes = this->schemes();
  std::string supported;
  for (const std::string& scheme : schemes) {
    if (!supported.empty()) supported += ", ";
    supported += scheme;
  }
  return unimplemented_error("unknown store scheme '" + uri.scheme + "' in '" + uri.to_string() +
                             "'; " +
                             (schemes.empty() ? std::string("no store schemes are registered")
                                              : "this build supports: " + supported));
}

Result<std::shared_ptr<Backend>> BackendRegistry::open(std::string_view text) const {
  SIMBA_ASSIGN_OR_RETURN(const Uri uri, Uri::parse(text));
  SIMBA_ASSIGN_OR_RETURN(const StoreEntry entry, find(uri));
  // Called without the lock: opening may connect to a server and take a
  // while, and an opener may itself use the registry.
  Result<std::shared_ptr<Backend>> backend = entry.open(uri);
  if (!backend.ok()) return backend.status().with_context("opening " + uri.to_string());
  if (*backend == nullptr) {
    return internal_error("the opener for store scheme '" + uri.scheme +
                          "' returned no backend for " + uri.to_string());
  }
  return backend;
}

Result<std::shared_ptr<KeyedLockBackend>> BackendRegistry::open_keyed(
    std::string_view text, const KeyedLockOptions& options) const {
  SIMBA_ASSIGN_OR_RETURN(const Uri uri, Uri::parse(text));
  SIMBA_ASSIGN_OR_RETURN(const StoreEntry entry, find(uri));
  if (entry.open_keyed) {
    Result<std::shared_ptr<KeyedLockBackend>> keyed = entry.open_keyed(uri, options);
    if (keyed.ok() && *keyed == nullptr) {
      return internal_error("the keyed opener for store scheme '" + uri.scheme +
                            "' returned no backend for " + uri.to_string());
    }
    return keyed;
  }
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, open(text));
  return new_lease_keyed_lock_backend(std::move(backend), options.lease, options.metrics,
                                      options.events);
}

Result<std::string> BackendRegistry::schema(std::string_view text) const {
  SIMBA_ASSIGN_OR_RETURN(const Uri uri, Uri::parse(text));
  SchemaMaker schema;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    const auto it = entries_.find(uri.scheme);
    if (it != entries_.end()) schema = it->second.schema;
  }
  if (!schema) {
    return unimplemented_error("'" + uri.scheme +
                               "' stores have no table for a DBA to create (only SQL servers do; "
                               "the backend creates what it needs)");
  }
  return schema(uri);
}

std::vector<std::string> BackendRegistry::schemes() const {
  const std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> schemes;
  schemes.reserve(entries_.size());
  for (const auto& entry : entries_) schemes.push_back(entry.first);
  return schemes;
}

}  // namespace simba
