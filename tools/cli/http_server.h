// A minimal HTTP/1.1 server for `simba dashboard`: one thread, poll(), one
// request per connection (Connection: close), no request bodies, no TLS.
// Enough for a status page on a trusted network or loopback; it is not a
// general-purpose web server.
//
//   HttpServer server(handler);
//   Status listening = server.listen("127.0.0.1", 0);  // 0: any free port
//   ... print server.port() ...
//   server.serve();  // until stop()
//
// Robustness: every connection has a deadline (a client that connects and
// sends nothing is dropped after `request_timeout` and never holds up the
// others), requests whose head exceeds `max_request_bytes` get 431, and at
// most `max_connections` are open at once (the oldest is dropped for a new
// one).
//
// Thread safety: serve() runs on one thread; stop() may be called from any
// thread and from a signal handler (it only write()s to a pipe).
#ifndef SIMBA_TOOLS_CLI_HTTP_SERVER_H_
#define SIMBA_TOOLS_CLI_HTTP_SERVER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "simba/status.h"

namespace simba::cli {

struct HttpRequest {
  std::string method;                                        // "GET", "HEAD", ... as sent
  std::string target;                                        // "/api/state?x=1"
  std::string path;                                          // "/api/state"
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  // Extra headers. The server adds Content-Type, Content-Length,
  // Cache-Control: no-store, Connection: close and nosniff itself.
  std::vector<std::pair<std::string, std::string>> headers;
};

// Called on the serving thread for each well-formed request; must not block
// for long (it holds up every other client). For HEAD the server sends the
// headers of the handler's response without its body.
using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpServerOptions {
  // The request line and headers together; larger requests get 431.
  std::size_t max_request_bytes = 16 * 1024;
  // From accept to the end of the request's head.
  std::chrono::milliseconds request_timeout{5000};
  // To write the response.
  std::chrono::milliseconds write_timeout{10000};
  std::size_t max_connections = 64;
};

class HttpServer {
 public:
  explicit HttpServer(HttpHandler handler, HttpServerOptions options = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds `host` (a numeric IPv4/IPv6 address or a name that resolves to
  // one) and `port` (0: a free port), and listens. kInvalidArgument for a
  // host that does not resolve, kUnavailable when the address cannot be
  // bound (in use, not local).
  Status listen(const std::string& host, std::uint16_t port);
  // The bound port (after Listen).
  std::uint16_t port() const { return port_; }
  // Whether the bound address is a loopback one (127.0.0.0/8, ::1).
  bool loopback() const { return loopback_; }

  // Serves requests until stop(); then closes every connection and returns.
  void serve();
  // Makes serve() return soon. Async-signal-safe.
  void stop();

 private:
  struct Connection;

  void accept();
  // Reads what is there; false when the connection is done with.
  bool on_readable(Connection& c);
  bool on_writable(Connection& c);
  void respond(Connection& c, HttpResponse response, bool head);

  HttpHandler handler_;
  HttpServerOptions options_;
  int listen_fd_ = -1;
  int wake_read_fd_ = -1;
  int wake_write_fd_ = -1;
  std::uint16_t port_ = 0;
  bool loopback_ = false;
  std::vector<Connection> connections_;
};

// "Not Found" for 404, ...
const char* http_reason(int status);

// Splits "HOST:PORT" or "[V6]:PORT" (port 0: any free port). Errors are
// kInvalidArgument and name --listen.
Result<std::pair<std::string, std::uint16_t>> parse_listen_address(const std::string& text);

}  // namespace simba::cli

#endif  // SIMBA_TOOLS_CLI_HTTP_SERVER_H_
