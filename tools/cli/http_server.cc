#include "tools/cli/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <optional>

namespace simba::cli {

using Clock = std::chrono::steady_clock;

namespace {

// After the response, the server stops writing and reads (and drops) what
// the client still sends for this long before closing, so that unread
// request bytes do not turn the close into a reset that loses the response.
constexpr std::chrono::milliseconds kLinger{1000};

bool is_token_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 ||
         std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

bool is_token(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), is_token_char);
}

std::string lower_cased(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::string http_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return buf;
}

HttpResponse plain(int status, const std::string& text) {
  HttpResponse r;
  r.status = status;
  r.body = text + "\n";
  return r;
}

// The request in `head` (without the blank line), or the error response to
// send instead.
struct Parsed {
  HttpRequest request;
  std::optional<HttpResponse> error;
};

Parsed parse_head(const std::string& head, std::size_t max_bytes) {
  Parsed p;
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start <= head.size()) {
    auto nl = head.find('\n', start);
    if (nl == std::string::npos) nl = head.size();
    std::string line = head.substr(start, nl - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    start = nl + 1;
  }
  const std::string& request_line = lines.front();
  const auto sp1 = request_line.find(' ');
  const auto sp2 = sp1 == std::string::npos ? sp1 : request_line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos || request_line.find(' ', sp2 + 1) != std::string::npos) {
    p.error = plain(400, "malformed request line");
    return p;
  }
  HttpRequest& r = p.request;
  r.method = request_line.substr(0, sp1);
  r.target = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string version = request_line.substr(sp2 + 1);
  if (!is_token(r.method) || r.target.empty() || r.target[0] != '/') {
    p.error = plain(400, "malformed request line");
    return p;
  }
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    p.error = version.rfind("HTTP/", 0) == 0 ? plain(505, "only HTTP/1.0 and HTTP/1.1")
                                             : plain(400, "malformed request line");
    return p;
  }
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    const auto colon = line.find(':');
    if (colon == std::string::npos || !is_token(line.substr(0, colon))) {
      p.error = plain(400, "malformed header");
      return p;
    }
    r.headers.emplace_back(lower_cased(line.substr(0, colon)), trim(line.substr(colon + 1)));
  }
  for (const auto& [name, value] : r.headers) {
    if (name != "content-length") continue;
    if (value.empty() || value.size() > 18 || !std::all_of(value.begin(), value.end(), [](char c) {
          return std::isdigit(static_cast<unsigned char>(c)) != 0;
        })) {
      p.error = plain(400, "malformed Content-Length");
      return p;
    }
    if (std::stoull(value) > max_bytes) {
      p.error = plain(413, "request too large");
      return p;
    }
  }
  r.path = r.target.substr(0, r.target.find_first_of("?#"));
  return p;
}

bool is_loopback(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
    // ::ffff:127.x.y.z
    return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace

struct HttpServer::Connection {
  enum class Phase { kReading, kWriting, kDraining };
  int fd = -1;
  Phase phase = Phase::kReading;
  std::string in;
  std::string out;
  std::size_t sent = 0;
  Clock::time_point accepted;
  Clock::time_point deadline;
};

const char* http_reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

Result<std::pair<std::string, std::uint16_t>> parse_listen_address(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return invalid_argument_error("--listen: '" + text + "' " + why +
                                  " (write HOST:PORT, e.g. 127.0.0.1:8080 or [::1]:0)");
  };
  std::string host;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    const auto close = text.find("]:");
    if (close == std::string::npos) return bad("is not [IPV6]:PORT");
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string::npos) return bad("has no port");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string::npos) return bad("needs brackets around an IPv6 host");
  }
  if (host.empty()) return bad("has no host");
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(),
                   [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }) ||
      std::stoi(port) > 65535) {
    return bad("has no valid port (0..65535)");
  }
  return std::make_pair(host, static_cast<std::uint16_t>(std::stoi(port)));
}

HttpServer::HttpServer(HttpHandler handler, HttpServerOptions options)
    : handler_(std::move(handler)), options_(options) {
  int fds[2];
  if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0) {
    wake_read_fd_ = fds[0];
    wake_write_fd_ = fds[1];
  }
}

HttpServer::~HttpServer() {
  for (auto& c : connections_) ::close(c.fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_read_fd_ >= 0) ::close(wake_read_fd_);
  if (wake_write_fd_ >= 0) ::close(wake_write_fd_);
}

Status HttpServer::listen(const std::string& host, std::uint16_t port) {
  if (wake_read_fd_ < 0) return internal_error(std::string("pipe: ") + std::strerror(errno));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    return invalid_argument_error("--listen: cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  std::string error = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    const int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ai->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
      error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    port_ =
        ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                          : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
    loopback_ = is_loopback(bound);
    listen_fd_ = fd;
    break;
  }
  ::freeaddrinfo(found);
  if (listen_fd_ < 0) {
    return unavailable_error("--listen: cannot listen on " + host + ":" + std::to_string(port) +
                             ": " + error);
  }
  return Status();
}

void HttpServer::stop() {
  if (wake_write_fd_ < 0) return;
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_write_fd_, &byte, 1);
}

void HttpServer::serve() {
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wake_read_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    const auto now = Clock::now();
    auto next = Clock::time_point::max();
    for (const auto& c : connections_) {
      fds.push_back(
          {c.fd, static_cast<short>(c.phase == Connection::Phase::kWriting ? POLLOUT : POLLIN), 0});
      next = std::min(next, c.deadline);
    }
    int timeout = -1;
    if (next != Clock::time_point::max()) {
      timeout = static_cast<int>(std::max<long long>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1));
    }
    const int ready = ::poll(fds.data(), fds.size(), timeout);
    if (ready < 0 && errno != EINTR) break;
    if (ready > 0 && (fds[0].revents & POLLIN) != 0) break;  // stop()

    const auto after = Clock::now();
    std::vector<bool> done(connections_.size(), false);
    for (std::size_t i = 0; i < connections_.size(); ++i) {
      Connection& c = connections_[i];
      const short revents = ready > 0 ? fds[i + 2].revents : 0;
      if (revents != 0) {
        done[i] = c.phase == Connection::Phase::kWriting && (revents & POLLOUT) != 0
                      ? !on_writable(c)
                      : !on_readable(c);
        if (done[i]) continue;
      }
      if (after >= c.deadline) {
        // A request that never completed gets 408 if anything arrived at
        // all (one attempt to send it; the connection closes either way).
        if (c.phase == Connection::Phase::kReading && !c.in.empty()) {
          const std::string reply =
              "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n"
              "Content-Length: 0\r\n\r\n";
          [[maybe_unused]] const ssize_t n =
              ::send(c.fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        done[i] = true;
      }
    }
    std::size_t kept = 0;
    for (std::size_t i = 0; i < connections_.size(); ++i) {
      if (done[i]) {
        ::close(connections_[i].fd);
      } else {
        if (kept != i) connections_[kept] = std::move(connections_[i]);
        ++kept;
      }
    }
    connections_.resize(kept);
    if (ready > 0 && (fds[1].revents & POLLIN) != 0) accept();
  }
  for (auto& c : connections_) ::close(c.fd);
  connections_.clear();
  // Empty the wake pipe, so that a later serve() (tests) does not return at once.
  char buf[64];
  while (::read(wake_read_fd_, buf, sizeof buf) > 0) {
  }
}

void HttpServer::accept() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a transient error (EMFILE, ECONNABORTED...)
    if (connections_.size() >= options_.max_connections) {
      // Full: drop the oldest connection for the new one, so that idle
      // clients cannot lock everyone else out.
      auto oldest = std::min_element(
          connections_.begin(), connections_.end(),
          [](const Connection& a, const Connection& b) { return a.accepted < b.accepted; });
      ::close(oldest->fd);
      connections_.erase(oldest);
    }
    Connection c;
    c.fd = fd;
    c.accepted = Clock::now();
    c.deadline = c.accepted + options_.request_timeout;
    connections_.push_back(std::move(c));
  }
}

bool HttpServer::on_readable(Connection& c) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n == 0) return false;  // the client closed (before a full request, or after ours)
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    if (c.phase == Connection::Phase::kDraining) continue;
    c.in.append(buf, static_cast<std::size_t>(n));
    // The end of the head: an empty line.
    std::size_t end = c.in.find("\r\n\r\n");
    std::size_t blank = 4;
    if (const auto lf = c.in.find("\n\n"); lf != std::string::npos && lf < end) {
      end = lf;
      blank = 2;
    }
    if (end == std::string::npos) {
      if (c.in.size() > options_.max_request_bytes) {
        respond(c, plain(431, "request too large"), false);
        return on_writable(c);
      }
      continue;
    }
    if (end + blank > options_.max_request_bytes) {
      respond(c, plain(431, "request too large"), false);
      return on_writable(c);
    }
    Parsed parsed = parse_head(c.in.substr(0, end), options_.max_request_bytes);
    if (parsed.error) {
      respond(c, std::move(*parsed.error), false);
      return on_writable(c);
    }
    const bool head = parsed.request.method == "HEAD";
    HttpResponse response;
    try {
      response = handler_(parsed.request);
    } catch (const std::exception&) {
      response = plain(500, "internal error");
    }
    respond(c, std::move(response), head);
    return on_writable(c);
  }
}

void HttpServer::respond(Connection& c, HttpResponse response, bool head) {
  std::string out =
      "HTTP/1.1 " + std::to_string(response.status) + " " + http_reason(response.status) + "\r\n";
  out += "Date: " + http_date() + "\r\n";
  out += "Content-Type: " + response.content_type + "\r\n";
  out += "Content-Length: " + std::to_string(response.body.size()) + "\r\n";
  out += "Cache-Control: no-store\r\n";
  out += "X-Content-Type-Options: nosniff\r\n";
  out += "Connection: close\r\n";
  for (const auto& [name, value] : response.headers) out += name + ": " + value + "\r\n";
  out += "\r\n";
  if (!head) out += response.body;
  c.in.clear();
  c.in.shrink_to_fit();
  c.out = std::move(out);
  c.sent = 0;
  c.phase = Connection::Phase::kWriting;
  c.deadline = Clock::now() + options_.write_timeout;
}

bool HttpServer::on_writable(Connection& c) {
  while (c.sent < c.out.size()) {
    const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    c.sent += static_cast<std::size_t>(n);
  }
  ::shutdown(c.fd, SHUT_WR);
  c.out.clear();
  c.out.shrink_to_fit();
  c.phase = Connection::Phase::kDraining;
  c.deadline = Clock::now() + kLinger;
  return true;
}

}  // namespace simba::cli
