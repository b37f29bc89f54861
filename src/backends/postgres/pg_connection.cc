#include "backends/postgres/pg_connection.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <vector>

#include "core/log.h"
#include "core/poll_timeout.h"

namespace simba::internal::pg {

namespace {

std::string WithoutTrailingNewlines(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

std::string Quoted(std::string_view text) { return "'" + std::string(text) + "'"; }

std::string ConnMessage(PGconn* conn) { return WithoutTrailingNewlines(PQerrorMessage(conn)); }

std::string DescribeServer(const std::map<std::string, std::string>& params) {
  auto get = [&](const char* key, const std::string& fallback) {
    auto it = params.find(key);
    return it == params.end() ? fallback : it->second;
  };
  return "postgresql at " + get("host", "?") + ":" + get("port", "5432") + "/" +
         get("dbname", get("user", ""));
}

SocketWait WaitSocket(int fd, short events, Deadline deadline, int wake_fd) {
  for (;;) {
    const int timeout = PollTimeout(deadline);
    if (timeout < 0) return SocketWait::kTimedOut;
    // poll() skips an entry whose fd is negative.
    pollfd p[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    const int n = ::poll(p, 2, timeout);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return SocketWait::kReady;  // let libpq report the error
    if (n == 0) continue;                  // PollTimeout rounds up: look again
    if (p[1].revents != 0) return SocketWait::kWoken;
    return SocketWait::kReady;
  }
}

bool WaitSocket(PGconn* conn, short events, Deadline deadline) {
  return WaitSocket(PQsocket(conn), events, deadline) == SocketWait::kReady;
}

std::string SqlState(const PGresult* result) {
  const char* state = PQresultErrorField(result, PG_DIAG_SQLSTATE);
  return state != nullptr ? state : "";
}

Status ResultStatus(PGresult* result, sql::SqlFailure* failure) {
  using sql::SqlFailure;
  const std::string sqlstate = SqlState(result);
  const std::string text = WithoutTrailingNewlines(PQresultErrorMessage(result));
  const std::string message = text + (sqlstate.empty() ? "" : " (SQLSTATE " + sqlstate + ")");
  SqlFailure kind = SqlFailure::kOther;
  Status status;
  if (sqlstate == "42P01") {
    kind = SqlFailure::kNoTable;
    status = NotFoundError(message);
  } else if (sqlstate == "42501") {
    kind = SqlFailure::kNoPrivilege;
    status = PermissionDeniedError(message);
  } else if (sqlstate == "23505") {
    kind = SqlFailure::kDuplicateKey;
    status = AbortedError(message);
  } else if (sqlstate == "42P07" || sqlstate == "42710") {
    // duplicate_table, duplicate_object (the table's row type).
    kind = SqlFailure::kAlreadyExists;
    status = AlreadyExistsError(message);
  } else if (sqlstate == "57014") {
    status = DeadlineExceededError(message);
  } else if (sqlstate.rfind("08", 0) == 0 || sqlstate.rfind("57", 0) == 0 ||
             sqlstate.rfind("53", 0) == 0 || sqlstate == "40001" || sqlstate == "40P01") {
    // Connection trouble, shutdown, resources, serialization: try again.
    status = UnavailableError(message);
  } else {
    status = InternalError(message);
  }
  if (failure != nullptr) *failure = kind;
  return status;
}

Result<PgConn> Connect(const std::map<std::string, std::string>& params,
                       const std::string& description, Deadline deadline, int wake_fd) {
  std::vector<const char*> keys;
  std::vector<const char*> values;
  for (const auto& [k, v] : params) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  keys.push_back(nullptr);
  values.push_back(nullptr);
  PgConn conn(PQconnectStartParams(keys.data(), values.data(), 0));
  if (!conn) return UnavailableError(description + ": out of memory");
  if (PQstatus(conn.get()) == CONNECTION_BAD) {
    return UnavailableError(description + ": " + ConnMessage(conn.get()));
  }
  PostgresPollingStatusType state = PGRES_POLLING_WRITING;
  for (;;) {
    if (state == PGRES_POLLING_OK) break;
    if (state == PGRES_POLLING_FAILED) {
      const std::string message = ConnMessage(conn.get());
      if (message.find("password authentication failed") != std::string::npos ||
          message.find("no password supplied") != std::string::npos ||
          message.find("no pg_hba.conf entry") != std::string::npos) {
        return PermissionDeniedError(description + ": " + message);
      }
      if (message.find("does not exist") != std::string::npos) {
        return NotFoundError(description + ": " + message);
      }
      return UnavailableError(description + ": " + message);
    }
    const short events = state == PGRES_POLLING_READING ? POLLIN : POLLOUT;
    switch (WaitSocket(PQsocket(conn.get()), events, deadline, wake_fd)) {
      case SocketWait::kReady:
        break;
      case SocketWait::kWoken:
        return CancelledError(description + ": cancelled while connecting");
      case SocketWait::kTimedOut:
        return DeadlineExceededError(description + ": connecting timed out");
    }
    state = PQconnectPoll(conn.get());
  }
  if (PQsetnonblocking(conn.get(), 1) != 0) {
    return UnavailableError(description + ": " + ConnMessage(conn.get()));
  }
  // libpq prints notices ("relation ... already exists, skipping") to
  // stderr by default: a library must not write into its user's stderr.
  PQsetNoticeProcessor(
      conn.get(),
      [](void*, const char* message) {
        SIMBA_LOG(kDebug, "postgresql: " << WithoutTrailingNewlines(message));
      },
      nullptr);
  return conn;
}

const std::set<std::string>& LibpqKeywords() {
  static const std::set<std::string>* keywords = [] {
    auto* set = new std::set<std::string>();
    if (PQconninfoOption* options = PQconndefaults()) {
      for (PQconninfoOption* o = options; o->keyword != nullptr; ++o) set->insert(o->keyword);
      PQconninfoFree(options);
    }
    return set;
  }();
  return *keywords;
}

WakeFd::WakeFd() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

WakeFd::~WakeFd() {
  if (fd_ >= 0) ::close(fd_);
}

void WakeFd::Post() const {
  const std::uint64_t one = 1;
  // Only fails when the counter would overflow: it is readable then anyway.
  (void)!::write(fd_, &one, sizeof one);
}

void WakeFd::Drain() const {
  std::uint64_t count = 0;
  (void)!::read(fd_, &count, sizeof count);
}

}  // namespace simba::internal::pg
