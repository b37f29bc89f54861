// The suites' targets from a store's description. See store.h.
#include "testing/stores/store.h"

#include <algorithm>
#include <cctype>

#include "testing/test_servers.h"

namespace simba::testing {

std::string table_for(const std::string& ns) {
  std::string table = ns;
  std::replace_if(
      table.begin(), table.end(),
      [](char c) { return !(std::isalnum(static_cast<unsigned char>(c)) || c == '_'); }, '_');
  std::transform(table.begin(), table.end(), table.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return table.substr(0, 63);
}

std::string shared_server_of(const StoreDescription& store) {
  return store.server.empty() ? std::string() : shared_server_uri(store.server);
}

std::string store_uri(const StoreDescription& store, const std::string& ns) {
  return store.at(shared_server_of(store), ns);
}

BackendTarget conformance_target_of(const StoreDescription& store) {
  BackendTarget target;
  target.name = store.name;
  target.uri = [store](const std::string& unique) { return store_uri(store, "t-" + unique); };
  target.bad_uris = store.bad_uris;
  target.options = store.lease;
  target.expect = store.expect;
  if (store.restarts) {
    target.server = store.server;
    target.server_args = store.server_args;
    target.uri_on = [at = store.at](const std::string& server_uri, const std::string& unique) {
      return at(server_uri, "t-" + unique);
    };
    target.restart_owner_within = store.restart_owner_within;
  }
  return target;
}

KeyedTarget keyed_target_of(const StoreDescription& store) {
  KeyedTarget target;
  target.name = store.name;
  if (store.keyed_on_server) {
    target.uri = [store](const std::string&) { return shared_server_of(store); };
  } else {
    target.uri = [store](const std::string& unique) { return store_uri(store, "k-" + unique); };
  }
  target.options.lease = store.lease;
  target.crash_freed_within = store.keyed_crash_freed_within;
  target.expect = store.keyed_expect;
  target.store_lists_waiters = store.keyed_store_lists_waiters;
  target.order_tested_by = store.keyed_order_tested_by;
  return target;
}

ClusteredTarget clustered_target_of(const StoreDescription& store) {
  ClusteredTarget target;
  target.name = store.name;
  target.uri = [store](const std::string& unique) { return store_uri(store, "t-" + unique); };
  target.lease = store.lease;
  target.client_library_threads_under_load = store.client_library_threads_under_load;
  return target;
}

}  // namespace simba::testing
