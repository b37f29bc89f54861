#include "backends/mysql/mysql_client.h"

#include <errmsg.h>
#include <mysqld_error.h>
#include <netdb.h>
#include <poll.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <mutex>

#include "core/host_lookup.h"
#include "core/poll_timeout.h"

namespace simba::internal::sql::mysql {

using std::chrono::steady_clock;

void init_library_once() {
  static std::once_flag once;
  std::call_once(once, [] { mysql_library_init(0, nullptr, nullptr); });
}

// One poll() of a driven call: the `ready` mask for the library's _cont, or
// -1 when there is nothing to tell it yet. Sets *timed_out once `deadline`
// has passed and *woken when `wake_fd` is readable.
int poll_for_drive(MYSQL* m, int status, Deadline deadline, int wake_fd, bool* woken,
                   bool* timed_out) {
  int timeout = poll_timeout(deadline);
  if (timeout < 0) {
    *timed_out = true;
    return -1;
  }
  // The library's own timeouts (connect_timeout) count too.
  bool library_timeout = false;
  if ((status & MYSQL_WAIT_TIMEOUT) != 0) {
    const unsigned int ms = mysql_get_timeout_value_ms(m);
    if (static_cast<long long>(ms) < timeout) {
      timeout = static_cast<int>(ms);
      library_timeout = true;
    }
  }
  short events = 0;
  if ((status & MYSQL_WAIT_READ) != 0) events |= POLLIN;
  if ((status & MYSQL_WAIT_WRITE) != 0) events |= POLLOUT;
  if ((status & MYSQL_WAIT_EXCEPT) != 0) events |= POLLPRI;
  pollfd fds[2] = {{static_cast<int>(mysql_get_socket(m)), events, 0}, {wake_fd, POLLIN, 0}};
  const int n = ::poll(fds, wake_fd >= 0 ? 2 : 1, timeout);
  if (n < 0) {
    if (errno == EINTR) return -1;
    return status & (MYSQL_WAIT_READ | MYSQL_WAIT_WRITE);  // let the library see the error
  }
  if (wake_fd >= 0 && (fds[1].revents & POLLIN) != 0) {
    *woken = true;
    return -1;
  }
  if (n == 0) return library_timeout ? MYSQL_WAIT_TIMEOUT : -1;  // the deadline: checked next
  const short revents = fds[0].revents;
  int ready = 0;
  if ((revents & POLLIN) != 0) ready |= MYSQL_WAIT_READ;
  if ((revents & POLLOUT) != 0) ready |= MYSQL_WAIT_WRITE;
  if ((revents & POLLPRI) != 0) ready |= MYSQL_WAIT_EXCEPT;
  if ((revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) {
    ready |= status & (MYSQL_WAIT_READ | MYSQL_WAIT_WRITE);
  }
  return ready == 0 ? -1 : ready;
}

Failure error_of(MYSQL* m) {
  const unsigned int code = mysql_errno(m);
  const std::string message = std::string(mysql_error(m)) + " (error " + std::to_string(code) +
                              ", SQLSTATE " + mysql_sqlstate(m) + ")";
  Failure f;
  switch (code) {
    case ER_NO_SUCH_TABLE:  // 1146
      f.kind = SqlFailure::kNoTable;
      f.status = not_found_error(message);
      break;
    case ER_TABLEACCESS_DENIED_ERROR:      // 1142
    case ER_DBACCESS_DENIED_ERROR:         // 1044
    case ER_SPECIFIC_ACCESS_DENIED_ERROR:  // 1227
      f.kind = SqlFailure::kNoPrivilege;
      f.status = permission_denied_error(message);
      break;
    case ER_TABLE_EXISTS_ERROR:  // 1050
      f.kind = SqlFailure::kAlreadyExists;
      f.status = already_exists_error(message);
      break;
    case ER_DUP_ENTRY:  // 1062
      f.kind = SqlFailure::kDuplicateKey;
      f.status = aborted_error(message);
      break;
    case ER_ACCESS_DENIED_ERROR:  // 1045
      f.status = permission_denied_error(message);
      break;
    case ER_BAD_DB_ERROR:  // 1049
      f.status = not_found_error(message);
      break;
    case ER_LOCK_WAIT_TIMEOUT:  // 1205
    case ER_LOCK_DEADLOCK:      // 1213
      f.status = unavailable_error(message);
      break;
    case ER_OPTION_PREVENTS_STATEMENT:  // 1290
    case ER_READ_ONLY_MODE:             // 1836 (MySQL: "Running in read-only mode")
    case ER_INNODB_READ_ONLY:           // 1874
      // "running with the --read-only option": the primary was demoted
      // (a switchover) under an open connection. Dropping the connection
      // makes the next one look for the writable host.
      f.broken = true;
      f.status = unavailable_error(message + " (the server has become read-only)");
      break;
    case CR_CONNECTION_ERROR:      // 2002
    case CR_CONN_HOST_ERROR:       // 2003
    case CR_SERVER_GONE_ERROR:     // 2006
    case CR_SERVER_LOST:           // 2013
    case CR_SERVER_LOST_EXTENDED:  // 2055
    case ER_CONNECTION_KILLED:     // 1927 (MariaDB: KILL of this connection)
    case ER_SERVER_SHUTDOWN:       // 1053
    case ER_QUERY_INTERRUPTED:     // 1317
      f.broken = true;
      f.status = unavailable_error(message);
      break;
    default:
      // Other client errors (2xxx) leave the connection in doubt.
      f.broken = code >= 2000 && code < 3000;
      f.status = f.broken ? unavailable_error(message) : internal_error(message);
      break;
  }
  return f;
}

namespace {

// Server errors of MySQL that MariaDB's mysqld_error.h does not name.
constexpr unsigned int kMysqlAccountLocked = 3118;            // ER_ACCOUNT_HAS_BEEN_LOCKED
constexpr unsigned int kMysqlSecureTransportRequired = 3159;  // ER_SECURE_TRANSPORT_REQUIRED

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

Status connect_failure_status(unsigned int code, const std::string& message) {
  switch (code) {
    case ER_ACCESS_DENIED_ERROR:              // 1045
    case ER_DBACCESS_DENIED_ERROR:            // 1044
    case ER_HOST_NOT_PRIVILEGED:              // 1130
    case ER_NOT_SUPPORTED_AUTH_MODE:          // 1251
    case ER_ACCESS_DENIED_NO_PASSWORD_ERROR:  // 1698 (MariaDB: unix_socket, no password)
    case ER_MUST_CHANGE_PASSWORD_LOGIN:       // 1862 (the password has expired)
    case ER_ACCOUNT_HAS_BEEN_LOCKED:          // 4151 (MariaDB)
    case kMysqlAccountLocked:                 // 3118
    case kMysqlSecureTransportRequired:       // 3159 (MariaDB says 1045)
      return permission_denied_error(message);
    case ER_HOST_IS_BLOCKED:  // 1129
      // Stays so until an operator acts: retrying would only add failures.
      return permission_denied_error(message +
                                     " (after max_connect_errors failed connections; it stays "
                                     "blocked until an operator runs FLUSH HOSTS)");
    case ER_BAD_DB_ERROR:  // 1049
      return not_found_error(message);
    case CR_SSL_CONNECTION_ERROR: {  // 2026
      // The server's certificate not verified (chain, expiry, name), or a
      // server without TLS: a failover does not change either. Other TLS
      // failures (a handshake cut short) may pass.
      std::string lower = message;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      for (const std::string_view verdict : {"certificate", "verif", "self-signed", "self signed",
                                             "issuer", "server does not support"}) {
        if (contains(lower, verdict)) return permission_denied_error(message);
      }
      return unavailable_error(message);
    }
    case ER_CON_COUNT_ERROR:  // 1040: too many connections, for now
    default:
      // Refused, reset, timed out, a lookup failed, shutting down, any other
      // client error (2xxx) or unknown server error: another try may pass.
      return unavailable_error(message);
  }
}

std::string describe_server(const MysqlOptions& server) {
  std::string hosts = server.host + ":" + std::to_string(server.port);
  for (const MysqlHost& more : server.more_hosts) {
    hosts += "," + more.host + ":" + std::to_string(more.port);
  }
  return "mysql at " + hosts + "/" + server.database;
}

namespace {

// The system's CA bundle, for verify_ca without a CA file (libmariadb
// verifies a chain without the host name only against a file).
std::string system_ca_file() {
  if (const char* file = std::getenv("SSL_CERT_FILE"); file != nullptr && file[0] != 0) {
    return file;
  }
  for (const char* file : {"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                           "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem"}) {
    if (std::ifstream(file).good()) return file;
  }
  return "";
}

}  // namespace

Status apply_tls(MysqlOptions& server) {
  if (!server.tls) return ok_status();
  const TlsOptions tls = *server.tls;
  server.tls.reset();
  SIMBA_RETURN_IF_ERROR(tls.validate("mysql"));
  if (!tls.server_name.empty()) {
    return invalid_argument_error(
        "mysql: tls_server_name is not supported: libmariadb verifies the server's certificate "
        "against the host it connects to and has no option to name another; put that name in "
        "the URI's host");
  }
  const std::string mode = std::string("tls=") + tls_mode_name(tls.mode);
  const char* ssl_mode = tls.mode == TlsMode::kVerify ? "verify_identity"
                         : tls.mode == TlsMode::kOn   ? "verify_ca"
                                                      : "disabled";
  // "disabled" is also the field's default: only another value was asked for.
  if (server.ssl_mode != "disabled" && server.ssl_mode != ssl_mode) {
    return invalid_argument_error("mysql: " + mode + " (ssl_mode=" + ssl_mode +
                                  ") contradicts ssl_mode=" + server.ssl_mode +
                                  ": give one of them");
  }
  if (tls.mode == TlsMode::kOff && server.ssl_mode == "disabled" &&
      (!server.ssl_ca.empty() || !server.ssl_cert.empty())) {
    return invalid_argument_error("mysql: " + mode +
                                  " contradicts ssl_ca and ssl_cert, which ask for TLS");
  }
  server.ssl_mode = ssl_mode;
  struct File {
    const char* ours;
    const std::string& value;
    const char* theirs;
    std::string& field;
  };
  for (const File& file : {File{"tls_ca", tls.ca, "ssl_ca", server.ssl_ca},
                           File{"tls_cert", tls.cert, "ssl_cert", server.ssl_cert},
                           File{"tls_key", tls.key, "ssl_key", server.ssl_key}}) {
    if (file.value.empty()) continue;
    if (!file.field.empty() && file.field != file.value) {
      return invalid_argument_error(std::string("mysql: ") + file.ours + " and " + file.theirs +
                                    " name different files: give one of them");
    }
    file.field = file.value;
  }
  if (tls.mode == TlsMode::kOn && server.ssl_ca.empty()) {
    server.ssl_ca = system_ca_file();
    if (server.ssl_ca.empty()) {
      return invalid_argument_error(
          "mysql: tls=on without tls_ca needs the system's CA file, and none was found (set "
          "tls_ca, or SSL_CERT_FILE)");
    }
  }
  return ok_status();
}

std::string transport_of(const MysqlOptions& server) {
  const bool files = !server.ssl_ca.empty() || !server.ssl_cert.empty() || !server.ssl_key.empty();
  if (server.ssl_mode == "disabled" && !files) return "plain text";
  std::string out;
  if (server.ssl_mode == "verify_identity") {
    out = "TLS (verify)";
  } else if (server.ssl_mode == "verify_ca" || !server.ssl_ca.empty()) {
    out = "TLS (on)";
  } else {
    out = "TLS, server not verified (ssl_mode=required)";
  }
  if (!server.ssl_cert.empty()) out += ", client certificate";
  return out;
}

Status check_server(const MysqlOptions& server) {
  if (server.host.empty()) return invalid_argument_error("mysql: no host");
  for (std::size_t i = 0; i < server.more_hosts.size(); ++i) {
    if (server.more_hosts[i].host.empty()) {
      return invalid_argument_error("mysql: more_hosts[" + std::to_string(i) + "] has no host");
    }
  }
  if (server.database.empty()) return invalid_argument_error("mysql: no database");
  if (server.connect_timeout <= std::chrono::milliseconds::zero()) {
    return invalid_argument_error("mysql: connect_timeout must be positive");
  }
  if (server.ssl_mode != "disabled" && server.ssl_mode != "required" &&
      server.ssl_mode != "verify_ca" && server.ssl_mode != "verify_identity") {
    return invalid_argument_error(
        "mysql: ssl_mode must be disabled, required, verify_ca or verify_identity, not " +
        in_quotes(server.ssl_mode));
  }
  // libmariadb verifies a chain without the host name only against a CA
  // file; without one, verify_ca would verify nothing.
  if (server.ssl_mode == "verify_ca" && server.ssl_ca.empty()) {
    return invalid_argument_error(
        "mysql: ssl_mode=verify_ca needs ssl_ca (the CA file that signed the server's "
        "certificate)");
  }
  if (!server.ssl_key.empty() && server.ssl_cert.empty()) {
    return invalid_argument_error("mysql: ssl_key needs ssl_cert (the client certificate)");
  }
  return ok_status();
}

namespace {

// Whether the connection must be encrypted (any mode but "disabled", or
// any of the TLS files given).
bool wants_tls(const MysqlOptions& server) {
  return server.ssl_mode != "disabled" || !server.ssl_ca.empty() || !server.ssl_cert.empty() ||
         !server.ssl_key.empty();
}

// One connection attempt to `host` (the endpoint's own, or one of its
// addresses) on a new handle. `*unreachable` says whether another address
// of the same server is worth a try.
Result<MysqlConn> connect_to(const std::string& host, const MysqlOptions& endpoint,
                             const std::string& description, Deadline deadline,
                             const ConnectExtras& extras, bool* unreachable) {
  *unreachable = false;
  MysqlConn conn(mysql_init(nullptr));
  if (!conn) return unavailable_error(description + ": out of memory");
  MYSQL* m = conn.get();
  mysql_options(m, MYSQL_OPT_NONBLOCK, nullptr);
  mysql_options(m, MYSQL_SET_CHARSET_NAME, "utf8mb4");
  if (!extras.init_command.empty()) {
    mysql_options(m, MYSQL_INIT_COMMAND, extras.init_command.c_str());
  }
  const unsigned int timeout_s = static_cast<unsigned int>(std::max<long long>(
      1, std::chrono::ceil<std::chrono::seconds>(endpoint.connect_timeout).count()));
  mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &timeout_s);
  mysql_options4(m, MYSQL_OPT_CONNECT_ATTR_ADD, "program_name", "simba");
  for (const auto& [key, value] : extras.attributes) {
    mysql_options4(m, MYSQL_OPT_CONNECT_ATTR_ADD, key.c_str(), value.c_str());
  }
  if (wants_tls(endpoint)) {
    const my_bool on = 1;
    mysql_options(m, MYSQL_OPT_SSL_ENFORCE, &on);
    // With a CA file, libmariadb verifies the server's certificate chain
    // against it (in every mode: "verify_ca" is "required" with a CA).
    if (!endpoint.ssl_ca.empty()) mysql_options(m, MYSQL_OPT_SSL_CA, endpoint.ssl_ca.c_str());
    if (!endpoint.ssl_cert.empty()) {
      mysql_options(m, MYSQL_OPT_SSL_CERT, endpoint.ssl_cert.c_str());
    }
    if (!endpoint.ssl_key.empty()) mysql_options(m, MYSQL_OPT_SSL_KEY, endpoint.ssl_key.c_str());
    // The host name check; also the chain against the system's CAs when
    // there is no CA file.
    const my_bool verify = endpoint.ssl_mode == "verify_identity" ? 1 : 0;
    mysql_options(m, MYSQL_OPT_SSL_VERIFY_SERVER_CERT, &verify);
  }
  MYSQL* connected = nullptr;
  int status = mysql_real_connect_start(
      &connected, m, host.c_str(), endpoint.user.c_str(),
      endpoint.password.empty() ? nullptr : endpoint.password.c_str(), endpoint.database.c_str(),
      endpoint.port, nullptr, extras.multi_statements ? CLIENT_MULTI_STATEMENTS : 0);
  auto cont = [&](int ready) { return mysql_real_connect_cont(&connected, m, ready); };
  const DriveOutcome outcome = drive(m, status, deadline, cont, extras.wake_fd);
  if (outcome != DriveOutcome::kDone) {
    abandon(m, status, cont);
    if (outcome == DriveOutcome::kWoken) return cancelled_error(description + ": cancelled");
    return deadline_exceeded_error(description + ": connecting timed out");
  }
  if (connected == nullptr) {
    const unsigned int code = mysql_errno(m);
    *unreachable = code == CR_CONN_HOST_ERROR || code == CR_CONNECTION_ERROR;
    const Status failed = connect_failure_status(code, error_of(m).status.message());
    // MariaDB with require_secure_transport answers a plain client with
    // "Access denied" only, however right the password.
    const char* plain = code == ER_ACCESS_DENIED_ERROR && !wants_tls(endpoint)
                            ? " (over plain text: a server that takes only TLS answers so too; "
                              "tls=verify and tls_ca)"
                            : "";
    return Status(failed.code(), description + ": connecting: " + failed.message() + plain);
  }
  // libmariadb 3.3 refuses a server without TLS only when it also verifies
  // the host name: in the other modes it goes on in the clear. Such a
  // connection is never used (the server's greeting had no TLS, so an
  // attacker in the path may have removed it). Permanent: a failover does
  // not change a server's TLS setup.
  if (wants_tls(endpoint) && mysql_get_ssl_cipher(m) == nullptr) {
    const std::string why = endpoint.ssl_mode != "disabled"
                                ? "ssl_mode=" + endpoint.ssl_mode
                                : std::string("a TLS file (ssl_ca, ssl_cert)");
    return permission_denied_error(
        description + ": connecting: the server does not offer TLS, which " + why + " requires");
  }
  return conn;
}

// Connects to `endpoint`'s host:port (its more_hosts are not looked at) by
// `deadline`.
Result<MysqlConn> connect_host(const MysqlOptions& endpoint, const std::string& description,
                               Deadline deadline, const ConnectExtras& extras) {
  bool unreachable = false;
  // To libmariadb "localhost" is its Unix socket: nothing to resolve.
  if (endpoint.host == "localhost") {
    return connect_to(endpoint.host, endpoint, description, deadline, extras, &unreachable);
  }
  // libmariadb resolves a name with a blocking getaddrinfo() that no timeout
  // bounds, so a hung DNS server would stall the connect past its deadline:
  // resolve it here, within the deadline, and hand the library addresses.
  // The port does not change the addresses; it only lets concurrent lookups
  // of one server share a worker.
  Result<std::vector<ResolvedAddress>> found =
      look_up_host_unless_woken(endpoint.host, endpoint.port, deadline, extras.wake_fd);
  if (!found.ok()) return found.status().with_context(description);
  if (endpoint.ssl_mode == "verify_identity") {
    // libmariadb checks the certificate against the host it was given, and
    // has no option to name another: it must get the name, and looks it up
    // again itself, unbounded. The lookup above still ends the common case,
    // a resolver that is down or hung, by the deadline.
    return connect_to(endpoint.host, endpoint, description, deadline, extras, &unreachable);
  }
  // Each address in the resolver's order until one answers, as libmariadb
  // itself would try them.
  std::vector<std::string> tried;
  Status last = unavailable_error(description + ": cannot resolve host: no address");
  for (const ResolvedAddress& address : *found) {
    std::string text = numeric_address(address);
    if (text.empty() || std::find(tried.begin(), tried.end(), text) != tried.end()) continue;
    if (!tried.empty() && steady_clock::now() >= deadline) break;
    Result<MysqlConn> conn =
        connect_to(text, endpoint, description, deadline, extras, &unreachable);
    if (conn.ok() || !unreachable) return conn;
    last = conn.status();
    tried.push_back(std::move(text));
  }
  return last;
}

// Connects to `endpoint`'s host:port by `deadline` and keeps the connection
// if the server is fit for locks.
Result<MysqlConn> connect_fit_host(const MysqlOptions& endpoint, Deadline deadline,
                                   const ConnectExtras& extras) {
  const std::string description = describe_server(endpoint);
  SIMBA_ASSIGN_OR_RETURN(MysqlConn conn, connect_host(endpoint, description, deadline, extras));
  Status fit =
      refuse_unsafe_server(conn.get(), description, deadline, extras.session_locks, extras.wake_fd);
  if (!fit.ok()) {
    // Closed without a goodbye: the reply to the role query may be unread.
    mariadb_cancel(conn.get());
    return fit;
  }
  return conn;
}

}  // namespace

StatusCode code_of_none_fit(const std::vector<Status>& failures) {
  if (failures.empty()) return StatusCode::kUnavailable;
  bool transient = false;
  bool deadline = false;
  for (const Status& failure : failures) {
    // A host that timed out may answer in time next; any other transient
    // failure (refused, read-only, too many connections) may be a failover
    // under way.
    if (failure.code() == StatusCode::kDeadlineExceeded) {
      deadline = true;
    } else if (is_retryable(failure)) {
      transient = true;
    }
  }
  if (transient) return StatusCode::kUnavailable;
  if (deadline) return StatusCode::kDeadlineExceeded;
  return failures.front().code();
}

Result<MysqlConn> connect(const MysqlOptions& server, Deadline deadline,
                          const ConnectExtras& extras) {
  init_library_once();
  // libmariadb connects to one host: the list is ours to walk.
  std::vector<MysqlHost> hosts = {{server.host, server.port}};
  hosts.insert(hosts.end(), server.more_hosts.begin(), server.more_hosts.end());
  std::vector<Status> failures;
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    MysqlOptions endpoint = server;
    endpoint.host = hosts[i].host;
    endpoint.port = hosts[i].port;
    endpoint.more_hosts.clear();
    const auto now = steady_clock::now();
    if (i > 0 && now >= deadline) {
      failures.push_back(deadline_exceeded_error(describe_server(endpoint) +
                                                 ": not tried: the deadline had passed"));
      continue;
    }
    // The connect timeout, in case the call's deadline is far away; and an
    // equal share of what is left, so a host that hangs (a primary cut off
    // by the failover) leaves the others their turn.
    Deadline host_deadline = std::min(deadline, now + server.connect_timeout);
    if (deadline > now) {
      host_deadline =
          std::min(host_deadline, now + (deadline - now) / static_cast<long>(hosts.size() - i));
    }
    Result<MysqlConn> conn = connect_fit_host(endpoint, host_deadline, extras);
    if (conn.ok() || conn.status().code() == StatusCode::kCancelled) return conn;
    if (hosts.size() == 1) return conn;
    failures.push_back(conn.status());
  }
  const StatusCode code = code_of_none_fit(failures);
  std::string message = describe_server(server) + ": no host is a writable primary";
  if (is_retryable(Status(code, "-"))) {
    message += " (a failover may be under way)";
  } else {
    // Nothing that passes by itself.
    message += " (every host refused us or is unfit for locks)";
  }
  for (const Status& failure : failures) message += "; " + failure.message();
  return Status(code, message);
}

const char kServerRoleSql[] =
    "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('read_only', 'super_read_only', "
    "'innodb_read_only', 'wsrep_on', 'group_replication_group_name')";

ServerRole server_role_of(const std::vector<SqlRow>& rows) {
  ServerRole role;
  const auto lower = [](std::string text) {
    for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return text;
  };
  for (const SqlRow& row : rows) {
    if (row.size() < 2) continue;
    const std::string name = lower(row[0]);
    const std::string value = lower(row[1]);
    const bool on = value == "on" || value == "1" || value == "true";
    if (name == "read_only") {
      role.read_only = on;
    } else if (name == "super_read_only") {
      role.super_read_only = on;
    } else if (name == "innodb_read_only") {
      role.innodb_read_only = on;
    } else if (name == "wsrep_on") {
      role.wsrep = on;
    } else if (name == "group_replication_group_name") {
      role.group_name = row[1];
    }
  }
  return role;
}

Status check_server_role(const ServerRole& role, const std::string& description,
                         bool session_locks) {
  // A Galera or Group Replication member stays unfit for GET_LOCK whatever
  // its role: that refusal is permanent, and comes first.
  if (session_locks && role.wsrep) {
    return failed_precondition_error(
        description +
        ": the server is a Galera cluster member (wsrep_on=ON): GET_LOCK is not replicated "
        "between members, so keyed locks would not exclude each other; use the lease table "
        "(MutexContendServiceFactory, Locker) instead");
  }
  if (session_locks && !role.group_name.empty()) {
    return failed_precondition_error(
        description + ": the server is a Group Replication member (group_replication_group_name=" +
        role.group_name +
        "): named locks (GET_LOCK) are not certified across members, so keyed locks would not "
        "exclude each other; use the lease table (MutexContendServiceFactory, Locker) instead");
  }
  std::string read_only;
  if (role.read_only) read_only = "read_only";
  if (role.super_read_only) read_only = "super_read_only";
  if (role.innodb_read_only) read_only = "innodb_read_only";
  if (!read_only.empty()) {
    // Transient: a replica may be promoted (a failover under way), and a
    // primary may not be writable yet.
    return unavailable_error(
        description + ": the server is read-only (" + read_only +
        "=ON): a replica, or a primary not yet promoted; locks taken there would not exclude the "
        "primary's holders. Name the primary, or wait for a replica to be promoted");
  }
  return ok_status();
}

Status refuse_unsafe_server(MYSQL* m, const std::string& description, Deadline deadline,
                            bool session_locks, int wake_fd) {
  QueryReply reply = query(m, kServerRoleSql, deadline, wake_fd);
  if (!reply.error.status.ok()) {
    return reply.error.status.with_context(description + ": reading the server's role: ");
  }
  if (reply.results.empty()) return ok_status();
  return check_server_role(server_role_of(reply.results.front().rows), description, session_locks);
}

QueryReply query(MYSQL* m, std::string_view sql, Deadline deadline, int wake_fd) {
  QueryReply reply;
  // An unfinished call: the reply may still come, so the connection cannot
  // be reused.
  auto done = [&](int& status, auto cont) {
    const DriveOutcome outcome = drive(m, status, deadline, cont, wake_fd);
    if (outcome == DriveOutcome::kDone) return true;
    abandon(m, status, cont);
    reply.error.broken = true;
    reply.error.status = outcome == DriveOutcome::kWoken
                             ? cancelled_error("cancelled")
                             : deadline_exceeded_error("no reply by the deadline");
    return false;
  };
  int rc = 0;
  int status = mysql_real_query_start(&rc, m, sql.data(), sql.size());
  if (!done(status, [&](int ready) { return mysql_real_query_cont(&rc, m, ready); })) {
    return reply;
  }
  if (rc != 0) {
    reply.error = error_of(m);
    return reply;
  }
  for (;;) {
    MYSQL_RES* raw = nullptr;
    status = mysql_store_result_start(&raw, m);
    if (!done(status, [&](int ready) { return mysql_store_result_cont(&raw, m, ready); })) {
      return reply;
    }
    MysqlResult result(raw);
    SqlResult out;
    if (result) {
      const unsigned int columns = mysql_num_fields(result.get());
      while (MYSQL_ROW row = mysql_fetch_row(result.get())) {
        const unsigned long* lengths = mysql_fetch_lengths(result.get());
        SqlRow values;
        values.reserve(columns);
        for (unsigned int c = 0; c < columns; ++c) {
          values.emplace_back(row[c] != nullptr ? std::string(row[c], lengths[c]) : "");
        }
        out.rows.push_back(std::move(values));
      }
    } else if (mysql_field_count(m) != 0) {
      reply.error = error_of(m);  // rows were due but could not be read
      reply.error.broken = true;
      return reply;
    } else {
      out.affected_rows = mysql_affected_rows(m);
    }
    reply.results.push_back(std::move(out));
    int next = 0;
    status = mysql_next_result_start(&next, m);
    if (!done(status, [&](int ready) { return mysql_next_result_cont(&next, m, ready); })) {
      return reply;
    }
    if (next == -1) return reply;  // no more results
    if (next > 0) {
      reply.error = error_of(m);  // the next statement failed
      return reply;
    }
  }
}

ScalarReply query_scalar(MYSQL* m, const std::string& sql, Deadline deadline, int wake_fd) {
  QueryReply reply = query(m, sql, deadline, wake_fd);
  if (!reply.error.status.ok()) return {reply.error.status, std::nullopt};
  if (reply.results.empty() || reply.results[0].rows.empty() || reply.results[0].rows[0].empty()) {
    return {};
  }
  return {ok_status(), reply.results[0].rows[0][0]};
}

std::string sql_literal(MYSQL* m, std::string_view text) {
  std::string escaped(text.size() * 2 + 1, '\0');
  escaped.resize(mysql_real_escape_string(m, escaped.data(), text.data(), text.size()));
  return "'" + escaped + "'";
}

}  // namespace simba::internal::sql::mysql
