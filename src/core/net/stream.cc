#include "core/net/stream.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "core/host_lookup.h"
#include "core/poll_timeout.h"

namespace simba::internal {

FdWait wait_fd(int fd, short events, Deadline deadline, int wake_fd) {
  for (;;) {
    const int timeout = poll_timeout(deadline);
    if (timeout < 0) return FdWait::kTimedOut;
    // poll() skips an entry whose fd is negative.
    pollfd p[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    const int n = ::poll(p, 2, timeout);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return FdWait::kFailed;
    if (n == 0) continue;  // PollTimeout rounds up: look again
    if (p[1].revents != 0) return FdWait::kWoken;
    return FdWait::kReady;
  }
}

WakeFd::WakeFd() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

WakeFd::~WakeFd() {
  if (fd_ >= 0) ::close(fd_);
}

void WakeFd::post() const {
  const std::uint64_t one = 1;
  // Only fails when the counter would overflow: it is readable then anyway.
  (void)!::write(fd_, &one, sizeof one);
}

void WakeFd::drain() const {
  std::uint64_t count = 0;
  (void)!::read(fd_, &count, sizeof count);
}

Stream::Stream(int fd, std::string context) : fd_(fd), context_(std::move(context)) {}

Stream::~Stream() {
  if (fd_ >= 0) ::close(fd_);
}

int Stream::release_fd() { return std::exchange(fd_, -1); }

Status Stream::fail(std::string_view what, int error_number) const {
  return unavailable_error(context_ + ": " + std::string(what) + ": " +
                           std::strerror(error_number));
}

Status Stream::wait(short events, Deadline deadline, std::string_view what) const {
  switch (wait_fd(fd_, events, deadline)) {
    case FdWait::kTimedOut:
      return deadline_exceeded_error(context_ + ": " + std::string(what) + " timed out");
    case FdWait::kFailed:
      return fail("poll", errno);
    default:
      return ok_status();
  }
}

Status Stream::write_all(std::string_view bytes, Deadline deadline) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      SIMBA_RETURN_IF_ERROR(wait(POLLOUT, deadline, "write"));
    } else {
      return fail("write", errno);
    }
  }
  return ok_status();
}

Result<std::size_t> Stream::read_some(char* buffer, std::size_t size, Deadline deadline,
                                      std::string_view what) {
  for (;;) {
    const ssize_t n = ::recv(fd_, buffer, size, 0);
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return fail("read", errno);
    SIMBA_RETURN_IF_ERROR(wait(POLLIN, deadline, what));
  }
}

void Stream::shutdown() { ::shutdown(fd_, SHUT_RDWR); }

Result<std::unique_ptr<Stream>> connect_tcp(const std::string& host, std::uint16_t port,
                                            const std::string& context, Deadline deadline,
                                            bool tcp_keepalive) {
  Result<std::vector<ResolvedAddress>> addresses = look_up_host(host, port, deadline);
  if (!addresses.ok()) return addresses.status().with_context(context);

  Status last = unavailable_error(context + ": no address to connect to");
  for (const ResolvedAddress& a : *addresses) {
    const int fd = ::socket(a.family, a.socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a.protocol);
    if (fd < 0) {
      last = unavailable_error(context + ": socket: " + std::strerror(errno));
      continue;
    }
    auto stream = std::make_unique<Stream>(fd, context);
    if (::connect(fd, a.address(), a.length) != 0) {
      if (errno != EINPROGRESS) {
        last = stream->fail("connect", errno);
        continue;
      }
      SIMBA_RETURN_IF_ERROR(stream->wait(POLLOUT, deadline, "connect"));
      int error = 0;
      socklen_t length = sizeof(error);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) {
        last = stream->fail("connect", error);
        continue;
      }
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (tcp_keepalive) {
      const int idle = 15;
      const int interval = 5;
      const int count = 3;
      ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
    }
    // TLS, when the store asks for it, is the caller's: start_tls
    // (core/net/tls_stream.h) wraps `stream` within the same deadline.
    return stream;
  }
  return last;
}

}  // namespace simba::internal
