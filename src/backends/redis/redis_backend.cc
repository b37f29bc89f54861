// The Redis backend: see include/simba/backends/redis.h for the contract and
// redis_scripts.h for the protocol on the server.
//
// Two connections per backend:
//   CommandChannel  every store call, one at a time, each a Lua script
//                   (EVALSHA, falling back to loading the scripts again when
//                   the server forgot them)
//   Subscriber      pub/sub, read by one thread that delivers events to the
//                   subscriptions of all mutexes

#include "simba/backends/redis.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/redis/redis_cluster.h"
#include "backends/redis/redis_connection.h"
#include "backends/redis/redis_scripts.h"
#include "core/listener_hub.h"
#include "core/log.h"
#include "core/store_options.h"
#include "core/worker.h"

namespace simba {
namespace {

using internal::Backoff;
using internal::ListenerHub;
using internal::TurnGate;
using internal::Worker;
using internal::redis::Command;
using internal::redis::Connection;
using internal::redis::Endpoint;
using internal::redis::error_reply_status;
using internal::redis::is_error;
using internal::redis::Reply;
using internal::redis::reply_string;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr std::size_t kMaxNameLength = 512;
// An idle subscriber connection is checked with PING this often; no answer
// by the next check means it is dead (e.g. a cut that sent no RST).
constexpr milliseconds kSubscriberPing{15000};
// SUBSCRIBE arguments per command when renewing many subscriptions.
constexpr std::size_t kChannelsPerSubscribe = 1000;
// How long a channel nobody listens on any more stays subscribed. A
// contender that stops and starts again within it (a Locker's release and
// next acquire, a waiter between two waits) finds its channel subscribed
// and confirmed: no SUBSCRIBE, UNSUBSCRIBE or confirmation per hold.
constexpr milliseconds kChannelLinger{1000};

// "<prefix>:{M}": the lock key and broadcast channel of mutex M ("simba"
// is JVM Simba's prefix).
std::string lock_key(std::string_view prefix, std::string_view mutex) {
  return std::string(prefix) + ":{" + std::string(mutex) + "}";
}

std::vector<std::string> mutex_keys(std::string_view prefix, std::string_view mutex) {
  const std::string lock = lock_key(prefix, mutex);
  return {lock, lock + ":contender", lock + ":fence"};
}

// "<prefix>:{M}" or "<prefix>:{M}:<suffix>" -> M (and the suffix); false
// for anything else.
bool split_name(std::string_view prefix, std::string_view name, std::string* mutex,
                std::string* suffix) {
  const std::string start = std::string(prefix) + ":{";
  if (name.substr(0, start.size()) != start) return false;
  const std::size_t close = name.find('}', start.size());
  if (close == std::string_view::npos || close == start.size()) return false;
  *mutex = std::string(name.substr(start.size(), close - start.size()));
  const std::string_view rest = name.substr(close + 1);
  if (rest.empty()) {
    suffix->clear();
    return true;
  }
  if (rest.front() != ':' || rest.size() == 1) return false;
  *suffix = std::string(rest.substr(1));
  return true;
}

void replace_all(std::string& text, std::string_view from, std::string_view to) {
  for (std::size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
}

bool parse_int(std::string_view text, long long* out) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return error == std::errc() && end == text.data() + text.size();
}

// Reads a script's reply: an array of strings parsed as integers where asked.
class ReplyFields {
 public:
  ReplyFields(const redisReply* reply, std::string_view what) : reply_(reply), what_(what) {}

  Status check(std::size_t count) const {
    if (reply_->type != REDIS_REPLY_ARRAY || reply_->elements != count) {
      return internal_error("redis: unexpected reply to " + std::string(what_));
    }
    for (std::size_t i = 0; i < count; ++i) {
      if (reply_->element[i]->type != REDIS_REPLY_STRING) {
        return internal_error("redis: unexpected reply to " + std::string(what_));
      }
    }
    return ok_status();
  }
  std::string text(std::size_t i) const { return std::string(reply_string(reply_->element[i])); }
  Result<long long> number(std::size_t i) const {
    long long value = 0;
    if (!parse_int(reply_string(reply_->element[i]), &value)) {
      return internal_error("redis: unexpected number in the reply to " + std::string(what_));
    }
    return value;
  }

 private:
  const redisReply* reply_;
  std::string_view what_;
};

// What the scripts say about a lock: owner, pttl, token, now, ttl, tr.
struct LockFields {
  std::string owner;
  long long pttl = -2;
  long long token = 0;
  long long now = 0;
  long long ttl = 0;  // 0: unknown (a JVM Simba owner)
  long long tr = 0;
};

Result<LockFields> parse_lock(const ReplyFields& fields, std::size_t first) {
  LockFields lock;
  lock.owner = fields.text(first);
  SIMBA_ASSIGN_OR_RETURN(lock.pttl, fields.number(first + 1));
  SIMBA_ASSIGN_OR_RETURN(lock.token, fields.number(first + 2));
  SIMBA_ASSIGN_OR_RETURN(lock.now, fields.number(first + 3));
  SIMBA_ASSIGN_OR_RETURN(lock.ttl, fields.number(first + 4));
  SIMBA_ASSIGN_OR_RETURN(lock.tr, fields.number(first + 5));
  return lock;
}

// The owner record for script fields. Where the owner's own ttl and
// transition are unknown (JVM Simba wrote the lock), `fallback_ttl` and
// `fallback_tr` stand in: JVM Simba needs the same settings on every node.
OwnerRecord to_record(const LockFields& lock, milliseconds fallback_ttl, milliseconds fallback_tr) {
  OwnerRecord record;
  record.store_now = StoreTime(lock.now);
  if (lock.owner.empty()) return record;
  const bool known = lock.token != 0;
  const long long ttl = known ? lock.ttl : fallback_ttl.count();
  const long long tr = known ? lock.tr : fallback_tr.count();
  MutexOwner& owner = record.owner;
  owner.owner_id = lock.owner;
  // PTTL -1 is a lock key without expiry, which no Simba writes: treat it as
  // a fresh lease so contenders poll at the usual pace rather than spin.
  const long long pttl = lock.pttl >= 0 ? lock.pttl : ttl + tr;
  owner.transition_at = StoreTime(lock.now + pttl);
  owner.ttl_at = owner.transition_at - milliseconds(tr);
  owner.acquired_at = owner.ttl_at - milliseconds(ttl);
  owner.fencing_token = static_cast<std::uint64_t>(lock.token);
  return record;
}

// The error of a connect that asked several servers (sentinels, cluster
// nodes) in turn and got nowhere: `what` and every server's failure. A
// permanent code only when every server failed permanently (TLS
// verification refused everywhere, a password each refused): the first
// such, since asking again cannot help. One transient failure (a server
// down, failing over, or not asked before the deadline) is kUnavailable:
// the next try may find it back.
Status none_answered(std::string what, const std::vector<Status>& failures) {
  std::optional<StatusCode> permanent;
  bool transient = failures.empty();
  for (std::size_t i = 0; i < failures.size(); ++i) {
    what += (i == 0 ? "" : "; ") + failures[i].message();
    if (is_retryable(failures[i])) {
      transient = true;
    } else if (!permanent) {
      permanent = failures[i].code();
    }
  }
  if (failures.empty()) what += "deadline passed";
  return Status(transient ? StatusCode::kUnavailable : *permanent, std::move(what));
}

// ---------------------------------------------------------------------------
// Finding the data node: the one host of redis://, or behind Sentinel the
// primary the sentinels name (and that says so itself, by ROLE).

class NodeOpener {
 public:
  NodeOpener(Endpoint data, std::vector<Endpoint> sentinels, std::string master_name)
      : data_(std::move(data)),
        sentinels_(std::move(sentinels)),
        master_name_(std::move(master_name)),
        last_(data_) {}
  // Redis Cluster: the node is whichever `resolve` names at each connect
  // (the node serving a slot now, after a failover the promoted replica).
  NodeOpener(Endpoint data, std::function<Result<Endpoint>(Deadline)> resolve)
      : data_(std::move(data)), resolve_(std::move(resolve)), last_(data_) {}

  bool sentinel() const { return !sentinels_.empty(); }
  const std::vector<Endpoint>& sentinels() const { return sentinels_; }
  const std::string& master_name() const { return master_name_; }
  int database() const { return data_.database; }

  // The node last connected to ("host:port"), or the sentinels before that.
  std::string describe() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (resolve_) return last_.describe();
    if (!sentinel()) return data_.describe();
    if (known_) return last_.describe() + " (primary of '" + master_name_ + "')";
    return "sentinels " + sentinel_list() + " (master '" + master_name_ + "')";
  }

  // A connection to the data node. Behind Sentinel: each sentinel in turn
  // (the last one that worked first) names the primary, which must answer
  // ROLE with "master"; the error names every sentinel and what went wrong.
  Result<std::unique_ptr<Connection>> open(std::string_view client_name, Deadline deadline) {
    if (resolve_) {
      SIMBA_ASSIGN_OR_RETURN(Endpoint node, resolve_(deadline));
      {
        std::lock_guard<std::mutex> lock(mu_);
        last_ = node;
      }
      return Connection::open(node, client_name, deadline);
    }
    if (!sentinel()) return Connection::open(data_, client_name, deadline);
    std::size_t first = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      first = preferred_;
    }
    std::vector<Status> failures;
    const std::size_t n = sentinels_.size();
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t at = (first + i) % n;
      const Endpoint& s = sentinels_[at];
      // A hung sentinel gets its share of the time left, not all of it.
      const auto left = deadline - steady_clock::now();
      if (left <= steady_clock::duration::zero()) {
        for (std::size_t j = i; j < n; ++j) {
          failures.push_back(unavailable_error("sentinel " +
                                               sentinels_[(first + j) % n].describe() +
                                               ": not asked (the deadline had passed)"));
        }
        break;
      }
      const Deadline ask_deadline = steady_clock::now() + left / static_cast<long>(n - i);
      auto named = ask(s, ask_deadline);
      if (!named.ok()) {
        failures.push_back(named.status());
        continue;
      }
      const std::string named_by = " (named by sentinel " + s.describe() + ")";
      auto conn = Connection::open(*named, client_name, deadline);
      if (!conn.ok()) {
        failures.push_back(Status(conn.status().code(), conn.status().message() + named_by));
        continue;
      }
      auto role = (*conn)->call(Command{"ROLE"}, deadline);
      if (!role.ok()) {
        failures.push_back(Status(role.status().code(), role.status().message() + named_by));
        continue;
      }
      const redisReply* r = role->get();
      if (is_error(r)) {
        failures.push_back(error_reply_status(r, "redis at " + named->describe() + named_by));
        continue;
      }
      const std::string_view said = r->type == REDIS_REPLY_ARRAY && r->elements > 0
                                        ? reply_string(r->element[0])
                                        : reply_string(r);
      if (said != "master") {
        failures.push_back(unavailable_error("redis at " + named->describe() + named_by + " is a " +
                                             std::string(said) + ", not the primary"));
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (known_ && last_.describe() != named->describe()) {
        SIMBA_LOG(kInfo, "redis-sentinel: the primary of '" << master_name_ << "' is now "
                                                            << named->describe() << " (was "
                                                            << last_.describe() << ")");
      }
      last_ = *named;
      known_ = true;
      preferred_ = at;
      return conn;
    }
    return none_answered("redis-sentinel: no primary for master '" + master_name_ +
                             "' through sentinels " + sentinel_list() + ": ",
                         failures);
  }

  // A connection to a sentinel, authenticated as the sentinels want. Its
  // errors say "sentinel HOST:PORT: ..." (a connection's own say "redis at").
  static Result<std::unique_ptr<Connection>> open_sentinel(const Endpoint& s,
                                                           std::string_view client_name,
                                                           Deadline deadline) {
    auto conn = Connection::open(s, client_name, deadline);
    if (!conn.ok()) return as_sentinel(conn.status());
    return conn;
  }

  // `status`, of a connection to a sentinel, as "sentinel HOST:PORT: ...".
  static Status as_sentinel(const Status& status) {
    constexpr std::string_view kRedisAt = "redis at ";
    if (!status.message().starts_with(kRedisAt)) return status.with_context("sentinel");
    return Status(status.code(), "sentinel " + status.message().substr(kRedisAt.size()));
  }

 private:
  // The primary that sentinel `s` names.
  Result<Endpoint> ask(const Endpoint& s, Deadline deadline) const {
    SIMBA_ASSIGN_OR_RETURN(std::unique_ptr<Connection> conn,
                           open_sentinel(s, "simba-sentinel", deadline));
    SIMBA_ASSIGN_OR_RETURN(
        Reply reply,
        conn->call(Command{"SENTINEL", "get-master-addr-by-name", master_name_}, deadline));
    const redisReply* r = reply.get();
    if (is_error(r)) return error_reply_status(r, "sentinel " + s.describe());
    long long port = 0;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        !parse_int(reply_string(r->element[1]), &port) || port <= 0 || port > 65535) {
      return unavailable_error("sentinel " + s.describe() + " knows no master '" + master_name_ +
                               "'");
    }
    Endpoint named = data_;
    named.host = std::string(reply_string(r->element[0]));
    named.port = static_cast<int>(port);
    return named;
  }

  std::string sentinel_list() const {
    std::string list;
    for (const Endpoint& s : sentinels_) list += (list.empty() ? "" : ",") + s.describe();
    return list;
  }

  const Endpoint data_;
  const std::vector<Endpoint> sentinels_;
  const std::string master_name_;
  const std::function<Result<Endpoint>(Deadline)> resolve_;
  mutable std::mutex mu_;
  Endpoint last_;
  bool known_ = false;
  std::size_t preferred_ = 0;
};

// ---------------------------------------------------------------------------
// The command connection.

enum Script { kAcquire, kRelease, kForceRelease, kRead, kWaiters, kLeave, kRenew, kScriptCount };

struct ServerFacts {
  // The server may lose acknowledged writes when it restarts.
  bool lossy = true;
  // When it started, by its own clock (ms), rounded late.
  long long started_ms = 0;
  // Its master_replid: a new one after a restart or a promotion.
  std::string replid;
  // It was a replica once (master_replid2 is another primary's id): it
  // may lack writes that primary acknowledged.
  bool promoted = false;
};

class CommandChannel {
 public:
  // `cluster`: a node of a Redis Cluster, where messages go by sharded
  // pub/sub (SPUBLISH, in the slot of the mutex's keys) and the failover
  // guard's term is kept per mutex (below).
  CommandChannel(std::shared_ptr<NodeOpener> opener, std::string prefix,
                 milliseconds connect_timeout, bool restart_guard, bool cluster = false)
      : opener_(std::move(opener)),
        prefix_(std::move(prefix)),
        connect_timeout_(connect_timeout),
        restart_guard_(restart_guard),
        cluster_(cluster) {
    static constexpr const char* kBodies[kScriptCount] = {
        internal::redis::kLuaAcquire,      internal::redis::kLuaRelease,
        internal::redis::kLuaForceRelease, internal::redis::kLuaRead,
        internal::redis::kLuaWaiters,      internal::redis::kLuaLeave,
        internal::redis::kLuaRenew};
    for (int i = 0; i < kScriptCount; ++i) {
      scripts_[i] = std::string(internal::redis::kLuaPrelude) + kBodies[i];
      if (cluster_) {
        // Classic PUBLISH reaches every node of a cluster and counts only
        // this node's listeners; sharded pub/sub stays in the shard.
        replace_all(scripts_[i], "'PUBLISH'", "'SPUBLISH'");
        replace_all(scripts_[i], "'NUMSUB'", "'SHARDNUMSUB'");
      }
    }
  }

  // Runs `script` on a mutex's keys. The reply may be an error reply.
  // With `guard_px`, appends the restart guard's bound to the arguments: the
  // server's start plus that lease if the guard is on and the server may
  // have lost leases when it started, else 0. `facts` receives what the bound was computed from.
  //
  // With `wait` (replicas, timeout), the script is followed by WAIT in the
  // same round trip, and `*acked` receives how many replicas acknowledged.
  Result<Reply> eval(Script script, std::string_view mutex, const std::vector<std::string>& args,
                     Deadline deadline, ServerFacts* facts = nullptr,
                     std::optional<milliseconds> guard_px = std::nullopt,
                     std::optional<std::pair<int, milliseconds>> wait = std::nullopt,
                     long long* acked = nullptr, bool asking = false) {
    return eval_keys(script, {mutex}, args, deadline, facts, guard_px, wait, acked, asking);
  }

  // `script` on the keys of several mutexes at once (KEYS: each mutex's
  // three in turn; one server only: in a cluster they are in many slots).
  Result<Reply> eval_many(Script script, const std::vector<std::string_view>& mutexes,
                          const std::vector<std::string>& args, Deadline deadline,
                          std::optional<std::pair<int, milliseconds>> wait, long long* acked) {
    return eval_keys(script, mutexes, args, deadline, nullptr, std::nullopt, wait, acked, false);
  }

  Result<Reply> eval_keys(Script script, const std::vector<std::string_view>& mutexes,
                          const std::vector<std::string>& args, Deadline deadline,
                          ServerFacts* facts, std::optional<milliseconds> guard_px,
                          std::optional<std::pair<int, milliseconds>> wait, long long* acked,
                          bool asking) {
    const TurnGate::Turn turn = turn_.take(deadline);
    if (!turn.taken()) return busy();
    for (int attempt = 0;; ++attempt) {
      const bool reused = conn_ != nullptr && !stale_.load();
      auto reply =
          eval_locked(script, mutexes, args, deadline, facts, guard_px, wait, acked, asking);
      // A connection opened before the server went away (a failover, a
      // restart) fails at its next use: once, the call is tried again on a
      // new one (behind Sentinel: the primary named now). Every script may
      // run twice: an acquisition again is a renewal, a release again
      // finds nothing to release.
      if (!reply.ok() && reused && attempt == 0 &&
          reply.status().code() == StatusCode::kUnavailable && steady_clock::now() < deadline) {
        continue;
      }
      return reply;
    }
  }

  Result<Reply> eval_locked(Script script, const std::vector<std::string_view>& mutexes,
                            const std::vector<std::string>& args, Deadline deadline,
                            ServerFacts* facts, std::optional<milliseconds> guard_px,
                            std::optional<std::pair<int, milliseconds>> wait, long long* acked,
                            bool asking) {
    SIMBA_ASSIGN_OR_RETURN(Connection * conn, connected_locked(deadline));
    if (facts != nullptr) *facts = facts_;
    // Behind Sentinel the acquire script also keeps the primary's term (in
    // <prefix>:@@term). In a cluster there is no key every slot can reach:
    // a node that was promoted keeps its term per mutex, in the mutex's
    // fence hash; one that never was a replica has lost nothing to one.
    const bool term_key = guard_px && opener_->sentinel() && restart_guard_;
    const bool term_in_fence = guard_px && cluster_ && restart_guard_ && facts_.promoted;
    Command command = eval_command(script, mutexes, term_key);
    command.insert(command.end(), args.begin(), args.end());
    if (guard_px) {
      command.push_back(restart_guard_ && facts_.lossy
                            ? std::to_string(facts_.started_ms + guard_px->count())
                            : std::string("0"));
      if (term_key || term_in_fence) command.push_back(facts_.replid);
    }
    // ASKING: this node imports the mutex's slot, and the node that exports
    // it sent us here (an ASK redirect) for this one command.
    const std::size_t first = asking ? 1 : 0;
    std::vector<Command> commands;
    if (asking) commands.push_back({"ASKING"});
    commands.push_back(command);
    if (wait) {
      // WAIT 0 would wait forever: at least a millisecond, at most what the
      // deadline leaves.
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now());
      const milliseconds timeout = std::max(milliseconds(1), std::min(wait->second, left));
      commands.push_back({"WAIT", std::to_string(wait->first), std::to_string(timeout.count())});
    }
    auto replies = call_locked(*conn, commands, deadline);
    if (replies.ok() && is_error((*replies)[first].get()) &&
        reply_string((*replies)[first].get()).substr(0, 8) == "NOSCRIPT") {
      // SCRIPT FLUSH or a failover to a server that never saw them.
      SIMBA_RETURN_IF_ERROR(load_scripts_locked(*conn, deadline));
      commands[first][1] = shas_[script];
      replies = call_locked(*conn, commands, deadline);
    }
    if (!replies.ok()) return replies.status();
    if (acked != nullptr && wait) {
      const redisReply* w = (*replies)[first + 1].get();
      *acked = w->type == REDIS_REPLY_INTEGER ? w->integer : -1;
    }
    return std::move((*replies)[first]);
  }

  // "host:port" of the node served (behind Sentinel: the primary last found).
  std::string describe() const { return opener_->describe(); }

  // Closes the connection under a call in flight (that call fails, the next
  // one finds the primary again): after a failover. Thread-safe.
  void interrupt() {
    stale_ = true;
    std::lock_guard<std::mutex> lock(live_mu_);
    if (live_) live_->shutdown();
  }

  // Several commands in one round trip.
  Result<std::vector<Reply>> pipeline(const std::vector<Command>& commands, Deadline deadline) {
    const TurnGate::Turn turn = turn_.take(deadline);
    if (!turn.taken()) return busy();
    for (int attempt = 0;; ++attempt) {
      const bool reused = conn_ != nullptr && !stale_.load();
      SIMBA_ASSIGN_OR_RETURN(Connection * conn, connected_locked(deadline));
      auto replies = call_locked(*conn, commands, deadline);
      // As in eval: once more on a new connection (these are reads).
      if (!replies.ok() && reused && attempt == 0 &&
          replies.status().code() == StatusCode::kUnavailable && steady_clock::now() < deadline) {
        continue;
      }
      return replies;
    }
  }

  // `script` on each mutex, in one round trip. (The scripts' hashes do not
  // change while the channel lives; a NOSCRIPT reply is the caller's error.)
  // With `args` (one list per mutex), each script gets its own arguments.
  Result<std::vector<Reply>> eval_each(Script script, const std::vector<std::string>& mutexes,
                                       const std::vector<std::vector<std::string>>* args,
                                       Deadline deadline) {
    std::vector<Command> commands;
    {
      const TurnGate::Turn turn = turn_.take(deadline);
      if (!turn.taken()) return busy();
      SIMBA_RETURN_IF_ERROR(connected_locked(deadline).status());
      for (std::size_t i = 0; i < mutexes.size(); ++i) {
        Command command = eval_command(script, {mutexes[i]});
        if (args != nullptr) command.insert(command.end(), (*args)[i].begin(), (*args)[i].end());
        commands.push_back(std::move(command));
      }
    }
    return pipeline(commands, deadline);
  }

 private:
  // EVALSHA of `script` on the keys of `mutexes` (shas_ is read with the
  // turn).
  Command eval_command(Script script, const std::vector<std::string_view>& mutexes,
                       bool term = false) const {
    Command command = {"EVALSHA", shas_[script],
                       std::to_string(3 * mutexes.size() + (term ? 1 : 0))};
    for (const std::string_view mutex : mutexes) {
      for (std::string& key : mutex_keys(prefix_, mutex)) command.push_back(std::move(key));
    }
    if (term) command.push_back(prefix_ + ":@@term");
    return command;
  }

  Status busy() const {
    return deadline_exceeded_error("redis at " + opener_->describe() +
                                   ": deadline passed while waiting for the command connection");
  }

  Result<std::vector<Reply>> call_locked(Connection& conn, const std::vector<Command>& commands,
                                         Deadline deadline) {
    auto replies = conn.call(commands, deadline);
    // After a failed or late call the connection may still carry its reply,
    // which the next call would take for its own: close it.
    if (!replies.ok()) {
      drop_locked();
      return replies;
    }
    // A node that is no longer the primary (READONLY: demoted after a
    // failover) or not serving: the next call connects anew, behind
    // Sentinel to the primary named then.
    for (const Reply& reply : *replies) {
      if (!is_error(reply.get())) continue;
      const std::string_view text = reply_string(reply.get());
      if (text.starts_with("READONLY") || text.starts_with("MASTERDOWN") ||
          text.starts_with("LOADING")) {
        drop_locked();
        break;
      }
    }
    return replies;
  }

  void drop_locked() {
    {
      std::lock_guard<std::mutex> lock(live_mu_);
      live_.reset();
    }
    conn_.reset();
    // The first reconnect after a working connection is immediate.
    backoff_.reset();
  }

  Result<Connection*> connected_locked(Deadline deadline) {
    if (stale_.exchange(false)) drop_locked();
    if (conn_) return conn_.get();
    SIMBA_RETURN_IF_ERROR(backoff_.ready());
    const Deadline connect_deadline = std::min(deadline, steady_clock::now() + connect_timeout_);
    auto opened = opener_->open("simba-commands", connect_deadline);
    Status status = opened.status();
    if (opened.ok()) status = load_scripts_locked(**opened, connect_deadline);
    if (opened.ok() && status.ok()) status = read_facts_locked(**opened, connect_deadline);
    if (!status.ok()) {
      backoff_.failed(status);
      return status;
    }
    conn_ = std::move(*opened);
    {
      std::lock_guard<std::mutex> lock(live_mu_);
      live_ = conn_;
    }
    backoff_.reset();
    return conn_.get();
  }

  Status load_scripts_locked(Connection& conn, Deadline deadline) {
    std::vector<Command> loads;
    for (const std::string& script : scripts_) loads.push_back({"SCRIPT", "LOAD", script});
    SIMBA_ASSIGN_OR_RETURN(std::vector<Reply> replies, conn.call(loads, deadline));
    for (int i = 0; i < kScriptCount; ++i) {
      if (is_error(replies[i].get())) {
        return error_reply_status(replies[i].get(),
                                  "redis at " + opener_->describe() + ": loading the scripts");
      }
      shas_[i] = std::string(reply_string(replies[i].get()));
    }
    return ok_status();
  }

  // Is the server durable, and when did it start? (For the restart guard.)
  Status read_facts_locked(Connection& conn, Deadline deadline) {
    SIMBA_ASSIGN_OR_RETURN(std::vector<Reply> replies, conn.call({{"TIME"},
                                                                  {"INFO", "server"},
                                                                  {"INFO", "persistence"},
                                                                  {"CONFIG", "GET", "appendfsync"},
                                                                  {"INFO", "replication"}},
                                                                 deadline));
    const redisReply* time = replies[0].get();
    long long seconds = 0;
    long long micros = 0;
    if (time->type != REDIS_REPLY_ARRAY || time->elements != 2 ||
        !parse_int(reply_string(time->element[0]), &seconds) ||
        !parse_int(reply_string(time->element[1]), &micros)) {
      return internal_error("redis at " + opener_->describe() + ": unexpected reply to TIME");
    }
    // The value on INFO's "<key>:<value>" line; "" without one.
    auto info_field = [](const redisReply* info, std::string_view key) -> std::string {
      const std::string text = "\n" + std::string(is_error(info) ? "" : reply_string(info));
      const std::size_t at = text.find("\n" + std::string(key) + ":");
      if (at == std::string::npos) return {};
      const std::size_t start = at + key.size() + 2;
      return text.substr(start, text.find_first_of("\r\n", start) - start);
    };
    long long uptime = 0;
    // Without an uptime assume the server just started: the safe side.
    parse_int(info_field(replies[1].get(), "uptime_in_seconds"), &uptime);
    const bool aof = info_field(replies[2].get(), "aof_enabled") == "1";
    const redisReply* fsync = replies[3].get();
    const bool fsync_always = fsync->type == REDIS_REPLY_ARRAY && fsync->elements == 2 &&
                              reply_string(fsync->element[1]) == "always";
    facts_.lossy = !(aof && fsync_always);
    facts_.replid = info_field(replies[4].get(), "master_replid");
    const std::string replid2 = info_field(replies[4].get(), "master_replid2");
    facts_.promoted = !replid2.empty() && replid2.find_first_not_of('0') != std::string::npos;
    // uptime_in_seconds is the difference of two whole-second clocks (the
    // start's and now's, each rounded down), so the real start lies within
    // a second either side of now - uptime: it reads 1 a moment after a
    // start late in a second. Take the latest the start can be (never after
    // now), so the guard lasts up to a second longer, never shorter. (The
    // fault runs caught the guard ending early when this took now - uptime.)
    const long long now_ms = seconds * 1000 + micros / 1000;
    facts_.started_ms = std::min(now_ms, now_ms - uptime * 1000 + 1000);
    return ok_status();
  }

  const std::shared_ptr<NodeOpener> opener_;
  const std::string prefix_;
  const milliseconds connect_timeout_;
  const bool restart_guard_;
  const bool cluster_;
  std::string scripts_[kScriptCount];

  TurnGate turn_;  // a call that has it alone touches what follows
  std::shared_ptr<Connection> conn_;
  std::mutex live_mu_;  // guards live_: conn_ for interrupt()
  std::shared_ptr<Connection> live_;
  // Set by interrupt(): the connection is to be replaced at the next call.
  std::atomic<bool> stale_{false};
  std::string shas_[kScriptCount];
  ServerFacts facts_;
  Backoff backoff_;
};

// ---------------------------------------------------------------------------
// The subscriber connection.

class Subscriber : public std::enable_shared_from_this<Subscriber> {
 public:
  // `sharded`: a shard of a Redis Cluster, listened to with SSUBSCRIBE
  // (the scripts SPUBLISH there; see CommandChannel), one slot per command.
  Subscriber(std::shared_ptr<NodeOpener> opener, std::string prefix, milliseconds connect_timeout,
             bool keyspace_events, bool sharded = false)
      : opener_(std::move(opener)),
        prefix_(std::move(prefix)),
        connect_timeout_(connect_timeout),
        use_keyspace_events_(keyspace_events && !sharded),
        sharded_(sharded),
        expired_channel_("__keyevent@" + std::to_string(opener_->database()) + "__:expired") {}

  ~Subscriber() { stop(); }

  // The channels a slot listens on: a contender only on its personal
  // channel (only releases are news to it), a retriever on the broadcast
  // channel and the release channel.
  using Slot = ListenerHub::Slot;

  std::vector<std::string> channels_of(const Slot& slot) const {
    const std::string lock = lock_key(prefix_, slot.mutex);
    if (!slot.contender_id.empty()) return {lock + ":" + slot.contender_id};
    return {lock, lock + ":@@released"};
  }

  std::unique_ptr<Subscription> add(std::string mutex, std::string contender_id,
                                    ListenerHub::Listener listener) {
    ListenerHub::SlotPtr slot;
    auto subscription = hub_->subscribe(
        std::move(mutex), std::move(contender_id), std::move(listener),
        [self = shared_from_this()](const Slot& gone) { self->remove(gone); }, &slot);
    const std::vector<std::string> channels = channels_of(*slot);
    std::unique_lock<std::mutex> lock(mu_);
    // The thread owns the subscriber: a listener may destroy the backend.
    if (!stopping_) worker_.start("redis-sub", [self = shared_from_this()] { self->run(); });
    std::vector<std::string> fresh;
    for (const std::string& channel : channels) {
      // A lingering channel is still subscribed (and confirmed, or its
      // confirmation is on its way): nothing to send.
      if (wanted_[channel]++ == 0 && lingering_.erase(channel) == 0) fresh.push_back(channel);
    }
    if (conn_ && !fresh.empty()) {
      // (One mutex's channels share its slot: one SSUBSCRIBE is allowed.)
      Command command = {subscribe_command()};
      command.insert(command.end(), fresh.begin(), fresh.end());
      send_locked(command);
    }
    cv_.notify_all();
    // No waiting for the server to confirm: the contender's first attempt
    // goes out at once (an uncontended acquisition is one round trip). A
    // release before the confirmation may miss this contender, so once
    // confirmed it is woken to look again (see Session).
    if (all_confirmed_locked(*slot)) settled_.insert(slot.get());
    return subscription;
  }

  bool all_confirmed_locked(const Slot& slot) const {
    const std::vector<std::string> channels = channels_of(slot);
    return std::all_of(channels.begin(), channels.end(),
                       [&](const std::string& c) { return confirmed_.count(c) > 0; });
  }

  void remove(const Slot& slot) {
    std::lock_guard<std::mutex> lock(mu_);
    settled_.erase(&slot);
    const auto until = steady_clock::now() + kChannelLinger;
    for (const std::string& channel : channels_of(slot)) {
      auto it = wanted_.find(channel);
      if (it != wanted_.end() && --it->second == 0) {
        wanted_.erase(it);
        // Unsubscribed by the reader once the linger is over (it looks at
        // least every kChannelLinger), unless wanted again by then. Not
        // subscribed on any connection: nothing to do (the next connection
        // subscribes only what is wanted).
        if (conn_) {
          lingering_[channel] = until;
          sweep_at_ = std::min(sweep_at_, until);
        }
      }
    }
  }

  // Unsubscribes the channels whose linger is over. Runs after every read,
  // so it looks through them only once the earliest linger is over.
  void end_lingering_locked(steady_clock::time_point now) {
    if (now < sweep_at_) return;
    sweep_at_ = steady_clock::time_point::max();
    std::vector<std::string> gone;
    for (auto it = lingering_.begin(); it != lingering_.end();) {
      if (it->second > now) {
        sweep_at_ = std::min(sweep_at_, it->second);
        ++it;
        continue;
      }
      confirmed_.erase(it->first);
      gone.push_back(it->first);
      it = lingering_.erase(it);
    }
    if (!conn_) return;
    for (const Command& command : batched(sharded_ ? "SUNSUBSCRIBE" : "UNSUBSCRIBE", gone)) {
      send_locked(command);
    }
  }

  // `verb` for each of `channels`, as few commands as the server takes
  // (the sharded verbs take the channels of one slot: one a command).
  std::vector<Command> batched(const char* verb, const std::vector<std::string>& channels) const {
    std::vector<Command> commands;
    const std::size_t per_command = sharded_ ? 1 : kChannelsPerSubscribe;
    for (std::size_t i = 0; i < channels.size(); i += per_command) {
      Command command = {verb};
      const std::size_t end = std::min(channels.size(), i + per_command);
      command.insert(command.end(), channels.begin() + static_cast<std::ptrdiff_t>(i),
                     channels.begin() + static_cast<std::ptrdiff_t>(end));
      commands.push_back(std::move(command));
    }
    return commands;
  }

  // Drops the connection (after a failover): the reader connects again,
  // behind Sentinel to the new primary, and wakes everyone once resubscribed.
  void reconnect() {
    std::lock_guard<std::mutex> lock(mu_);
    if (conn_) conn_->shutdown();
    // Also cut short a wait between failed attempts.
    reconnect_now_ = true;
    cv_.notify_all();
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      if (conn_) conn_->shutdown();
      cv_.notify_all();
    }
    worker_.join();
  }

 private:
  // Writes on the subscriber connection from any thread. A failed write is
  // left to the reader thread, which sees the connection fail.
  void send_locked(const Command& command) {
    const Status sent = conn_->send({command}, steady_clock::now() + connect_timeout_);
    if (!sent.ok()) conn_->shutdown();
  }

  void run() {
    Backoff backoff;
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      // Connect only when somebody listens.
      cv_.wait(lock, [&] { return stopping_ || !wanted_.empty(); });
      if (stopping_) break;
      lock.unlock();
      Status status = session();
      lock.lock();
      conn_.reset();
      confirmed_.clear();
      lingering_.clear();
      sweep_at_ = steady_clock::time_point::max();
      settled_.clear();
      // Releases published while we are away are lost: wake everyone once
      // the next connection has subscribed again.
      wake_on_confirm_ = true;
      cv_.notify_all();
      if (stopping_) break;
      milliseconds delay{0};
      if (status.ok() || reconnect_now_) {
        backoff.reset();
      } else {
        delay = backoff.failed();
        SIMBA_LOG(kDebug,
                  "redis subscriber: " << status << "; reconnecting in " << format_duration(delay));
      }
      cv_.wait_for(lock, delay, [&] { return stopping_ || reconnect_now_; });
      reconnect_now_ = false;
    }
  }

  // One connection's life: connect, subscribe to everything wanted, then
  // deliver messages until the connection fails or stop().
  Status session() {
    const Deadline connect_deadline = steady_clock::now() + connect_timeout_;
    SIMBA_ASSIGN_OR_RETURN(std::unique_ptr<Connection> opened,
                           opener_->open("simba-events", connect_deadline));
    std::shared_ptr<Connection> conn(std::move(opened));
    bool expired_events = false;
    if (use_keyspace_events_) {
      // Expiry events are only published if the server was told to (E and
      // x, or A); whether to use them is decided per connection.
      SIMBA_ASSIGN_OR_RETURN(
          Reply config,
          conn->call(Command{"CONFIG", "GET", "notify-keyspace-events"}, connect_deadline));
      if (config->type == REDIS_REPLY_ARRAY && config->elements == 2) {
        const std::string_view flags = reply_string(config->element[1]);
        expired_events = flags.find('E') != std::string_view::npos &&
                         (flags.find('x') != std::string_view::npos ||
                          flags.find('A') != std::string_view::npos);
      }
    }
    std::vector<std::string> channels;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return ok_status();
      conn_ = conn;
      for (const auto& [channel, count] : wanted_) channels.push_back(channel);
    }
    if (expired_events) channels.push_back(expired_channel_);
    // Once all of these are confirmed, every subscriber is woken if events
    // may have been missed (see wake_on_confirm_).
    std::set<std::string> unconfirmed(channels.begin(), channels.end());
    for (const Command& command : batched(subscribe_command(), channels)) {
      std::lock_guard<std::mutex> lock(mu_);
      SIMBA_RETURN_IF_ERROR(conn->send({command}, connect_deadline));
    }
    bool ping_outstanding = false;
    auto ping_at = steady_clock::now() + kSubscriberPing;
    for (;;) {
      // Woken at least every kChannelLinger to end lingering channels.
      auto reply = conn->read(std::min(ping_at, steady_clock::now() + kChannelLinger));
      {
        std::lock_guard<std::mutex> lock(mu_);
        end_lingering_locked(steady_clock::now());
      }
      if (!reply.ok()) {
        if (reply.status().code() != StatusCode::kDeadlineExceeded) return reply.status();
        if (steady_clock::now() < ping_at) continue;
        if (ping_outstanding) return reply.status();
        ping_outstanding = true;
        ping_at = steady_clock::now() + kSubscriberPing;
        std::lock_guard<std::mutex> lock(mu_);
        SIMBA_RETURN_IF_ERROR(conn->send({{"PING"}}, steady_clock::now() + connect_timeout_));
        continue;
      }
      ping_outstanding = false;
      ping_at = steady_clock::now() + kSubscriberPing;
      const redisReply* r = reply->get();
      if (r->type != REDIS_REPLY_ARRAY || r->elements < 2) continue;
      const std::string_view kind = reply_string(r->element[0]);
      if (kind == (sharded_ ? "ssubscribe" : "subscribe")) {
        const std::string channel(reply_string(r->element[1]));
        ListenerHub::Work work;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (wanted_.count(channel) > 0 || lingering_.count(channel) > 0) {
            confirmed_.insert(channel);
          }
          cv_.notify_all();
          unconfirmed.erase(channel);
          std::string mutex;
          std::string suffix;
          if (wake_on_confirm_) {
            // After a reconnect: everyone, once the whole batch is back.
            if (unconfirmed.empty()) {
              wake_on_confirm_ = false;
              hub_->collect_all(MutexEvent{MutexEvent::Kind::kReleased, {}, {}}, &work);
            }
          } else if (split_name(prefix_, channel, &mutex, &suffix)) {
            // A subscription made before this confirmation may have missed
            // a release: it looks again once all its channels are confirmed.
            hub_->collect(MutexEvent{MutexEvent::Kind::kReleased, mutex, {}}, &work,
                          [&](const Slot& slot) {
                            return settled_.count(&slot) == 0 && all_confirmed_locked(slot);
                          });
          }
          for (const auto& item : work) settled_.insert(item.first.get());
        }
        hub_->deliver(work);
        continue;
      }
      if (kind == (sharded_ ? "smessage" : "message") && r->elements == 3) {
        deliver(reply_string(r->element[1]), reply_string(r->element[2]));
      }
      if (sharded_ && kind == "sunsubscribe") {
        // The server dropped a channel we still want: its slot moved to
        // another shard (resharding). Start over on a new connection,
        // whose resolver finds where the shard's slots are now.
        std::lock_guard<std::mutex> lock(mu_);
        const std::string channel(reply_string(r->element[1]));
        if (wanted_.count(channel) > 0) {
          return unavailable_error("redis-cluster: the node at " + opener_->describe() +
                                   " no longer serves a subscribed channel's slot");
        }
        // A lingering channel is no longer subscribed: wanted again, it
        // must be subscribed again (on whichever shard serves it now).
        if (lingering_.erase(channel) > 0) confirmed_.erase(channel);
      }
    }
  }

  void deliver(std::string_view channel, std::string_view payload) {
    ListenerHub::Work work;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::string mutex;
      std::string suffix;
      if (channel == expired_channel_) {
        // A lock key expired: its owner stopped renewing. Everyone may try.
        if (split_name(prefix_, payload, &mutex, &suffix) && suffix.empty()) {
          add_work_locked(mutex, MutexEvent::Kind::kReleased, {}, nullptr, &work);
        }
      } else if (split_name(prefix_, channel, &mutex, &suffix)) {
        const std::size_t split = payload.find("@@");
        const std::string_view event = payload.substr(0, split);
        const std::string by(split == std::string_view::npos ? std::string_view()
                                                             : payload.substr(split + 2));
        if (suffix.empty() && event == "acquired") {
          add_work_locked(mutex, MutexEvent::Kind::kAcquired, by, nullptr, &work);
        } else if (event == "released" && !suffix.empty() && by == suffix) {
          // Our own id as the releaser on our personal channel: only a
          // forced release sends that (see kLuaForceRelease). The message
          // names no token, so it ends whichever hold the owner has; a
          // renewal that re-took the mutex in the moment the message was
          // on its way is given up too, which errs on the safe side.
          add_work_locked(mutex, MutexEvent::Kind::kLost, by, &suffix, &work);
          for (auto& item : work) item.second.forced = true;
        } else if (event == "released") {
          // The release channel reaches retrievers; a personal channel its
          // one contender.
          const std::string who = suffix == "@@released" ? std::string() : suffix;
          add_work_locked(mutex, MutexEvent::Kind::kReleased, by, &who, &work);
        }
      }
    }
    hub_->deliver(work);  // outside mu_: a listener may (un)subscribe
  }

  // Queues `kind` for the slots of `mutex` (only those with contender id
  // `*only`, when given).
  void add_work_locked(const std::string& mutex, MutexEvent::Kind kind, const std::string& by,
                       const std::string* only, ListenerHub::Work* work) {
    hub_->collect(MutexEvent{kind, mutex, by}, work, [only](const Slot& slot) {
      return only == nullptr || slot.contender_id == *only;
    });
  }

  const std::shared_ptr<NodeOpener> opener_;
  const std::string prefix_;
  const milliseconds connect_timeout_;
  const bool use_keyspace_events_;
  const bool sharded_;
  const std::string expired_channel_;

  const char* subscribe_command() const { return sharded_ ? "SSUBSCRIBE" : "SUBSCRIBE"; }

  const std::shared_ptr<ListenerHub> hub_ = std::make_shared<ListenerHub>();
  Worker worker_;
  std::mutex mu_;  // guards everything below; also serializes writes
  std::condition_variable cv_;
  bool stopping_ = false;
  std::shared_ptr<Connection> conn_;
  // Subscriptions confirmed by the server since they were made (or woken
  // once they were): the rest are woken when their channels are confirmed.
  std::set<const Slot*> settled_;
  std::map<std::string, int> wanted_;  // channel -> listeners
  // Channels nobody listens on, still subscribed until then (kChannelLinger).
  std::map<std::string, steady_clock::time_point> lingering_;
  // No linger ends before this (the earliest end, or later when one was
  // wanted again): end_lingering_locked() looks no sooner.
  steady_clock::time_point sweep_at_ = steady_clock::time_point::max();
  // Subscribed channels the server has confirmed (wanted or lingering).
  std::set<std::string> confirmed_;
  // A connection was lost: subscribers may have missed a release.
  bool wake_on_confirm_ = false;
  // reconnect() asked for a new connection now (a failover).
  bool reconnect_now_ = false;
};

// ---------------------------------------------------------------------------
// Behind Sentinel: one thread subscribed to +switch-master on a sentinel
// (the next one after a failure), so a failover closes the connections to
// the old primary at once rather than when a call fails on them.

class SentinelWatcher : public std::enable_shared_from_this<SentinelWatcher> {
 public:
  SentinelWatcher(std::shared_ptr<NodeOpener> opener, milliseconds connect_timeout,
                  std::function<void()> on_switch)
      : opener_(std::move(opener)),
        connect_timeout_(connect_timeout),
        on_switch_(std::move(on_switch)) {}

  void start() {
    worker_.start("redis-sentinel", [self = shared_from_this()] { self->run(); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      if (conn_) conn_->shutdown();
      cv_.notify_all();
    }
    worker_.join();
  }

 private:
  void run() {
    Backoff backoff;
    std::size_t next = 0;
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      const Endpoint& sentinel = opener_->sentinels()[next];
      lock.unlock();
      bool subscribed = false;
      const Status status = session(sentinel, &subscribed);
      lock.lock();
      conn_.reset();
      if (stopping_) break;
      next = (next + 1) % opener_->sentinels().size();
      if (subscribed) backoff.reset();
      const milliseconds delay = backoff.failed(status);
      SIMBA_LOG(kDebug, "redis-sentinel watcher: " << status << "; next sentinel in "
                                                   << format_duration(delay));
      cv_.wait_for(lock, delay, [&] { return stopping_; });
    }
  }

  Status session(const Endpoint& sentinel, bool* subscribed) {
    const Deadline connect_deadline = steady_clock::now() + connect_timeout_;
    SIMBA_ASSIGN_OR_RETURN(
        std::unique_ptr<Connection> opened,
        NodeOpener::open_sentinel(sentinel, "simba-sentinel-events", connect_deadline));
    std::shared_ptr<Connection> conn(std::move(opened));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return ok_status();
      conn_ = conn;
    }
    SIMBA_RETURN_IF_ERROR(conn->send({{"SUBSCRIBE", "+switch-master"}}, connect_deadline));
    bool ping_outstanding = false;
    for (;;) {
      auto reply = conn->read(steady_clock::now() + kSubscriberPing);
      if (!reply.ok()) {
        if (reply.status().code() != StatusCode::kDeadlineExceeded || ping_outstanding) {
          return NodeOpener::as_sentinel(reply.status());
        }
        ping_outstanding = true;
        SIMBA_RETURN_IF_ERROR(conn->send({{"PING"}}, steady_clock::now() + connect_timeout_));
        continue;
      }
      ping_outstanding = false;
      const redisReply* r = reply->get();
      if (r->type != REDIS_REPLY_ARRAY || r->elements < 3) continue;
      const std::string_view kind = reply_string(r->element[0]);
      if (kind == "subscribe") *subscribed = true;
      // "+switch-master <name> <old ip> <old port> <new ip> <new port>"
      if (kind == "message" &&
          reply_string(r->element[2]).starts_with(opener_->master_name() + " ")) {
        SIMBA_LOG(kInfo, "redis-sentinel: sentinel " << sentinel.describe() << " reports "
                                                     << reply_string(r->element[2]));
        on_switch_();
      }
    }
  }

  const std::shared_ptr<NodeOpener> opener_;
  const milliseconds connect_timeout_;
  const std::function<void()> on_switch_;
  Worker worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::shared_ptr<Connection> conn_;
};

// ---------------------------------------------------------------------------
// Redis Cluster: the slot map, and calls routed by it.

using internal::redis::kClusterSlots;
using internal::redis::key_slot;
using internal::redis::SlotRange;

// Which node serves each slot, as CLUSTER SLOTS last said (and MOVED
// replies since). Asked of any node it knows or of the URI's seeds.
class ClusterMap {
 public:
  ClusterMap(Endpoint base, std::vector<Endpoint> seeds, milliseconds connect_timeout)
      : base_(std::move(base)),
        seeds_(std::move(seeds)),
        connect_timeout_(connect_timeout),
        slot_node_(kClusterSlots, -1) {}

  // The URI's seeds ("host:port,...").
  std::string describe() const {
    std::string list;
    for (const Endpoint& seed : seeds_) list += (list.empty() ? "" : ",") + seed.describe();
    return "redis-cluster " + list;
  }

  // The node serving `slot`, reading the map first if it has none for it
  // or it was marked stale (then the old answer if reading it fails).
  Result<Endpoint> node_of(int slot, Deadline deadline) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (read_at_ && slot_node_[static_cast<std::size_t>(slot)] >= 0) return node_locked(slot);
    }
    const Status refreshed = refresh(deadline);
    std::lock_guard<std::mutex> lock(mu_);
    if (slot_node_[static_cast<std::size_t>(slot)] >= 0) return node_locked(slot);
    if (!refreshed.ok()) return refreshed;
    return unavailable_error(describe() + ": no node serves slot " + std::to_string(slot) +
                             " (the cluster is not fully covered)");
  }

  // A MOVED reply: `slot` is served by host:port now.
  void moved(int slot, const std::string& host, int port) {
    std::lock_guard<std::mutex> lock(mu_);
    slot_node_[static_cast<std::size_t>(slot)] = index_locked(host, port);
  }

  // The primaries the map names, each once.
  std::vector<Endpoint> primaries() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Endpoint> out;
    std::set<int> seen;
    for (const int node : slot_node_) {
      if (node >= 0 && seen.insert(node).second) out.push_back(endpoint_locked(node));
    }
    return out;
  }

  // The ranges CLUSTER SLOTS last reported.
  std::vector<SlotRange> ranges() {
    std::lock_guard<std::mutex> lock(mu_);
    return ranges_;
  }

  // Reads CLUSTER SLOTS again, from the node that answered last, then the
  // other nodes it knows, then the seeds; each gets its share of the time
  // left. An attempt less than kFresh ago stands for this one (many calls
  // failing at once after a failover ask once).
  Status refresh(Deadline deadline) {
    std::lock_guard<std::mutex> refreshing(refresh_mu_);
    if (attempted_at_ && steady_clock::now() - *attempted_at_ < kFresh) return last_refresh_;
    attempted_at_ = steady_clock::now();
    last_refresh_ = refresh_now(deadline);
    return last_refresh_;
  }

  // Whether any node has answered CLUSTER SLOTS yet.
  bool ever_read() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !ranges_.empty();
  }

  // Forgets when the map was read, so the next node_of() reads it again.
  void stale() {
    std::lock_guard<std::mutex> lock(mu_);
    read_at_.reset();
  }

  Endpoint with_address(const std::string& host, int port) const {
    Endpoint e = base_;
    e.host = host;
    e.port = port;
    return e;
  }

 private:
  static constexpr milliseconds kFresh{100};

  Status refresh_now(Deadline deadline) {
    std::vector<Endpoint> candidates;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::set<std::string> seen;
      auto add = [&](const Endpoint& e) {
        if (seen.insert(e.describe()).second) candidates.push_back(e);
      };
      if (answered_) add(*answered_);
      for (const SlotRange& range : ranges_) {
        add(with_address(range.host, range.port));
        for (const std::string& replica : range.replicas) {
          const std::size_t colon = replica.rfind(':');
          long long port = 0;
          if (colon != std::string::npos && parse_int(replica.substr(colon + 1), &port)) {
            add(with_address(replica.substr(0, colon), static_cast<int>(port)));
          }
        }
      }
      for (const Endpoint& seed : seeds_) add(seed);
    }
    std::vector<Status> failures;
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      const auto left = deadline - steady_clock::now();
      if (left <= steady_clock::duration::zero()) {
        for (std::size_t j = i; j < candidates.size(); ++j) {
          failures.push_back(unavailable_error("redis at " + candidates[j].describe() +
                                               ": not asked (the deadline had passed)"));
        }
        break;
      }
      const Deadline ask_deadline = std::min(
          deadline, steady_clock::now() +
                        std::min<steady_clock::duration>(
                            connect_timeout_, left / static_cast<long>(candidates.size() - i)));
      auto conn = Connection::open(candidates[i], "simba-cluster", ask_deadline);
      if (!conn.ok()) {
        failures.push_back(conn.status());
        continue;
      }
      auto reply = (*conn)->call(Command{"CLUSTER", "SLOTS"}, ask_deadline);
      if (!reply.ok()) {
        failures.push_back(reply.status());
        continue;
      }
      const std::string where = "redis at " + candidates[i].describe();
      std::vector<SlotRange> ranges;
      if (is_error(reply->get())) {
        // CLUSTERDOWN, LOADING, NOPERM keep their codes; an ERR ("This
        // instance has cluster support disabled") will not change by itself.
        const Status refused = error_reply_status(reply->get(), where);
        failures.push_back(
            refused.code() == StatusCode::kInternal
                ? invalid_argument_error(refused.message() + " (is it a cluster node?)")
                : refused);
        continue;
      }
      if (!internal::redis::parse_cluster_slots(reply->get(), candidates[i].host, &ranges)) {
        failures.push_back(
            internal_error(where + ": unexpected reply to CLUSTER SLOTS (is it a cluster node?)"));
        continue;
      }
      if (ranges.empty()) {
        failures.push_back(unavailable_error(where + " serves no slots yet"));
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      std::fill(slot_node_.begin(), slot_node_.end(), -1);
      for (const SlotRange& range : ranges) {
        const int node = index_locked(range.host, range.port);
        for (int slot = range.first; slot <= range.last; ++slot) {
          slot_node_[static_cast<std::size_t>(slot)] = node;
        }
      }
      ranges_ = std::move(ranges);
      answered_ = candidates[i];
      read_at_ = steady_clock::now();
      return ok_status();
    }
    return none_answered(describe() + ": no node answered CLUSTER SLOTS: ", failures);
  }

  Endpoint node_locked(int slot) const {
    return endpoint_locked(slot_node_[static_cast<std::size_t>(slot)]);
  }
  Endpoint endpoint_locked(int node) const {
    const auto& [host, port] = nodes_[static_cast<std::size_t>(node)];
    return with_address(host, port);
  }
  int index_locked(const std::string& host, int port) {
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].first == host && nodes_[i].second == port) return static_cast<int>(i);
    }
    nodes_.emplace_back(host, port);
    return static_cast<int>(nodes_.size() - 1);
  }

  const Endpoint base_;  // user, password, TLS of every node
  const std::vector<Endpoint> seeds_;
  const milliseconds connect_timeout_;
  std::mutex refresh_mu_;  // one refresh at a time; guards the next two
  std::optional<steady_clock::time_point> attempted_at_;
  Status last_refresh_;
  mutable std::mutex mu_;  // guards what follows
  std::vector<std::pair<std::string, int>> nodes_;
  std::vector<int> slot_node_;  // slot -> index in nodes_, -1: unknown
  std::vector<SlotRange> ranges_;
  std::optional<Endpoint> answered_;
  std::optional<steady_clock::time_point> read_at_;
};

// Every store call of a backend: on its one server (redis://, behind
// Sentinel the primary), or in a cluster on the node serving the mutex's
// slot, following MOVED and ASK, and waiting out a failover (CLUSTERDOWN,
// TRYAGAIN, a node that went away) within the call's deadline.
class CommandRouter {
 public:
  CommandRouter(std::shared_ptr<NodeOpener> opener, std::string prefix,
                milliseconds connect_timeout, bool restart_guard)
      : prefix_(std::move(prefix)),
        connect_timeout_(connect_timeout),
        restart_guard_(restart_guard),
        single_(std::make_unique<CommandChannel>(std::move(opener), prefix_, connect_timeout,
                                                 restart_guard)) {}
  CommandRouter(std::shared_ptr<ClusterMap> map, std::string prefix, milliseconds connect_timeout,
                bool restart_guard)
      : map_(std::move(map)),
        prefix_(std::move(prefix)),
        connect_timeout_(connect_timeout),
        restart_guard_(restart_guard) {}

  bool cluster() const { return map_ != nullptr; }

  std::string describe() const { return single_ ? single_->describe() : map_->describe(); }

  void interrupt() {
    if (single_) single_->interrupt();
  }

  // `script` on the keys of several mutexes in one call, on one server
  // (not a cluster: their keys are in many slots).
  Result<Reply> eval_many(Script script, const std::vector<std::string_view>& mutexes,
                          const std::vector<std::string>& args, Deadline deadline,
                          std::optional<std::pair<int, milliseconds>> wait, long long* acked) {
    if (!single_) {
      return unimplemented_error(map_->describe() +
                                 ": the keys of many mutexes are in many slots of the cluster");
    }
    return single_->eval_many(script, mutexes, args, deadline, wait, acked);
  }

  Result<Reply> eval(Script script, std::string_view mutex, const std::vector<std::string>& args,
                     Deadline deadline, ServerFacts* facts = nullptr,
                     std::optional<milliseconds> guard_px = std::nullopt,
                     std::optional<std::pair<int, milliseconds>> wait = std::nullopt,
                     long long* acked = nullptr) {
    if (single_) return single_->eval(script, mutex, args, deadline, facts, guard_px, wait, acked);
    const int slot = key_slot(mutex);
    std::optional<Endpoint> asked;
    milliseconds pause{20};
    Status last;
    auto wait_a_little = [&] {
      const auto left = deadline - steady_clock::now();
      if (left > steady_clock::duration::zero()) {
        std::this_thread::sleep_for(std::min<steady_clock::duration>(pause, left));
      }
      pause = std::min(pause * 2, milliseconds(500));
    };
    for (;;) {
      const auto now = steady_clock::now();
      if (now >= deadline) {
        if (!last.ok()) return last;
        return deadline_exceeded_error(map_->describe() + ": deadline passed before slot " +
                                       std::to_string(slot) + " was served");
      }
      Endpoint node;
      if (asked) {
        node = *asked;
      } else {
        auto found = map_->node_of(slot, deadline);
        if (!found.ok()) {
          // No node ever answered: nothing is failing over, the cluster is
          // not there (or refuses us). Said at once, as for one server.
          if (!map_->ever_read()) return found.status();
          last = found.status();
          wait_a_little();
          continue;
        }
        node = *found;
      }
      // An attempt gets half the time left (at least 250 ms): a node that
      // went away (a paused or cut-off one) leaves time for the next.
      const Deadline attempt =
          std::min(deadline, std::max(now + milliseconds(250), now + (deadline - now) / 2));
      const bool asking = asked.has_value();
      asked.reset();
      auto reply =
          channel(node).eval(script, mutex, args, attempt, facts, guard_px, wait, acked, asking);
      if (!reply.ok()) {
        last = reply.status();
        if (reply.status().code() != StatusCode::kUnavailable &&
            reply.status().code() != StatusCode::kDeadlineExceeded) {
          return reply.status();
        }
        // The node went away: ask the cluster where the slot is now.
        map_->stale();
        wait_a_little();
        continue;
      }
      if (!is_error(reply->get())) return reply;
      const std::string_view text = reply_string(reply->get());
      int moved_slot = 0;
      std::string host;
      int port = 0;
      if (internal::redis::parse_redirect(text, "MOVED", &moved_slot, &host, &port)) {
        map_->moved(moved_slot, host, port);
        map_->stale();  // the rest of the map may have changed too
        continue;
      }
      if (internal::redis::parse_redirect(text, "ASK", &moved_slot, &host, &port)) {
        asked = map_->with_address(host, port);
        continue;
      }
      if (text.starts_with("TRYAGAIN") || text.starts_with("CLUSTERDOWN") ||
          text.starts_with("MASTERDOWN") || text.starts_with("READONLY") ||
          text.starts_with("LOADING")) {
        // A slot mid-migration, a cluster electing a new primary, a node
        // demoted under us: the same call again shortly.
        last = error_reply_status(reply->get(), "redis at " + node.describe());
        map_->stale();
        wait_a_little();
        continue;
      }
      return reply;
    }
  }

  // `script` on each mutex (with `args`, each with its own arguments): in
  // one round trip per node; an answer that is a redirect or a failover is
  // asked again alone (eval()).
  Result<std::vector<Reply>> eval_each(Script script, const std::vector<std::string>& mutexes,
                                       const std::vector<std::vector<std::string>>* args,
                                       Deadline deadline) {
    if (single_) return single_->eval_each(script, mutexes, args, deadline);
    std::map<std::string, std::vector<std::size_t>> by_node;
    std::map<std::string, Endpoint> nodes;
    for (std::size_t i = 0; i < mutexes.size(); ++i) {
      SIMBA_ASSIGN_OR_RETURN(Endpoint node, map_->node_of(key_slot(mutexes[i]), deadline));
      by_node[node.describe()].push_back(i);
      nodes.emplace(node.describe(), node);
    }
    std::vector<Reply> out(mutexes.size());
    for (const auto& [name, indexes] : by_node) {
      std::vector<std::string> group;
      std::vector<std::vector<std::string>> group_args;
      for (const std::size_t i : indexes) {
        group.push_back(mutexes[i]);
        if (args != nullptr) group_args.push_back((*args)[i]);
      }
      auto replies =
          channel(nodes.at(name))
              .eval_each(script, group, args != nullptr ? &group_args : nullptr, deadline);
      for (std::size_t k = 0; k < indexes.size(); ++k) {
        const bool fine = replies.ok() && !is_error((*replies)[k].get());
        if (fine) {
          out[indexes[k]] = std::move((*replies)[k]);
          continue;
        }
        SIMBA_ASSIGN_OR_RETURN(
            out[indexes[k]],
            eval(script, mutexes[indexes[k]],
                 args != nullptr ? (*args)[indexes[k]] : std::vector<std::string>{}, deadline));
      }
    }
    return out;
  }

  // Every key matching `pattern`, on every primary.
  Result<std::vector<std::string>> scan(const std::string& pattern, Deadline deadline) {
    std::vector<std::string> keys;
    std::vector<CommandChannel*> targets;
    if (single_) {
      targets.push_back(single_.get());
    } else {
      SIMBA_RETURN_IF_ERROR(map_->node_of(0, deadline).status());
      for (const Endpoint& node : map_->primaries()) targets.push_back(&channel(node));
    }
    for (CommandChannel* target : targets) {
      std::string cursor = "0";
      do {
        SIMBA_ASSIGN_OR_RETURN(
            std::vector<Reply> replies,
            target->pipeline({{"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}}, deadline));
        const redisReply* r = replies[0].get();
        if (is_error(r)) return error_reply_status(r, "redis at " + target->describe());
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
          return internal_error("redis at " + target->describe() + ": unexpected reply to SCAN");
        }
        cursor = std::string(reply_string(r->element[0]));
        for (std::size_t i = 0; i < r->element[1]->elements; ++i) {
          keys.emplace_back(reply_string(r->element[1]->element[i]));
        }
      } while (cursor != "0");
    }
    return keys;
  }

  // `commands` on the server, or on every primary of the cluster: each
  // node's description and replies (`simba doctor`).
  Result<std::vector<std::pair<std::string, std::vector<Reply>>>> on_every_primary(
      const std::vector<Command>& commands, Deadline deadline) {
    std::vector<std::pair<std::string, std::vector<Reply>>> out;
    if (single_) {
      SIMBA_ASSIGN_OR_RETURN(std::vector<Reply> replies, single_->pipeline(commands, deadline));
      out.emplace_back(single_->describe(), std::move(replies));
      return out;
    }
    SIMBA_RETURN_IF_ERROR(map_->node_of(0, deadline).status());
    for (const Endpoint& node : map_->primaries()) {
      SIMBA_ASSIGN_OR_RETURN(std::vector<Reply> replies,
                             channel(node).pipeline(commands, deadline));
      out.emplace_back(node.describe(), std::move(replies));
    }
    return out;
  }

 private:
  // The channel to `node`, made on first use and kept (a node that went
  // away keeps its channel, used again if it serves again).
  CommandChannel& channel(const Endpoint& node) {
    std::lock_guard<std::mutex> lock(mu_);
    std::unique_ptr<CommandChannel>& slot = channels_[node.describe()];
    if (!slot) {
      slot = std::make_unique<CommandChannel>(
          std::make_shared<NodeOpener>(node, std::vector<Endpoint>{}, std::string()), prefix_,
          connect_timeout_, restart_guard_, /*cluster=*/true);
    }
    return *slot;
  }

  const std::shared_ptr<ClusterMap> map_;
  const std::string prefix_;
  const milliseconds connect_timeout_;
  const bool restart_guard_;
  const std::unique_ptr<CommandChannel> single_;
  std::mutex mu_;  // guards channels_ (the channels are thread-safe)
  std::map<std::string, std::unique_ptr<CommandChannel>> channels_;
};

// The subscriber connections of a backend: one, or in a cluster one per
// shard, each following its shard's slots to whichever node serves them
// (after a failover, the promoted replica).
class SubscriberRouter {
 public:
  explicit SubscriberRouter(std::shared_ptr<Subscriber> single) : single_(std::move(single)) {}
  SubscriberRouter(std::shared_ptr<ClusterMap> map, std::string prefix,
                   milliseconds connect_timeout, Endpoint base)
      : map_(std::move(map)),
        prefix_(std::move(prefix)),
        connect_timeout_(connect_timeout),
        base_(std::move(base)) {}

  std::unique_ptr<Subscription> add(std::string mutex, std::string contender_id,
                                    ListenerHub::Listener listener) {
    if (single_) {
      return single_->add(std::move(mutex), std::move(contender_id), std::move(listener));
    }
    const std::shared_ptr<Subscriber> shard = shard_of(key_slot(mutex));
    return shard->add(std::move(mutex), std::move(contender_id), std::move(listener));
  }

  void reconnect() {
    if (single_) single_->reconnect();
  }

  void stop() {
    if (single_) single_->stop();
    std::map<int, std::shared_ptr<Subscriber>> shards;
    {
      std::lock_guard<std::mutex> lock(mu_);
      shards = shards_;
    }
    for (auto& [slot, subscriber] : shards) subscriber->stop();
  }

 private:
  // The subscriber of the shard serving `slot`: one whose first slot the
  // same node serves now, or a new one that follows `slot`. (A failover
  // moves a shard's slots together, so a shard stays one subscriber.)
  std::shared_ptr<Subscriber> shard_of(int slot) {
    auto node = map_->node_of(slot, steady_clock::now() + connect_timeout_);
    std::lock_guard<std::mutex> lock(mu_);
    if (node.ok()) {
      for (auto& [first, subscriber] : shards_) {
        auto serving = map_->node_of(first, steady_clock::now());
        if (serving.ok() && serving->describe() == node->describe()) return subscriber;
      }
    } else if (auto it = shards_.find(slot); it != shards_.end()) {
      return it->second;
    }
    std::shared_ptr<ClusterMap> map = map_;
    auto opener =
        std::make_shared<NodeOpener>(base_, [map, slot](Deadline deadline) -> Result<Endpoint> {
          // A subscriber connects again after its node failed: read the map
          // again first (at most every 100 ms), then go where the slot is.
          map->stale();
          SIMBA_RETURN_IF_ERROR(map->refresh(deadline));
          return map->node_of(slot, deadline);
        });
    auto subscriber = std::make_shared<Subscriber>(std::move(opener), prefix_, connect_timeout_,
                                                   /*keyspace_events=*/false, /*sharded=*/true);
    shards_.emplace(slot, subscriber);
    return subscriber;
  }

  const std::shared_ptr<Subscriber> single_;
  const std::shared_ptr<ClusterMap> map_;
  const std::string prefix_;
  const milliseconds connect_timeout_{0};
  const Endpoint base_;
  std::mutex mu_;
  std::map<int, std::shared_ptr<Subscriber>> shards_;  // by the slot each follows
};

// ---------------------------------------------------------------------------

class RedisBackend final : public Backend {
 public:
  RedisBackend(const RedisOptions& options, std::shared_ptr<const internal::TlsContext> tls)
      : options_(options),
        opener_(make_opener(options, tls)),
        map_(make_map(options, tls)),
        commands_(map_ ? CommandRouter(map_, options.key_prefix, options.connect_timeout,
                                       options.restart_guard)
                       : CommandRouter(opener_, options.key_prefix, options.connect_timeout,
                                       options.restart_guard)),
        subscriber_(map_ ? SubscriberRouter(map_, options.key_prefix, options.connect_timeout,
                                            data_endpoint(options, tls))
                         : SubscriberRouter(std::make_shared<Subscriber>(
                               opener_, options.key_prefix, options.connect_timeout,
                               options.keyspace_events))) {
    capabilities_.push_release = true;
    capabilities_.cross_process = true;
    capabilities_.lists_waiters = true;
    // One script renews many leases on one server. In a cluster the
    // mutexes' keys are in many slots, which one script cannot reach: a
    // script per mutex, one round trip per node (eval_each). WAIT for
    // replicas is per node and per call, so a cluster with min_replicas
    // renews one lease a call.
    capabilities_.batch_renewals = map_ == nullptr || options_.min_replicas == 0;
    capabilities_.fencing_source =
        opener_->sentinel()
            ? "counter in simba:{M}:fence: max(last + 1, server time in microseconds); "
              "after a Sentinel failover no new lease until the old primary's have ended"
        : map_ ? "counter in simba:{M}:fence on the mutex's shard: max(last + 1, server time in "
                 "microseconds); after a failover no new lease on a promoted node until the old "
                 "primary's have ended"
               : "counter in simba:{M}:fence: max(last + 1, server time in microseconds)";
    capabilities_.max_mutex_length = kMaxNameLength;
    capabilities_.max_contender_id_length = kMaxNameLength;
    capabilities_.transport = options.tls.describe();
    if (opener_->sentinel()) {
      watcher_ = std::make_shared<SentinelWatcher>(opener_, options.connect_timeout, [this] {
        commands_.interrupt();
        subscriber_.reconnect();
      });
      watcher_->start();
    }
  }

  ~RedisBackend() override {
    if (watcher_) watcher_->stop();
    subscriber_.stop();
  }

  std::string_view scheme() const override {
    return map_ ? "redis-cluster" : opener_->sentinel() ? "redis-sentinel" : "redis";
  }
  const Capabilities& capabilities() const override { return capabilities_; }

  Status validate_store_mutex(std::string_view mutex) const override {
    if (mutex.find_first_of("{}") != std::string_view::npos) {
      return invalid_argument_error("mutex " + internal::in_quotes(mutex) +
                                    " must not contain '{' or '}' on redis (its keys are "
                                    "simba:{<mutex>}, a Redis Cluster hash tag)");
    }
    if (mutex.find("@@") != std::string_view::npos) {
      return invalid_argument_error(
          "mutex " + internal::in_quotes(mutex) +
          " must not contain \"@@\" on redis (Simba's message delimiter)");
    }
    return ok_status();
  }

  Status validate_store_contender_id(std::string_view id) const override {
    if (id.find("@@") != std::string_view::npos) {
      return invalid_argument_error(
          "contender_id " + internal::in_quotes(id) +
          " must not contain \"@@\" on redis (Simba's message delimiter)");
    }
    return ok_status();
  }

  Result<OwnerRecord> do_acquire_or_renew(const AcquireRequest& request,
                                          Deadline deadline) override {
    // The restart guard's bound depends on when the server started, which
    // the command channel learns when it connects; it appends the bound.
    const milliseconds px = request.ttl + request.transition;
    ServerFacts facts;
    std::optional<std::pair<int, milliseconds>> wait;
    if (options_.min_replicas > 0)
      wait.emplace(options_.min_replicas, options_.min_replicas_timeout);
    long long acked = 0;
    SIMBA_ASSIGN_OR_RETURN(
        Reply reply,
        commands_.eval(kAcquire, request.mutex,
                       {std::string(request.contender_id), std::to_string(request.ttl.count()),
                        std::to_string(request.transition.count())},
                       deadline, &facts, std::optional(px), wait, &acked));
    const std::string what = "acquiring mutex " + internal::in_quotes(request.mutex);
    if (is_error(reply.get())) return error_reply_status(reply.get(), context(what));
    ReplyFields fields(reply.get(), what);
    SIMBA_RETURN_IF_ERROR(fields.check(7));
    const std::string outcome = fields.text(0);
    SIMBA_ASSIGN_OR_RETURN(LockFields lock, parse_lock(fields, 1));
    if (wait && (outcome == "acquired" || outcome == "renewed") && acked < wait->first) {
      // The write may not survive a failover: not counted. A fresh
      // acquisition is given back (best effort), so that nobody waits for a
      // lease its owner does not know it has.
      std::string released;
      if (outcome == "acquired") {
        auto gone = do_release(request.mutex, request.contender_id,
                               static_cast<std::uint64_t>(lock.token), deadline);
        released = gone.ok() ? "; released it again"
                             : "; releasing it again failed: " + gone.status().message();
      }
      return unavailable_error(
                 context(what) + ": " + (outcome == "acquired" ? "acquired" : "renewed") +
                 " but only " + std::to_string(std::max(0LL, acked)) + " of the " +
                 std::to_string(wait->first) +
                 " replicas asked for (min_replicas) acknowledged the write within " +
                 format_duration(wait->second) + ", so a failover could lose it" + released)
          .with_retry_after(wait->second);
    }
    if (outcome == "free") {
      // Contenders come back when the guard ends (pttl), not at the next
      // step of their error backoff.
      if (map_ && facts.promoted) {
        return unavailable_error(
                   context(what) +
                   ": the node serving it was promoted from a replica (a cluster failover) and "
                   "may lack leases its old primary granted; new leases on this mutex in " +
                   format_duration(milliseconds(lock.pttl)) +
                   " (restart_guard=off in the URI skips this wait)")
            .with_retry_after(milliseconds(lock.pttl));
      }
      if (opener_->sentinel()) {
        return unavailable_error(
                   context(what) +
                   ": this primary is new to Simba (after a Sentinel failover, a restart of a "
                   "server without durable writes, or on first use), so a lease a previous one "
                   "granted may still be in use; new leases in " +
                   format_duration(milliseconds(lock.pttl)) +
                   " (restart_guard=off in the URI skips this wait)")
            .with_retry_after(milliseconds(lock.pttl));
      }
      return unavailable_error(
                 context(what) + ": the server started " +
                 format_duration(milliseconds(lock.now - facts.started_ms)) +
                 " ago and keeps no durable copy of its data (it needs appendonly yes and "
                 "appendfsync always), so a lease granted before it restarted may still be in use; "
                 "new leases in " +
                 format_duration(milliseconds(lock.pttl)) +
                 " (restart_guard=off in the URI skips this wait)")
          .with_retry_after(milliseconds(lock.pttl));
    }
    return to_record(lock, request.ttl, request.transition);
  }

  // One script over every lease (kLuaRenew): renews those its contender
  // holds, reads the others. In a cluster the keys of many mutexes are in
  // many slots: a script per mutex, one round trip per node.
  Result<std::vector<OwnerRecord>> do_renew(const std::vector<AcquireRequest>& requests,
                                            Deadline deadline) override {
    if (commands_.cluster()) return renew_each(requests, deadline);
    std::vector<std::string_view> mutexes;
    std::vector<std::string> args;
    for (const AcquireRequest& request : requests) {
      mutexes.push_back(request.mutex);
      for (std::string& arg : renewal_args(request)) args.push_back(std::move(arg));
    }
    std::optional<std::pair<int, milliseconds>> wait;
    if (options_.min_replicas > 0) {
      wait.emplace(options_.min_replicas, options_.min_replicas_timeout);
    }
    long long acked = 0;
    SIMBA_ASSIGN_OR_RETURN(Reply reply,
                           commands_.eval_many(kRenew, mutexes, args, deadline, wait, &acked));
    const std::string what = "renewing " + std::to_string(requests.size()) + " leases";
    if (is_error(reply.get())) return error_reply_status(reply.get(), context(what));
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != requests.size()) {
      return internal_error(context(what) + ": unexpected reply");
    }
    if (wait && acked < wait->first) {
      // As for one renewal (do_acquire_or_renew): not counted.
      return unavailable_error(context(what) + ": renewed but only " +
                               std::to_string(std::max(0LL, acked)) + " of the " +
                               std::to_string(wait->first) +
                               " replicas asked for (min_replicas) acknowledged the write "
                               "within " +
                               format_duration(wait->second) + ", so a failover could lose it")
          .with_retry_after(wait->second);
    }
    std::vector<OwnerRecord> records;
    records.reserve(requests.size());
    for (std::size_t i = 0; i < requests.size(); ++i) {
      SIMBA_ASSIGN_OR_RETURN(OwnerRecord record,
                             renewal_record(reply->element[i], requests[i], what));
      records.push_back(std::move(record));
    }
    return records;
  }

  // The renewal script's arguments for one lease: id, ttl, transition.
  static std::vector<std::string> renewal_args(const AcquireRequest& request) {
    return {std::string(request.contender_id), std::to_string(request.ttl.count()),
            std::to_string(request.transition.count())};
  }

  // One lease's answer of the renewal script (shaped as the read script's).
  static Result<OwnerRecord> renewal_record(const redisReply* element,
                                            const AcquireRequest& request,
                                            const std::string& what) {
    ReplyFields fields(element, what);
    SIMBA_RETURN_IF_ERROR(fields.check(6));
    SIMBA_ASSIGN_OR_RETURN(LockFields lock, parse_lock(fields, 0));
    return to_record(lock, request.ttl, request.transition);
  }

  // do_renew in a cluster (never with min_replicas: see the capability).
  Result<std::vector<OwnerRecord>> renew_each(const std::vector<AcquireRequest>& requests,
                                              Deadline deadline) {
    std::vector<std::string> mutexes;
    std::vector<std::vector<std::string>> args;
    for (const AcquireRequest& request : requests) {
      mutexes.emplace_back(request.mutex);
      args.push_back(renewal_args(request));
    }
    SIMBA_ASSIGN_OR_RETURN(std::vector<Reply> replies,
                           commands_.eval_each(kRenew, mutexes, &args, deadline));
    std::vector<OwnerRecord> records;
    records.reserve(requests.size());
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const std::string what = "renewing mutex " + internal::in_quotes(requests[i].mutex);
      const redisReply* reply = replies[i].get();
      if (is_error(reply)) return error_reply_status(reply, context(what));
      if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 1) {
        return internal_error(context(what) + ": unexpected reply");
      }
      SIMBA_ASSIGN_OR_RETURN(OwnerRecord record,
                             renewal_record(reply->element[0], requests[i], what));
      records.push_back(std::move(record));
    }
    return records;
  }

  Result<bool> do_release(std::string_view mutex, std::string_view contender_id,
                          std::uint64_t fencing_token, Deadline deadline) override {
    SIMBA_ASSIGN_OR_RETURN(
        Reply reply,
        commands_.eval(kRelease, mutex, {std::string(contender_id), std::to_string(fencing_token)},
                       deadline));
    const std::string what = "releasing mutex " + internal::in_quotes(mutex);
    if (is_error(reply.get())) return error_reply_status(reply.get(), context(what));
    if (reply->type != REDIS_REPLY_INTEGER) return internal_error(context(what) + ": bad reply");
    return reply->integer == 1;
  }

  Status do_leave(std::string_view mutex, std::string_view contender_id,
                  Deadline deadline) override {
    SIMBA_ASSIGN_OR_RETURN(Reply reply,
                           commands_.eval(kLeave, mutex, {std::string(contender_id)}, deadline));
    if (is_error(reply.get())) {
      return error_reply_status(
          reply.get(), context("leaving the queue of mutex " + internal::in_quotes(mutex)));
    }
    return ok_status();
  }

  Result<ForcedRelease> do_force_release(std::string_view mutex, Deadline deadline) override {
    SIMBA_ASSIGN_OR_RETURN(Reply reply, commands_.eval(kForceRelease, mutex, {}, deadline));
    const std::string what = "force-releasing mutex " + internal::in_quotes(mutex);
    if (is_error(reply.get())) return error_reply_status(reply.get(), context(what));
    ReplyFields fields(reply.get(), what);
    SIMBA_RETURN_IF_ERROR(fields.check(7));
    SIMBA_ASSIGN_OR_RETURN(LockFields lock, parse_lock(fields, 0));
    SIMBA_ASSIGN_OR_RETURN(long long floor, fields.number(6));
    const OwnerRecord record = to_record(lock, milliseconds(0), milliseconds(0));
    return ForcedRelease{record.owner, static_cast<std::uint64_t>(floor), record.store_now};
  }

  Result<OwnerRecord> do_read(std::string_view mutex, Deadline deadline) override {
    SIMBA_ASSIGN_OR_RETURN(Reply reply, commands_.eval(kRead, mutex, {}, deadline));
    return parse_read(reply.get(), mutex);
  }

  Result<std::vector<ListedMutex>> do_list(Deadline deadline) override {
    std::set<std::string> mutexes;
    auto keys = commands_.scan(options_.key_prefix + ":{*", deadline);
    if (!keys.ok()) return keys.status().with_context(context("listing mutexes") + ": ");
    for (const std::string& key : *keys) {
      std::string mutex;
      std::string suffix;
      if (split_name(options_.key_prefix, key, &mutex, &suffix) &&
          (suffix.empty() || suffix == "contender" || suffix == "fence") &&
          validate_mutex(mutex).ok()) {
        mutexes.insert(std::move(mutex));
      }
    }

    std::vector<ListedMutex> listed;
    const std::vector<std::string> names(mutexes.begin(), mutexes.end());
    constexpr std::size_t kBatch = 500;
    for (std::size_t i = 0; i < names.size(); i += kBatch) {
      const std::size_t end = std::min(names.size(), i + kBatch);
      const std::vector<std::string> batch(names.begin() + static_cast<std::ptrdiff_t>(i),
                                           names.begin() + static_cast<std::ptrdiff_t>(end));
      SIMBA_ASSIGN_OR_RETURN(std::vector<Reply> replies,
                             commands_.eval_each(kRead, batch, nullptr, deadline));
      for (std::size_t j = i; j < end; ++j) {
        SIMBA_ASSIGN_OR_RETURN(OwnerRecord record, parse_read(replies[j - i].get(), names[j]));
        listed.push_back(ListedMutex{names[j], std::move(record)});
      }
    }
    return listed;
  }

  // The queue simba:{M}:contender: contenders whose acquisition failed, as
  // JVM Simba keeps it, listed oldest first while they listen on their
  // personal channel (see kLuaWaiters).
  Result<std::vector<std::string>> do_waiters(std::string_view mutex, Deadline deadline) override {
    SIMBA_ASSIGN_OR_RETURN(Reply reply, commands_.eval(kWaiters, mutex, {}, deadline));
    const std::string what = "listing the waiters of mutex " + internal::in_quotes(mutex);
    const redisReply* r = reply.get();
    if (is_error(r)) return error_reply_status(r, context(what));
    const ReplyFields fields(r, what);
    SIMBA_RETURN_IF_ERROR(fields.check(r->type == REDIS_REPLY_ARRAY ? r->elements : 0));
    std::vector<std::string> waiters;
    for (std::size_t i = 0; i < r->elements; ++i) waiters.push_back(fields.text(i));
    return waiters;
  }

  // `simba doctor`: the server's role and replicas (in a cluster, every
  // primary's), whether it keeps a durable copy, and what the restart and
  // failover guards make of that.
  Status do_inspect(StoreReport& report, Deadline deadline) override {
    using Severity = StoreFinding::Severity;
    SIMBA_ASSIGN_OR_RETURN(auto nodes,
                           commands_.on_every_primary({{"INFO", "server"},
                                                       {"INFO", "replication"},
                                                       {"INFO", "persistence"},
                                                       {"CONFIG", "GET", "appendfsync"}},
                                                      deadline));
    if (map_) {
      int covered = 0;
      std::string shards;
      for (const internal::redis::SlotRange& range : map_->ranges()) {
        covered += range.last - range.first + 1;
        shards += (shards.empty() ? "" : ", ") + range.host + ":" + std::to_string(range.port) +
                  " slots " + std::to_string(range.first) + "-" + std::to_string(range.last) +
                  " (" + std::to_string(range.replicas.size()) + " replica(s))";
      }
      const bool whole = covered == internal::redis::kClusterSlots;
      report.add(whole ? Severity::kOk : Severity::kNote, "topology",
                 "a cluster of " + std::to_string(nodes.size()) + " primaries: " + shards +
                     (whole ? ""
                            : "; " + std::to_string(covered) +
                                  " of 16384 slots served: mutexes in the rest fail"));
    }
    long long replicas_min = -1;
    for (auto& node_replies : nodes) {
      const std::string& where = node_replies.first;
      const std::vector<Reply>& replies = node_replies.second;
      for (std::size_t i = 0; i < 3; ++i) {
        if (is_error(replies[i].get())) {
          return error_reply_status(replies[i].get(), "redis at " + where + ": inspecting");
        }
      }
      auto field = [&](std::size_t i, std::string_view key) -> std::string {
        const std::string text = "\n" + std::string(reply_string(replies[i].get()));
        const std::size_t at = text.find("\n" + std::string(key) + ":");
        if (at == std::string::npos) return {};
        const std::size_t start = at + key.size() + 2;
        return text.substr(start, text.find_first_of("\r\n", start) - start);
      };
      const std::string node = map_ ? where + ": " : std::string();
      const std::string mode = field(0, "redis_mode");
      report.add(Severity::kOk, "server",
                 "Redis " + field(0, "redis_version") + " at " + where +
                     (mode == "standalone" || mode.empty() ? "" : " (" + mode + " mode)"));
      const std::string role = field(1, "role");
      long long replicas = 0;
      parse_int(field(1, "connected_slaves"), &replicas);
      replicas_min = replicas_min < 0 ? replicas : std::min(replicas_min, replicas);
      if (role != "master") {
        report.add(Severity::kUnsafe, "topology",
                   node + "a replica (role:" + role +
                       "): acquisitions fail (READONLY), and what it shows may lag its primary");
      } else if (opener_->sentinel()) {
        report.add(Severity::kOk, "topology",
                   "the primary of '" + opener_->master_name() + "' named by sentinels, with " +
                       std::to_string(replicas) + " replica(s) connected");
      } else if (!map_) {
        report.add(replicas > 0 ? Severity::kNote : Severity::kOk, "topology",
                   replicas > 0 ? "a primary with " + std::to_string(replicas) +
                                      " replica(s), named directly: a failover to a replica is "
                                      "not followed (redis-sentinel:// follows one)"
                                : "a single server");
      }
      const bool aof = field(2, "aof_enabled") == "1";
      const redisReply* fsync = replies[3].get();
      const std::string appendfsync = fsync->type == REDIS_REPLY_ARRAY && fsync->elements == 2
                                          ? std::string(reply_string(fsync->element[1]))
                                          : std::string("unknown (CONFIG GET refused)");
      const std::string settings =
          node + "appendonly " + (aof ? "yes" : "no") + ", appendfsync " + appendfsync;
      if (aof && appendfsync == "always") {
        report.add(Severity::kOk, "durability",
                   settings + ": an acknowledged acquisition survives a restart");
      } else if (options_.restart_guard) {
        report.add(Severity::kNote, "durability",
                   settings +
                       ": a restart may forget leases, so after one no new lease is granted for "
                       "ttl + transition (the restart guard)");
      } else {
        report.add(Severity::kUnsafe, "durability",
                   settings +
                       " and restart_guard=off: after a restart a second owner can be granted "
                       "while the first still holds");
      }
    }
    if (opener_->sentinel() || map_) {
      const std::string guard =
          map_ ? "a promoted node grants no new lease on a mutex for ttl + transition from its "
                 "first use there (the failover guard)"
               : "a new primary grants no lease for ttl + transition (the failover guard)";
      if (!options_.restart_guard) {
        report.add(Severity::kUnsafe, "failover",
                   "restart_guard=off: after a failover the new primary may lack recent "
                   "acquisitions and grant them again");
      } else if (options_.min_replicas == 0) {
        report.add(Severity::kNote, "failover",
                   "replication is asynchronous: " + guard +
                       "; min_replicas=1 also makes every acquisition wait for a replica");
      } else {
        report.add(Severity::kOk, "failover",
                   "every acquisition waits for " + std::to_string(options_.min_replicas) +
                       " replica(s) (min_replicas), and " + guard);
      }
      if (replicas_min >= 0 && replicas_min < options_.min_replicas) {
        report.add(Severity::kNote, "replication",
                   std::to_string(replicas_min) +
                       " replica(s) connected, fewer than min_replicas=" +
                       std::to_string(options_.min_replicas) +
                       ": acquisitions fail (safely) until enough are back");
      }
    }
    return ok_status();
  }

  Result<std::unique_ptr<Subscription>> do_subscribe(
      std::string_view mutex, std::string_view contender_id,
      std::function<void(const MutexEvent&)> listener) override {
    return subscriber_.add(std::string(mutex), std::string(contender_id), std::move(listener));
  }

 private:
  std::string context(std::string_view what) const {
    return "redis at " + commands_.describe() + ": " + std::string(what);
  }

  // The data node's endpoint, or in a cluster what every node's shares
  // (user, password, TLS) with the first seed's address.
  static Endpoint data_endpoint(const RedisOptions& options,
                                std::shared_ptr<const internal::TlsContext> tls) {
    Endpoint data{options.host,     options.port,     options.user,
                  options.password, options.database, std::move(tls)};
    if (!options.cluster_nodes.empty()) {
      data.host = options.cluster_nodes.front().host;
      data.port = options.cluster_nodes.front().port;
    }
    return data;
  }

  static std::shared_ptr<ClusterMap> make_map(const RedisOptions& options,
                                              std::shared_ptr<const internal::TlsContext> tls) {
    if (options.cluster_nodes.empty()) return nullptr;
    const Endpoint base = data_endpoint(options, std::move(tls));
    std::vector<Endpoint> seeds;
    for (const RedisOptions::NodeAddress& node : options.cluster_nodes) {
      Endpoint seed = base;
      seed.host = node.host;
      seed.port = node.port;
      seeds.push_back(std::move(seed));
    }
    return std::make_shared<ClusterMap>(base, std::move(seeds), options.connect_timeout);
  }

  static std::shared_ptr<NodeOpener> make_opener(const RedisOptions& options,
                                                 std::shared_ptr<const internal::TlsContext> tls) {
    Endpoint data = data_endpoint(options, tls);
    std::vector<Endpoint> sentinels;
    for (const RedisOptions::SentinelAddress& s : options.sentinels) {
      sentinels.push_back(Endpoint{s.host, s.port, {}, options.sentinel_password, 0, tls});
    }
    return std::make_shared<NodeOpener>(std::move(data), std::move(sentinels), options.master_name);
  }

  Result<OwnerRecord> parse_read(const redisReply* reply, std::string_view mutex) const {
    const std::string what = "reading mutex " + internal::in_quotes(mutex);
    if (is_error(reply)) return error_reply_status(reply, context(what));
    ReplyFields fields(reply, what);
    SIMBA_RETURN_IF_ERROR(fields.check(6));
    SIMBA_ASSIGN_OR_RETURN(LockFields lock, parse_lock(fields, 0));
    return to_record(lock, milliseconds(0), milliseconds(0));
  }

  const RedisOptions options_;
  const std::shared_ptr<NodeOpener> opener_;
  const std::shared_ptr<ClusterMap> map_;  // Redis Cluster only
  Capabilities capabilities_;
  CommandRouter commands_;
  SubscriberRouter subscriber_;
  std::shared_ptr<SentinelWatcher> watcher_;
};

}  // namespace

Result<std::shared_ptr<Backend>> new_redis_backend(RedisOptions options) {
  if (!options.cluster_nodes.empty()) {
    for (const RedisOptions::NodeAddress& node : options.cluster_nodes) {
      SIMBA_RETURN_IF_ERROR(internal::validate_host_port("redis-cluster", node.host, node.port));
    }
    if (!options.sentinels.empty()) {
      return invalid_argument_error("redis: give cluster nodes or sentinels, not both");
    }
    if (options.database != 0) {
      return invalid_argument_error("redis-cluster: a cluster has only database 0, not " +
                                    std::to_string(options.database));
    }
  } else if (options.sentinels.empty()) {
    SIMBA_RETURN_IF_ERROR(internal::validate_host_port("redis", options.host, options.port));
  } else {
    for (const RedisOptions::SentinelAddress& s : options.sentinels) {
      SIMBA_RETURN_IF_ERROR(internal::validate_host_port("redis-sentinel", s.host, s.port));
    }
    if (options.master_name.empty()) {
      return invalid_argument_error("redis-sentinel: the master name must not be empty");
    }
  }
  if (options.min_replicas < 0) {
    return invalid_argument_error("redis: min_replicas must not be negative");
  }
  if (options.min_replicas > 0 && options.min_replicas_timeout <= milliseconds(0)) {
    return invalid_argument_error("redis: min_replicas_timeout must be positive");
  }
  if (options.database < 0) return invalid_argument_error("redis: database must not be negative");
  SIMBA_RETURN_IF_ERROR(
      internal::validate_timeout_and_prefix("redis", options.connect_timeout, options.key_prefix));
  SIMBA_RETURN_IF_ERROR(options.tls.validate("redis"));
  std::shared_ptr<const internal::TlsContext> tls;
  if (options.tls.enabled()) {
    SIMBA_ASSIGN_OR_RETURN(tls, internal::TlsContext::create(options.tls, "redis"));
  }
  return std::shared_ptr<Backend>(std::make_shared<RedisBackend>(options, std::move(tls)));
}

Result<RedisOptions> redis_options_from_uri(const Uri& uri) {
  const bool sentinel = uri.scheme == "redis-sentinel" || uri.scheme == "rediss-sentinel";
  const bool cluster = uri.scheme == "redis-cluster" || uri.scheme == "rediss-cluster";
  const std::string form =
      sentinel  ? "redis[s]-sentinel://[user:password@]host:port[,host:port...]/master-name[/db]"
      : cluster ? "redis[s]-cluster://[user:password@]host:port[,host:port...]"
                : "redis[s]://[user:password@]host[:port][/db]";
  if (uri.scheme != "redis" && uri.scheme != "rediss" && !sentinel && !cluster) {
    return invalid_argument_error("redis: URI scheme is '" + uri.scheme +
                                  "', expected 'redis' or 'rediss' (or 'redis-sentinel', "
                                  "'rediss-sentinel', 'redis-cluster', 'rediss-cluster')");
  }
  if (cluster) {
    if (uri.hosts.empty()) {
      return invalid_argument_error("redis-cluster: URI names no node; expected " + form);
    }
    if (!uri.path.empty() && uri.path != "/") {
      return invalid_argument_error("redis-cluster: URI path " + internal::in_quotes(uri.path) +
                                    " is not allowed (a cluster has only database 0); expected " +
                                    form);
    }
  }
  if (!sentinel && !cluster && uri.hosts.size() != 1) {
    return invalid_argument_error(
        "redis: URI must name exactly one host (several: sentinels, "
        "with redis-sentinel://); expected " +
        form);
  }
  if (sentinel && uri.hosts.empty()) {
    return invalid_argument_error("redis-sentinel: URI names no sentinel; expected " + form);
  }
  std::vector<std::string_view> keys = {"connect_timeout", "restart_guard", "keyspace_events",
                                        "key_prefix", "password_file"};
  if (sentinel) {
    keys.insert(keys.end(), {"sentinel_password", "min_replicas", "min_replicas_timeout"});
  }
  if (cluster) {
    // Keyspace events are per node in a cluster: not used there.
    keys.erase(std::find(keys.begin(), keys.end(), "keyspace_events"));
    keys.insert(keys.end(), {"min_replicas", "min_replicas_timeout"});
  }
  keys.insert(keys.end(), std::begin(kTlsQueryKeys), std::end(kTlsQueryKeys));
  SIMBA_RETURN_IF_ERROR(uri.check_query_keys(keys).with_context("redis"));
  RedisOptions options;
  SIMBA_ASSIGN_OR_RETURN(
      options.tls, tls_options_from_uri(uri, "redis",
                                        uri.scheme == "rediss" || uri.scheme == "rediss-sentinel" ||
                                            uri.scheme == "rediss-cluster"));
  std::string path = uri.path;
  if (sentinel) {
    for (const UriHost& host : uri.hosts) {
      if (host.host.empty()) {
        return invalid_argument_error("redis-sentinel: URI has an empty host; expected " + form);
      }
      options.sentinels.push_back({host.host, host.port.value_or(26379)});
    }
    // "/master-name[/db]"
    if (path.size() < 2 || path[1] == '/') {
      return invalid_argument_error("redis-sentinel: URI names no master; expected " + form);
    }
    const std::size_t slash = path.find('/', 1);
    options.master_name =
        path.substr(1, slash == std::string::npos ? std::string::npos : slash - 1);
    path = slash == std::string::npos ? std::string() : path.substr(slash);
    if (auto value = uri.query_value("sentinel_password")) options.sentinel_password = *value;
    if (auto value = uri.query_value("min_replicas")) {
      long long n = -1;
      if (!parse_int(*value, &n) || n < 0 || n > 100) {
        return invalid_argument_error(
            "redis-sentinel: min_replicas must be a number of replicas "
            "(0 to 100), not " +
            internal::in_quotes(*value));
      }
      options.min_replicas = static_cast<int>(n);
    }
    SIMBA_RETURN_IF_ERROR(internal::read_positive_duration(
        uri, "redis-sentinel", "min_replicas_timeout", &options.min_replicas_timeout));
  } else if (cluster) {
    for (const UriHost& host : uri.hosts) {
      if (host.host.empty()) {
        return invalid_argument_error("redis-cluster: URI has an empty host; expected " + form);
      }
      options.cluster_nodes.push_back({host.host, host.port.value_or(6379)});
    }
    path.clear();
    if (auto value = uri.query_value("min_replicas")) {
      long long n = -1;
      if (!parse_int(*value, &n) || n < 0 || n > 100) {
        return invalid_argument_error(
            "redis-cluster: min_replicas must be a number of replicas (0 to 100), not " +
            internal::in_quotes(*value));
      }
      options.min_replicas = static_cast<int>(n);
    }
    SIMBA_RETURN_IF_ERROR(internal::read_positive_duration(
        uri, "redis-cluster", "min_replicas_timeout", &options.min_replicas_timeout));
    options.keyspace_events = false;
  } else {
    options.host = uri.hosts.front().host;
    if (options.host.empty()) {
      return invalid_argument_error("redis: URI has no host; expected " + form);
    }
    if (uri.hosts.front().port) options.port = *uri.hosts.front().port;
  }
  if (uri.user) options.user = *uri.user;
  if (uri.password) options.password = *uri.password;
  if (auto file = uri.query_value("password_file")) {
    if (uri.password) {
      return invalid_argument_error(
          "redis: the URI has a password and a password_file; give one of them");
    }
    SIMBA_ASSIGN_OR_RETURN(options.password, read_secret_file("redis", "password_file", *file));
  }
  if (!path.empty() && path != "/") {
    long long db = -1;
    if (!parse_int(std::string_view(path).substr(1), &db) || db < 0 || db > 1'000'000) {
      return invalid_argument_error("redis: URI path " + internal::in_quotes(uri.path) +
                                    " is not a database number; expected " + form);
    }
    options.database = static_cast<int>(db);
  }
  SIMBA_RETURN_IF_ERROR(
      internal::read_positive_duration(uri, "redis", "connect_timeout", &options.connect_timeout));
  auto on_off = [](std::string_view key, const std::string& value, std::string_view on,
                   bool* out) -> Status {
    if (value == on) {
      *out = true;
    } else if (value == "off") {
      *out = false;
    } else {
      return invalid_argument_error("redis: " + std::string(key) + " must be " + std::string(on) +
                                    " or off, not " + internal::in_quotes(value));
    }
    return ok_status();
  };
  if (auto value = uri.query_value("key_prefix")) {
    SIMBA_RETURN_IF_ERROR(internal::validate_key_prefix("redis", *value));
    options.key_prefix = *value;
  }
  if (auto value = uri.query_value("restart_guard")) {
    SIMBA_RETURN_IF_ERROR(on_off("restart_guard", *value, "on", &options.restart_guard));
  }
  if (auto value = uri.query_value("keyspace_events")) {
    SIMBA_RETURN_IF_ERROR(on_off("keyspace_events", *value, "auto", &options.keyspace_events));
  }
  return options;
}

}  // namespace simba
