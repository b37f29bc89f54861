#include "backends/zookeeper/zookeeper_sockets.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

namespace simba::internal::zookeeper {
namespace {

// Connecting or connected, in /proc/net/tcp's "st" column (TCP_ESTABLISHED,
// TCP_SYN_SENT).
constexpr std::string_view kEstablished = "01";
constexpr std::string_view kSynSent = "02";

bool parse_hex32(std::string_view text, std::uint32_t* value) {
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value, 16);
  return error == std::errc() && end == text.data() + text.size();
}

// /proc/net/tcp's "0100007F:0885": each 32-bit word of the address as the
// kernel holds it (network order in memory, printed as a native integer),
// then the port in host order.
std::optional<TcpPeer> parse_proc_address(std::string_view text, bool v6) {
  const std::size_t colon = text.find(':');
  const std::size_t words = v6 ? 4 : 1;
  if (colon != words * 8 || text.size() != colon + 5) return std::nullopt;
  TcpPeer peer;
  peer.v6 = v6;
  for (std::size_t i = 0; i < words; ++i) {
    std::uint32_t word = 0;
    if (!parse_hex32(text.substr(i * 8, 8), &word)) return std::nullopt;
    std::memcpy(peer.address + i * 4, &word, 4);
  }
  std::uint32_t port = 0;
  if (!parse_hex32(text.substr(colon + 1), &port) || port > 0xffff) return std::nullopt;
  peer.port = static_cast<std::uint16_t>(port);
  return peer;
}

std::string read_file(const char* path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The inode of socket descriptor `fd` ("socket:[123]"), or 0.
std::uint64_t socket_inode(const std::string& fd_path) {
  char target[64];
  const ssize_t n = readlink(fd_path.c_str(), target, sizeof target - 1);
  if (n <= 0) return 0;
  const std::string_view link(target, static_cast<std::size_t>(n));
  constexpr std::string_view kPrefix = "socket:[";
  if (link.substr(0, kPrefix.size()) != kPrefix || link.back() != ']') return 0;
  std::uint64_t inode = 0;
  const std::string_view digits = link.substr(kPrefix.size(), link.size() - kPrefix.size() - 1);
  auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), inode);
  return error == std::errc() && end == digits.data() + digits.size() ? inode : 0;
}

}  // namespace

bool operator==(const TcpPeer& a, const TcpPeer& b) {
  const std::size_t size = a.v6 ? 16 : 4;
  return a.v6 == b.v6 && a.port == b.port && std::memcmp(a.address, b.address, size) == 0;
}

std::optional<TcpPeer> parse_peer(std::string_view endpoint) {
  const std::size_t colon = endpoint.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  std::string_view host = endpoint.substr(0, colon);
  const std::string_view port_text = endpoint.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  unsigned port = 0;
  auto [end, error] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port, 10);
  if (error != std::errc() || end != port_text.data() + port_text.size() || port == 0 ||
      port > 0xffff) {
    return std::nullopt;
  }
  TcpPeer peer;
  peer.port = static_cast<std::uint16_t>(port);
  const std::string text(host);
  if (inet_pton(AF_INET, text.c_str(), peer.address) == 1) return peer;
  peer.v6 = true;
  if (inet_pton(AF_INET6, text.c_str(), peer.address) == 1) return peer;
  return std::nullopt;
}

std::vector<std::uint64_t> inodes_connected_to(std::string_view table, const TcpPeer& peer) {
  std::vector<std::uint64_t> inodes;
  std::size_t start = table.find('\n');  // past the header
  while (start != std::string_view::npos && start + 1 < table.size()) {
    const std::size_t end = table.find('\n', start + 1);
    const std::string_view line =
        table.substr(start + 1, (end == std::string_view::npos ? table.size() : end) - start - 1);
    start = end;
    // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
    std::vector<std::string_view> fields;
    for (std::size_t at = 0; at < line.size();) {
      at = line.find_first_not_of(' ', at);
      if (at == std::string_view::npos) break;
      const std::size_t stop = std::min(line.find(' ', at), line.size());
      fields.push_back(line.substr(at, stop - at));
      at = stop;
    }
    if (fields.size() < 10 || (fields[3] != kEstablished && fields[3] != kSynSent)) continue;
    const std::optional<TcpPeer> remote = parse_proc_address(fields[2], peer.v6);
    if (!remote || !(*remote == peer)) continue;
    std::uint64_t inode = 0;
    auto [at, error] =
        std::from_chars(fields[9].data(), fields[9].data() + fields[9].size(), inode, 10);
    if (error == std::errc() && inode != 0) inodes.push_back(inode);
  }
  return inodes;
}

int shut_down_connections_to(const TcpPeer& peer) {
  const std::string table = read_file(peer.v6 ? "/proc/self/net/tcp6" : "/proc/self/net/tcp");
  const std::vector<std::uint64_t> inodes = inodes_connected_to(table, peer);
  if (inodes.empty()) return 0;
  int done = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  while (const dirent* entry = readdir(dir)) {
    int fd = -1;
    const std::string_view name = entry->d_name;
    auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), fd, 10);
    if (error != std::errc() || end != name.data() + name.size() || fd == dirfd(dir)) continue;
    const std::string path = std::string("/proc/self/fd/") + entry->d_name;
    const std::uint64_t inode = socket_inode(path);
    if (inode == 0 || std::find(inodes.begin(), inodes.end(), inode) == inodes.end()) continue;
    // Looked at again just before: the descriptor may have been closed and
    // reused meanwhile by its owner.
    if (socket_inode(path) != inode) continue;
    if (shutdown(fd, SHUT_RDWR) == 0) ++done;
  }
  closedir(dir);
  return done;
}

}  // namespace simba::internal::zookeeper
