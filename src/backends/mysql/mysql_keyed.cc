// Keyed locks on MySQL and MariaDB: one key is one GET_LOCK name, held by
// the session of a connection pinned to the hold (docs/backends/mysql.md, "Keyed
// locks").
//
// Threads: none per hold or per wait. A waiter blocks in its own thread on
// its connection's socket; one loss monitor per backend polls the sockets of
// held (idle) connections, so a session the server ends is reported at once.
//
// Cancellation: each acquire has an eventfd that a std::stop_callback makes
// readable; the waiter polls it beside its socket and, when it fires, closes
// the connection. We chose this over KILL QUERY from a second connection
// because (1) it needs no connection beyond the budget (lock_connections is
// the most this backend opens, a canceller included), (2) it takes no extra
// round trip, so a cancel is seen within a poll wake-up, and (3) the server
// drops a GET_LOCK waiter as soon as its client goes (checked on MariaDB
// 10.11), and a GET_LOCK granted just then is freed with the session, so no
// key stays held without a hold. Waits are also cut into slices of at most
// kMaxSlice, which bounds a server-side waiter the server did not drop. The
// cost is a reconnect after a cancel.
#include "simba/backends/mysql_keyed.h"

#include <mysql.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "backends/mysql/mysql_client.h"
#include "backends/mysql/mysql_lock_name.h"
#include "core/log.h"
#include "simba/backends/mysql.h"

namespace simba {
namespace {

using internal::mysql::ConnectExtras;
using internal::mysql::Endpoint;
using internal::mysql::LockNameCompare;
using internal::mysql::LockNameOf;
using internal::mysql::MysqlConn;
using internal::mysql::QueryScalar;
using internal::mysql::ScalarReply;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

// The longest single GET_LOCK wait: a longer wait is several in a row.
constexpr milliseconds kMaxSlice{10000};
// How far past its wait_deadline a wait may end: the server's own timeout
// ends a MariaDB wait on time (to the millisecond); a MySQL wait (whole
// seconds) is abandoned by the client this long after the deadline.
constexpr milliseconds kDeadlineGrace{200};
// Longest key: longer ones are hashed anyway, this only keeps a caller's
// mistake (a megabyte "key") from reaching the store.
constexpr std::size_t kMaxKeyBytes = 65536;
constexpr int kDefaultLockConnections = 8;
constexpr int kMaxLockConnections = 1024;
constexpr milliseconds kDefaultOpTimeout{5000};

std::string Quoted(std::string_view text) { return "'" + std::string(text) + "'"; }

// A Linux eventfd: readable once signalled, until drained.
class WakeFd {
 public:
  WakeFd() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~WakeFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  WakeFd(const WakeFd&) = delete;
  WakeFd& operator=(const WakeFd&) = delete;

  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void Signal() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(fd_, &one, sizeof(one));
  }
  void Drain() {
    std::uint64_t value = 0;
    [[maybe_unused]] const ssize_t n = ::read(fd_, &value, sizeof(value));
  }

 private:
  int fd_;
};

// What the server is, as far as locks care; probed on the first connection.
struct ServerTraits {
  std::string version;
  // MariaDB takes fractional seconds (to the microsecond); MySQL rounds a
  // GET_LOCK timeout to whole seconds.
  bool fractional_timeouts = false;
  LockNameCompare names = LockNameCompare::kFolded;
};

// One connection of the budget.
struct Connection {
  MysqlConn conn;  // null until connected
  MYSQL* get() const { return conn.get(); }
};

// Closes a connection without waiting for the server (its session then ends,
// freeing whatever it held).
void CloseNow(std::unique_ptr<Connection> connection) {
  if (connection && connection->conn) mariadb_cancel(connection->get());
}

// True when an idle connection's socket has something to say: a session
// with no call in flight only hears from the server when it ends (an error
// packet, EOF or a reset).
bool SessionEnded(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;
}

// Dead peers on a silently cut network are noticed by TCP keepalive (about
// 8 s); a server that closes the session is noticed at once.
void EnableKeepalive(int fd) {
  const int on = 1, idle_s = 5, interval_s = 1, probes = 3;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
}

// One thread per backend that watches the sockets of held connections and
// reports a session the server ended (KILL, restart, reset) to its hold's
// on_lost. A held connection has no call in flight, so any readability
// means the session is over. Owned jointly by the backend state and its own
// thread, so an on_lost that drops the last hold (and so the backend state)
// on this thread does not pull the monitor out from under it.
class LossMonitor : public std::enable_shared_from_this<LossMonitor> {
 public:
  // Starts watching `fd`; `on_lost` runs at most once, on the monitor
  // thread, never under its lock. Returns the watch's id.
  std::uint64_t Watch(int fd, std::function<void()> on_lost) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::uint64_t id = next_id_++;
    watches_.emplace(id, Watched{fd, std::move(on_lost)});
    if (!thread_.joinable() && !stop_) {
      thread_ = std::thread([self = shared_from_this()] { self->Run(); });
    }
    wake_.Signal();
    return id;
  }

  // Stops watching. False when the loss was already reported (or is being).
  bool Unwatch(std::uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    const bool watched = watches_.erase(id) == 1;
    wake_.Signal();
    return watched;
  }

  // Ends the thread (joined, unless this is it: then it ends on its own).
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      wake_.Signal();
    }
    if (!thread_.joinable()) return;
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }

  bool ok() const { return wake_.ok(); }

 private:
  struct Watched {
    int fd;
    std::function<void()> on_lost;
  };

  void Run() {
    std::vector<pollfd> fds;
    std::vector<std::uint64_t> ids;
    for (;;) {
      fds.assign(1, pollfd{wake_.fd(), POLLIN, 0});
      ids.clear();
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        for (const auto& [id, watched] : watches_) {
          fds.push_back(pollfd{watched.fd, POLLIN, 0});
          ids.push_back(id);
        }
      }
      if (::poll(fds.data(), fds.size(), -1) < 0) continue;  // EINTR
      if (fds[0].revents != 0) wake_.Drain();
      std::vector<std::function<void()>> lost;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        for (std::size_t i = 0; i < ids.size(); ++i) {
          // A watch removed meanwhile (released, its socket maybe closed or
          // reused) is gone from the map: its wake-up means nothing.
          if (fds[i + 1].revents == 0) continue;
          auto it = watches_.find(ids[i]);
          if (it == watches_.end()) continue;
          lost.push_back(std::move(it->second.on_lost));
          watches_.erase(it);
        }
      }
      for (auto& on_lost : lost) {
        if (on_lost) on_lost();
      }
    }
  }

  std::mutex mu_;
  std::map<std::uint64_t, Watched> watches_;
  std::uint64_t next_id_ = 1;
  bool stop_ = false;
  WakeFd wake_;
  std::thread thread_;
};

struct KeyedMysqlConfig {
  Endpoint endpoint;
  int lock_connections = kDefaultLockConnections;
  milliseconds op_timeout = kDefaultOpTimeout;
};

// How a wait for a free connection ended.
enum class TakeOutcome { kTaken, kTimedOut, kCancelled };

// The connections, the server's traits and the loss monitor: shared by the
// backend and every hold (a hold may outlive its backend).
class KeyedMysqlState : public std::enable_shared_from_this<KeyedMysqlState> {
 public:
  explicit KeyedMysqlState(KeyedMysqlConfig config)
      : config_(std::move(config)), monitor_(std::make_shared<LossMonitor>()) {
    description_ = "mysql at " + config_.endpoint.host + ":" +
                   std::to_string(config_.endpoint.port) + "/" + config_.endpoint.database;
  }
  ~KeyedMysqlState() { monitor_->Stop(); }

  const KeyedMysqlConfig& config() const { return config_; }
  const std::string& description() const { return description_; }
  LossMonitor& monitor() { return *monitor_; }
  bool ok() const { return monitor_->ok(); }

  // Waits for a connection of the budget: an idle one, or room to open one
  // (then `*out` has no MYSQL yet). Counts against `deadline`; `cancel`
  // ends the wait.
  TakeOutcome Take(Deadline deadline, std::stop_token cancel, std::unique_ptr<Connection>* out) {
    for (;;) {
      std::unique_lock<std::mutex> lock(mu_);
      auto available = [&] { return !idle_.empty() || open_ < config_.lock_connections; };
      bool got;
      if (deadline == Deadline::max()) {
        got = freed_.wait(lock, cancel, available);
      } else {
        got = freed_.wait_until(lock, cancel, deadline, available);
      }
      if (cancel.stop_requested()) return TakeOutcome::kCancelled;
      if (!got) return TakeOutcome::kTimedOut;
      if (idle_.empty()) {
        ++open_;
        *out = std::make_unique<Connection>();
        return TakeOutcome::kTaken;
      }
      std::unique_ptr<Connection> connection = std::move(idle_.back());
      idle_.pop_back();
      lock.unlock();
      // An idle session the server ended (a restart) is closed here rather
      // than failing the caller's GET_LOCK.
      if (!SessionEnded(static_cast<int>(mysql_get_socket(connection->get())))) {
        *out = std::move(connection);
        return TakeOutcome::kTaken;
      }
      Discard(std::move(connection));
    }
  }

  // A connection back to the budget: kept for reuse when it is connected
  // (its session holds no lock), else its slot is freed.
  void Return(std::unique_ptr<Connection> connection) {
    if (!connection || !connection->conn) {
      Discard(std::move(connection));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      idle_.push_back(std::move(connection));
    }
    freed_.notify_all();  // a waiter woken by one may have given up
  }

  // Closes a connection (its session's locks are freed by its end) and
  // frees its slot.
  void Discard(std::unique_ptr<Connection> connection) {
    CloseNow(std::move(connection));
    {
      std::lock_guard<std::mutex> lock(mu_);
      --open_;
    }
    freed_.notify_all();  // a waiter woken by one may have given up
  }

  // Connects `connection` (by the connect timeout; `wake_fd` readable gives
  // up) and learns the server's traits on the first connection.
  Status Connect(Connection& connection, int wake_fd) {
    ConnectExtras extras;
    // A held lock lives as long as its session: the server's idle timeout
    // (wait_timeout, 8 h by default) must not end it, so it is a year.
    extras.init_command = "SET SESSION wait_timeout = 31536000";
    extras.attributes = {{"simba_role", "keyed_lock"}};
    extras.wake_fd = wake_fd;
    SIMBA_ASSIGN_OR_RETURN(connection.conn,
                           internal::mysql::Connect(config_.endpoint, description_,
                                                    Deadline::max(), extras));
    EnableKeepalive(static_cast<int>(mysql_get_socket(connection.get())));
    if (traits().has_value()) return OkStatus();
    SIMBA_ASSIGN_OR_RETURN(ServerTraits probed, ProbeTraits(connection, wake_fd));
    std::lock_guard<std::mutex> lock(mu_);
    if (!traits_) {
      SIMBA_LOG(kInfo, description_ << ": keyed locks on " << probed.version << ", "
                                    << (probed.names == LockNameCompare::kExact
                                            ? "exact"
                                            : "case-folded")
                                    << " lock names");
      traits_ = std::move(probed);
    }
    return OkStatus();
  }

  std::optional<ServerTraits> traits() {
    std::lock_guard<std::mutex> lock(mu_);
    return traits_;
  }

 private:
  // The server's version, and whether it tells names apart that differ only
  // in case: it takes a probe lock and asks whether its case-folded twin is
  // free (MariaDB 10.11: yes; MySQL lower-cases names: no).
  Result<ServerTraits> ProbeTraits(Connection& connection, int wake) {
    MYSQL* m = connection.get();
    const Deadline deadline = steady_clock::now() + config_.op_timeout;
    ServerTraits traits;
    SIMBA_ASSIGN_OR_RETURN(traits.version, Scalar(m, "SELECT VERSION()", deadline, wake));
    traits.fractional_timeouts = traits.version.find("MariaDB") != std::string::npos;
    const std::string suffix = "-" + std::to_string(mysql_thread_id(m));
    const std::string probe = internal::mysql::Literal(m, "simba-case-probe-A\xc3\xa9" + suffix);
    const std::string twin = internal::mysql::Literal(m, "simba-case-probe-a\xc3\x89" + suffix);
    SIMBA_ASSIGN_OR_RETURN(std::string taken,
                           Scalar(m, "SELECT GET_LOCK(" + probe + ", 0)", deadline, wake));
    SIMBA_ASSIGN_OR_RETURN(std::string twin_free,
                           Scalar(m, "SELECT IS_FREE_LOCK(" + twin + ")", deadline, wake));
    SIMBA_ASSIGN_OR_RETURN(std::string released,
                           Scalar(m, "SELECT RELEASE_LOCK(" + probe + ")", deadline, wake));
    if (taken != "1" || released != "1") {
      return UnavailableError(description_ + ": the probe lock could not be taken and freed");
    }
    traits.names = twin_free == "1" ? LockNameCompare::kExact : LockNameCompare::kFolded;
    return traits;
  }

  // A statement's single value ("" for NULL); errors with context.
  Result<std::string> Scalar(MYSQL* m, const std::string& sql, Deadline deadline, int wake) {
    ScalarReply reply = QueryScalar(m, sql, deadline, wake);
    if (!reply.status.ok()) return reply.status.WithContext(description_ + ": " + sql + ": ");
    return reply.value.value_or("");
  }

  const KeyedMysqlConfig config_;
  std::string description_;
  const std::shared_ptr<LossMonitor> monitor_;
  std::mutex mu_;
  std::condition_variable_any freed_;
  std::vector<std::unique_ptr<Connection>> idle_;
  int open_ = 0;  // connections open, being opened, or lent out
  std::optional<ServerTraits> traits_;
};

// A connection lent out of the budget: given back when destroyed.
class LentConnection {
 public:
  LentConnection(std::shared_ptr<KeyedMysqlState> state, std::unique_ptr<Connection> connection)
      : state_(std::move(state)), connection_(std::move(connection)) {}
  ~LentConnection() {
    if (connection_) state_->Return(std::move(connection_));
  }
  LentConnection(LentConnection&&) = default;
  LentConnection(const LentConnection&) = delete;
  LentConnection& operator=(const LentConnection&) = delete;

  Connection& operator*() { return *connection_; }
  Connection* operator->() { return connection_.get(); }
  // Gives it back now (its session holds no lock).
  void GiveBack() {
    if (connection_) state_->Return(std::move(connection_));
  }
  // Closes it instead (a broken or abandoned session).
  void Discard() {
    if (connection_) state_->Discard(std::move(connection_));
  }

 private:
  std::shared_ptr<KeyedMysqlState> state_;
  std::unique_ptr<Connection> connection_;
};

class MysqlKeyHold final : public KeyHold {
 public:
  MysqlKeyHold(std::shared_ptr<KeyedMysqlState> state, LentConnection connection,
               std::string name)
      : state_(std::move(state)), connection_(std::move(connection)), name_(std::move(name)) {}

  // Starts reporting the session's end to `on_lost`.
  void WatchSession(std::function<void()> on_lost) {
    watch_id_ = state_->monitor().Watch(static_cast<int>(mysql_get_socket(connection_->get())),
                                        std::move(on_lost));
    watched_ = true;
  }

  ~MysqlKeyHold() override {
    if (!released_) {
      Status status = release(steady_clock::now() + state_->config().op_timeout);
      if (!status.ok()) SIMBA_LOG(kWarn, "dropping a MySQL key hold: " << status);
    }
  }

  std::uint64_t fencing_token() const override { return 0; }

  Status release(Deadline deadline) override {
    if (released_.exchange(true)) return OkStatus();
    if (watched_ && !state_->monitor().Unwatch(watch_id_)) {
      connection_.Discard();
      return AbortedError(state_->description() + ": the session holding the key ended");
    }
    deadline = std::min(deadline, steady_clock::now() + state_->config().op_timeout);
    MYSQL* m = connection_->get();
    ScalarReply reply = QueryScalar(
        m, "SELECT RELEASE_LOCK(" + internal::mysql::Literal(m, name_) + ")", deadline);
    if (!reply.status.ok()) {
      // Closing the connection ends the session, which frees the key.
      connection_.Discard();
      return reply.status.WithContext(state_->description() + ": RELEASE_LOCK: ");
    }
    if (reply.value != "1") {
      connection_.Discard();
      return AbortedError(state_->description() + ": RELEASE_LOCK found the key not held by "
                          "this session");
    }
    connection_.GiveBack();  // for the next acquire, even while this hold object lives on
    return OkStatus();
  }

 private:
  const std::shared_ptr<KeyedMysqlState> state_;
  LentConnection connection_;
  const std::string name_;
  std::uint64_t watch_id_ = 0;
  bool watched_ = false;  // set before the hold is handed out
  std::atomic<bool> released_{false};
};

// The GET_LOCK timeout argument for a wait of `wait` (>= 0): milliseconds
// as a decimal where the server takes fractions, else whole seconds rounded
// up (the client then ends the wait on time itself).
std::string TimeoutArgument(milliseconds wait, bool fractional) {
  if (!fractional) {
    return std::to_string(std::chrono::ceil<std::chrono::seconds>(wait).count());
  }
  const long long ms = wait.count();
  std::string fraction = std::to_string(ms % 1000);
  fraction.insert(0, 3 - fraction.size(), '0');
  return std::to_string(ms / 1000) + "." + fraction;
}

class MysqlKeyedLockBackend final : public KeyedLockBackend {
 public:
  explicit MysqlKeyedLockBackend(std::shared_ptr<KeyedMysqlState> state)
      : state_(std::move(state)) {
    capabilities_.mechanism =
        "GET_LOCK (session; keys over 64 characters or 192 bytes are hashed to '#sha256:' + 56 "
        "hex digits, and two keys with one hashed name exclude each other; no fencing tokens: "
        "GET_LOCK mints none)";
    capabilities_.cross_process = true;
    capabilities_.fencing_tokens = false;
    // MariaDB's metadata-lock queue is not a documented FIFO, and a wait of
    // more than one slice asks again.
    capabilities_.fifo = false;
    capabilities_.push_handoff = true;  // the server wakes a waiter on release
    capabilities_.freed_with_session = true;
    capabilities_.max_key_length = kMaxKeyBytes;
  }

  std::string_view scheme() const override { return "mysql"; }
  const KeyedLockCapabilities& capabilities() const override { return capabilities_; }

  Status validate_key(std::string_view key) const override {
    return KeyedLockBackend::validate_key(key);
  }

  Result<std::unique_ptr<KeyHold>> acquire(const KeyAcquireRequest& request) override {
    SIMBA_RETURN_IF_ERROR(validate_key(request.key));
    if (request.cancel.stop_requested()) return CancelledError("acquire was cancelled");
    std::unique_ptr<Connection> taken;
    switch (state_->Take(request.wait_deadline, request.cancel, &taken)) {
      case TakeOutcome::kTaken:
        break;
      case TakeOutcome::kTimedOut:
        return std::unique_ptr<KeyHold>();  // every connection stayed busy
      case TakeOutcome::kCancelled:
        return CancelledError("acquire was cancelled while waiting for a connection");
    }
    LentConnection connection(state_, std::move(taken));
    // The cancel's wake-up belongs to this call, not to the connection: it
    // outlives the stop_callback (declared after it), so a late cancel can
    // neither touch a closed connection nor interrupt its next user.
    WakeFd wake;
    if (!wake.ok()) {
      connection.Discard();
      return UnavailableError(std::string("eventfd: ") + std::strerror(errno));
    }
    std::stop_callback on_cancel(request.cancel, [&wake] { wake.Signal(); });
    if (!connection->conn) {
      const Status connected = state_->Connect(*connection, wake.fd());
      if (!connected.ok()) {
        connection.Discard();
        return connected;
      }
    }
    return WaitForLock(request, std::move(connection), wake.fd());
  }

 private:
  // GET_LOCK in slices until it is granted, the wait deadline passes, or the
  // caller cancels.
  Result<std::unique_ptr<KeyHold>> WaitForLock(const KeyAcquireRequest& request,
                                               LentConnection connection, int wake_fd) {
    const ServerTraits traits = *state_->traits();
    MYSQL* m = connection->get();
    const std::string name = LockNameOf(request.key, traits.names);
    const std::string literal = internal::mysql::Literal(m, name);
    const milliseconds op_timeout = state_->config().op_timeout;
    for (;;) {
      const auto now = steady_clock::now();
      const Deadline wait_deadline = request.wait_deadline;
      const bool last = wait_deadline - now <= kMaxSlice;
      const milliseconds wait =
          last ? std::max(milliseconds::zero(),
                          std::chrono::ceil<milliseconds>(wait_deadline - now))
               : kMaxSlice;
      const std::string timeout = TimeoutArgument(wait, traits.fractional_timeouts);
      // An attempt without a wait gets op_timeout for its reply; the last
      // slice ends kDeadlineGrace after the wait deadline at the latest (a
      // whole-second server would wait longer); an earlier slice gets its
      // reply op_timeout after the server's own timeout.
      Deadline reply_deadline;
      if (wait == milliseconds::zero()) {
        reply_deadline = now + op_timeout;
      } else if (last) {
        reply_deadline = wait_deadline + kDeadlineGrace;
      } else {
        reply_deadline = now + kMaxSlice + op_timeout;  // kMaxSlice is whole seconds
      }
      ScalarReply reply = QueryScalar(m, "SELECT GET_LOCK(" + literal + ", " + timeout + ")",
                                      reply_deadline, wake_fd);
      if (!reply.status.ok()) {
        connection.Discard();  // abandoned or broken: its end frees a late grant
        if (reply.status.code() == StatusCode::kCancelled) {
          return CancelledError("acquire was cancelled");
        }
        if (reply.status.code() == StatusCode::kDeadlineExceeded && last &&
            wait > milliseconds::zero()) {
          return std::unique_ptr<KeyHold>();  // the wait deadline passed
        }
        return reply.status.WithContext(state_->description() + ": GET_LOCK: ");
      }
      if (!reply.value) {
        connection.Discard();
        return UnavailableError(state_->description() +
                                ": GET_LOCK returned NULL (the wait was killed or failed)");
      }
      if (*reply.value == "1") return Granted(request, std::move(connection), name);
      if (*reply.value != "0") {
        connection.Discard();
        return InternalError(state_->description() + ": GET_LOCK returned " +
                             Quoted(*reply.value));
      }
      if (last) return std::unique_ptr<KeyHold>();  // timed out
    }
  }

  // The key is held by `connection`'s session: a hold, unless the caller
  // cancelled meanwhile (then the key is freed again).
  Result<std::unique_ptr<KeyHold>> Granted(const KeyAcquireRequest& request,
                                           LentConnection connection, const std::string& name) {
    auto hold = std::make_unique<MysqlKeyHold>(state_, std::move(connection), name);
    if (request.cancel.stop_requested()) {
      Status released = hold->release(steady_clock::now() + state_->config().op_timeout);
      (void)released;  // on failure its connection was closed, which frees the key
      return CancelledError("acquire was cancelled");
    }
    hold->WatchSession(request.on_lost);
    return std::unique_ptr<KeyHold>(std::move(hold));
  }

  const std::shared_ptr<KeyedMysqlState> state_;
  KeyedLockCapabilities capabilities_;
};

Result<int> ParseLockConnections(const std::string& value) {
  int n = 0;
  auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (error != std::errc() || end != value.data() + value.size() || n < 1 ||
      n > kMaxLockConnections) {
    return InvalidArgumentError("mysql: lock_connections must be 1.." +
                                std::to_string(kMaxLockConnections) + ", not " + Quoted(value));
  }
  return n;
}

// The contention backend's keys (MysqlOptionsFromUri checks them) plus
// lock_connections and op_timeout.
Result<KeyedMysqlConfig> KeyedConfigFromUri(const Uri& uri) {
  Uri shared = uri;
  shared.query.erase("lock_connections");
  shared.query.erase("op_timeout");
  SIMBA_ASSIGN_OR_RETURN(MysqlOptions options, MysqlOptionsFromUri(shared));
  KeyedMysqlConfig config;
  config.endpoint.host = options.host;
  config.endpoint.port = options.port;
  config.endpoint.user = options.user;
  config.endpoint.password = options.password;
  config.endpoint.database = options.database;
  config.endpoint.connect_timeout = options.connect_timeout;
  config.endpoint.ssl_mode = options.ssl_mode;
  config.endpoint.ssl_ca = options.ssl_ca;
  config.endpoint.ssl_cert = options.ssl_cert;
  config.endpoint.ssl_key = options.ssl_key;
  if (auto value = uri.Query("lock_connections")) {
    SIMBA_ASSIGN_OR_RETURN(config.lock_connections, ParseLockConnections(*value));
  }
  if (auto value = uri.Query("op_timeout")) {
    SIMBA_ASSIGN_OR_RETURN(config.op_timeout, ParseDuration("op_timeout", *value));
    if (config.op_timeout <= milliseconds::zero()) {
      return InvalidArgumentError("mysql: op_timeout must be positive");
    }
  }
  return config;
}

}  // namespace

Result<std::shared_ptr<KeyedLockBackend>> OpenMysqlKeyedLockBackend(const Uri& uri) {
  SIMBA_ASSIGN_OR_RETURN(KeyedMysqlConfig config, KeyedConfigFromUri(uri));
  auto state = std::make_shared<KeyedMysqlState>(std::move(config));
  if (!state->ok()) return UnavailableError(std::string("eventfd: ") + std::strerror(errno));
  return std::shared_ptr<KeyedLockBackend>(std::make_shared<MysqlKeyedLockBackend>(state));
}

}  // namespace simba
