#include "tests/dashboard/webdriver_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace simba::testing {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---- HTTP ----------------------------------------------------------------------

std::string HttpReply::header(const std::string& name) const {
  auto lower = [](std::string s) {
    std::transform(s.begin(), s.end(), s.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return s;
  };
  const std::string want = lower(name) + ":";
  std::size_t start = head.find('\n');
  while (start != std::string::npos && start + 1 < head.size()) {
    const std::size_t end = head.find('\n', start + 1);
    std::string line =
        head.substr(start + 1, end == std::string::npos ? std::string::npos : end - start - 1);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (lower(line).rfind(want, 0) == 0) {
      std::string value = line.substr(want.size());
      value.erase(0, value.find_first_not_of(' '));
      return value;
    }
    start = end;
  }
  return "";
}

std::optional<HttpReply> http_raw(int port, const std::string& raw, milliseconds timeout,
                                  std::string* error) {
  const auto deadline = Clock::now() + timeout;
  auto left_ms = [&] {
    return static_cast<int>(std::max<long long>(
        0, std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count()));
  };
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *error = std::string("socket: ") + std::strerror(errno);
    return std::nullopt;
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 && errno != EINPROGRESS) {
    *error = "connect to port " + std::to_string(port) + ": " + std::strerror(errno);
    return std::nullopt;
  }
  std::size_t sent = 0;
  while (sent < raw.size()) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, left_ms()) <= 0) {
      *error = "timed out sending to port " + std::to_string(port);
      return std::nullopt;
    }
    const ssize_t n = ::send(fd, raw.data() + sent, raw.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      *error = "send to port " + std::to_string(port) + ": " + std::strerror(errno);
      return std::nullopt;
    }
    sent += static_cast<std::size_t>(n);
  }
  std::string in;
  HttpReply reply;
  std::optional<std::size_t> body_at;
  std::optional<std::size_t> length;
  for (;;) {
    if (body_at && length && in.size() >= *body_at + *length) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, left_ms()) <= 0) {
      *error = "timed out waiting for port " + std::to_string(port) +
               " (read so far: " + in.substr(0, 200) + ")";
      return std::nullopt;
    }
    char buf[8192];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) break;  // closed (or reset: take what came)
    in.append(buf, static_cast<std::size_t>(n));
    if (!body_at) {
      const auto end = in.find("\r\n\r\n");
      if (end == std::string::npos) continue;
      body_at = end + 4;
      reply.head = in.substr(0, end);
      const std::string cl = reply.header("Content-Length");
      if (!cl.empty()) length = std::stoull(cl);
    }
  }
  if (!body_at) {
    *error = "no complete reply from port " + std::to_string(port) + ": " + in.substr(0, 200);
    return std::nullopt;
  }
  reply.body = in.substr(*body_at, length.value_or(std::string::npos));
  if (std::sscanf(reply.head.c_str(), "HTTP/1.%*d %d", &reply.status) != 1) {
    *error = "bad status line: " + reply.head.substr(0, 100);
    return std::nullopt;
  }
  return reply;
}

std::optional<HttpReply> http_call(int port, const std::string& method, const std::string& path,
                                   const std::string& body, milliseconds timeout,
                                   std::string* error) {
  std::string raw = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                    "\r\nConnection: close\r\n";
  if (!body.empty() || method == "POST") {
    raw += "Content-Type: application/json; charset=utf-8\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n";
  }
  raw += "\r\n" + body;
  return http_raw(port, raw, timeout, error);
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// ---- WebDriver -----------------------------------------------------------------

namespace {
constexpr milliseconds kCommandTimeout{60000};  // a first session starts a browser
}  // namespace

WebDriver::~WebDriver() {
  if (has_session()) delete_session();
}

std::optional<Json> WebDriver::command(const std::string& method, const std::string& path,
                                       const std::string& body, std::string* error) {
  auto reply = http_call(port_, method, path, body, kCommandTimeout, error);
  if (!reply) return std::nullopt;
  auto doc = parse_json(reply->body, error);
  if (!doc) return std::nullopt;
  const Json* value = doc->get("value");
  if (value == nullptr) {
    *error = "no value in " + reply->body.substr(0, 300);
    return std::nullopt;
  }
  if (reply->status != 200) {
    const Json* e = value->get("error");
    const Json* m = value->get("message");
    *error = "WebDriver " + method + " " + path + ": HTTP " + std::to_string(reply->status) + " " +
             (e != nullptr ? e->string : "") + ": " + (m != nullptr ? m->string : "");
    return std::nullopt;
  }
  return *value;
}

bool WebDriver::ready() {
  std::string error;
  auto value = command("GET", "/status", "", &error);
  if (!value) return false;
  const Json* ready = value->get("ready");
  return ready != nullptr && ready->boolean;
}

bool WebDriver::new_session(const std::string& always_match, std::string* error) {
  auto value = command("POST", "/session",
                       "{\"capabilities\":{\"alwaysMatch\":" + always_match + "}}", error);
  if (!value) return false;
  const Json* id = value->get("sessionId");
  if (id == nullptr || id->string.empty()) {
    *error = "no sessionId in the reply";
    return false;
  }
  session_ = id->string;
  return true;
}

bool WebDriver::navigate(const std::string& url, std::string* error) {
  return command("POST", "/session/" + session_ + "/url", "{\"url\":" + json_string(url) + "}",
                 error)
      .has_value();
}

std::optional<Json> WebDriver::execute(const std::string& script, std::string* error) {
  return command("POST", "/session/" + session_ + "/execute/sync",
                 "{\"script\":" + json_string(script) + ",\"args\":[]}", error);
}

std::string WebDriver::execute_string(const std::string& script) {
  std::string error;
  auto value = execute(script, &error);
  if (!value || value->type != Json::Type::kString) return "";
  return value->string;
}

bool WebDriver::delete_session() {
  if (!has_session()) return true;
  std::string error;
  const bool ok = command("DELETE", "/session/" + session_, "", &error).has_value();
  session_.clear();
  return ok;
}

}  // namespace simba::testing
