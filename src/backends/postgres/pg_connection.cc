#include "backends/postgres/pg_connection.h"

#include <netdb.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/host_lookup.h"
#include "core/log.h"

namespace simba::internal::sql::pg {

namespace {

std::string without_trailing_newlines(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// libpq's lists ("a,b"): split at every comma, no escapes, no trimming.
std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> items;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = list.find(',', start);
    items.push_back(list.substr(start, comma - start));
    if (comma == std::string::npos) return items;
    start = comma + 1;
  }
}

std::string join_list(const std::vector<std::string>& items) {
  std::string list;
  for (std::size_t i = 0; i < items.size(); ++i) list += (i == 0 ? "" : ",") + items[i];
  return list;
}

// A Unix-socket directory to libpq, or its default (a socket or localhost):
// nothing to resolve.
bool needs_no_look_up(const std::string& host) {
  return host.empty() || host.front() == '/' || host.front() == '@';
}

// libpq resolves `host` with a blocking getaddrinfo() that no timeout bounds,
// so a hung DNS server would stall the connect past its deadline. Resolving
// here, within the deadline, and passing the addresses as `hostaddr` spares
// libpq the lookup; `host` stays, and libpq still uses it for TLS
// verification, .pgpass and its messages. A name with several addresses
// becomes one list entry per address (the name repeated in `host`), so libpq
// still tries each in turn, and so does a list of hosts, one entry after
// another; a host that does not resolve is left out unless none does, as
// libpq would skip it. Params that name `hostaddr` already, or whose `port`
// list does not match `host`'s (libpq reports that), are left alone.
Result<std::map<std::string, std::string>> with_host_addresses(
    std::map<std::string, std::string> params, const std::string& description, Deadline deadline,
    int wake_fd) {
  const auto host = params.find("host");
  if (host == params.end() || params.count("hostaddr") != 0) return params;
  const std::vector<std::string> hosts = split_list(host->second);
  const auto port = params.find("port");
  const std::vector<std::string> ports =
      port == params.end() ? std::vector<std::string>{""} : split_list(port->second);
  if (ports.size() != 1 && ports.size() != hosts.size()) return params;

  std::vector<std::string> new_hosts;
  std::vector<std::string> new_addresses;
  std::vector<std::string> new_ports;
  bool looked_up = false;
  Status first_failure;
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    const std::string& name = hosts[i];
    const std::string& port_text = ports.size() == 1 ? ports.front() : ports[i];
    if (needs_no_look_up(name)) {
      new_hosts.push_back(name);
      new_addresses.emplace_back();
      new_ports.push_back(port_text);
      continue;
    }
    // The port does not change the addresses; it only lets concurrent
    // lookups of one server share a worker. PGPORT is not consulted.
    std::uint16_t port_number = 5432;
    std::uint16_t parsed = 0;
    const char* end = port_text.data() + port_text.size();
    if (auto [at, error] = std::from_chars(port_text.data(), end, parsed);
        error == std::errc() && at == end && parsed != 0) {
      port_number = parsed;
    }
    looked_up = true;
    const std::string context =
        hosts.size() == 1 ? description : description + ", host " + in_quotes(name);
    Result<std::vector<ResolvedAddress>> found =
        look_up_host_unless_woken(name, port_number, deadline, wake_fd);
    if (!found.ok()) {
      // Past the deadline or cancelled: no other host could be tried either.
      if (found.status().code() != StatusCode::kUnavailable) {
        return found.status().with_context(context);
      }
      if (first_failure.ok()) first_failure = found.status().with_context(context);
      continue;
    }
    std::vector<std::string> seen;
    for (const ResolvedAddress& address : *found) {
      std::string text = numeric_address(address);
      if (text.empty() || std::find(seen.begin(), seen.end(), text) != seen.end()) continue;
      seen.push_back(text);
      new_hosts.push_back(name);
      new_addresses.push_back(std::move(text));
      new_ports.push_back(port_text);
    }
  }
  if (!looked_up) return params;
  if (new_hosts.empty()) return first_failure;
  host->second = join_list(new_hosts);
  params["hostaddr"] = join_list(new_addresses);
  if (ports.size() > 1) port->second = join_list(new_ports);
  return params;
}

// libpq's connect_timeout (whole seconds) as a bound on the lookup too, in
// case the call's deadline is far away; `deadline` when it is unset or bad.
Deadline with_connect_timeout(const std::map<std::string, std::string>& params, Deadline deadline) {
  const auto timeout = params.find("connect_timeout");
  if (timeout == params.end()) return deadline;
  const std::string& text = timeout->second;
  int seconds = 0;
  const char* end = text.data() + text.size();
  if (auto [at, error] = std::from_chars(text.data(), end, seconds);
      error != std::errc() || at != end || seconds <= 0) {
    return deadline;
  }
  return std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(seconds));
}

}  // namespace

std::string conn_message(PGconn* conn) { return without_trailing_newlines(PQerrorMessage(conn)); }

std::string describe_server(const std::map<std::string, std::string>& params) {
  auto get = [&](const char* key, const std::string& fallback) {
    auto it = params.find(key);
    return it == params.end() ? fallback : it->second;
  };
  return "postgresql at " + get("host", "?") + ":" + get("port", "5432") + "/" +
         get("dbname", get("user", ""));
}

FdWait wait_socket(int fd, short events, Deadline deadline, int wake_fd) {
  const FdWait waited = wait_fd(fd, events, deadline, wake_fd);
  return waited == FdWait::kFailed ? FdWait::kReady : waited;
}

Status flush(PGconn* conn, Deadline deadline) {
  for (;;) {
    const int flushed = PQflush(conn);
    if (flushed == 0) return ok_status();
    if (flushed < 0) return unavailable_error("sending: " + conn_message(conn));
    if (wait_socket(PQsocket(conn), POLLOUT | POLLIN, deadline) != FdWait::kReady) {
      return deadline_exceeded_error("sending timed out");
    }
    if (PQconsumeInput(conn) != 1) return unavailable_error("reading: " + conn_message(conn));
  }
}

Result<bool> await_result(PGconn* conn, Deadline deadline, int wake_fd) {
  while (PQisBusy(conn) == 1) {
    const FdWait waited = wait_socket(PQsocket(conn), POLLIN, deadline, wake_fd);
    if (waited == FdWait::kWoken) return false;
    if (waited == FdWait::kTimedOut) return deadline_exceeded_error("no reply by the deadline");
    if (PQconsumeInput(conn) != 1) return unavailable_error("reading: " + conn_message(conn));
  }
  return true;
}

std::string sql_state(const PGresult* result) {
  const char* state = PQresultErrorField(result, PG_DIAG_SQLSTATE);
  return state != nullptr ? state : "";
}

Status result_status(PGresult* result, SqlFailure* failure) {
  const std::string sqlstate = sql_state(result);
  const std::string text = without_trailing_newlines(PQresultErrorMessage(result));
  const std::string message = text + (sqlstate.empty() ? "" : " (SQLSTATE " + sqlstate + ")");
  SqlFailure kind = SqlFailure::kOther;
  Status status;
  if (sqlstate == "42P01") {
    kind = SqlFailure::kNoTable;
    status = not_found_error(message);
  } else if (sqlstate == "42501") {
    kind = SqlFailure::kNoPrivilege;
    status = permission_denied_error(message);
  } else if (sqlstate == "23505") {
    kind = SqlFailure::kDuplicateKey;
    status = aborted_error(message);
  } else if (sqlstate == "42P07" || sqlstate == "42710") {
    // duplicate_table, duplicate_object (the table's row type).
    kind = SqlFailure::kAlreadyExists;
    status = already_exists_error(message);
  } else if (sqlstate == "57014") {
    status = deadline_exceeded_error(message);
  } else if (sqlstate.rfind("08", 0) == 0 || sqlstate.rfind("57", 0) == 0 ||
             sqlstate.rfind("53", 0) == 0 || sqlstate == "40001" || sqlstate == "40P01") {
    // Connection trouble, shutdown, resources, serialization: try again.
    status = unavailable_error(message);
  } else {
    status = internal_error(message);
  }
  if (failure != nullptr) *failure = kind;
  return status;
}

Result<PgConn> connect(const std::map<std::string, std::string>& params,
                       const std::string& description, Deadline deadline, int wake_fd) {
  SIMBA_ASSIGN_OR_RETURN(
      const auto resolved,
      with_host_addresses(params, description, with_connect_timeout(params, deadline), wake_fd));
  std::vector<const char*> keys;
  std::vector<const char*> values;
  for (const auto& [k, v] : resolved) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  keys.push_back(nullptr);
  values.push_back(nullptr);
  PgConn conn(PQconnectStartParams(keys.data(), values.data(), 0));
  if (!conn) return unavailable_error(description + ": out of memory");
  if (PQstatus(conn.get()) == CONNECTION_BAD) {
    return unavailable_error(description + ": " + conn_message(conn.get()));
  }
  PostgresPollingStatusType state = PGRES_POLLING_WRITING;
  for (;;) {
    if (state == PGRES_POLLING_OK) break;
    if (state == PGRES_POLLING_FAILED) {
      const std::string message = conn_message(conn.get());
      if (message.find("password authentication failed") != std::string::npos ||
          message.find("no password supplied") != std::string::npos ||
          message.find("no pg_hba.conf entry") != std::string::npos) {
        return permission_denied_error(description + ": " + message);
      }
      if (message.find("does not exist") != std::string::npos) {
        return not_found_error(description + ": " + message);
      }
      return unavailable_error(description + ": " + message);
    }
    const short events = state == PGRES_POLLING_READING ? POLLIN : POLLOUT;
    switch (wait_socket(PQsocket(conn.get()), events, deadline, wake_fd)) {
      case FdWait::kReady:
      case FdWait::kFailed:  // not returned by WaitSocket
        break;
      case FdWait::kWoken:
        return cancelled_error(description + ": cancelled while connecting");
      case FdWait::kTimedOut:
        return deadline_exceeded_error(description + ": connecting timed out");
    }
    state = PQconnectPoll(conn.get());
  }
  if (PQsetnonblocking(conn.get(), 1) != 0) {
    return unavailable_error(description + ": " + conn_message(conn.get()));
  }
  // libpq prints notices ("relation ... already exists, skipping") to
  // stderr by default: a library must not write into its user's stderr.
  PQsetNoticeProcessor(
      conn.get(),
      [](void*, const char* message) {
        SIMBA_LOG(kDebug, "postgresql: " << without_trailing_newlines(message));
      },
      nullptr);
  return conn;
}

const std::set<std::string>& libpq_keywords() {
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

Status check_params(const std::map<std::string, std::string>& params) {
  if (params.count("host") == 0 && params.count("hostaddr") == 0) {
    return invalid_argument_error("postgresql: no host");
  }
  for (const auto& [key, value] : params) {
    if (libpq_keywords().count(key) == 0) {
      return invalid_argument_error("postgresql: unknown connection option " + in_quotes(key));
    }
  }
  return ok_status();
}

}  // namespace simba::internal::sql::pg
