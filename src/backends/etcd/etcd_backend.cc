// The etcd backend: see include/simba/backends/etcd.h for the contract and
// etcd_client.h for why it speaks the JSON gateway over a socket of its own.
//
// Two connections per backend:
//   RequestChannel  every store call, one at a time; a call pipelines the
//                   requests it needs (e.g. lease keep-alive + transaction)
//                   so most calls are one round trip
//   Watcher         one watch on the whole key prefix, read by one thread
//                   that wakes the waiter queued behind a deleted key, tells
//                   an owner whose key vanished (kLost), and keeps the
//                   contenders' queue positions (Holder) that the calls and
//                   the events share
//
// The queue (etcd's election recipe): contender C of mutex M holds lease L
// and key <prefix>/<M>/<L in hex>; the key with the lowest create revision
// owns M, and its create revision is the fencing token. A waiter remembers
// the key just below its own (its predecessor) and is woken only when that
// key is deleted: a release wakes one waiter, not all of them.

#include "simba/backends/etcd.h"

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backends/etcd/etcd_client.h"
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
using internal::etcd::base64_decode;
using internal::etcd::base64_encode;
using internal::etcd::Endpoint;
using internal::etcd::HttpConnection;
using internal::etcd::HttpRequest;
using internal::etcd::HttpResponse;
using internal::etcd::int64_field;
using internal::etcd::Json;
using internal::etcd::parse_reply;
using internal::etcd::parse_stream_line;
using internal::etcd::prefix_end;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr std::size_t kMaxNameLength = 512;
// How many deleted keys the watcher remembers, for a call whose reply
// names a predecessor the watch already saw deleted.
constexpr std::size_t kRecentDeletes = 4096;
// Lease lookups per pipelined batch in list().
constexpr std::size_t kListBatch = 100;
// Rounds of one acquire_or_renew call when the store changed under it.
constexpr int kAcquireRounds = 4;

StoreTime wall_now() {
  return std::chrono::duration_cast<milliseconds>(
      std::chrono::system_clock::now().time_since_epoch());
}

// '/' and '%' in a mutex name are escaped in keys, so the keys of mutex
// "a" (<prefix>/a/...) never include those of mutex "a/b"
// (<prefix>/a%2Fb/...).
std::string encode_mutex(std::string_view mutex) {
  std::string out;
  out.reserve(mutex.size());
  for (const char c : mutex) {
    if (c == '%') {
      out += "%25";
    } else if (c == '/') {
      out += "%2F";
    } else {
      out += c;
    }
  }
  return out;
}

bool decode_mutex(std::string_view encoded, std::string* mutex) {
  mutex->clear();
  for (std::size_t i = 0; i < encoded.size(); ++i) {
    const char c = encoded[i];
    if (c == '/') return false;
    if (c != '%') {
      *mutex += c;
      continue;
    }
    const std::string_view escape = encoded.substr(i, 3);
    if (escape == "%25") {
      *mutex += '%';
    } else if (escape == "%2F") {
      *mutex += '/';
    } else {
      return false;
    }
    i += 2;
  }
  return !mutex->empty();
}

std::string lease_hex(std::int64_t lease) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(lease));
  return hex;
}

// "<prefix>/<M>/": every key of mutex M starts with this.
std::string mutex_key_prefix(std::string_view prefix, std::string_view mutex) {
  return std::string(prefix) + "/" + encode_mutex(mutex) + "/";
}

std::string key_for(std::string_view prefix, std::string_view mutex, std::int64_t lease) {
  return mutex_key_prefix(prefix, mutex) + lease_hex(lease);
}

// "<prefix>/<M>": the record that mutex M was used (no lease, no value),
// so that list() also shows mutexes that are free now. It is outside M's
// queue range ("<prefix>/<M>/" up to "<prefix>/<M>0").
bool parse_record_key(std::string_view prefix, std::string_view key, std::string* mutex) {
  if (key.size() < prefix.size() + 2 || key.substr(0, prefix.size()) != prefix ||
      key[prefix.size()] != '/') {
    return false;
  }
  return decode_mutex(key.substr(prefix.size() + 1), mutex);
}

// "<prefix>/<M>/<16 hex>" -> M; false for any other key.
bool parse_key(std::string_view prefix, std::string_view key, std::string* mutex) {
  const std::size_t head = prefix.size() + 1;
  if (key.size() < head + 1 + 17 || key.substr(0, prefix.size()) != prefix ||
      key[prefix.size()] != '/' || key[key.size() - 17] != '/') {
    return false;
  }
  const std::string_view hex = key.substr(key.size() - 16);
  if (!std::all_of(hex.begin(), hex.end(),
                   [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); })) {
    return false;
  }
  return decode_mutex(key.substr(head, key.size() - 17 - head), mutex);
}

// One key-value as etcd reports it, bytes decoded.
struct Kv {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t version = 0;
  std::int64_t lease = 0;
};

bool parse_kv(const Json& json, Kv* kv) {
  if (!json.is_object()) return false;
  if (!base64_decode(json.value("key", std::string()), &kv->key)) return false;
  if (!base64_decode(json.value("value", std::string()), &kv->value)) return false;
  kv->create_revision = int64_field(json, "create_revision");
  kv->mod_revision = int64_field(json, "mod_revision");
  kv->version = int64_field(json, "version");
  kv->lease = int64_field(json, "lease");
  return true;
}

// The kvs of a range reply (or of a transaction's response_range).
Result<std::vector<Kv>> kvs_of(const Json& range, std::string_view context) {
  std::vector<Kv> kvs;
  if (!range.is_object()) return internal_error(std::string(context) + ": malformed range reply");
  const auto it = range.find("kvs");
  if (it == range.end()) return kvs;
  if (!it->is_array()) return internal_error(std::string(context) + ": malformed range reply");
  for (const Json& item : *it) {
    Kv kv;
    if (!parse_kv(item, &kv)) {
      return internal_error(std::string(context) + ": malformed key-value in a reply");
    }
    kvs.push_back(std::move(kv));
  }
  return kvs;
}

std::int64_t header_revision(const Json& reply) {
  const auto it = reply.find("header");
  return it == reply.end() ? 0 : int64_field(*it, "revision");
}

// ---- request bodies ---------------------------------------------------------------

HttpRequest post(std::string path, const Json& body) { return {std::move(path), body.dump()}; }

// A range over every key of `mutex_prefix`, sorted by create revision.
Json range_op(const std::string& mutex_prefix, bool ascending, int limit, bool keys_only,
              std::int64_t max_create_revision = 0) {
  Json range = {{"key", base64_encode(mutex_prefix)},
                {"range_end", base64_encode(prefix_end(mutex_prefix))},
                {"sort_order", ascending ? "ASCEND" : "DESCEND"},
                {"sort_target", "CREATE"},
                {"limit", std::to_string(limit)}};
  if (keys_only) range["keys_only"] = true;
  if (max_create_revision > 0) range["max_create_revision"] = std::to_string(max_create_revision);
  return range;
}

Json request_range(Json range) { return Json{{"request_range", std::move(range)}}; }

// A transaction's comparison: the key (base64) has this create revision
// (0: the key does not exist).
Json created_at(const std::string& key64, std::int64_t create_revision) {
  return Json::array({Json{{"key", key64},
                           {"target", "CREATE"},
                           {"result", "EQUAL"},
                           {"create_revision", std::to_string(create_revision)}}});
}

HttpRequest lease_grant(std::int64_t lease, std::int64_t ttl_seconds) {
  return post("/v3/lease/grant",
              {{"ID", std::to_string(lease)}, {"TTL", std::to_string(ttl_seconds)}});
}
HttpRequest lease_keep_alive(std::int64_t lease) {
  return post("/v3/lease/keepalive", {{"ID", std::to_string(lease)}});
}
HttpRequest lease_revoke(std::int64_t lease) {
  return post("/v3/lease/revoke", {{"ID", std::to_string(lease)}});
}
HttpRequest lease_time_to_live(std::int64_t lease) {
  return post("/v3/lease/timetolive", {{"ID", std::to_string(lease)}});
}

// The one transaction of acquire_or_renew: if our key is missing, create it
// (value: our id, attached to our lease) and read the lowest key and the two
// newest (ours and the one just below); otherwise read our key, the lowest
// key and, when we know our create revision, the key just below ours.
HttpRequest acquire_txn(const std::string& mutex_prefix, const std::string& key,
                        const std::string& contender_id, std::int64_t lease,
                        std::int64_t known_create_revision) {
  const std::string key64 = base64_encode(key);
  Json lowest = request_range(range_op(mutex_prefix, true, 1, false));
  Json failure = Json::array({request_range(Json{{"key", key64}}), lowest});
  if (known_create_revision > 1) {
    failure.push_back(
        request_range(range_op(mutex_prefix, false, 1, true, known_create_revision - 1)));
  }
  Json put = {
      {"request_put",
       {{"key", key64}, {"value", base64_encode(contender_id)}, {"lease", std::to_string(lease)}}}};
  // The mutex's record (see RecordKey), created once, so that list()
  // shows a mutex that is free now but was used.
  const std::string record64 = base64_encode(mutex_prefix.substr(0, mutex_prefix.size() - 1));
  Json record = {{"request_txn",
                  {{"compare", created_at(record64, 0)},
                   {"success", Json::array({Json{{"request_put", {{"key", record64}}}}})}}}};
  Json success =
      Json::array({std::move(put), std::move(lowest),
                   request_range(range_op(mutex_prefix, false, 2, true)), std::move(record)});
  return post("/v3/kv/txn", {{"compare", created_at(key64, 0)},
                             {"success", std::move(success)},
                             {"failure", std::move(failure)}});
}

// Deletes `key` if it still has `create_revision`.
HttpRequest delete_if_created_at(const std::string& key, std::int64_t create_revision) {
  const std::string key64 = base64_encode(key);
  Json success = Json::array({Json{{"request_delete_range", {{"key", key64}}}}});
  return post("/v3/kv/txn", {{"compare", created_at(key64, create_revision)},
                             {"success", std::move(success)},
                             {"failure", Json::array()}});
}

// An operator's release: if `owner_key` still has `create_revision`, deletes
// every key of the mutex, the owner's and its queue's. The queue goes too
// because tokens are create revisions: a waiter's key, older than the floor
// this returns, would otherwise make it the next owner with a token below the
// floor. The waiters see their keys deleted and queue again, with keys (and
// so tokens) created after it, as ZooKeeper's waiters do.
HttpRequest delete_queue_if_owner_created_at(const std::string& mutex_prefix,
                                             const std::string& owner_key,
                                             std::int64_t create_revision) {
  Json success = Json::array({Json{{"request_delete_range",
                                    {{"key", base64_encode(mutex_prefix)},
                                     {"range_end", base64_encode(prefix_end(mutex_prefix))}}}}});
  return post("/v3/kv/txn", {{"compare", created_at(base64_encode(owner_key), create_revision)},
                             {"success", std::move(success)},
                             {"failure", Json::array()}});
}

// ---- connecting ---------------------------------------------------------------------

std::string describe_endpoints(const std::vector<Endpoint>& endpoints) {
  std::string out;
  for (const Endpoint& endpoint : endpoints) {
    if (!out.empty()) out += ',';
    out += endpoint.describe();
  }
  return out;
}

// Connects to the first endpoint that answers, starting at *next; *next is
// left at the one that answered (or after the last one tried).
Result<std::unique_ptr<HttpConnection>> connect_any(const std::vector<Endpoint>& endpoints,
                                                    std::size_t* next, milliseconds connect_timeout,
                                                    Deadline deadline, bool tcp_keepalive) {
  Status last = deadline_exceeded_error("etcd at " + describe_endpoints(endpoints) +
                                        ": deadline passed before connecting");
  const std::size_t first = *next;
  for (std::size_t i = 0; i < endpoints.size(); ++i) {
    const auto now = steady_clock::now();
    if (now >= deadline) break;
    const std::size_t at = (first + i) % endpoints.size();
    auto conn = HttpConnection::open(endpoints[at], std::min(deadline, now + connect_timeout),
                                     tcp_keepalive);
    if (conn.ok()) {
      *next = at;
      return conn;
    }
    last = conn.status();
    *next = (at + 1) % endpoints.size();
  }
  return last;
}

// ---- the request connection ---------------------------------------------------------

class RequestChannel {
 public:
  // `left_endpoint(i)` is called (with the call's turn held) when calls
  // leave endpoint i because it failed them, so the watch can leave it too.
  RequestChannel(std::vector<Endpoint> endpoints, milliseconds connect_timeout,
                 std::function<void(std::size_t)> left_endpoint)
      : endpoints_(std::move(endpoints)),
        described_("etcd at " + describe_endpoints(endpoints_)),
        connect_timeout_(connect_timeout),
        left_endpoint_(std::move(left_endpoint)) {}

  const std::string& describe() const { return described_; }

  // One call's exclusive use of the connection, waiting for its turn no
  // longer than the call's deadline. (Not std::timed_mutex: its
  // try_lock_until is invisible to ThreadSanitizer on this glibc.)
  class Turn {
   public:
    Turn(RequestChannel* channel, Deadline deadline)
        : channel_(channel), deadline_(deadline), turn_(channel->turn_.take(deadline)) {}

    Status status() const {
      if (turn_.taken()) return ok_status();
      return deadline_exceeded_error(channel_->described_ +
                                     ": deadline passed while waiting for the request connection");
    }

    // Writes the requests at once and reads every reply, in order. A failed
    // or late call closes the connection, and the next call tries the next
    // endpoint first: an endpoint that resets, or that accepts connections
    // but answers nothing (a paused or cut-off member), must not hold every
    // later call until its deadline while another endpoint could serve it.
    Result<std::vector<HttpResponse>> call(const std::vector<HttpRequest>& requests) {
      SIMBA_ASSIGN_OR_RETURN(HttpConnection * conn, channel_->connected_locked(deadline_));
      auto replies = conn->call(requests, deadline_);
      if (!replies.ok()) {
        channel_->leave_locked();
      } else if (!conn->reusable()) {
        channel_->drop_locked(false);
      }
      return replies;
    }

    // The server answered but cannot serve (no leader, ...): close the
    // connection and try the next endpoint first next time. (Nothing to do
    // if the call itself failed: it left the endpoint already.)
    void abandon() {
      if (channel_->conn_) channel_->leave_locked();
    }

    // One request and its reply parsed; a server that cannot serve is left
    // (Abandon).
    Result<Json> call_parsed(HttpRequest request, std::string_view context) {
      SIMBA_ASSIGN_OR_RETURN(std::vector<HttpResponse> replies, call({std::move(request)}));
      auto reply = parse_reply(replies[0], context);
      if (reply.status().code() == StatusCode::kUnavailable) abandon();
      return reply;
    }

   private:
    RequestChannel* channel_;
    Deadline deadline_;
    TurnGate::Turn turn_;
  };

 private:
  // Closes the connection and moves on from its endpoint; the watch is
  // told, so it leaves that endpoint too.
  void leave_locked() {
    const std::size_t left = conn_at_;
    drop_locked(true);
    if (endpoints_.size() > 1 && left_endpoint_) left_endpoint_(left);
  }

  void drop_locked(bool next_endpoint) {
    conn_.reset();
    if (next_endpoint) next_ = (conn_at_ + 1) % endpoints_.size();
    // The first reconnect after a working connection is immediate.
    backoff_.reset();
  }

  Result<HttpConnection*> connected_locked(Deadline deadline) {
    if (conn_) return conn_.get();
    SIMBA_RETURN_IF_ERROR(backoff_.ready());
    auto opened = connect_any(endpoints_, &next_, connect_timeout_, deadline, false);
    if (!opened.ok()) {
      backoff_.failed(opened.status());
      return opened.status();
    }
    conn_ = std::move(*opened);
    conn_at_ = next_;  // ConnectAny leaves next_ at the endpoint that answered
    backoff_.reset();
    return conn_.get();
  }

  const std::vector<Endpoint> endpoints_;
  const std::string described_;
  const milliseconds connect_timeout_;
  const std::function<void(std::size_t)> left_endpoint_;

  TurnGate turn_;  // a call that has it alone touches what follows
  std::unique_ptr<HttpConnection> conn_;
  std::size_t conn_at_ = 0;  // the endpoint conn_ (or the last one) is on
  std::size_t next_ = 0;
  Backoff backoff_;
};

// ---- queue positions and the watch -----------------------------------------------

// A contender's place in a mutex's queue, as this process knows it.
struct Holder {
  std::int64_t lease = 0;
  std::int64_t asked_ttl = 0;    // seconds asked for at the grant
  std::int64_t granted_ttl = 0;  // seconds granted
  // Our lease lives at least until then (local clock): the last grant or
  // keep-alive sent before it gave granted_ttl seconds from when the server
  // took it. A delete of our key before then was no expiry.
  steady_clock::time_point alive_until{};
  std::string key;
  // The create revision of our key; 0 while the key is not known to exist.
  std::int64_t create_revision = 0;
  // Our key was the lowest at the last call.
  bool owner = false;
  // The key we queue behind (empty for an owner).
  std::string predecessor;
  std::int64_t predecessor_revision = 0;
  // The watch session (Watcher::live_session) that was already running when
  // the last full check (the transaction) was sent; 0 if none was. While
  // that session lasts, every later delete of our key reaches this holder.
  std::uint64_t watched_since = 0;
};

using Work = ListenerHub::Work;

class Watcher : public std::enable_shared_from_this<Watcher> {
 public:
  Watcher(std::vector<Endpoint> endpoints, std::string prefix, milliseconds connect_timeout)
      : endpoints_(std::move(endpoints)),
        prefix_(std::move(prefix)),
        connect_timeout_(connect_timeout) {}

  ~Watcher() { stop(); }

  // ---- holders (the calls' side) ----

  std::optional<Holder> find(const std::string& mutex, const std::string& contender) {
    std::lock_guard<std::mutex> lock(mu_);
    const Holder* holder = find_locked(mutex, contender);
    return holder != nullptr ? std::optional<Holder>(*holder) : std::nullopt;
  }

  // Records what a call decided at store revision `decided_at`. Returns
  // false (and records the key as gone) if the watch has already seen our
  // key deleted: the call's answer is stale and it must look again. Wakes
  // the contender at once if the watch has already seen its predecessor
  // deleted (or cannot tell).
  bool store(const std::string& mutex, const std::string& contender, Holder holder,
             std::int64_t decided_at) {
    Work work;
    bool fresh = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!live_ && decided_at > 0) {
        // Decided while no watch covers it: the next watch starts early
        // enough to see what happens to this key after `decided_at`.
        unwatched_from_ = unwatched_from_ == 0 ? decided_at : std::min(unwatched_from_, decided_at);
      }
      if (holder.create_revision != 0 && recent_.count({holder.key, holder.create_revision}) > 0) {
        holder.create_revision = 0;
        holder.owner = false;
        holder.predecessor.clear();
        fresh = false;
      }
      if (!holder.predecessor.empty() &&
          (recent_.count({holder.predecessor, holder.predecessor_revision}) > 0 ||
           forgotten_upto_ > decided_at)) {
        holder.predecessor.clear();
        add_work_locked(mutex, &contender, MutexEvent::Kind::kReleased, {}, 0, &work);
      }
      holders_[mutex][contender] = std::move(holder);
    }
    hub_->deliver(work);
    return fresh;
  }

  // Until the first watch is established (when there is one to wait for):
  // a call decided before it would not be covered by it from the start.
  // Later reconnects are not waited for (an owner must not renew late).
  void await_first_watch(Deadline deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, deadline, [&] {
      return stopping_ || session_ > 0 || !worker_.running() || gave_up_ || hub_->empty();
    });
  }

  // The current watch session if its watch is established (every delete
  // under the prefix from then on will be seen), else 0.
  std::uint64_t live_session() {
    std::lock_guard<std::mutex> lock(mu_);
    return live_ ? session_ : 0;
  }

  // Whether the holder still owns by its key: the key with
  // `create_revision` was not seen deleted, and the watch session that
  // would have seen it has run without a break since `session`.
  bool still_owner(const std::string& mutex, const std::string& contender,
                   std::int64_t create_revision, std::uint64_t session, std::int64_t granted_ttl,
                   steady_clock::time_point alive_until) {
    std::lock_guard<std::mutex> lock(mu_);
    Holder* holder = find_locked(mutex, contender);
    if (!live_ || session_ != session || holder == nullptr || !holder->owner ||
        holder->create_revision != create_revision) {
      return false;
    }
    holder->granted_ttl = granted_ttl;
    holder->alive_until = std::max(holder->alive_until, alive_until);
    return true;
  }

  std::optional<Holder> take(const std::string& mutex, const std::string& contender) {
    std::lock_guard<std::mutex> lock(mu_);
    Holder* found = find_locked(mutex, contender);
    if (found == nullptr) return std::nullopt;
    Holder holder = std::move(*found);
    auto it = holders_.find(mutex);
    it->second.erase(contender);
    if (it->second.empty()) holders_.erase(it);
    return holder;
  }

  // ---- subscriptions ----

  std::unique_ptr<Subscription> add(std::string mutex, std::string contender_id,
                                    ListenerHub::Listener listener) {
    auto subscription =
        hub_->subscribe(std::move(mutex), std::move(contender_id), std::move(listener));
    std::lock_guard<std::mutex> lock(mu_);
    // The thread owns the watcher: a listener may destroy the backend.
    if (!stopping_) worker_.start([self = shared_from_this()] { self->run(); });
    cv_.notify_all();
    // No waiting for the watch: the contender's first attempt goes out at
    // once. A subscription made before the watch is established is woken
    // when it is (see Session), in case it missed a release meanwhile.
    return subscription;
  }

  // The calls left endpoint `index` because it failed them: if the watch is
  // on it, it moves to the next endpoint as well. Its events may have
  // stopped without its connection failing (a paused member's kernel keeps
  // the connection open), and a watch that is no longer heard from must not
  // go on vouching for owners' keys (StillOwner).
  void leave_endpoint(std::size_t index) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!conn_ || conn_at_ != index) return;
    leave_ = true;
    conn_->shutdown();
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
  Holder* find_locked(const std::string& mutex, const std::string& contender) {
    auto it = holders_.find(mutex);
    if (it == holders_.end()) return nullptr;
    auto found = it->second.find(contender);
    return found == it->second.end() ? nullptr : &found->second;
  }

  void run() {
    Backoff backoff;
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      // Watch only while somebody listens.
      cv_.wait(lock, [&] { return stopping_ || !hub_->empty(); });
      if (stopping_) break;
      connected_ = false;
      lock.unlock();
      bool created = false;
      const Status status = session(&created);
      lock.lock();
      conn_.reset();
      // Deletes may be missed from here on: holders verified by this
      // session must check with the store again.
      live_ = false;
      if (stopping_) break;
      if (leave_) {
        leave_ = false;
        next_endpoint_ = (conn_at_ + 1) % endpoints_.size();
        backoff.reset();
        continue;
      }
      if (connected_ && !created && endpoints_.size() > 1) {
        // Connected, but no watch was created (the endpoint accepts and
        // answers nothing, or answers an error): next time, the next one.
        next_endpoint_ = (conn_at_ + 1) % endpoints_.size();
      }
      if (restart_now_) {
        restart_now_ = false;
        backoff.reset();
        continue;
      }
      // Calls waiting for the first watch stop waiting for one that fails.
      gave_up_ = true;
      cv_.notify_all();
      if (created) backoff.reset();  // then the first delay again
      const milliseconds delay = backoff.failed();
      SIMBA_LOG(kDebug, "etcd watch: " << status << "; reconnecting in " << format_duration(delay));
      cv_.wait_for(lock, delay, [&] { return stopping_; });
    }
  }

  // One watch connection's life: connect, create the watch (from the
  // revision after the last one processed, so a reconnect misses nothing
  // unless the store compacted it), then handle events until the
  // connection fails or stop().
  Status session(bool* created) {
    const Deadline connect_deadline = steady_clock::now() + connect_timeout_;
    SIMBA_ASSIGN_OR_RETURN(
        std::unique_ptr<HttpConnection> opened,
        connect_any(endpoints_, &next_endpoint_, connect_timeout_, connect_deadline, true));
    std::shared_ptr<HttpConnection> conn(std::move(opened));
    std::int64_t start = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return ok_status();
      conn_ = conn;
      conn_at_ = next_endpoint_;  // ConnectAny leaves it at the one that answered
      connected_ = true;
      // Resume after the last event handled; the first time, after the
      // earliest decision a call made without a watch (or from now).
      if (processed_ > 0) {
        start = processed_ + 1;
      } else if (unwatched_from_ > 0) {
        start = unwatched_from_ + 1;
      }
    }
    const std::string range = prefix_ + "/";
    Json create = {{"key", base64_encode(range)},
                   {"range_end", base64_encode(prefix_end(range))},
                   {"prev_kv", true}};
    if (start > 0) create["start_revision"] = std::to_string(start);
    const std::string context = "etcd at " + conn->peer() + ": watch";
    SIMBA_RETURN_IF_ERROR(conn->send(
        {post("/v3/watch", Json{{"create_request", std::move(create)}})}, connect_deadline));
    SIMBA_ASSIGN_OR_RETURN(int status, conn->read_head(connect_deadline));
    if (status != 200) {
      HttpResponse response{status, {}};
      for (;;) {
        auto line = conn->read_line(connect_deadline);
        if (!line.ok() || !line->has_value()) break;
        response.body += **line;
      }
      return parse_reply(response, context).status();
    }
    for (;;) {
      // Events may be rare: a read that times out just looks again (TCP
      // keep-alive ends a connection whose peer vanished).
      auto line = conn->read_line(steady_clock::now() + std::chrono::seconds(60));
      if (!line.ok()) {
        if (line.status().code() == StatusCode::kDeadlineExceeded) {
          std::lock_guard<std::mutex> lock(mu_);
          if (stopping_) return ok_status();
          continue;
        }
        return line.status();
      }
      if (!line->has_value()) return unavailable_error(context + ": the server ended the watch");
      if ((*line)->empty()) continue;
      SIMBA_ASSIGN_OR_RETURN(Json result, parse_stream_line(**line, context));
      SIMBA_RETURN_IF_ERROR(handle(result, start == 0, created, context));
    }
  }

  // One watch response.
  Status handle(const Json& result, bool from_now, bool* created, const std::string& context) {
    Work work;
    Status status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (result.value("created", false)) {
        *created = true;
        const std::int64_t created_at = header_revision(result);
        if (from_now && unwatched_from_ > 0 && unwatched_from_ < created_at) {
          // A call decided something before this watch began (it started
          // from "now" when there was nothing to start from): watch again
          // from that decision so no later delete of its keys is missed.
          processed_ = unwatched_from_;
          restart_now_ = true;
          status = unavailable_error(context + ": restarting from revision " +
                                     std::to_string(unwatched_from_ + 1));
        } else {
          live_ = true;
          ++session_;
          unwatched_from_ = 0;
          cv_.notify_all();
          if (from_now) processed_ = std::max(processed_, created_at);
        }
        // Releases before the watch existed (or while it was away) were
        // missed: everyone looks again once.
        hub_->collect_all(MutexEvent{MutexEvent::Kind::kReleased, {}, {}, 0}, &work);
      }
      if (int64_field(result, "compact_revision") > 0) {
        // We asked for history the store no longer has: start again from
        // now (everyone is woken when the new watch is created).
        status = unavailable_error(context + ": revision " + std::to_string(processed_ + 1) +
                                   " was compacted; watching again from now");
        processed_ = 0;
        unwatched_from_ = 0;
      } else if (result.value("canceled", false)) {
        status = unavailable_error(context + ": canceled by the server: " +
                                   result.value("cancel_reason", std::string("no reason given")));
      }
      if (const auto events = result.find("events");
          status.ok() && events != result.end() && events->is_array()) {
        for (const Json& event : *events) handle_event_locked(event, &work);
      }
    }
    hub_->deliver(work);
    return status;
  }

  void handle_event_locked(const Json& event, Work* work) {
    Kv kv;
    if (!parse_kv(event.value("kv", Json::object()), &kv)) return;
    processed_ = std::max(processed_, kv.mod_revision);
    std::string mutex;
    if (!parse_key(prefix_, kv.key, &mutex)) return;
    const bool deleted = event.value("type", std::string("PUT")) == "DELETE";
    if (!deleted) {
      // A new key may be a new owner of a free mutex: retrievers look.
      if (kv.version == 1) {
        const std::string none;
        add_work_locked(mutex, &none, MutexEvent::Kind::kReleased, {}, 0, work);
      }
      return;
    }
    Kv prev;
    const auto prev_json = event.find("prev_kv");
    const bool have_prev = prev_json != event.end() && parse_kv(*prev_json, &prev);
    const std::int64_t created_at = have_prev ? prev.create_revision : 0;
    remember_delete_locked(kv.key, created_at, kv.mod_revision);
    auto it = holders_.find(mutex);
    if (it != holders_.end()) {
      for (auto& [contender, holder] : it->second) {
        if (holder.predecessor == kv.key &&
            (created_at == 0 || created_at == holder.predecessor_revision)) {
          // The key we queue behind is gone: our turn may have come.
          holder.predecessor.clear();
          add_work_locked(mutex, &contender, MutexEvent::Kind::kReleased, {}, 0, work);
        }
        if (holder.key == kv.key && holder.create_revision != 0 &&
            (created_at == 0 || created_at == holder.create_revision)) {
          if (holder.owner) {
            // Our own key, held as the owner, was deleted (lease revoked or
            // expired, forced release): the owner stops at once. While our
            // lease is surely alive, somebody took the key away (forced).
            add_work_locked(mutex, &contender, MutexEvent::Kind::kLost, contender,
                            static_cast<std::uint64_t>(holder.create_revision), work,
                            steady_clock::now() < holder.alive_until);
          } else {
            // A waiter lost its place: queue again now rather than at its
            // next poll.
            add_work_locked(mutex, &contender, MutexEvent::Kind::kReleased, {}, 0, work);
          }
          holder.create_revision = 0;
          holder.owner = false;
          holder.predecessor.clear();
        }
      }
    }
    const std::string none;
    add_work_locked(mutex, &none, MutexEvent::Kind::kReleased, {}, 0, work);
  }

  void remember_delete_locked(const std::string& key, std::int64_t created_at,
                              std::int64_t deleted_at) {
    if (created_at == 0) return;
    recent_.insert({key, created_at});
    recent_order_.push_back({deleted_at, {key, created_at}});
    while (recent_order_.size() > kRecentDeletes) {
      forgotten_upto_ = std::max(forgotten_upto_, recent_order_.front().first);
      recent_.erase(recent_order_.front().second);
      recent_order_.pop_front();
    }
  }

  // Queues `kind` for the slots of `mutex` (only those of contender
  // `*only`, when given; "" means the retrievers).
  void add_work_locked(const std::string& mutex, const std::string* only, MutexEvent::Kind kind,
                       const std::string& owner, std::uint64_t token, Work* work,
                       bool forced = false) {
    MutexEvent event{kind, mutex, owner, token};
    event.forced = forced;
    hub_->collect(event, work, [only](const ListenerHub::Slot& slot) {
      return only == nullptr || slot.contender_id == *only;
    });
  }

  const std::vector<Endpoint> endpoints_;
  const std::string prefix_;
  const milliseconds connect_timeout_;
  std::size_t next_endpoint_ = 0;  // the watch thread's

  // Its listeners are called outside mu_: one may (un)subscribe.
  const std::shared_ptr<ListenerHub> hub_ = std::make_shared<ListenerHub>();
  Worker worker_;
  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  bool stopping_ = false;
  std::shared_ptr<HttpConnection> conn_;
  std::map<std::string, std::map<std::string, Holder>> holders_;
  // The highest revision of an event handled.
  std::int64_t processed_ = 0;
  // Watch sessions established so far, and whether the current one is.
  std::uint64_t session_ = 0;
  bool live_ = false;
  // The earliest revision a call decided at while no watch was live (0:
  // none), and whether the watch must start again from it at once.
  std::int64_t unwatched_from_ = 0;
  bool restart_now_ = false;
  // The calls asked the watch to leave its endpoint (LeaveEndpoint).
  bool leave_ = false;
  // session() got a connection, on endpoint conn_at_.
  bool connected_ = false;
  std::size_t conn_at_ = 0;
  // A watch session failed before any was established.
  bool gave_up_ = false;
  // Keys deleted lately, as (key, create revision), oldest first in
  // recent_order_ with their delete revision; forgotten_upto_ is the
  // highest delete revision no longer remembered.
  std::set<std::pair<std::string, std::int64_t>> recent_;
  std::deque<std::pair<std::int64_t, std::pair<std::string, std::int64_t>>> recent_order_;
  std::int64_t forgotten_upto_ = 0;
};

// ---- the backend ------------------------------------------------------------------

class EtcdBackend final : public Backend {
 public:
  explicit EtcdBackend(const EtcdOptions& options)
      : options_(options),
        endpoints_(to_endpoints(options.endpoints)),
        channel_(endpoints_, options.connect_timeout,
                 [this](std::size_t index) { watcher_->leave_endpoint(index); }),
        watcher_(
            std::make_shared<Watcher>(endpoints_, options.key_prefix, options.connect_timeout)),
        random_(seed()) {
    capabilities_.push_release = true;
    capabilities_.cross_process = true;
    capabilities_.fifo = true;  // lowest create revision first: the queue of keys
    capabilities_.lists_waiters = true;
    capabilities_.fencing_source = "etcd create revision of the owner's key";
    capabilities_.max_mutex_length = kMaxNameLength;
    capabilities_.max_contender_id_length = kMaxNameLength;
  }

  ~EtcdBackend() override { watcher_->stop(); }

  std::string_view scheme() const override { return "etcd"; }
  const Capabilities& capabilities() const override { return capabilities_; }

  Result<OwnerRecord> do_acquire_or_renew(const AcquireRequest& request,
                                          Deadline deadline) override {
    const std::string mutex(request.mutex);
    const std::string id(request.contender_id);
    const std::string mutex_prefix = mutex_key_prefix(options_.key_prefix, mutex);
    const milliseconds hard = request.ttl + request.transition;
    // Whole seconds, rounded up: the lease never ends before the hard lease.
    const std::int64_t asked = std::max<std::int64_t>(1, (hard.count() + 999) / 1000);
    const std::string context = call_context("acquiring mutex " + internal::in_quotes(mutex));

    // A contender subscribes before its first attempt: let the watch that
    // subscription started see this decision from the start (one round
    // trip, once per backend; not waited for if it cannot be had).
    watcher_->await_first_watch(std::min(deadline, steady_clock::now() + options_.connect_timeout));
    RequestChannel::Turn turn(&channel_, deadline);
    SIMBA_RETURN_IF_ERROR(turn.status());
    for (int round = 0; round < kAcquireRounds; ++round) {
      std::optional<Holder> held = watcher_->find(mutex, id);
      const std::uint64_t watching = watcher_->live_session();
      if (held && held->asked_ttl == asked && held->owner && held->create_revision != 0 &&
          held->watched_since != 0 && held->watched_since == watching) {
        // An owner's renewal while the watch has run without a break since
        // its last full check: our key is still the lowest exactly as long
        // as it exists, the lease keeps it unless the lease ends (the
        // keep-alive says so), and any other delete of it reaches us
        // through the watch. So the keep-alive alone renews: one request
        // instead of two.
        const StoreTime sent = wall_now();
        const steady_clock::time_point sent_steady = steady_clock::now();
        SIMBA_ASSIGN_OR_RETURN(Json lease,
                               turn.call_parsed(lease_keep_alive(held->lease), context));
        const std::int64_t ttl_left = int64_field(lease, "TTL");
        if (ttl_left > 0 &&
            watcher_->still_owner(mutex, id, held->create_revision, watching, ttl_left,
                                  sent_steady + std::chrono::seconds(ttl_left))) {
          return owner_reply(id, sent, request.ttl, hard, ttl_left, held->create_revision);
        }
        continue;  // the full check below tells what happened
      }
      if (held && held->asked_ttl != asked) {
        // The lease was granted for other settings: leave that place in the
        // queue and start again with a lease of the right length.
        watcher_->take(mutex, id);
        SIMBA_ASSIGN_OR_RETURN(auto revoked, turn.call({lease_revoke(held->lease)}));
        (void)revoked;
        held.reset();
      }
      Holder holder;
      if (held) {
        holder = *held;
      } else {
        holder.lease = new_lease_id();
        holder.asked_ttl = asked;
        holder.key = key_for(options_.key_prefix, mutex, holder.lease);
        // Remembered before the grant goes out: if the reply is lost, the
        // next call keeps this lease alive instead of queueing twice.
        watcher_->store(mutex, id, holder, 0);
      }
      // What the reply promises an owner is measured from here: the lease
      // is granted or kept alive after this instant.
      const StoreTime sent = wall_now();
      const steady_clock::time_point sent_steady = steady_clock::now();
      SIMBA_ASSIGN_OR_RETURN(
          std::vector<HttpResponse> replies,
          turn.call(
              {held ? lease_keep_alive(holder.lease) : lease_grant(holder.lease, asked),
               acquire_txn(mutex_prefix, holder.key, id, holder.lease, holder.create_revision)}));
      int lease_code = 0;
      auto lease = parse_reply(replies[0], context, &lease_code);
      auto txn = parse_reply(replies[1], context);
      if (!lease.ok()) {
        if (!held && txn.ok() && txn->value("succeeded", false)) {
          // The grant failed but the put went through (attached to a lease
          // of the same ID someone else holds): take the key back.
          auto kvs = txn_kvs(*txn, 2, context);
          if (kvs.ok() && !kvs->empty()) {
            auto undone =
                turn.call({delete_if_created_at(holder.key, kvs->front().create_revision)});
            (void)undone;
          }
        }
        if (!held) watcher_->take(mutex, id);
        if (!held && lease_code == internal::etcd::kGrpcFailedPrecondition) {
          continue;  // "lease already exists": another ID
        }
        if (lease.status().code() == StatusCode::kUnavailable) turn.abandon();
        return lease.status();
      }
      const std::int64_t ttl_left = int64_field(*lease, "TTL");
      if (ttl_left <= 0) {
        // Our lease is gone (expired or revoked), and our key with it:
        // queue again with a new lease.
        watcher_->take(mutex, id);
        continue;
      }
      holder.granted_ttl = ttl_left;
      holder.alive_until = sent_steady + std::chrono::seconds(ttl_left);
      if (!txn.ok()) {
        watcher_->store(mutex, id, holder, 0);
        if (txn.status().code() == StatusCode::kUnavailable) turn.abandon();
        return txn.status();
      }
      const std::int64_t decided_at = header_revision(*txn);
      const bool put = txn->value("succeeded", false);
      Kv ours;
      Kv lowest;
      std::optional<Kv> predecessor;
      bool predecessor_known = false;
      {
        SIMBA_ASSIGN_OR_RETURN(std::vector<Kv> first, txn_kvs(*txn, put ? 2 : 0, context));
        SIMBA_ASSIGN_OR_RETURN(std::vector<Kv> lowest_kvs, txn_kvs(*txn, 1, context));
        if (first.empty() || lowest_kvs.empty() || first.front().key != holder.key) {
          return internal_error(context + ": the transaction's reply lacks our key");
        }
        ours = first.front();
        lowest = lowest_kvs.front();
        if (put) {
          predecessor_known = true;
          if (first.size() > 1) predecessor = first[1];
        } else if (holder.create_revision > 1 && holder.create_revision == ours.create_revision) {
          SIMBA_ASSIGN_OR_RETURN(std::vector<Kv> below, txn_kvs(*txn, 2, context));
          predecessor_known = true;
          if (!below.empty()) predecessor = below.front();
        }
      }
      if (ours.lease != holder.lease) {
        watcher_->take(mutex, id);
        return internal_error(context + ": key " + internal::in_quotes(holder.key) +
                              " is attached to another lease");
      }
      holder.create_revision = ours.create_revision;
      holder.watched_since = watching;
      holder.owner = lowest.key == holder.key;
      holder.predecessor.clear();
      holder.predecessor_revision = 0;
      std::int64_t decided = decided_at;
      if (!holder.owner) {
        if (lowest.value == id) {
          // A key of this contender id that is not ours (another process
          // using the same id): contender ids must be unique, and ours
          // must not be reported as the owner while that key holds the
          // mutex. Remove it and look again.
          watcher_->store(mutex, id, holder, decided_at);
          SIMBA_ASSIGN_OR_RETURN(
              auto removed, turn.call({delete_if_created_at(lowest.key, lowest.create_revision)}));
          (void)removed;
          continue;
        }
        if (!predecessor_known) {
          // We did not know our create revision before the call (a reply
          // was lost): find the key below ours now.
          SIMBA_ASSIGN_OR_RETURN(
              Json below,
              turn.call_parsed(post("/v3/kv/range", range_op(mutex_prefix, false, 1, true,
                                                             ours.create_revision - 1)),
                               context));
          SIMBA_ASSIGN_OR_RETURN(std::vector<Kv> kvs, kvs_of(below, context));
          decided = header_revision(below);
          if (!kvs.empty()) predecessor = kvs.front();
        }
        if (!predecessor) {
          // Nothing below us any more: look again (we may own it now).
          watcher_->store(mutex, id, holder, decided);
          continue;
        }
        holder.predecessor = predecessor->key;
        holder.predecessor_revision = predecessor->create_revision;
      }
      if (!watcher_->store(mutex, id, holder, decided)) continue;  // our key vanished since

      if (holder.owner) {
        return owner_reply(id, sent, request.ttl, hard, holder.granted_ttl, holder.create_revision);
      }
      // A waiter. The owner's lease is not in the reply, so its times are
      // unknown; the watch wakes us at once when our predecessor goes, and
      // we must call again before our own key's lease ends (the core comes
      // back early enough).
      OwnerRecord record;
      record.store_now = sent;
      record.ask_again_at = sent + milliseconds(holder.granted_ttl * 1000);
      MutexOwner& owner = record.owner;
      owner.owner_id = lowest.value;
      owner.fencing_token = static_cast<std::uint64_t>(lowest.create_revision);
      return record;
    }
    return unavailable_error(context + ": the queue kept changing during the call; try again");
  }

  Result<bool> do_release(std::string_view mutex_view, std::string_view contender_id,
                          std::uint64_t fencing_token, Deadline deadline) override {
    const std::string mutex(mutex_view);
    const std::string id(contender_id);
    const std::string mutex_prefix = mutex_key_prefix(options_.key_prefix, mutex);
    const std::string context = call_context("releasing mutex " + internal::in_quotes(mutex));
    RequestChannel::Turn turn(&channel_, deadline);
    SIMBA_RETURN_IF_ERROR(turn.status());
    // The token is our key's create revision: a release for an earlier
    // ownership leaves the key of this one alone.
    const auto token = static_cast<std::int64_t>(fencing_token);
    if (std::optional<Holder> known = watcher_->find(mutex, id); known && fencing_token != 0 &&
                                                                 known->create_revision != 0 &&
                                                                 known->create_revision != token) {
      return false;
    }
    if (std::optional<Holder> held = watcher_->take(mutex, id)) {
      // Revoking the lease deletes our key; the range just before it says
      // whether that key was the owner (nobody else can become the owner
      // while our key is the lowest).
      SIMBA_ASSIGN_OR_RETURN(std::vector<HttpResponse> replies,
                             turn.call({post("/v3/kv/range", range_op(mutex_prefix, true, 1, true)),
                                        lease_revoke(held->lease)}));
      auto range = parse_reply(replies[0], context);
      int code = 0;
      auto revoked = parse_reply(replies[1], context, &code);
      for (const Status& status : {range.status(), revoked.status()}) {
        if (status.code() == StatusCode::kUnavailable) turn.abandon();
      }
      if (!revoked.ok() && code != internal::etcd::kGrpcNotFound) return revoked.status();
      SIMBA_RETURN_IF_ERROR(range.status());
      SIMBA_ASSIGN_OR_RETURN(std::vector<Kv> lowest, kvs_of(*range, context));
      return !lowest.empty() && lowest.front().key == held->key &&
             lowest.front().lease == held->lease;
    }
    // Nothing known here (e.g. a compensating release after a lost reply,
    // or another process with this id): remove every key with our id.
    SIMBA_ASSIGN_OR_RETURN(std::vector<Kv> kvs, queue(turn, mutex, 0, context));
    std::vector<HttpRequest> deletes;
    bool owned = false;
    for (std::size_t i = 0; i < kvs.size(); ++i) {
      if (kvs[i].value != id || (fencing_token != 0 && kvs[i].create_revision != token)) continue;
      owned = owned || i == 0;
      deletes.push_back(delete_if_created_at(kvs[i].key, kvs[i].create_revision));
    }
    if (deletes.empty()) return false;
    SIMBA_ASSIGN_OR_RETURN(std::vector<HttpResponse> deleted, turn.call(deletes));
    for (const HttpResponse& reply : deleted) {
      SIMBA_RETURN_IF_ERROR(parse_reply(reply, context).status());
    }
    return owned;
  }

  Result<ForcedRelease> do_force_release(std::string_view mutex_view, Deadline deadline) override {
    const std::string mutex(mutex_view);
    const std::string mutex_prefix = mutex_key_prefix(options_.key_prefix, mutex);
    const std::string context = call_context("force-releasing mutex " + internal::in_quotes(mutex));
    RequestChannel::Turn turn(&channel_, deadline);
    SIMBA_RETURN_IF_ERROR(turn.status());
    for (int round = 0; round < kAcquireRounds; ++round) {
      const StoreTime sent = wall_now();
      SIMBA_ASSIGN_OR_RETURN(
          Json range,
          turn.call_parsed(post("/v3/kv/range", range_op(mutex_prefix, true, 1, false)), context));
      SIMBA_ASSIGN_OR_RETURN(std::vector<Kv> lowest, kvs_of(range, context));
      if (lowest.empty()) {
        // A free mutex: every later key is created after this revision.
        ForcedRelease forced;
        forced.fencing_floor =
            static_cast<std::uint64_t>(std::max<std::int64_t>(1, header_revision(range)));
        forced.store_now = sent;
        return forced;
      }
      const Kv& owner = lowest.front();
      SIMBA_ASSIGN_OR_RETURN(std::vector<HttpResponse> deleted,
                             turn.call({delete_queue_if_owner_created_at(mutex_prefix, owner.key,
                                                                         owner.create_revision),
                                        lease_time_to_live(owner.lease)}));
      SIMBA_ASSIGN_OR_RETURN(Json txn, parse_reply(deleted[0], context));
      if (!txn.value("succeeded", false)) continue;  // it changed meanwhile
      ForcedRelease forced;
      forced.fencing_floor = static_cast<std::uint64_t>(header_revision(txn));
      auto ttl = parse_reply(deleted[1], context);
      forced.previous = owner_of(owner, sent, ttl.ok() ? &*ttl : nullptr);
      forced.store_now = sent;
      return forced;
    }
    return unavailable_error(context + ": the owner kept changing during the call; try again");
  }

  Result<OwnerRecord> do_read(std::string_view mutex, Deadline deadline) override {
    const std::string context = call_context("reading mutex " + internal::in_quotes(mutex));
    RequestChannel::Turn turn(&channel_, deadline);
    SIMBA_ASSIGN_OR_RETURN(std::vector<Kv> lowest, queue(turn, mutex, 1, context));
    OwnerRecord record;
    record.store_now = wall_now();
    if (lowest.empty()) return record;
    SIMBA_ASSIGN_OR_RETURN(std::vector<OwnerRecord> records,
                           with_leases(turn, {lowest.front()}, context));
    return records.front();
  }

  Result<std::vector<ListedMutex>> do_list(Deadline deadline) override {
    const std::string context = call_context("listing mutexes");
    RequestChannel::Turn turn(&channel_, deadline);
    SIMBA_RETURN_IF_ERROR(turn.status());
    const std::string all = options_.key_prefix + "/";
    SIMBA_ASSIGN_OR_RETURN(
        Json range,
        turn.call_parsed(post("/v3/kv/range", {{"key", base64_encode(all)},
                                               {"range_end", base64_encode(prefix_end(all))}}),
                         context));
    SIMBA_ASSIGN_OR_RETURN(std::vector<Kv> kvs, kvs_of(range, context));
    // The owner of each mutex: its key with the lowest create revision.
    // A mutex with only its record is free.
    std::map<std::string, std::optional<Kv>> owners;
    for (Kv& kv : kvs) {
      std::string mutex;
      if (parse_key(options_.key_prefix, kv.key, &mutex)) {
        if (!validate_mutex(mutex).ok()) continue;
        std::optional<Kv>& owner = owners[mutex];
        if (!owner || kv.create_revision < owner->create_revision) owner = std::move(kv);
      } else if (parse_record_key(options_.key_prefix, kv.key, &mutex) &&
                 validate_mutex(mutex).ok()) {
        owners[mutex];
      }
    }
    std::vector<Kv> lowest;
    for (const auto& [mutex, kv] : owners) {
      if (kv) lowest.push_back(*kv);
    }
    SIMBA_ASSIGN_OR_RETURN(std::vector<OwnerRecord> records, with_leases(turn, lowest, context));
    std::vector<ListedMutex> listed;
    std::size_t next = 0;
    const StoreTime now = wall_now();
    for (const auto& [mutex, kv] : owners) {
      if (kv) {
        listed.push_back(ListedMutex{mutex, std::move(records[next++])});
      } else {
        OwnerRecord free;
        free.store_now = now;
        listed.push_back(ListedMutex{mutex, std::move(free)});
      }
    }
    return listed;
  }

  // The keys behind the lowest, by create revision: the order the queue
  // serves them in. Each names its contender; a key lives as long as its
  // contender's lease, which a waiter keeps alive by polling, so a waiter
  // that went away drops out when its lease ends. A contender with several
  // keys is listed once, at its first; the owner's id is left out.
  Result<std::vector<std::string>> do_waiters(std::string_view mutex, Deadline deadline) override {
    const std::string context =
        call_context("listing the waiters of mutex " + internal::in_quotes(mutex));
    RequestChannel::Turn turn(&channel_, deadline);
    SIMBA_ASSIGN_OR_RETURN(std::vector<Kv> kvs, queue(turn, mutex, 0, context));
    std::vector<std::string> waiters;
    if (kvs.empty()) return waiters;
    const std::string& owner = kvs.front().value;
    std::set<std::string> seen;
    for (std::size_t i = 1; i < kvs.size(); ++i) {
      const std::string& id = kvs[i].value;
      if (id.empty() || id == owner || !seen.insert(id).second) continue;
      waiters.push_back(id);
    }
    return waiters;
  }

  Result<std::unique_ptr<Subscription>> do_subscribe(
      std::string_view mutex, std::string_view contender_id,
      std::function<void(const MutexEvent&)> listener) override {
    return watcher_->add(std::string(mutex), std::string(contender_id), std::move(listener));
  }

 private:
  static std::vector<Endpoint> to_endpoints(const std::vector<EtcdEndpoint>& endpoints) {
    std::vector<Endpoint> out;
    for (const EtcdEndpoint& endpoint : endpoints) out.push_back({endpoint.host, endpoint.port});
    return out;
  }

  static std::uint64_t seed() {
    std::random_device device;
    const auto now =
        static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    return (static_cast<std::uint64_t>(device()) << 32) ^ device() ^ now;
  }

  // A random positive lease ID (the key names it, so it is chosen here and
  // the grant can travel with the transaction that uses it).
  std::int64_t new_lease_id() {
    std::lock_guard<std::mutex> lock(random_mu_);
    for (;;) {
      const auto id = static_cast<std::int64_t>(random_() >> 1);
      if (id != 0) return id;
    }
  }

  // What an owner is told: never more than the store gives, since the
  // lease runs at least `granted_ttl` seconds from a moment after `sent`.
  static OwnerRecord owner_reply(const std::string& id, StoreTime sent, milliseconds ttl,
                                 milliseconds hard, std::int64_t granted_ttl,
                                 std::int64_t create_revision) {
    OwnerRecord record;
    record.store_now = sent;
    MutexOwner& owner = record.owner;
    owner.owner_id = id;
    owner.acquired_at = sent;
    owner.transition_at = sent + std::min(hard, milliseconds(granted_ttl * 1000));
    owner.ttl_at = std::min(sent + ttl, owner.transition_at);
    owner.fencing_token = static_cast<std::uint64_t>(create_revision);
    return record;
  }

  std::string call_context(std::string_view what) const {
    return channel_.describe() + ": " + std::string(what);
  }

  // The first `limit` keys (0: all) of `mutex`'s queue, oldest first, on
  // `turn` (its status checked here). A server that cannot serve is left.
  Result<std::vector<Kv>> queue(RequestChannel::Turn& turn, std::string_view mutex, int limit,
                                const std::string& context) {
    SIMBA_RETURN_IF_ERROR(turn.status());
    SIMBA_ASSIGN_OR_RETURN(
        Json range,
        turn.call_parsed(post("/v3/kv/range", range_op(mutex_key_prefix(options_.key_prefix, mutex),
                                                       true, limit, false)),
                         context));
    return kvs_of(range, context);
  }

  // The kvs of the `index`th response of a transaction reply.
  static Result<std::vector<Kv>> txn_kvs(const Json& txn, std::size_t index,
                                         std::string_view context) {
    const auto responses = txn.find("responses");
    if (responses == txn.end() || !responses->is_array() || responses->size() <= index) {
      return internal_error(std::string(context) + ": malformed transaction reply");
    }
    const Json& response = (*responses)[index];
    const auto range = response.find("response_range");
    if (range == response.end()) {
      return internal_error(std::string(context) + ": malformed transaction reply");
    }
    return kvs_of(*range, context);
  }

  // The owner a key names, with times from its lease's time-to-live reply
  // (remaining and granted seconds) when there is one; without one its
  // times are unknown (0).
  static MutexOwner owner_of(const Kv& kv, StoreTime now, const Json* ttl) {
    MutexOwner owner;
    owner.owner_id = kv.value;
    owner.fencing_token = static_cast<std::uint64_t>(kv.create_revision);
    if (ttl == nullptr) return owner;
    const std::int64_t left = std::max<std::int64_t>(0, int64_field(*ttl, "TTL"));
    const std::int64_t granted = std::max(left, int64_field(*ttl, "grantedTTL"));
    // etcd keeps only the lease's total, not our ttl/transition split: the
    // lease's end is reported as both.
    owner.transition_at = now + milliseconds(left * 1000);
    owner.ttl_at = owner.transition_at;
    owner.acquired_at = now - milliseconds((granted - left) * 1000);
    return owner;
  }

  // Records for `kvs` (each a mutex's lowest key) with their leases' times,
  // looked up in pipelined batches.
  Result<std::vector<OwnerRecord>> with_leases(RequestChannel::Turn& turn,
                                               const std::vector<Kv>& kvs,
                                               const std::string& context) {
    std::vector<OwnerRecord> records;
    for (std::size_t i = 0; i < kvs.size(); i += kListBatch) {
      const std::size_t end = std::min(kvs.size(), i + kListBatch);
      std::vector<HttpRequest> lookups;
      for (std::size_t j = i; j < end; ++j) lookups.push_back(lease_time_to_live(kvs[j].lease));
      const StoreTime sent = wall_now();
      SIMBA_ASSIGN_OR_RETURN(std::vector<HttpResponse> replies, turn.call(lookups));
      for (std::size_t j = i; j < end; ++j) {
        auto ttl = parse_reply(replies[j - i], context);
        OwnerRecord record;
        record.store_now = sent;
        record.owner = owner_of(kvs[j], sent, ttl.ok() ? &*ttl : nullptr);
        if (!ttl.ok()) record.ask_again_at = sent;  // times unknown
        records.push_back(std::move(record));
      }
    }
    return records;
  }

  const EtcdOptions options_;
  const std::vector<Endpoint> endpoints_;
  Capabilities capabilities_;
  RequestChannel channel_;
  std::shared_ptr<Watcher> watcher_;
  std::mutex random_mu_;
  std::mt19937_64 random_;
};

}  // namespace

Result<std::shared_ptr<Backend>> new_etcd_backend(EtcdOptions options) {
  if (options.endpoints.empty()) {
    return invalid_argument_error("etcd: at least one endpoint is needed");
  }
  for (const EtcdEndpoint& endpoint : options.endpoints) {
    SIMBA_RETURN_IF_ERROR(internal::validate_host_port("etcd", endpoint.host, endpoint.port));
  }
  SIMBA_RETURN_IF_ERROR(
      internal::validate_timeout_and_prefix("etcd", options.connect_timeout, options.key_prefix));
  return std::shared_ptr<Backend>(std::make_shared<EtcdBackend>(options));
}

Result<EtcdOptions> etcd_options_from_uri(const Uri& uri) {
  constexpr char kForm[] = "etcd://host[:port][,host[:port]...][?key_prefix=...]";
  SIMBA_RETURN_IF_ERROR(internal::check_scheme(uri, "etcd"));
  if (uri.user || uri.password) {
    return invalid_argument_error(
        "etcd: user and password in the URI are not supported (this backend does not do etcd "
        "authentication); remove them, or use a cluster without auth");
  }
  if (uri.hosts.empty()) {
    return invalid_argument_error(std::string("etcd: URI has no host; expected ") + kForm);
  }
  if (!uri.path.empty() && uri.path != "/") {
    return invalid_argument_error("etcd: URI path " + internal::in_quotes(uri.path) +
                                  " is not supported (use key_prefix=...); expected " + kForm);
  }
  SIMBA_RETURN_IF_ERROR(
      uri.check_query_keys({"key_prefix", "connect_timeout"}).with_context("etcd"));
  EtcdOptions options;
  options.endpoints.clear();
  for (const UriHost& host : uri.hosts) {
    if (host.host.empty()) {
      return invalid_argument_error(std::string("etcd: URI has an empty host; expected ") + kForm);
    }
    options.endpoints.push_back(EtcdEndpoint{host.host, host.port.value_or(2379)});
  }
  SIMBA_RETURN_IF_ERROR(
      internal::read_positive_duration(uri, "etcd", "connect_timeout", &options.connect_timeout));
  if (auto value = uri.query_value("key_prefix")) {
    SIMBA_RETURN_IF_ERROR(internal::validate_key_prefix("etcd", *value));
    options.key_prefix = *value;
  }
  return options;
}

}  // namespace simba
