// Host name resolution bounded by a store call's deadline, for the backends
// that open their own sockets (Redis, etcd). getaddrinfo() has no timeout and
// a hung DNS server can stall it for minutes; a store call must still return
// by its deadline.
//
// Numeric hosts ("10.0.0.7", "::1") resolve inline. Any other name resolves
// on a detached worker thread while the caller waits until its deadline; a
// caller that gives up leaves the worker to finish (and clean up) on its own.
// Concurrent lookups of the same host and port share one worker, so a hung
// resolver and a reconnect loop do not pile up threads. Answers are not
// cached: the next lookup after one completes asks the resolver again.
//
// Example:
//   SIMBA_ASSIGN_OR_RETURN(std::vector<ResolvedAddress> addresses,
//                          look_up_host(host, port, deadline));
//   for (const ResolvedAddress& a : addresses) {
//     int fd = ::socket(a.family, a.socktype, a.protocol);
//     ::connect(fd, a.address(), a.length);
//   }
//
// Thread safety: every function here may be called from any thread.
#ifndef SIMBA_CORE_HOST_LOOKUP_H_
#define SIMBA_CORE_HOST_LOOKUP_H_

#include <netdb.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "simba/backend.h"
#include "simba/status.h"

namespace simba::internal {

// One address to socket() and connect() to: an owning copy of an addrinfo.
struct ResolvedAddress {
  int family = AF_UNSPEC;
  int socktype = 0;
  int protocol = 0;
  sockaddr_storage storage{};
  socklen_t length = 0;

  const sockaddr* address() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

// The stream (TCP) addresses of `host` at `port`, in the resolver's order
// (never empty on success).
// Errors (messages name no peer: callers prepend "redis at host:port: "):
//   kUnavailable       the resolver failed ("cannot resolve host: <gai_strerror>").
//   kDeadlineExceeded  no answer by `deadline`.
Result<std::vector<ResolvedAddress>> look_up_host(const std::string& host, std::uint16_t port,
                                                  Deadline deadline);

// LookUpHost, also giving up (kCancelled) once `wake_fd` is readable (-1:
// never), for callers that can be cancelled through a wake fd. It looks at
// the fd every 50 ms; each look rejoins the same in-flight lookup, so this
// costs no extra query.
Result<std::vector<ResolvedAddress>> look_up_host_unless_woken(const std::string& host,
                                                               std::uint16_t port,
                                                               Deadline deadline, int wake_fd);

// The numeric form of `address` ("10.0.0.7", "fe80::1%eth0"), as client
// libraries take it in place of a name; "" if it has none.
std::string numeric_address(const ResolvedAddress& address);

// getaddrinfo()'s signature and contract: 0 and `*found` (to be freed with
// freeaddrinfo()), or an EAI_ code.
using GetAddrInfoFunction = std::function<int(const char* host, const char* service,
                                              const addrinfo* hints, addrinfo** found)>;

// Makes name lookups started from now on call `get_addr_info` instead of
// ::getaddrinfo (an empty function restores it). Numeric hosts never call it.
void set_get_addr_info_for_testing(GetAddrInfoFunction get_addr_info);

// Lookups whose worker has not finished yet.
std::size_t host_lookups_in_flight_for_testing();

}  // namespace simba::internal

#endif  // SIMBA_CORE_HOST_LOOKUP_H_
