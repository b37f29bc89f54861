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

// ---- JSON ---------------------------------------------------------------------

const Json* Json::Get(const std::string& key) const {
  for (const auto& [k, v] : object) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool Json::IsInteger() const {
  if (type != Type::kNumber || number.empty()) return false;
  const std::size_t start = number[0] == '-' ? 1 : 0;
  return start < number.size() && number.size() - start < 19 &&
         std::all_of(number.begin() + static_cast<std::ptrdiff_t>(start), number.end(),
                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; });
}

long long Json::Int() const { return std::stoll(number); }

namespace {

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  std::optional<Json> Document(std::string* error) {
    Json v;
    if (!Value(&v, 0) || (Ws(), i_ != s_.size())) {
      *error = "invalid JSON at offset " + std::to_string(i_) + ": " + s_.substr(0, 300);
      return std::nullopt;
    }
    return v;
  }

 private:
  void Ws() {
    while (i_ < s_.size() && std::strchr(" \t\r\n", s_[i_]) != nullptr) ++i_;
  }
  bool Eat(char c) {
    Ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool Word(const char* w) {
    const std::size_t n = std::strlen(w);
    if (s_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }
  static void Utf8(unsigned cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  bool Hex4(unsigned* cp) {
    if (i_ + 4 > s_.size()) return false;
    *cp = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      if (std::isxdigit(static_cast<unsigned char>(c)) == 0) return false;
      *cp = *cp * 16 + static_cast<unsigned>(std::isdigit(static_cast<unsigned char>(c)) != 0
                                                 ? c - '0'
                                                 : std::tolower(c) - 'a' + 10);
    }
    return true;
  }
  bool String(std::string* out) {
    if (i_ >= s_.size() || s_[i_] != '"') return false;
    ++i_;
    while (i_ < s_.size()) {
      const char c = s_[i_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (i_ >= s_.size()) return false;
      const char e = s_[i_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          unsigned cp = 0;
          if (!Hex4(&cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && s_.compare(i_, 2, "\\u") == 0) {
            i_ += 2;
            unsigned low = 0;
            if (!Hex4(&low)) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          Utf8(cp, out);
          break;
        }
        default: return false;
      }
    }
    return false;
  }
  bool Number(std::string* out) {
    const std::size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    auto digits = [&] {
      const std::size_t from = i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_])) != 0) ++i_;
      return i_ > from;
    };
    if (!digits()) return false;
    if (i_ < s_.size() && s_[i_] == '.' && (++i_, !digits())) return false;
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (!digits()) return false;
    }
    *out = s_.substr(start, i_ - start);
    return true;
  }
  bool Value(Json* v, int depth) {
    if (depth > 64) return false;
    Ws();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      v->type = Json::Type::kObject;
      if (Eat('}')) return true;
      do {
        Ws();
        std::string key;
        Json member;
        if (!String(&key) || !Eat(':') || !Value(&member, depth + 1)) return false;
        v->object.emplace_back(std::move(key), std::move(member));
      } while (Eat(','));
      return Eat('}');
    }
    if (c == '[') {
      ++i_;
      v->type = Json::Type::kArray;
      if (Eat(']')) return true;
      do {
        Json item;
        if (!Value(&item, depth + 1)) return false;
        v->array.push_back(std::move(item));
      } while (Eat(','));
      return Eat(']');
    }
    if (c == '"') {
      v->type = Json::Type::kString;
      return String(&v->string);
    }
    if (Word("true")) {
      v->type = Json::Type::kBool;
      v->boolean = true;
      return true;
    }
    if (Word("false")) {
      v->type = Json::Type::kBool;
      return true;
    }
    if (Word("null")) return true;
    v->type = Json::Type::kNumber;
    return Number(&v->number);
  }

  const std::string& s_;
  std::size_t i_ = 0;
};

}  // namespace

std::optional<Json> ParseJson(const std::string& text, std::string* error) {
  return Parser(text).Document(error);
}

std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// ---- HTTP ----------------------------------------------------------------------

std::string HttpReply::Header(const std::string& name) const {
  auto lower = [](std::string s) {
    std::transform(s.begin(), s.end(), s.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return s;
  };
  const std::string want = lower(name) + ":";
  std::size_t start = head.find('\n');
  while (start != std::string::npos && start + 1 < head.size()) {
    const std::size_t end = head.find('\n', start + 1);
    std::string line = head.substr(start + 1, end == std::string::npos ? std::string::npos
                                                                         : end - start - 1);
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

std::optional<HttpReply> HttpRaw(int port, const std::string& raw, milliseconds timeout,
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
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 &&
      errno != EINPROGRESS) {
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
      *error = "timed out waiting for port " + std::to_string(port) + " (read so far: " +
               in.substr(0, 200) + ")";
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
      const std::string cl = reply.Header("Content-Length");
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

std::optional<HttpReply> HttpCall(int port, const std::string& method, const std::string& path,
                                  const std::string& body, milliseconds timeout,
                                  std::string* error) {
  std::string raw = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1:" +
                    std::to_string(port) + "\r\nConnection: close\r\n";
  if (!body.empty() || method == "POST") {
    raw += "Content-Type: application/json; charset=utf-8\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n";
  }
  raw += "\r\n" + body;
  return HttpRaw(port, raw, timeout, error);
}

int FreePort() {
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
  if (has_session()) DeleteSession();
}

std::optional<Json> WebDriver::Command(const std::string& method, const std::string& path,
                                       const std::string& body, std::string* error) {
  auto reply = HttpCall(port_, method, path, body, kCommandTimeout, error);
  if (!reply) return std::nullopt;
  auto doc = ParseJson(reply->body, error);
  if (!doc) return std::nullopt;
  const Json* value = doc->Get("value");
  if (value == nullptr) {
    *error = "no value in " + reply->body.substr(0, 300);
    return std::nullopt;
  }
  if (reply->status != 200) {
    const Json* e = value->Get("error");
    const Json* m = value->Get("message");
    *error = "WebDriver " + method + " " + path + ": HTTP " + std::to_string(reply->status) +
             " " + (e != nullptr ? e->string : "") + ": " + (m != nullptr ? m->string : "");
    return std::nullopt;
  }
  return *value;
}

bool WebDriver::Ready() {
  std::string error;
  auto value = Command("GET", "/status", "", &error);
  if (!value) return false;
  const Json* ready = value->Get("ready");
  return ready != nullptr && ready->boolean;
}

bool WebDriver::NewSession(const std::string& always_match, std::string* error) {
  auto value = Command("POST", "/session",
                       "{\"capabilities\":{\"alwaysMatch\":" + always_match + "}}", error);
  if (!value) return false;
  const Json* id = value->Get("sessionId");
  if (id == nullptr || id->string.empty()) {
    *error = "no sessionId in the reply";
    return false;
  }
  session_ = id->string;
  return true;
}

bool WebDriver::Navigate(const std::string& url, std::string* error) {
  return Command("POST", "/session/" + session_ + "/url", "{\"url\":" + JsonQuote(url) + "}",
                 error)
      .has_value();
}

std::optional<Json> WebDriver::Execute(const std::string& script, std::string* error) {
  return Command("POST", "/session/" + session_ + "/execute/sync",
                 "{\"script\":" + JsonQuote(script) + ",\"args\":[]}", error);
}

std::string WebDriver::ExecuteString(const std::string& script) {
  std::string error;
  auto value = Execute(script, &error);
  if (!value || value->type != Json::Type::kString) return "";
  return value->string;
}

bool WebDriver::DeleteSession() {
  if (!has_session()) return true;
  std::string error;
  const bool ok = Command("DELETE", "/session/" + session_, "", &error).has_value();
  session_.clear();
  return ok;
}

}  // namespace simba::testing
