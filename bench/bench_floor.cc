#include "bench_floor.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include "simba/internal/backends_config.h"

#if SIMBA_HAVE_SQLITE
#include <sqlite3.h>
#endif
#if SIMBA_HAVE_REDIS
#include <hiredis/hiredis.h>
#endif
#if SIMBA_HAVE_POSTGRES
#include <libpq-fe.h>
#endif
#if SIMBA_HAVE_MYSQL
#include <mysql.h>
#endif
#if SIMBA_HAVE_ZOOKEEPER
#include <zookeeper/zookeeper.h>
#endif
#if SIMBA_HAVE_ETCD
#include "backends/etcd/etcd_client.h"
#endif

namespace simba::bench {
namespace {

using Clock = std::chrono::steady_clock;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// Times `round_trips` calls of `once` (which returns false on failure),
// each after `idle` without one.
template <typename F>
Result<std::vector<double>> time(int round_trips, std::chrono::milliseconds idle, F&& once) {
  std::vector<double> samples;
  samples.reserve(static_cast<std::size_t>(round_trips));
  for (int i = 0; i < round_trips; ++i) {
    if (idle.count() > 0) std::this_thread::sleep_for(idle);
    const auto start = Clock::now();
    if (!once()) return unavailable_error("a floor round trip failed");
    samples.push_back(micros(Clock::now() - start));
  }
  return samples;
}

std::string host_of(const Uri& uri) { return uri.hosts.empty() ? "127.0.0.1" : uri.hosts[0].host; }

int port_of(const Uri& uri, int fallback) {
  return uri.hosts.empty() || !uri.hosts[0].port ? fallback : *uri.hosts[0].port;
}

#if SIMBA_HAVE_SQLITE
// SQLite has no round trip: its floor is its cheapest durable write, with the
// settings the backend uses (WAL, synchronous=FULL), in a table of its own.
Result<FloorSamples> sqlite_floor(const Uri& uri, int n, std::chrono::milliseconds idle) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(uri.path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    sqlite3_close(db);
    return unavailable_error("sqlite: cannot open " + uri.path);
  }
  sqlite3_busy_timeout(db, 5000);
  const char* setup =
      "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
      "CREATE TABLE IF NOT EXISTS simba_bench_floor (k INTEGER PRIMARY KEY, v INTEGER);"
      "INSERT OR IGNORE INTO simba_bench_floor VALUES (1, 0);";
  if (sqlite3_exec(db, setup, nullptr, nullptr, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return unavailable_error("sqlite: cannot set up the floor table in " + uri.path);
  }
  auto micros = time(n, idle, [&] {
    return sqlite3_exec(db,
                        "BEGIN IMMEDIATE; UPDATE simba_bench_floor SET v = v + 1 WHERE k = 1; "
                        "COMMIT;",
                        nullptr, nullptr, nullptr) == SQLITE_OK;
  });
  sqlite3_close(db);
  SIMBA_RETURN_IF_ERROR(micros.status());
  return FloorSamples{"one durable write (WAL, synchronous=FULL)", std::move(*micros)};
}
#endif

#if SIMBA_HAVE_REDIS
Result<FloorSamples> redis_floor(const Uri& uri, int n, std::chrono::milliseconds idle) {
  const timeval timeout{3, 0};
  redisContext* c = redisConnectWithTimeout(host_of(uri).c_str(), port_of(uri, 6379), timeout);
  if (c == nullptr || c->err) {
    if (c != nullptr) redisFree(c);
    return unavailable_error("redis: cannot connect");
  }
  const auto command = [&](const char* fmt, auto... args) {
    auto* reply = static_cast<redisReply*>(redisCommand(c, fmt, args...));
    const bool ok = reply != nullptr && reply->type != REDIS_REPLY_ERROR;
    if (reply != nullptr) freeReplyObject(reply);
    return ok;
  };
  if (uri.password && !(uri.user ? command("AUTH %s %s", uri.user->c_str(), uri.password->c_str())
                                 : command("AUTH %s", uri.password->c_str()))) {
    redisFree(c);
    return permission_denied_error("redis: AUTH failed");
  }
  auto micros = time(n, idle, [&] { return command("PING"); });
  redisFree(c);
  SIMBA_RETURN_IF_ERROR(micros.status());
  return FloorSamples{"PING", std::move(*micros)};
}
#endif

#if SIMBA_HAVE_POSTGRES
Result<FloorSamples> postgres_floor(const Uri& uri, int n, std::chrono::milliseconds idle) {
  const std::string host = host_of(uri);
  const std::string port = std::to_string(port_of(uri, 5432));
  const std::string dbname = uri.path.size() > 1 ? uri.path.substr(1) : "postgres";
  std::vector<const char*> keys{"host", "port", "dbname", "connect_timeout"};
  std::vector<const char*> values{host.c_str(), port.c_str(), dbname.c_str(), "5"};
  if (uri.user) {
    keys.push_back("user");
    values.push_back(uri.user->c_str());
  }
  if (uri.password) {
    keys.push_back("password");
    values.push_back(uri.password->c_str());
  }
  keys.push_back(nullptr);
  values.push_back(nullptr);
  PGconn* conn = PQconnectdbParams(keys.data(), values.data(), 0);
  if (PQstatus(conn) != CONNECTION_OK) {
    PQfinish(conn);
    return unavailable_error("postgresql: cannot connect");
  }
  auto micros = time(n, idle, [&] {
    PGresult* r = PQexec(conn, "SELECT 1");
    const bool ok = PQresultStatus(r) == PGRES_TUPLES_OK;
    PQclear(r);
    return ok;
  });
  PQfinish(conn);
  SIMBA_RETURN_IF_ERROR(micros.status());
  return FloorSamples{"SELECT 1", std::move(*micros)};
}
#endif

#if SIMBA_HAVE_MYSQL
Result<FloorSamples> mysql_floor(const Uri& uri, int n, std::chrono::milliseconds idle) {
  MYSQL* conn = mysql_init(nullptr);
  const unsigned int timeout = 5;
  mysql_options(conn, MYSQL_OPT_CONNECT_TIMEOUT, &timeout);
  const std::string db = uri.path.size() > 1 ? uri.path.substr(1) : "";
  if (mysql_real_connect(conn, host_of(uri).c_str(), uri.user ? uri.user->c_str() : nullptr,
                         uri.password ? uri.password->c_str() : nullptr,
                         db.empty() ? nullptr : db.c_str(),
                         static_cast<unsigned int>(port_of(uri, 3306)), nullptr, 0) == nullptr) {
    mysql_close(conn);
    return unavailable_error("mysql: cannot connect");
  }
  auto micros = time(n, idle, [&] {
    if (mysql_query(conn, "SELECT 1") != 0) return false;
    MYSQL_RES* result = mysql_store_result(conn);
    if (result == nullptr) return false;
    mysql_free_result(result);
    return true;
  });
  mysql_close(conn);
  SIMBA_RETURN_IF_ERROR(micros.status());
  return FloorSamples{"SELECT 1", std::move(*micros)};
}
#endif

#if SIMBA_HAVE_ZOOKEEPER
struct ZkConnected {
  std::mutex mu;
  std::condition_variable cv;
  bool connected = false;
};

void on_zk_session(zhandle_t*, int type, int state, const char*, void* context) {
  if (type != ZOO_SESSION_EVENT || state != ZOO_CONNECTED_STATE) return;
  auto* waiter = static_cast<ZkConnected*>(context);
  std::lock_guard<std::mutex> lock(waiter->mu);
  waiter->connected = true;
  waiter->cv.notify_all();
}

Result<FloorSamples> zookeeper_floor(const Uri& uri, int n, std::chrono::milliseconds idle) {
  std::string hosts;
  for (const auto& h : uri.hosts) {
    if (!hosts.empty()) hosts += ",";
    hosts += h.host + ":" + std::to_string(h.port ? *h.port : 2181);
  }
  zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR);
  ZkConnected waiter;
  zhandle_t* zh = zookeeper_init(hosts.c_str(), on_zk_session, 10000, nullptr, &waiter, 0);
  if (zh == nullptr) return unavailable_error("zookeeper: cannot start a session");
  {
    std::unique_lock<std::mutex> lock(waiter.mu);
    if (!waiter.cv.wait_for(lock, std::chrono::seconds(10), [&] { return waiter.connected; })) {
      zookeeper_close(zh);
      return unavailable_error("zookeeper: no session within 10 s");
    }
  }
  Stat stat;
  auto micros = time(n, idle, [&] {
    const int rc = zoo_exists(zh, "/", 0, &stat);
    return rc == ZOK;
  });
  zookeeper_close(zh);
  SIMBA_RETURN_IF_ERROR(micros.status());
  return FloorSamples{"exists /", std::move(*micros)};
}
#endif

#if SIMBA_HAVE_ETCD
Result<FloorSamples> etcd_floor(const Uri& uri, int n, std::chrono::milliseconds idle) {
  namespace etcd = internal::etcd;
  // A channel of our own (as the backend opens them), one key read per
  // round trip over etcd's gRPC API.
  const etcd::Endpoint endpoint{host_of(uri), port_of(uri, 2379)};
  // TLS as the URI asks (tls=, tls_*); the floor sends no auth token, so it
  // needs a server that lets anonymous range reads through.
  SIMBA_ASSIGN_OR_RETURN(const TlsOptions tls, tls_options_from_uri(uri, "etcd"));
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                         etcd::open_channel(endpoint, false, tls));
  SIMBA_RETURN_IF_ERROR(
      etcd::wait_connected(*channel, endpoint, Clock::now() + std::chrono::seconds(5)));
  std::unique_ptr<etcdserverpb::KV::Stub> kv = etcdserverpb::KV::NewStub(channel);
  etcdserverpb::RangeRequest range;
  range.set_key("simba-bench-floor");
  auto micros = time(n, idle, [&] {
    grpc::ClientContext context;
    context.set_deadline(etcd::grpc_deadline(Clock::now() + std::chrono::seconds(5)));
    etcdserverpb::RangeResponse reply;
    return kv->Range(&context, range, &reply).ok();
  });
  SIMBA_RETURN_IF_ERROR(micros.status());
  return FloorSamples{"range read (gRPC)", std::move(*micros)};
}
#endif

}  // namespace

Result<FloorSamples> measure_floor(const Uri& uri, int round_trips,
                                   std::chrono::milliseconds idle) {
  const std::string& s = uri.scheme;
#if SIMBA_HAVE_SQLITE
  if (s == "sqlite") return sqlite_floor(uri, round_trips, idle);
#endif
#if SIMBA_HAVE_REDIS
  if (s == "redis") return redis_floor(uri, round_trips, idle);
#endif
#if SIMBA_HAVE_POSTGRES
  if (s == "postgresql" || s == "postgres") return postgres_floor(uri, round_trips, idle);
#endif
#if SIMBA_HAVE_MYSQL
  if (s == "mysql" || s == "mariadb") return mysql_floor(uri, round_trips, idle);
#endif
#if SIMBA_HAVE_ZOOKEEPER
  if (s == "zookeeper") return zookeeper_floor(uri, round_trips, idle);
#endif
#if SIMBA_HAVE_ETCD
  if (s == "etcd") return etcd_floor(uri, round_trips, idle);
#endif
  return unimplemented_error("no floor for " + s + ":// stores");
}

}  // namespace simba::bench
