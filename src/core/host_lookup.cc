#include "core/host_lookup.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "core/worker.h"

namespace simba::internal {
namespace {

using HostAndPort = std::pair<std::string, std::uint16_t>;
using Addresses = std::vector<ResolvedAddress>;

// One worker's lookup, shared by the worker and every caller waiting for it:
// whoever lets go last frees it.
struct Lookup {
  std::condition_variable finished;
  // Set once, by the worker. Guarded by Registry::mu.
  std::optional<Result<Addresses>> result;
};

struct Registry {
  std::mutex mu;
  // Lookups whose worker is still running. Guarded by mu.
  std::map<HostAndPort, std::shared_ptr<Lookup>> in_flight;
  // Empty: ::getaddrinfo. Guarded by mu.
  GetAddrInfoFunction get_addr_info;
};

Registry& the_registry() {
  // Never destroyed: a detached worker may still finish after main() returns.
  static Registry* const kRegistry = new Registry;
  return *kRegistry;
}

Addresses copy_addresses(const addrinfo* list) {
  Addresses addresses;
  for (const addrinfo* a = list; a != nullptr; a = a->ai_next) {
    if (a->ai_addr == nullptr || a->ai_addrlen > sizeof(sockaddr_storage)) continue;
    ResolvedAddress& copy = addresses.emplace_back();
    copy.family = a->ai_family;
    copy.socktype = a->ai_socktype;
    copy.protocol = a->ai_protocol;
    std::memcpy(&copy.storage, a->ai_addr, a->ai_addrlen);
    copy.length = a->ai_addrlen;
  }
  return addresses;
}

// Calls `get_addr_info` (::getaddrinfo when empty) for TCP addresses.
// `numeric_only` forbids it to ask a name service, so it cannot block.
Result<Addresses> resolve(const GetAddrInfoFunction& get_addr_info, const std::string& host,
                          std::uint16_t port, bool numeric_only) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (numeric_only ? AI_NUMERICHOST : 0);
  const std::string service = std::to_string(port);
  addrinfo* found = nullptr;
  errno = 0;
  const int rc = get_addr_info ? get_addr_info(host.c_str(), service.c_str(), &hints, &found)
                               : ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) {
    std::string reason = gai_strerror(rc);
    if (rc == EAI_SYSTEM && errno != 0) reason += std::string(": ") + std::strerror(errno);
    return unavailable_error("cannot resolve host: " + reason);
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, &::freeaddrinfo);
  Addresses addresses = copy_addresses(found);
  if (addresses.empty()) return unavailable_error("cannot resolve host: no address");
  return addresses;
}

void work(const std::shared_ptr<Lookup>& lookup, const HostAndPort& key,
          const GetAddrInfoFunction& get_addr_info) {
  name_this_thread("lookup");
  Result<Addresses> result = resolve(get_addr_info, key.first, key.second, false);
  Registry& registry = the_registry();
  {
    std::lock_guard<std::mutex> lock(registry.mu);
    // Gone from the map before the answer is out: a lookup that starts
    // after this one finished asks the resolver afresh.
    if (const auto it = registry.in_flight.find(key);
        it != registry.in_flight.end() && it->second == lookup) {
      registry.in_flight.erase(it);
    }
    lookup->result.emplace(std::move(result));
  }
  lookup->finished.notify_all();
}

Status too_late() { return deadline_exceeded_error("cannot resolve host within the deadline"); }

}  // namespace

Result<std::vector<ResolvedAddress>> look_up_host(const std::string& host, std::uint16_t port,
                                                  Deadline deadline) {
  if (Result<Addresses> numeric = resolve(nullptr, host, port, true); numeric.ok()) {
    return numeric;
  }

  Registry& registry = the_registry();
  std::unique_lock<std::mutex> lock(registry.mu);
  HostAndPort key(host, port);
  std::shared_ptr<Lookup> lookup;
  if (const auto it = registry.in_flight.find(key); it != registry.in_flight.end()) {
    lookup = it->second;
  } else {
    // Not worth a thread: its answer could not be used.
    if (std::chrono::steady_clock::now() >= deadline) return too_late();
    lookup = std::make_shared<Lookup>();
    registry.in_flight.emplace(key, lookup);
    try {
      // The worker holds its own references: it may outlive every caller.
      std::thread([lookup, key, get_addr_info = registry.get_addr_info] {
        work(lookup, key, get_addr_info);
      }).detach();
    } catch (const std::system_error& e) {
      registry.in_flight.erase(key);
      return unavailable_error(std::string("cannot resolve host: cannot start a thread: ") +
                               e.what());
    }
  }

  const auto answered = [&] { return lookup->result.has_value(); };
  if (deadline == Deadline::max()) {
    lookup->finished.wait(lock, answered);
  } else if (!lookup->finished.wait_until(lock, deadline, answered)) {
    return too_late();
  }
  // A copy: other callers may be waiting for the same answer.
  return *lookup->result;
}

Result<std::vector<ResolvedAddress>> look_up_host_unless_woken(const std::string& host,
                                                               std::uint16_t port,
                                                               Deadline deadline, int wake_fd) {
  constexpr std::chrono::milliseconds kWakeCheckInterval(50);
  const auto readable = [](int fd) {
    pollfd p = {fd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0;
  };
  for (;;) {
    if (wake_fd >= 0 && readable(wake_fd)) {
      return cancelled_error("cancelled while resolving the host");
    }
    const Deadline slice =
        wake_fd < 0 ? deadline
                    : std::min(deadline, std::chrono::steady_clock::now() + kWakeCheckInterval);
    Result<std::vector<ResolvedAddress>> found = look_up_host(host, port, slice);
    if (found.ok() || found.status().code() != StatusCode::kDeadlineExceeded || slice == deadline) {
      return found;
    }
  }
}

std::string numeric_address(const ResolvedAddress& address) {
  char text[NI_MAXHOST] = {};
  if (::getnameinfo(address.address(), address.length, text, sizeof text, nullptr, 0,
                    NI_NUMERICHOST) != 0) {
    return "";
  }
  return text;
}

void set_get_addr_info_for_testing(GetAddrInfoFunction get_addr_info) {
  Registry& registry = the_registry();
  std::lock_guard<std::mutex> lock(registry.mu);
  registry.get_addr_info = std::move(get_addr_info);
}

std::size_t host_lookups_in_flight_for_testing() {
  Registry& registry = the_registry();
  std::lock_guard<std::mutex> lock(registry.mu);
  return registry.in_flight.size();
}

}  // namespace simba::internal
