// Leaving a ZooKeeper member that accepts connections but does not answer.
//
// The ZooKeeper C client gives up on a member only after 2/3 of the session
// timeout without a byte from it, connecting or connected alike, and has no
// call that drops a connection while keeping the session (zoo_set_servers
// drops it without failing the requests already sent; zookeeper_close sends
// CloseSession, which a member that resumes later would still carry out).
// So the backend ends the client's socket itself, with shutdown(2), never
// close(2): the client's I/O thread sees the connection end, fails what was
// in flight as a connection loss, closes its own descriptor and moves to
// the next member with the same session (docs/backends/zookeeper.md).
#ifndef SIMBA_BACKENDS_ZOOKEEPER_ZOOKEEPER_SOCKETS_H_
#define SIMBA_BACKENDS_ZOOKEEPER_ZOOKEEPER_SOCKETS_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace simba::internal::zookeeper {

// A TCP peer: an IPv4 or IPv6 address (16 bytes, IPv4 in the first 4) and
// a port.
struct TcpPeer {
  bool v6 = false;
  std::uint8_t address[16] = {};
  std::uint16_t port = 0;

  friend bool operator==(const TcpPeer& a, const TcpPeer& b);
};

// "127.0.0.1:2181", "[::1]:2181" or "::1:2181" (the C client's
// zoo_get_current_server form: the port after the last colon); nullopt for
// anything else.
std::optional<TcpPeer> parse_peer(std::string_view endpoint);

// The socket inodes of /proc/net/tcp (or tcp6) `table` whose remote end is
// `peer` and which are connecting or connected.
std::vector<std::uint64_t> inodes_connected_to(std::string_view table, const TcpPeer& peer);

// Shuts down (SHUT_RDWR, no close) every TCP socket of this process whose
// remote end is `peer`, connecting or connected. Returns how many.
int shut_down_connections_to(const TcpPeer& peer);

// The member and the cause in one of the C client's error lines ("Socket
// 127.0.0.1:2181 zk retcode=-4, errno=111(Connection refused): server
// refused to accept the client" -> {"127.0.0.1:2181", "server refused to
// accept the client (Connection refused)"}), or nullopt for another line.
std::optional<std::pair<std::string, std::string>> member_cause_of_log_line(std::string_view line);

// "member: cause; member: cause" for the members the client (or the
// backend, leaving a silent one) said something of since `since`.
std::string member_causes_since(std::chrono::steady_clock::time_point since);

}  // namespace simba::internal::zookeeper

#endif  // SIMBA_BACKENDS_ZOOKEEPER_ZOOKEEPER_SOCKETS_H_
