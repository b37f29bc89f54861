// One connection to a Redis server, with every wait bounded by a deadline.
//
// hiredis 0.14 (Debian 12) has no connect-with-options and no per-call
// timeout, so the socket is ours (core/net/stream.h), with hiredis used only
// to format commands and parse replies. That keeps every call inside its
// deadline and lets another thread wake a blocked reader (Shutdown). TLS
// is ours for the same reason (hiredis 0.14 has none): core/net/tls_stream.h
// wraps the socket before the first command.

#ifndef SIMBA_BACKENDS_REDIS_REDIS_CONNECTION_H_
#define SIMBA_BACKENDS_REDIS_REDIS_CONNECTION_H_

#include <hiredis/hiredis.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/net/stream.h"
#include "core/net/tls_stream.h"
#include "core/unique_handle.h"
#include "simba/backend.h"
#include "simba/status.h"

namespace simba::internal::redis {

using Reply = UniqueHandle<redisReply, freeReplyObject>;

using Command = std::vector<std::string>;

struct Endpoint {
  std::string host;
  int port = 6379;
  std::string user;
  std::string password;
  int database = 0;
  // TLS when set (loaded once per backend), else plain text.
  std::shared_ptr<const TlsContext> tls;
  // "host:port", for messages.
  std::string describe() const;
};

class Connection {
 public:
  // Connects (and runs the TLS handshake when endpoint.tls is set), then
  // AUTH (if a password is set) and SELECT (if database != 0), and names the
  // client (CLIENT SETNAME `client_name`, a courtesy: refused by an ACL, it
  // is skipped) so operators can see it in CLIENT LIST. Errors:
  // kUnavailable (cannot connect, a failed TLS handshake, or the server is
  // loading, turns us away as one client too many, or is otherwise not
  // ready), kDeadlineExceeded, kPermissionDenied (AUTH refused, a password
  // needed, TLS verification failed), kInvalidArgument (SELECT refused).
  // No error shows the password.
  static Result<std::unique_ptr<Connection>> open(const Endpoint& endpoint,
                                                  std::string_view client_name, Deadline deadline);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Writes the commands (one write when they fit: a pipeline).
  Status send(const std::vector<Command>& commands, Deadline deadline);
  // Reads one reply. An error reply is a reply, not a failed Status.
  Result<Reply> read(Deadline deadline);
  // Send + one Read per command.
  Result<std::vector<Reply>> call(const std::vector<Command>& commands, Deadline deadline);
  Result<Reply> call(const Command& command, Deadline deadline);

  // Makes a Read blocked in another thread return (kUnavailable) and every
  // later call fail. Thread-safe.
  void shutdown() { stream_->shutdown(); }

 private:
  explicit Connection(std::unique_ptr<Stream> stream);

  const std::unique_ptr<Stream> stream_;
  redisReader* reader_;
};

// kInternal-free helpers for replies.
bool is_error(const redisReply* reply);
std::string_view reply_string(const redisReply* reply);
// The error reply as a Status, "<context>: <reply>": the replies of a
// server that may answer otherwise on its own later are kUnavailable
// (LOADING, BUSY, MASTERDOWN, TRYAGAIN, CLUSTERDOWN, READONLY, NOSCRIPT, OOM,
// NOREPLICAS, MISCONF, "ERR max number of clients reached"); WRONGPASS,
// NOAUTH and NOPERM kPermissionDenied; others kInternal.
Status error_reply_status(const redisReply* reply, std::string_view context);

}  // namespace simba::internal::redis

#endif  // SIMBA_BACKENDS_REDIS_REDIS_CONNECTION_H_
