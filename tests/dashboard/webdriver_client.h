// Just enough HTTP, JSON and W3C WebDriver for the dashboard tests, with no
// library beyond the standard one: a blocking HTTP/1.1 client for 127.0.0.1,
// a small JSON reader, and a WebDriver session on a local chromedriver.
#ifndef SIMBA_TESTS_DASHBOARD_WEBDRIVER_CLIENT_H_
#define SIMBA_TESTS_DASHBOARD_WEBDRIVER_CLIENT_H_

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/core/json.h"
#include "testing/json_reader.h"

namespace simba::testing {

using internal::json_string;

// ---- HTTP ----------------------------------------------------------------------

struct HttpReply {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;
  // The first header `name` (case-insensitive), or "".
  std::string header(const std::string& name) const;
};

// Sends `raw` as it is to 127.0.0.1:`port` and reads the reply until the
// server closes or Content-Length is reached. nullopt (with `error`) when
// the connection fails or `timeout` passes first.
std::optional<HttpReply> http_raw(int port, const std::string& raw,
                                  std::chrono::milliseconds timeout, std::string* error);
// One request (Connection: close); a non-empty `body` is sent as JSON.
std::optional<HttpReply> http_call(int port, const std::string& method, const std::string& path,
                                   const std::string& body, std::chrono::milliseconds timeout,
                                   std::string* error);

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();

// ---- WebDriver -----------------------------------------------------------------

// A W3C WebDriver session on a chromedriver listening on 127.0.0.1:`port`.
class WebDriver {
 public:
  explicit WebDriver(int port) : port_(port) {}
  ~WebDriver();  // deletes the session if still open
  WebDriver(const WebDriver&) = delete;
  WebDriver& operator=(const WebDriver&) = delete;

  // Whether the driver answers /status with ready: true.
  bool ready();
  // POST /session with {"capabilities":{"alwaysMatch": `always_match`}}.
  bool new_session(const std::string& always_match, std::string* error);
  bool navigate(const std::string& url, std::string* error);
  // execute/sync: runs `script` (a function body; `return` gives the value)
  // in the page and returns its value.
  std::optional<Json> execute(const std::string& script, std::string* error);
  // The script's value as a string ("" for null / not a string).
  std::string execute_string(const std::string& script);
  bool delete_session();
  bool has_session() const { return !session_.empty(); }

 private:
  // The "value" of a command's reply, or nullopt with the WebDriver error.
  std::optional<Json> command(const std::string& method, const std::string& path,
                              const std::string& body, std::string* error);

  int port_;
  std::string session_;
};

}  // namespace simba::testing

#endif  // SIMBA_TESTS_DASHBOARD_WEBDRIVER_CLIENT_H_
