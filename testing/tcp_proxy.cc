#include "testing/tcp_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace simba::testing {
namespace {

sockaddr_in ipv4(std::uint32_t host, int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = host;
  return address;
}

sockaddr_in loopback(int port) { return ipv4(htonl(INADDR_LOOPBACK), port); }

// A client's connection and ours to the server; bytes read from one side
// wait in `pending` for the other.
struct Link {
  int client = -1;
  int server = -1;
  std::string to_server;
  std::string to_client;
  bool closed = false;
};

void close_link(Link& link) {
  if (link.client >= 0) ::close(link.client);
  if (link.server >= 0) ::close(link.server);
  link.client = link.server = -1;
  link.closed = true;
}

// Closes `fd` with a reset instead of an orderly shutdown.
void reset(int fd) {
  if (fd < 0) return;
  linger hard{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
  ::close(fd);
}

// Reads what `from` has into `buffer`; false once it is closed or failed.
bool read_into(int from, std::string& buffer) {
  char chunk[16384];
  const ssize_t n = ::read(from, chunk, sizeof chunk);
  if (n > 0) {
    buffer.append(chunk, static_cast<std::size_t>(n));
    return true;
  }
  return n < 0 && (errno == EAGAIN || errno == EINTR);
}

// Writes what it can of `buffer` to `to`; false if the socket failed.
bool write_from(int to, std::string& buffer) {
  if (buffer.empty()) return true;
  const ssize_t n = ::send(to, buffer.data(), buffer.size(), MSG_NOSIGNAL);
  if (n > 0) {
    buffer.erase(0, static_cast<std::size_t>(n));
    return true;
  }
  return n < 0 && (errno == EAGAIN || errno == EINTR);
}

}  // namespace

TcpProxy::TcpProxy(const std::string& target_host, int target_port) : target_port_(target_port) {
  in_addr host{};
  if (::inet_pton(AF_INET, target_host.c_str(), &host) != 1) {
    std::fprintf(stderr, "TcpProxy: '%s' is not an IPv4 address\n", target_host.c_str());
    std::abort();
  }
  target_host_ = host.s_addr;
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in address = loopback(0);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(listen_fd_, 64) != 0) {
    std::perror("TcpProxy: bind/listen");
    std::abort();
  }
  socklen_t length = sizeof address;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length);
  port_ = ntohs(address.sin_port);
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) std::abort();
  thread_ = std::thread([this] { loop(); });
}

void TcpProxy::cut_all() {
  std::unique_lock<std::mutex> lock(cut_mu_);
  cut_requested_ = true;
  const char byte = 1;
  (void)!::write(wake_[1], &byte, 1);
  cut_cv_.wait(lock, [&] { return !cut_requested_ || stopping_; });
}

void TcpProxy::set_keep_server_open(bool on) {
  keep_server_open_ = on;
  const char byte = 1;
  (void)!::write(wake_[1], &byte, 1);
}

TcpProxy::~TcpProxy() {
  stopping_ = true;
  const char byte = 1;
  (void)!::write(wake_[1], &byte, 1);
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void TcpProxy::loop() {
  std::vector<Link> links;
  std::vector<int> waiting;  // accepted while black-holed, not yet connected
  std::vector<int> kept;     // server sides whose client closed (keep_server_open_)
  const auto close_kept = [&] {
    for (int fd : kept) ::close(fd);
    kept.clear();
    kept_ = 0;
  };
  while (!stopping_) {
    if (!keep_server_open_ && !kept.empty()) close_kept();
    {
      std::lock_guard<std::mutex> lock(cut_mu_);
      if (cut_requested_) {
        for (Link& link : links) {
          reset(link.client);
          reset(link.server);
          link.client = link.server = -1;
          link.closed = true;
        }
        for (int fd : waiting) reset(fd);
        waiting.clear();
        cut_requested_ = false;
        cut_cv_.notify_all();
      }
    }
    const bool hole = blackhole_;
    if (!hole) {
      for (int client : waiting) {
        Link link;
        link.client = client;
        link.server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in target = ipv4(target_host_, target_port_);
        if (::connect(link.server, reinterpret_cast<sockaddr*>(&target), sizeof target) != 0) {
          close_link(link);
          continue;
        }
        const int one = 1;
        ::setsockopt(link.server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        ::setsockopt(link.client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        ::fcntl(link.client, F_SETFL, O_NONBLOCK);
        ::fcntl(link.server, F_SETFL, O_NONBLOCK);
        links.push_back(std::move(link));
      }
      waiting.clear();
    }
    std::erase_if(links, [](const Link& l) { return l.closed; });
    open_ = static_cast<int>(links.size() + waiting.size());

    std::vector<pollfd> fds;
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    if (!hole) {
      for (const Link& link : links) {
        fds.push_back(
            {link.client, static_cast<short>(POLLIN | (link.to_client.empty() ? 0 : POLLOUT)), 0});
        fds.push_back(
            {link.server, static_cast<short>(POLLIN | (link.to_server.empty() ? 0 : POLLOUT)), 0});
      }
    }
    // Black-holed: only look again now and then (for the switch back).
    ::poll(fds.data(), fds.size(), hole ? 20 : 200);
    if (fds[0].revents & POLLIN) {
      char drain[64];
      while (::read(wake_[0], drain, sizeof drain) > 0) {
      }
    }
    if (fds[1].revents & POLLIN) {
      const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client >= 0) {
        ++accepted_;
        waiting.push_back(client);
      }
    }
    // Read the switch again: a black hole turned on while we waited must
    // hold back what woke us, or the first bytes after it would slip through.
    if (hole || blackhole_) continue;
    for (std::size_t i = 0; i < links.size(); ++i) {
      Link& link = links[i];
      const pollfd& c = fds[2 + 2 * i];
      const pollfd& s = fds[3 + 2 * i];
      bool ok = true;
      if (c.revents & (POLLIN | POLLHUP | POLLERR)) {
        ok = read_into(link.client, link.to_server);
        if (!ok && keep_server_open_) {
          // The client is gone; the server is not told.
          ::close(link.client);
          kept.push_back(link.server);
          kept_ = static_cast<int>(kept.size());
          link.client = link.server = -1;
          link.closed = true;
          continue;
        }
      }
      if (s.revents & (POLLIN | POLLHUP | POLLERR))
        ok = ok && read_into(link.server, link.to_client);
      if (drop_replies_) link.to_client.clear();
      ok = ok && write_from(link.server, link.to_server) && write_from(link.client, link.to_client);
      if (!ok) close_link(link);
    }
  }
  for (Link& link : links) close_link(link);
  for (int fd : waiting) ::close(fd);
  close_kept();
  std::lock_guard<std::mutex> lock(cut_mu_);
  cut_cv_.notify_all();
}

}  // namespace simba::testing
