#include "backends/redis/redis_connection.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/host_lookup.h"
#include "core/poll_timeout.h"

namespace simba::internal::redis {
namespace {

using std::chrono::steady_clock;

// Waits until `fd` is ready for `events`. kDeadlineExceeded at the deadline.
Status WaitFor(int fd, short events, Deadline deadline, std::string_view peer,
               std::string_view what) {
  for (;;) {
    const int timeout = PollTimeout(deadline);
    if (timeout < 0) {
      return DeadlineExceededError("redis at " + std::string(peer) + ": " + std::string(what) +
                                   " timed out");
    }
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, timeout);
    if (n > 0) return OkStatus();
    if (n < 0 && errno != EINTR) {
      return UnavailableError("redis at " + std::string(peer) + ": poll: " + std::strerror(errno));
    }
  }
}

std::string_view FirstWord(std::string_view text) {
  return text.substr(0, std::min(text.find(' '), text.size()));
}

}  // namespace

std::string Endpoint::Describe() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

bool IsError(const redisReply* reply) { return reply->type == REDIS_REPLY_ERROR; }

std::string_view ReplyString(const redisReply* reply) {
  if (reply->str == nullptr) return {};
  return std::string_view(reply->str, reply->len);
}

Status ErrorReplyStatus(const redisReply* reply, std::string_view context) {
  const std::string_view text = ReplyString(reply);
  const std::string_view code = FirstWord(text);
  const std::string message = std::string(context) + ": " + std::string(text);
  if (code == "WRONGPASS" || code == "NOAUTH" || code == "NOPERM") {
    return PermissionDeniedError(message);
  }
  if (code == "LOADING" || code == "BUSY" || code == "MASTERDOWN" || code == "TRYAGAIN" ||
      code == "CLUSTERDOWN" || code == "READONLY" || code == "NOSCRIPT" || code == "OOM") {
    return UnavailableError(message);
  }
  return InternalError(message);
}

Connection::Connection(int fd, std::string peer)
    : fd_(fd), peer_(std::move(peer)), reader_(redisReaderCreate()) {}

Connection::~Connection() {
  if (reader_ != nullptr) redisReaderFree(reader_);
  ::close(fd_);
}

Status Connection::Fail(std::string_view what, int error_number) const {
  return UnavailableError("redis at " + peer_ + ": " + std::string(what) + ": " +
                          std::strerror(error_number));
}

Result<std::unique_ptr<Connection>> Connection::Open(const Endpoint& endpoint,
                                                     std::string_view client_name,
                                                     Deadline deadline) {
  const std::string peer = endpoint.Describe();
  // The port came from a std::uint16_t option.
  Result<std::vector<ResolvedAddress>> addresses =
      LookUpHost(endpoint.host, static_cast<std::uint16_t>(endpoint.port), deadline);
  if (!addresses.ok()) return addresses.status().WithContext("redis at " + peer);

  Status last = UnavailableError("redis at " + peer + ": no address to connect to");
  for (const ResolvedAddress& a : *addresses) {
    const int fd = ::socket(a.family, a.socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a.protocol);
    if (fd < 0) {
      last = UnavailableError("redis at " + peer + ": socket: " + std::strerror(errno));
      continue;
    }
    std::unique_ptr<Connection> conn(new Connection(fd, peer));
    if (::connect(fd, a.address(), a.length) != 0) {
      if (errno != EINPROGRESS) {
        last = conn->Fail("connect", errno);
        continue;
      }
      if (Status ready = WaitFor(fd, POLLOUT, deadline, peer, "connect"); !ready.ok()) {
        return ready;
      }
      int error = 0;
      socklen_t length = sizeof(error);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) {
        last = conn->Fail("connect", error);
        continue;
      }
    }
    // Lock traffic is small request/reply pairs: never wait to coalesce.
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

    std::vector<Command> hello;
    if (!endpoint.password.empty()) {
      if (endpoint.user.empty()) {
        hello.push_back({"AUTH", endpoint.password});
      } else {
        hello.push_back({"AUTH", endpoint.user, endpoint.password});
      }
    }
    if (endpoint.database != 0) hello.push_back({"SELECT", std::to_string(endpoint.database)});
    hello.push_back({"CLIENT", "SETNAME", std::string(client_name)});
    SIMBA_ASSIGN_OR_RETURN(std::vector<Reply> replies, conn->Call(hello, deadline));
    for (std::size_t i = 0; i < replies.size(); ++i) {
      if (!IsError(replies[i].get())) continue;
      const std::string& command = hello[i][0];
      if (command == "AUTH") {
        return PermissionDeniedError("redis at " + peer + ": AUTH refused: " +
                                     std::string(ReplyString(replies[i].get())));
      }
      if (command == "SELECT") {
        return InvalidArgumentError("redis at " + peer + ": cannot select database " +
                                    std::to_string(endpoint.database) + ": " +
                                    std::string(ReplyString(replies[i].get())));
      }
      // CLIENT SETNAME is a courtesy; an ACL may forbid it. But NOAUTH
      // here means the server wants a password we were not given.
      const Status status = ErrorReplyStatus(replies[i].get(), "redis at " + peer);
      if (status.code() != StatusCode::kInternal) return status;
    }
    return conn;
  }
  return last;
}

Status Connection::Send(const std::vector<Command>& commands, Deadline deadline) {
  std::string out;
  for (const Command& command : commands) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lengths;
    argv.reserve(command.size());
    lengths.reserve(command.size());
    for (const std::string& arg : command) {
      argv.push_back(arg.data());
      lengths.push_back(arg.size());
    }
    char* formatted = nullptr;
    const int length = redisFormatCommandArgv(&formatted, static_cast<int>(argv.size()),
                                              argv.data(), lengths.data());
    if (length < 0) return InternalError("redis: cannot format a command");
    out.append(formatted, static_cast<std::size_t>(length));
    redisFreeCommand(formatted);
  }
  std::size_t sent = 0;
  while (sent < out.size()) {
    const ssize_t n = ::send(fd_, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      SIMBA_RETURN_IF_ERROR(WaitFor(fd_, POLLOUT, deadline, peer_, "write"));
      continue;
    }
    return Fail("write", errno);
  }
  return OkStatus();
}

Result<Reply> Connection::Read(Deadline deadline) {
  for (;;) {
    void* parsed = nullptr;
    if (redisReaderGetReply(reader_, &parsed) != REDIS_OK) {
      return UnavailableError("redis at " + peer_ + ": protocol error: " + reader_->errstr);
    }
    if (parsed != nullptr) return Reply(static_cast<redisReply*>(parsed));
    char buffer[16 * 1024];
    const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
    if (n > 0) {
      if (redisReaderFeed(reader_, buffer, static_cast<std::size_t>(n)) != REDIS_OK) {
        return UnavailableError("redis at " + peer_ + ": protocol error: " + reader_->errstr);
      }
      continue;
    }
    if (n == 0) return UnavailableError("redis at " + peer_ + ": connection closed");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      SIMBA_RETURN_IF_ERROR(WaitFor(fd_, POLLIN, deadline, peer_, "reply"));
      continue;
    }
    return Fail("read", errno);
  }
}

Result<std::vector<Reply>> Connection::Call(const std::vector<Command>& commands,
                                            Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(Send(commands, deadline));
  std::vector<Reply> replies;
  replies.reserve(commands.size());
  for (std::size_t i = 0; i < commands.size(); ++i) {
    SIMBA_ASSIGN_OR_RETURN(Reply reply, Read(deadline));
    replies.push_back(std::move(reply));
  }
  return replies;
}

Result<Reply> Connection::Call(const Command& command, Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(Send({command}, deadline));
  return Read(deadline);
}

void Connection::Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

}  // namespace simba::internal::redis
