#include "backends/redis/redis_connection.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <utility>

namespace simba::internal::redis {
namespace {

std::string_view first_word(std::string_view text) {
  return text.substr(0, std::min(text.find(' '), text.size()));
}

bool contains_ignoring_case(std::string_view text, std::string_view part) {
  return std::search(text.begin(), text.end(), part.begin(), part.end(), [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) ==
                  std::tolower(static_cast<unsigned char>(b));
         }) != text.end();
}

// Whether `text`, an error reply to AUTH, refuses the credentials:
// WRONGPASS, or an ERR about the password or AUTH itself ("ERR invalid
// password" before Redis 6, "ERR AUTH <password> called without any password
// configured", "ERR wrong number of arguments for 'auth' command" for a user
// before ACLs). Not a refusal of the connection that happened to answer
// AUTH: "ERR max number of clients reached" is written to every client
// turned away, whatever it sent.
bool refuses_credentials(std::string_view text) {
  const std::string_view code = first_word(text);
  if (code == "WRONGPASS" || code == "NOAUTH" || code == "NOPERM") return true;
  return code == "ERR" &&
         (contains_ignoring_case(text, "auth") || contains_ignoring_case(text, "password"));
}

}  // namespace

std::string Endpoint::describe() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

bool is_error(const redisReply* reply) { return reply->type == REDIS_REPLY_ERROR; }

std::string_view reply_string(const redisReply* reply) {
  if (reply->str == nullptr) return {};
  return std::string_view(reply->str, reply->len);
}

Status error_reply_status(const redisReply* reply, std::string_view context) {
  const std::string_view text = reply_string(reply);
  const std::string_view code = first_word(text);
  const std::string message = std::string(context) + ": " + std::string(text);
  if (code == "WRONGPASS" || code == "NOAUTH" || code == "NOPERM") {
    return permission_denied_error(message);
  }
  // A server not ready yet or failing over, a script cache to fill again,
  // a full memory, too few replicas (NOREPLICAS: min-replicas-to-write), a
  // failed RDB save refusing writes until the disk works again (MISCONF),
  // or too many clients: each may pass without anyone changing our side.
  if (code == "LOADING" || code == "BUSY" || code == "MASTERDOWN" || code == "TRYAGAIN" ||
      code == "CLUSTERDOWN" || code == "READONLY" || code == "NOSCRIPT" || code == "OOM" ||
      code == "NOREPLICAS" || code == "MISCONF" || text.starts_with("ERR max number of clients")) {
    return unavailable_error(message);
  }
  return internal_error(message);
}

Connection::Connection(std::unique_ptr<Stream> stream)
    : stream_(std::move(stream)), reader_(redisReaderCreate()) {}

Connection::~Connection() {
  if (reader_ != nullptr) redisReaderFree(reader_);
}

Result<std::unique_ptr<Connection>> Connection::open(const Endpoint& endpoint,
                                                     std::string_view client_name,
                                                     Deadline deadline) {
  const std::string peer = endpoint.describe();
  // The port came from a std::uint16_t option.
  SIMBA_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream,
                         connect_tcp(endpoint.host, static_cast<std::uint16_t>(endpoint.port),
                                     "redis at " + peer, deadline));
  if (endpoint.tls) {
    SIMBA_ASSIGN_OR_RETURN(stream,
                           start_tls(std::move(stream), *endpoint.tls, endpoint.host, deadline));
  }
  std::unique_ptr<Connection> conn(new Connection(std::move(stream)));
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
  // The replies one by one: a server that turns us away ("ERR max number of
  // clients reached") answers once and closes, and that answer, not the
  // closed connection behind it, is the cause to report.
  std::vector<Reply> replies;
  Status failure = conn->send(hello, deadline);
  while (failure.ok() && replies.size() < hello.size()) {
    Result<Reply> reply = conn->read(deadline);
    if (reply.ok()) {
      replies.push_back(std::move(*reply));
    } else {
      failure = reply.status();
    }
  }
  for (std::size_t i = 0; i < replies.size(); ++i) {
    const redisReply* reply = replies[i].get();
    if (!is_error(reply)) continue;
    const std::string& command = hello[i][0];
    if (command == "AUTH") {
      const std::string as =
          endpoint.user.empty() ? "the default user" : "user '" + endpoint.user + "'";
      if (!refuses_credentials(reply_string(reply))) {
        return error_reply_status(reply, "redis at " + peer + ": AUTH as " + as);
      }
      return permission_denied_error("redis at " + peer + ": AUTH as " + as +
                                     " refused: " + std::string(reply_string(reply)));
    }
    const Status status = error_reply_status(reply, "redis at " + peer);
    if (command == "SELECT") {
      // NOAUTH (a password we were not given), NOPERM, LOADING: not the
      // database's fault.
      if (status.code() != StatusCode::kInternal) return status;
      return invalid_argument_error("redis at " + peer + ": cannot select database " +
                                    std::to_string(endpoint.database) + ": " +
                                    std::string(reply_string(reply)));
    }
    // CLIENT SETNAME is a courtesy; an ACL may forbid it (NOPERM), and the
    // server may not know it. But NOAUTH here means the server wants a
    // password we were not given, and LOADING that it is not ready.
    if (first_word(reply_string(reply)) == "NOPERM") continue;
    if (status.code() != StatusCode::kInternal) return status;
  }
  if (!failure.ok() && replies.empty() && !endpoint.tls) {
    // A TLS-only server (tls-port, port 0) drops a plain-text client at its
    // first bytes, without a word.
    const std::string& message = failure.message();
    if (message.ends_with(": connection closed") ||
        message.ends_with(": Connection reset by peer")) {
      return unavailable_error(message +
                               " (the server dropped us at our first bytes, as a server that "
                               "serves only TLS does to plain text: use rediss:// or tls=verify)");
    }
  }
  SIMBA_RETURN_IF_ERROR(failure);
  return conn;
}

Status Connection::send(const std::vector<Command>& commands, Deadline deadline) {
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
    if (length < 0) return internal_error("redis: cannot format a command");
    out.append(formatted, static_cast<std::size_t>(length));
    redisFreeCommand(formatted);
  }
  return stream_->write_all(out, deadline);
}

Result<Reply> Connection::read(Deadline deadline) {
  for (;;) {
    void* parsed = nullptr;
    if (redisReaderGetReply(reader_, &parsed) != REDIS_OK) {
      return unavailable_error(stream_->context() + ": protocol error: " + reader_->errstr);
    }
    if (parsed != nullptr) return Reply(static_cast<redisReply*>(parsed));
    char buffer[16 * 1024];
    SIMBA_ASSIGN_OR_RETURN(const std::size_t n,
                           stream_->read_some(buffer, sizeof buffer, deadline));
    if (n == 0) return unavailable_error(stream_->context() + ": connection closed");
    if (redisReaderFeed(reader_, buffer, n) != REDIS_OK) {
      return unavailable_error(stream_->context() + ": protocol error: " + reader_->errstr);
    }
  }
}

Result<std::vector<Reply>> Connection::call(const std::vector<Command>& commands,
                                            Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(send(commands, deadline));
  std::vector<Reply> replies(commands.size());
  for (Reply& reply : replies) {
    SIMBA_ASSIGN_OR_RETURN(reply, read(deadline));
  }
  return replies;
}

Result<Reply> Connection::call(const Command& command, Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(send({command}, deadline));
  return read(deadline);
}

}  // namespace simba::internal::redis
