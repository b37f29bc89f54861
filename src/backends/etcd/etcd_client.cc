#include "backends/etcd/etcd_client.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <utility>

namespace simba::internal::etcd {
namespace {

// Bounds that keep a confused or hostile peer from growing our buffers
// without end: a status line or header, the header block, a body.
constexpr std::size_t kMaxLine = 16 * 1024;
constexpr std::size_t kMaxHeaderLines = 200;
constexpr std::uint64_t kMaxBody = 256ull * 1024 * 1024;

std::string lower_cased(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;
  if (c == '/' || c == '_') return 63;
  return -1;
}

}  // namespace

std::string Endpoint::describe() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// ---- the connection -----------------------------------------------------------

HttpConnection::HttpConnection(std::unique_ptr<Stream> stream, std::string peer)
    : stream_(std::move(stream)), peer_(std::move(peer)) {}

HttpConnection::~HttpConnection() = default;

Result<std::unique_ptr<HttpConnection>> HttpConnection::open(const Endpoint& endpoint,
                                                             Deadline deadline,
                                                             bool tcp_keepalive) {
  std::string peer = endpoint.describe();
  // The port came from a std::uint16_t option.
  SIMBA_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream,
                         connect_tcp(endpoint.host, static_cast<std::uint16_t>(endpoint.port),
                                     "etcd at " + peer, deadline, tcp_keepalive));
  return std::unique_ptr<HttpConnection>(new HttpConnection(std::move(stream), std::move(peer)));
}

Status HttpConnection::send(const std::vector<HttpRequest>& requests, Deadline deadline) {
  std::string out;
  for (const HttpRequest& request : requests) {
    out += "POST ";
    out += request.path;
    out += " HTTP/1.1\r\nHost: ";
    out += peer_;
    out += "\r\nContent-Type: application/json\r\nContent-Length: ";
    out += std::to_string(request.body.size());
    out += "\r\n\r\n";
    out += request.body;
  }
  Status sent = stream_->write_all(out, deadline);
  if (!sent.ok()) reusable_ = false;
  return sent;
}

void HttpConnection::consume(std::size_t n) {
  pos_ += n;
  if (pos_ == in_.size()) {
    in_.clear();
    pos_ = 0;
  } else if (pos_ > 64 * 1024 && pos_ * 2 > in_.size()) {
    in_.erase(0, pos_);
    pos_ = 0;
  }
}

Status HttpConnection::fill(Deadline deadline) {
  if (eof_) {
    reusable_ = false;
    return unavailable_error("etcd at " + peer_ + ": connection closed by the server");
  }
  char buffer[16 * 1024];
  Result<std::size_t> n = stream_->read_some(buffer, sizeof buffer, deadline);
  if (!n.ok()) {
    // A late reply leaves the connection usable (see ReadLine); a failed one does not.
    if (n.status().code() != StatusCode::kDeadlineExceeded) reusable_ = false;
    return n.status();
  }
  if (*n == 0) {
    eof_ = true;
    reusable_ = false;
    return unavailable_error("etcd at " + peer_ + ": connection closed by the server");
  }
  in_.append(buffer, *n);
  return ok_status();
}

Result<std::string> HttpConnection::read_crlf_line(Deadline deadline, std::size_t limit) {
  for (;;) {
    const std::string_view buffered = unread();
    const std::size_t end = buffered.find("\r\n");
    if (end != std::string_view::npos) {
      std::string line(buffered.substr(0, end));
      consume(end + 2);
      return line;
    }
    if (buffered.size() > limit) {
      reusable_ = false;
      return unavailable_error("etcd at " + peer_ + ": protocol error: line too long");
    }
    SIMBA_RETURN_IF_ERROR(fill(deadline));
  }
}

Result<int> HttpConnection::read_head(Deadline deadline) {
  // Until the whole head is read, the connection is in the middle of a
  // response.
  reusable_ = false;
  SIMBA_ASSIGN_OR_RETURN(std::string status_line, read_crlf_line(deadline, kMaxLine));
  // "HTTP/1.1 200 OK"
  int status = 0;
  {
    const std::string_view line(status_line);
    const std::size_t space = line.find(' ');
    if (line.substr(0, 5) != "HTTP/" || space == std::string_view::npos) {
      return unavailable_error("etcd at " + peer_ +
                               ": protocol error: not an HTTP response (is this an etcd client "
                               "URL, and not TLS?)");
    }
    const std::string_view code = line.substr(space + 1, 3);
    const auto [end, error] = std::from_chars(code.data(), code.data() + code.size(), status);
    if (error != std::errc() || end != code.data() + code.size()) {
      return unavailable_error("etcd at " + peer_ + ": protocol error: bad status line");
    }
    close_after_ = line.substr(0, space) == "HTTP/1.0";
  }
  bool chunked = false;
  std::optional<std::uint64_t> length;
  for (std::size_t n = 0;; ++n) {
    if (n > kMaxHeaderLines) {
      return unavailable_error("etcd at " + peer_ + ": protocol error: too many headers");
    }
    SIMBA_ASSIGN_OR_RETURN(std::string header, read_crlf_line(deadline, kMaxLine));
    if (header.empty()) break;
    const std::size_t colon = header.find(':');
    if (colon == std::string::npos) continue;
    const std::string name = lower_cased(trim(std::string_view(header).substr(0, colon)));
    const std::string value = lower_cased(trim(std::string_view(header).substr(colon + 1)));
    if (name == "content-length") {
      std::uint64_t parsed = 0;
      const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), parsed);
      if (error != std::errc() || end != value.data() + value.size() || parsed > kMaxBody) {
        return unavailable_error("etcd at " + peer_ + ": protocol error: bad Content-Length");
      }
      length = parsed;
    } else if (name == "transfer-encoding") {
      chunked = value.find("chunked") != std::string::npos;
    } else if (name == "connection") {
      if (value.find("close") != std::string::npos) close_after_ = true;
      if (value.find("keep-alive") != std::string::npos) close_after_ = false;
    }
  }
  left_ = 0;
  chunk_crlf_ = false;
  line_.clear();
  if (chunked) {
    mode_ = BodyMode::kChunked;
  } else if (length) {
    mode_ = BodyMode::kLength;
    left_ = *length;
  } else if (status == 204 || status == 304 || (status >= 100 && status < 200)) {
    mode_ = BodyMode::kLength;
  } else {
    mode_ = BodyMode::kUntilClose;
    close_after_ = true;
  }
  return status;
}

// Appends to *out what is buffered of the left_ bytes still due (reading
// more first if nothing is).
Status HttpConnection::take_left(std::string* out, Deadline deadline) {
  if (unread().empty()) SIMBA_RETURN_IF_ERROR(fill(deadline));
  const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(left_, unread().size()));
  out->append(unread().substr(0, n));
  consume(n);
  left_ -= n;
  return ok_status();
}

Result<bool> HttpConnection::read_body(std::string* out, Deadline deadline) {
  for (;;) {
    switch (mode_) {
      case BodyMode::kNone:
        return false;
      case BodyMode::kLength: {
        if (left_ == 0) {
          mode_ = BodyMode::kNone;
          reusable_ = !close_after_;
          return false;
        }
        SIMBA_RETURN_IF_ERROR(take_left(out, deadline));
        return true;
      }
      case BodyMode::kUntilClose: {
        if (unread().empty()) {
          if (eof_) {
            mode_ = BodyMode::kNone;
            return false;
          }
          Status filled = fill(deadline);
          if (!filled.ok()) {
            if (eof_) {
              mode_ = BodyMode::kNone;
              return false;
            }
            return filled;
          }
          continue;
        }
        if (out->size() + unread().size() > kMaxBody) {
          return unavailable_error("etcd at " + peer_ + ": protocol error: reply too large");
        }
        out->append(unread());
        consume(unread().size());
        return true;
      }
      case BodyMode::kChunked: {
        if (left_ > 0) {
          SIMBA_RETURN_IF_ERROR(take_left(out, deadline));
          if (left_ == 0) chunk_crlf_ = true;
          return true;
        }
        if (chunk_crlf_) {
          SIMBA_ASSIGN_OR_RETURN(std::string crlf, read_crlf_line(deadline, 2));
          if (!crlf.empty()) {
            return unavailable_error("etcd at " + peer_ + ": protocol error: bad chunk end");
          }
          chunk_crlf_ = false;
        }
        SIMBA_ASSIGN_OR_RETURN(std::string size_line, read_crlf_line(deadline, kMaxLine));
        const std::string_view digits =
            trim(std::string_view(size_line).substr(0, size_line.find(';')));
        std::uint64_t size = 0;
        const auto [end, error] =
            std::from_chars(digits.data(), digits.data() + digits.size(), size, 16);
        if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() ||
            size > kMaxBody) {
          return unavailable_error("etcd at " + peer_ + ": protocol error: bad chunk size");
        }
        if (size == 0) {
          // Trailers, up to an empty line.
          for (std::size_t n = 0;; ++n) {
            if (n > kMaxHeaderLines) {
              return unavailable_error("etcd at " + peer_ + ": protocol error: bad trailer");
            }
            SIMBA_ASSIGN_OR_RETURN(std::string trailer, read_crlf_line(deadline, kMaxLine));
            if (trailer.empty()) break;
          }
          mode_ = BodyMode::kNone;
          reusable_ = !close_after_;
          return false;
        }
        left_ = size;
        continue;
      }
    }
  }
}

Result<HttpResponse> HttpConnection::read(Deadline deadline) {
  HttpResponse response;
  SIMBA_ASSIGN_OR_RETURN(response.status, read_head(deadline));
  for (;;) {
    SIMBA_ASSIGN_OR_RETURN(bool more, read_body(&response.body, deadline));
    if (!more) break;
    if (response.body.size() > kMaxBody) {
      reusable_ = false;
      return unavailable_error("etcd at " + peer_ + ": protocol error: reply too large");
    }
  }
  return response;
}

Result<std::vector<HttpResponse>> HttpConnection::call(const std::vector<HttpRequest>& requests,
                                                       Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(send(requests, deadline));
  std::vector<HttpResponse> responses;
  responses.reserve(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    SIMBA_ASSIGN_OR_RETURN(HttpResponse response, read(deadline));
    responses.push_back(std::move(response));
  }
  return responses;
}

Result<std::optional<std::string>> HttpConnection::read_line(Deadline deadline) {
  for (;;) {
    const std::size_t newline = line_.find('\n');
    if (newline != std::string::npos) {
      std::string line = line_.substr(0, newline);
      line_.erase(0, newline + 1);
      return std::optional<std::string>(std::move(line));
    }
    if (line_.size() > kMaxBody) {
      reusable_ = false;
      return unavailable_error("etcd at " + peer_ + ": protocol error: line too long");
    }
    SIMBA_ASSIGN_OR_RETURN(bool more, read_body(&line_, deadline));
    if (!more) {
      if (line_.empty()) return std::optional<std::string>();
      std::string line = std::move(line_);
      line_.clear();
      return std::optional<std::string>(std::move(line));
    }
  }
}

// ---- JSON conventions ------------------------------------------------------------

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const std::uint32_t v = (static_cast<unsigned char>(bytes[i]) << 16) |
                            (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                            static_cast<unsigned char>(bytes[i + 2]);
    out += kBase64[(v >> 18) & 63];
    out += kBase64[(v >> 12) & 63];
    out += kBase64[(v >> 6) & 63];
    out += kBase64[v & 63];
  }
  if (i + 1 == bytes.size()) {
    const std::uint32_t v = static_cast<unsigned char>(bytes[i]) << 16;
    out += kBase64[(v >> 18) & 63];
    out += kBase64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    const std::uint32_t v = (static_cast<unsigned char>(bytes[i]) << 16) |
                            (static_cast<unsigned char>(bytes[i + 1]) << 8);
    out += kBase64[(v >> 18) & 63];
    out += kBase64[(v >> 12) & 63];
    out += kBase64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

bool base64_decode(std::string_view text, std::string* out) {
  out->clear();
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  if (text.size() % 4 == 1) return false;
  out->reserve(text.size() * 3 / 4);
  std::uint32_t buffer = 0;
  int bits = 0;
  for (const char c : text) {
    const int v = base64_value(c);
    if (v < 0) return false;
    buffer = (buffer << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(static_cast<char>((buffer >> bits) & 0xff));
    }
  }
  return true;
}

std::string prefix_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  // Every key: etcd's "\0" range end.
  return std::string(1, '\0');
}

std::int64_t int64_field(const Json& object, std::string_view name) {
  if (!object.is_object()) return 0;
  const auto it = object.find(name);
  if (it == object.end()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_string()) {
    const std::string& text = it->get_ref<const std::string&>();
    std::int64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error == std::errc() && end == text.data() + text.size()) return value;
  }
  return 0;
}

Status error_status(int grpc_code, int http_status, std::string_view message,
                    std::string_view context) {
  std::string text = std::string(context) + ": " + std::string(message);
  switch (grpc_code) {
    case 0:
      break;
    case 2:   // UNKNOWN: e.g. "etcdserver: leader changed" from older servers
    case 4:   // DEADLINE_EXCEEDED: "etcdserver: request timed out"
    case 8:   // RESOURCE_EXHAUSTED: "etcdserver: too many requests"
    case 10:  // ABORTED
    case 13:  // INTERNAL
    case 14:  // UNAVAILABLE: "etcdserver: no leader", "leader changed"
      return unavailable_error(std::move(text));
    case 7:   // PERMISSION_DENIED
    case 16:  // UNAUTHENTICATED: "etcdserver: user name is empty", "invalid auth token"
      return permission_denied_error(std::move(text));
    case 3:   // INVALID_ARGUMENT: "etcdserver: request is too large", ...
    case 11:  // OUT_OF_RANGE: "etcdserver: mvcc: required revision is a future revision"
      return invalid_argument_error(std::move(text));
    default:  // NOT_FOUND, FAILED_PRECONDITION, ...: the caller handles those it expects
      return internal_error(std::move(text));
  }
  if (http_status >= 500 || http_status == 429) return unavailable_error(std::move(text));
  if (http_status == 401 || http_status == 403) return permission_denied_error(std::move(text));
  return internal_error(std::move(text));
}

namespace {

Result<Json> parse_body(std::string_view body, int http_status, std::string_view context,
                        int* grpc_code) {
  if (grpc_code != nullptr) *grpc_code = 0;
  Json parsed = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    std::string excerpt(body.substr(0, 200));
    for (char& c : excerpt) {
      if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    }
    return error_status(0, http_status == 200 ? 500 : http_status,
                        "unexpected reply (HTTP " + std::to_string(http_status) + "): " + excerpt,
                        context);
  }
  // A stream's error: {"error": {"grpc_code": 5, "http_code": 404, "message": ...}}.
  if (const auto error = parsed.find("error"); error != parsed.end()) {
    int code = 0;
    std::string message;
    if (error->is_object()) {
      code = static_cast<int>(int64_field(*error, "grpc_code"));
      if (code == 0) code = static_cast<int>(int64_field(*error, "code"));
      message = error->value("message", std::string("error"));
    } else {
      // A unary error: {"error": "...", "message": "...", "code": 5}.
      code = static_cast<int>(int64_field(parsed, "code"));
      message = parsed.value("message", error->is_string() ? error->get<std::string>() : "error");
    }
    if (grpc_code != nullptr) *grpc_code = code;
    return error_status(code, http_status, message, context);
  }
  if (http_status != 200) {
    return error_status(0, http_status, "HTTP " + std::to_string(http_status), context);
  }
  if (const auto result = parsed.find("result"); result != parsed.end() && result->is_object()) {
    return Json(std::move(*result));
  }
  return parsed;
}

}  // namespace

Result<Json> parse_reply(const HttpResponse& response, std::string_view context, int* grpc_code) {
  return parse_body(response.body, response.status, context, grpc_code);
}

Result<Json> parse_stream_line(std::string_view line, std::string_view context, int* grpc_code) {
  return parse_body(line, 200, context, grpc_code);
}

}  // namespace simba::internal::etcd
