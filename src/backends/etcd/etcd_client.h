// A small HTTP/1.1 client for etcd's JSON gateway, with every wait bounded
// by a deadline.
//
// Why the gateway and not gRPC: Debian ships no etcd C++ client, and gRPC
// stubs would need etcd's .proto files (which import gogoproto and the
// google.api annotations, neither packaged by Debian) plus protoc and gRPC at
// build time. The gateway is built into every etcd server (3.4 serves it
// under /v3/) and speaks the same v3 API as JSON: byte fields are base64,
// int64 fields are strings. So the socket is ours (core/net/stream.h), like
// the Redis backend's, and nlohmann/json for bodies.
//
// What the client speaks: POST requests with a JSON body, keep-alive,
// pipelining (several requests written at once, the replies read in order;
// the gateway, a Go net/http server, answers them one after another), and
// responses with Content-Length or chunked bodies. Streaming responses (the
// watch) are read line by line: the gateway writes one JSON object per line.
//
// A call that fails or misses its deadline leaves the connection in an
// unknown state (a late reply would be read as the next call's): the owner
// of the connection must close it (see reusable()).

#ifndef SIMBA_BACKENDS_ETCD_ETCD_CLIENT_H_
#define SIMBA_BACKENDS_ETCD_ETCD_CLIENT_H_

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/net/stream.h"
#include "simba/backend.h"
#include "simba/status.h"

namespace simba::internal::etcd {

using Json = nlohmann::json;

struct Endpoint {
  std::string host;
  int port = 2379;
  // "host:port" (IPv6 in brackets), for messages.
  std::string describe() const;
};

struct HttpRequest {
  std::string path;  // "/v3/kv/range"
  std::string body;  // JSON
};

struct HttpResponse {
  int status = 0;
  std::string body;
};

class HttpConnection {
 public:
  // Connects (TCP, no TLS). `tcp_keepalive` turns on TCP keep-alive probes
  // (a long-lived watch notices a peer that vanished without a reset).
  // Errors: kUnavailable (cannot resolve or connect), kDeadlineExceeded.
  static Result<std::unique_ptr<HttpConnection>> open(const Endpoint& endpoint, Deadline deadline,
                                                      bool tcp_keepalive = false);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  // Writes the requests (one write when they fit: a pipeline).
  Status send(const std::vector<HttpRequest>& requests, Deadline deadline);
  // Reads one whole response.
  Result<HttpResponse> read(Deadline deadline);
  // Send + one Read per request, in order.
  Result<std::vector<HttpResponse>> call(const std::vector<HttpRequest>& requests,
                                         Deadline deadline);

  // Streaming: reads the status line and headers of the next response and
  // returns its status; the body is then read with ReadLine.
  Result<int> read_head(Deadline deadline);
  // The next line of the body (without the '\n'); nullopt at its end.
  // kDeadlineExceeded when no whole line arrives by `deadline`; the
  // connection stays usable for further ReadLine calls in that case.
  Result<std::optional<std::string>> read_line(Deadline deadline);

  // False once the server said it will close, or a response was left
  // unfinished: the connection must not carry another request.
  bool reusable() const { return reusable_; }

  // Makes a read blocked in another thread return (kUnavailable) and every
  // later call fail. Thread-safe.
  void shutdown() { stream_->shutdown(); }

  const std::string& peer() const { return peer_; }

 private:
  HttpConnection(std::unique_ptr<Stream> stream, std::string peer);
  // Reads more bytes into in_; kUnavailable at EOF, kDeadlineExceeded.
  Status fill(Deadline deadline);
  // Returns the next "\r\n"-terminated line (without it), reading as needed.
  Result<std::string> read_crlf_line(Deadline deadline, std::size_t limit);
  // Appends the next piece of the body to `out`; false once the body ended.
  Result<bool> read_body(std::string* out, Deadline deadline);
  Status take_left(std::string* out, Deadline deadline);
  std::string_view unread() const { return std::string_view(in_).substr(pos_); }
  void consume(std::size_t n);

  enum class BodyMode { kNone, kLength, kChunked, kUntilClose };

  const std::unique_ptr<Stream> stream_;
  const std::string peer_;  // also the Host header
  std::string in_;          // received bytes; in_[pos_..] not yet consumed
  std::size_t pos_ = 0;
  bool eof_ = false;
  bool reusable_ = true;
  // The body of the response being read.
  BodyMode mode_ = BodyMode::kNone;
  std::uint64_t left_ = 0;    // bytes left of the body or the chunk
  bool chunk_crlf_ = false;   // a chunk's data ended; its CRLF is due
  bool close_after_ = false;  // "Connection: close"
  std::string line_;          // ReadLine's partial line
};

// ---- etcd's JSON conventions ----------------------------------------------

std::string base64_encode(std::string_view bytes);
// False if `text` is not valid base64.
bool base64_decode(std::string_view text, std::string* out);

// etcd's range end for every key that starts with `prefix` (the prefix with
// its last byte incremented, dropping trailing 0xff bytes).
std::string prefix_end(std::string_view prefix);

// An int64 field, which the gateway writes as a string ("42") and may leave
// out when it is 0; also accepts a JSON number. 0 when absent or malformed.
std::int64_t int64_field(const Json& object, std::string_view name);

// The Status for an etcd error: `grpc_code` is the gRPC status code the
// gateway reports ("code" or "grpc_code"), `http_status` the HTTP status.
// Transient codes (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED,
// RESOURCE_EXHAUSTED, and UNKNOWN/INTERNAL such as "leader changed") are
// kUnavailable; UNAUTHENTICATED and PERMISSION_DENIED kPermissionDenied;
// INVALID_ARGUMENT and OUT_OF_RANGE kInvalidArgument; NOT_FOUND,
// FAILED_PRECONDITION and others kInternal. A non-200 reply without a gRPC
// code is kUnavailable for 5xx (and 429) and kInternal otherwise.
Status error_status(int grpc_code, int http_status, std::string_view message,
                    std::string_view context);

// A reply body parsed: the object, or the error it carries (a unary error
// {"error", "message", "code"}, a stream's {"error": {"grpc_code", ...}}, a
// non-200 status, or unparsable JSON). A stream's {"result": {...}} is
// unwrapped. `grpc_code` (when given) receives the error's gRPC code, 0 if
// none.
Result<Json> parse_reply(const HttpResponse& response, std::string_view context,
                         int* grpc_code = nullptr);
// The same for one line of a streaming body (always HTTP 200).
Result<Json> parse_stream_line(std::string_view line, std::string_view context,
                               int* grpc_code = nullptr);

// gRPC codes used by the backend.
inline constexpr int kGrpcNotFound = 5;
inline constexpr int kGrpcFailedPrecondition = 9;

}  // namespace simba::internal::etcd

#endif  // SIMBA_BACKENDS_ETCD_ETCD_CLIENT_H_
