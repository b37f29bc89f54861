#include "backends/postgres/pg_connection.h"

#include <netdb.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "core/host_lookup.h"
#include "core/log.h"
#include "core/worker.h"

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
// libpq would skip it, and its failure ("host 'name': cannot resolve host:
// ...") added to `*unresolved`, so that a connection that fails names it
// too. When none resolves, kUnavailable naming each. Params that name
// `hostaddr` already, or whose `port` list does not match `host`'s (libpq
// reports that), are left alone.
// With kConnectHostKey (tls_server_name), that host is resolved instead of
// `host`, which stays the name libpq verifies; the key itself is removed.
Result<std::map<std::string, std::string>> with_host_addresses(
    std::map<std::string, std::string> params, const std::string& description, Deadline deadline,
    int wake_fd, std::vector<std::string>* unresolved) {
  std::optional<std::string> connect_host;
  if (const auto it = params.find(kConnectHostKey); it != params.end()) {
    connect_host = it->second;
    params.erase(it);
  }
  const auto host = params.find("host");
  if (host == params.end() || params.count("hostaddr") != 0) return params;
  const std::vector<std::string> hosts = split_list(connect_host.value_or(host->second));
  // The TLS name for each address (with a connect host, there is one host).
  const auto tls_name = [&](const std::string& name) { return connect_host ? host->second : name; };
  const auto port = params.find("port");
  const std::vector<std::string> ports =
      port == params.end() ? std::vector<std::string>{""} : split_list(port->second);
  if (ports.size() != 1 && ports.size() != hosts.size()) return params;

  std::vector<std::string> new_hosts;
  std::vector<std::string> new_addresses;
  std::vector<std::string> new_ports;
  bool looked_up = false;
  Status first_failure;
  std::vector<std::string> failed;  // "host 'name': why", for each name that did not resolve
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    const std::string& name = hosts[i];
    const std::string& port_text = ports.size() == 1 ? ports.front() : ports[i];
    if (needs_no_look_up(name)) {
      new_hosts.push_back(tls_name(name));
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
      failed.push_back("host " + in_quotes(name) + ": " + found.status().message());
      continue;
    }
    std::vector<std::string> seen;
    for (const ResolvedAddress& address : *found) {
      std::string text = numeric_address(address);
      if (text.empty() || std::find(seen.begin(), seen.end(), text) != seen.end()) continue;
      seen.push_back(text);
      new_hosts.push_back(tls_name(name));
      new_addresses.push_back(std::move(text));
      new_ports.push_back(port_text);
    }
  }
  if (!looked_up) {
    if (connect_host) host->second = *connect_host;  // a socket: nothing to verify
    return params;
  }
  if (new_hosts.empty()) {
    if (first_failure.ok()) {
      return unavailable_error(description + ": cannot resolve host: no address");
    }
    // No host left to try: the first one's error, naming the others too.
    std::string message = first_failure.message();
    for (std::size_t i = 1; i < failed.size(); ++i) message += "; " + failed[i];
    return Status(first_failure.code(), message);
  }
  *unresolved = std::move(failed);
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
  // host:port for each host of the list ("h1:p1,h2:p2").
  const std::vector<std::string> hosts = split_list(get(kConnectHostKey, get("host", "?")));
  const std::vector<std::string> ports = split_list(get("port", "5432"));
  std::vector<std::string> addresses;
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    std::string port = ports.size() == hosts.size() ? ports[i] : ports.front();
    if (port.empty()) port = "5432";
    addresses.push_back(hosts[i] + ":" + port);
  }
  return "postgresql at " + join_list(addresses) + "/" + get("dbname", get("user", ""));
}

namespace {

// The system's CA bundle for libpq 15, which has no sslrootcert=system (16
// has): OpenSSL's own default file, else the usual places.
std::string system_ca_file() {
  if (PQlibVersion() >= 160000) return "system";
  if (const char* file = std::getenv("SSL_CERT_FILE"); file != nullptr && file[0] != 0) {
    return file;
  }
  for (const char* file : {"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                           "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem"}) {
    if (std::ifstream(file).good()) return file;
  }
  return "";
}

// sslmode for a TLS mode.
const char* sslmode_of(TlsMode mode) {
  switch (mode) {
    case TlsMode::kOff:
      return "disable";
    case TlsMode::kOn:
      return "verify-ca";
    case TlsMode::kVerify:
      return "verify-full";
  }
  return "disable";
}

// Locks taken on a hot standby would not exclude anyone: advisory locks are
// granted there locally, unknown to the primary, and the lease table is
// read-only. A session that landed on one (a URI naming a standby alone, or
// target_session_attrs=any) is refused, naming the host it reached.
// PostgreSQL 14 and later report in_hot_standby at connect (no round trip);
// older servers are asked pg_is_in_recovery(). Transient (kUnavailable): the
// standby may be being promoted, or the primary be back soon.
Status refuse_standby(PGconn* conn, const std::string& description, Deadline deadline,
                      int wake_fd) {
  bool standby = false;
  if (const char* reported = PQparameterStatus(conn, "in_hot_standby"); reported != nullptr) {
    standby = std::string_view(reported) == "on";
  } else {
    if (PQsendQuery(conn, "SELECT pg_is_in_recovery()") != 1) {
      return unavailable_error(description + ": " + conn_message(conn));
    }
    SIMBA_RETURN_IF_ERROR(flush(conn, deadline).with_context(description));
    for (;;) {
      SIMBA_ASSIGN_OR_RETURN(const bool ready, await_result(conn, deadline, wake_fd));
      if (!ready) return cancelled_error(description + ": cancelled while connecting");
      PgResult result(PQgetResult(conn));
      if (!result) break;
      if (PQresultStatus(result.get()) == PGRES_TUPLES_OK && PQntuples(result.get()) == 1) {
        standby = std::string_view(PQgetvalue(result.get(), 0, 0)) == "t";
      }
    }
  }
  if (!standby) return ok_status();
  const char* host = PQhost(conn);
  const char* port = PQport(conn);
  return unavailable_error(
      description + ": " + (host != nullptr ? host : "?") + ":" + (port != nullptr ? port : "?") +
      " is a standby (in recovery): locks taken there would not exclude the primary's; name the "
      "primary, or list the primary and its standbys (target_session_attrs=read-write picks the "
      "primary)");
}

}  // namespace

Status apply_tls(std::map<std::string, std::string>& params, const TlsOptions& tls) {
  SIMBA_RETURN_IF_ERROR(tls.validate("postgresql"));
  const std::string mode = std::string("tls=") + tls_mode_name(tls.mode);
  const std::string sslmode = sslmode_of(tls.mode);
  if (const auto it = params.find("sslmode"); it != params.end() && it->second != sslmode) {
    return invalid_argument_error("postgresql: " + mode + " (sslmode=" + sslmode +
                                  ") contradicts sslmode=" + it->second + ": give one of them");
  }
  params["sslmode"] = sslmode;
  struct File {
    const char* ours;
    const std::string& value;
    const char* libpq;
  };
  for (const File& file :
       {File{"tls_ca", tls.ca, "sslrootcert"}, File{"tls_cert", tls.cert, "sslcert"},
        File{"tls_key", tls.key, "sslkey"}}) {
    if (file.value.empty()) continue;
    const auto it = params.find(file.libpq);
    if (it != params.end() && it->second != file.value) {
      return invalid_argument_error(std::string("postgresql: ") + file.ours + " and " + file.libpq +
                                    " name different files: give one of them");
    }
    params[file.libpq] = file.value;
  }
  if (!tls.enabled()) return ok_status();
  if (params.count("sslrootcert") == 0) {
    const std::string system = system_ca_file();
    if (system.empty()) {
      return invalid_argument_error(
          "postgresql: " + mode +
          " without tls_ca needs the system's CA file, and none was found "
          "(set tls_ca, or SSL_CERT_FILE)");
    }
    params["sslrootcert"] = system;
  }
  if (!tls.server_name.empty()) {
    const auto host = params.find("host");
    if (host == params.end() || host->second.find(',') != std::string::npos) {
      return invalid_argument_error("postgresql: tls_server_name needs exactly one host");
    }
    // libpq verifies (and sends as SNI) `host`; with `hostaddr` it connects
    // there, else to the URI's host, which connect() resolves.
    if (params.count("hostaddr") == 0) params[kConnectHostKey] = host->second;
    host->second = tls.server_name;
  }
  return ok_status();
}

std::string transport_of(const std::map<std::string, std::string>& params) {
  std::string sslmode;
  if (const auto it = params.find("sslmode"); it != params.end()) {
    sslmode = it->second;
  } else if (const char* env = std::getenv("PGSSLMODE"); env != nullptr && env[0] != 0) {
    sslmode = env;
  } else {
    sslmode = "prefer";
  }
  std::string out;
  if (sslmode == "disable") return "plain text";
  if (sslmode == "verify-full") {
    out = "TLS (verify)";
  } else if (sslmode == "verify-ca") {
    out = "TLS (on)";
  } else if (sslmode == "require") {
    out = "TLS, server not verified (sslmode=require)";
  } else {
    out = "TLS if the server offers it (sslmode=" + sslmode + ")";
  }
  if (params.count("sslcert") != 0) out += ", client certificate";
  return out;
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

bool send_cancel(PGconn* conn, std::chrono::milliseconds within) {
  PGcancel* cancel = PQgetCancel(conn);
  if (cancel == nullptr) return false;
  // PQcancel (libpq 15) connects and then waits for the server to take the
  // request, with no timeout: a paused server, or a network that swallows
  // packets, would hold the calling thread until it answers. So it runs on
  // a thread of its own, which we wait for only `within`; the PGcancel is
  // the thread's alone (it does not refer to `conn`), and a request that
  // arrives after we gave up finds the session closed or idle: the server
  // ignores it (its key names only that session).
  struct Outcome {
    std::mutex mu;
    std::condition_variable done;
    std::optional<bool> sent;  // guarded by mu
  };
  auto outcome = std::make_shared<Outcome>();
  try {
    std::thread([cancel, outcome] {
      internal::name_this_thread("pg-cancel");
      char error[256] = {};
      const bool sent = PQcancel(cancel, error, sizeof error) == 1;
      PQfreeCancel(cancel);
      if (!sent) SIMBA_LOG(kDebug, "postgresql: cancel request failed: " << error);
      std::lock_guard<std::mutex> lock(outcome->mu);
      outcome->sent = sent;
      outcome->done.notify_all();
    }).detach();
  } catch (const std::system_error& e) {
    PQfreeCancel(cancel);
    SIMBA_LOG(kDebug, "postgresql: no thread for a cancel request: " << e.what());
    return false;
  }
  std::unique_lock<std::mutex> lock(outcome->mu);
  if (!outcome->done.wait_for(lock, within, [&] { return outcome->sent.has_value(); })) {
    SIMBA_LOG(kDebug, "postgresql: the server did not take a cancel request within "
                          << within.count() << " ms");
    return false;
  }
  return *outcome->sent;
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
  return sqlstate_status(sql_state(result), without_trailing_newlines(PQresultErrorMessage(result)),
                         failure);
}

Status sqlstate_status(const std::string& sqlstate, const std::string& text, SqlFailure* failure) {
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
  } else if (sqlstate == "25006") {
    // read_only_sql_transaction: the session is on a standby, or the server
    // was made read-only (default_transaction_read_only), as before a
    // switchover. A failover may be under way.
    status = unavailable_error(message);
  } else if (sqlstate == "55P03") {
    // lock_not_available: lock_timeout fired while waiting on a row (a
    // holder slow to commit). The keyed backend reads it by SQLSTATE (a
    // key not granted by the deadline) before this code matters; the SQL
    // protocol's wait line by its kind.
    kind = SqlFailure::kLockTimeout;
    status = unavailable_error(message);
  } else {
    status = internal_error(message);
  }
  if (failure != nullptr) *failure = kind;
  return status;
}

namespace {

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

// What one entry of libpq's connect failure says.
struct ConnectVerdict {
  StatusCode code = StatusCode::kUnavailable;
  const char* hint = nullptr;  // added once to the message, in parentheses
};

ConnectVerdict classify_connect_entry(const std::string& entry) {
  // A file named in the options (sslrootcert, sslcert, sslkey) that is
  // missing or unusable: only its owner can fix that.
  if (contains(entry, "certificate file") || contains(entry, "key file")) {
    return {StatusCode::kInvalidArgument};
  }
  // The server's certificate, or the server itself, fails our TLS demands;
  // a failover does not change a server's TLS setup.
  if (contains(entry, "certificate verify failed")) {
    // OpenSSL's verdict alone does not say why.
    return {StatusCode::kPermissionDenied,
            "the server's certificate is not signed by the CA given (tls_ca, sslrootcert), or "
            "has expired, or is not valid yet"};
  }
  if (contains(entry, "does not match host name") ||
      contains(entry, "server does not support SSL") ||
      // The server refused our client certificate during the handshake
      // ("SSL error: tlsv1 alert unknown ca", "... alert certificate
      // required").
      contains(entry, "alert unknown ca") || contains(entry, "alert bad certificate") ||
      contains(entry, "alert certificate")) {
    return {StatusCode::kPermissionDenied};
  }
  if (contains(entry, "password authentication failed") ||
      contains(entry, "no password supplied") ||
      contains(entry, "certificate authentication failed") ||
      contains(entry, "requires a valid client certificate") ||
      contains(entry, "no pg_hba.conf entry") ||
      contains(entry, "pg_hba.conf rejects connection") ||
      contains(entry, "is not permitted to log in") ||
      contains(entry, "permission denied for database")) {
    // A server that takes only TLS says "no encryption".
    return {StatusCode::kPermissionDenied,
            contains(entry, "no encryption")
                ? "the server takes only TLS: tls=verify and tls_ca, or sslmode"
                : nullptr};
  }
  if (contains(entry, "does not exist")) return {StatusCode::kNotFound};  // database or role
  if (contains(entry, "session is read-only") || contains(entry, "hot standby")) {
    // target_session_attrs=read-write (or primary) found no primary.
    return {StatusCode::kUnavailable,
            "no host is a primary: a failover under way, or the URI names only standbys"};
  }
  // Refused, reset, timed out, starting up, shutting down, too many
  // clients...: another try may get through.
  return {};
}

// libpq's message split into its entries, one per host and address tried.
std::vector<std::string> connect_failure_entries(const std::string& message) {
  std::vector<std::size_t> markers;
  for (const std::string_view marker : {std::string_view("connection to server at"),
                                        std::string_view("connection to server on socket")}) {
    for (std::size_t at = message.find(marker); at != std::string::npos;
         at = message.find(marker, at + marker.size())) {
      markers.push_back(at);
    }
  }
  std::sort(markers.begin(), markers.end());
  // Text before the first marker (or a message without one) is an entry too.
  std::vector<std::size_t> starts;
  if (markers.empty() || message.find_first_not_of(" \t\n") < markers.front()) {
    starts.push_back(0);
  }
  starts.insert(starts.end(), markers.begin(), markers.end());
  std::vector<std::string> entries;
  for (std::size_t i = 0; i < starts.size(); ++i) {
    const std::size_t end = i + 1 < starts.size() ? starts[i + 1] : message.size();
    entries.push_back(without_trailing_newlines(message.substr(starts[i], end - starts[i])));
  }
  return entries;
}

}  // namespace

Status connect_failure_status(const std::string& description, const std::string& message,
                              const std::vector<std::string>& unresolved_hosts) {
  std::optional<StatusCode> permanent;         // the first entry's, when none is transient
  bool transient = !unresolved_hosts.empty();  // a name that did not resolve may next time
  std::vector<std::string> hints;
  for (const std::string& entry : connect_failure_entries(message)) {
    const ConnectVerdict verdict = classify_connect_entry(entry);
    if (verdict.code == StatusCode::kUnavailable) {
      transient = true;
    } else if (!permanent) {
      permanent = verdict.code;
    }
    if (verdict.hint != nullptr &&
        std::find(hints.begin(), hints.end(), verdict.hint) == hints.end()) {
      hints.emplace_back(verdict.hint);
    }
  }
  std::string text = description + ": " + message;
  for (const std::string& hint : hints) text += " (" + hint + ")";
  for (const std::string& host : unresolved_hosts) text += "; " + host;
  return Status(transient || !permanent ? StatusCode::kUnavailable : *permanent, std::move(text));
}

Result<PgConn> connect(const std::map<std::string, std::string>& params,
                       const std::string& description, Deadline deadline, int wake_fd) {
  std::vector<std::string> unresolved;  // hosts of the list left out
  SIMBA_ASSIGN_OR_RETURN(
      const auto resolved,
      with_host_addresses(params, description, with_connect_timeout(params, deadline), wake_fd,
                          &unresolved));
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
      return connect_failure_status(description, conn_message(conn.get()), unresolved);
    }
    const short events = state == PGRES_POLLING_READING ? POLLIN : POLLOUT;
    switch (wait_socket(PQsocket(conn.get()), events, deadline, wake_fd)) {
      case FdWait::kReady:
      case FdWait::kFailed:  // not returned by WaitSocket
        break;
      case FdWait::kWoken:
        return cancelled_error(description + ": cancelled while connecting");
      case FdWait::kTimedOut: {
        std::string message = description + ": connecting timed out";
        for (const std::string& host : unresolved) message += "; " + host;
        return deadline_exceeded_error(std::move(message));
      }
    }
    state = PQconnectPoll(conn.get());
  }
  if (PQsetnonblocking(conn.get(), 1) != 0) {
    return unavailable_error(description + ": " + conn_message(conn.get()));
  }
  SIMBA_RETURN_IF_ERROR(refuse_standby(conn.get(), description, deadline, wake_fd));
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
