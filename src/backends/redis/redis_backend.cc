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
#include <charconv>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

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

// ---------------------------------------------------------------------------
// The command connection.

enum Script { kAcquire, kRelease, kForceRelease, kRead, kWaiters, kScriptCount };

struct ServerFacts {
  // The server may lose acknowledged writes when it restarts.
  bool lossy = true;
  // When it started, by its own clock (ms), rounded late.
  long long started_ms = 0;
};

class CommandChannel {
 public:
  CommandChannel(Endpoint endpoint, std::string prefix, milliseconds connect_timeout,
                 bool restart_guard)
      : endpoint_(std::move(endpoint)),
        prefix_(std::move(prefix)),
        connect_timeout_(connect_timeout),
        restart_guard_(restart_guard) {
    static constexpr const char* kBodies[kScriptCount] = {
        internal::redis::kLuaAcquire, internal::redis::kLuaRelease,
        internal::redis::kLuaForceRelease, internal::redis::kLuaRead, internal::redis::kLuaWaiters};
    for (int i = 0; i < kScriptCount; ++i) {
      scripts_[i] = std::string(internal::redis::kLuaPrelude) + kBodies[i];
    }
  }

  // Runs `script` on a mutex's keys. The reply may be an error reply.
  // With `guard_px`, appends the restart guard's bound to the arguments: the
  // server's start plus that lease if the guard is on and the server may
  // have lost leases when it started, else 0. `facts` receives what the bound was computed from.
  Result<Reply> eval(Script script, std::string_view mutex, const std::vector<std::string>& args,
                     Deadline deadline, ServerFacts* facts = nullptr,
                     std::optional<milliseconds> guard_px = std::nullopt) {
    const TurnGate::Turn turn = turn_.take(deadline);
    if (!turn.taken()) return busy();
    SIMBA_ASSIGN_OR_RETURN(Connection * conn, connected_locked(deadline));
    if (facts != nullptr) *facts = facts_;
    Command command = eval_command(script, mutex);
    command.insert(command.end(), args.begin(), args.end());
    if (guard_px) {
      command.push_back(restart_guard_ && facts_.lossy
                            ? std::to_string(facts_.started_ms + guard_px->count())
                            : std::string("0"));
    }
    auto reply = call_locked(*conn, command, deadline);
    if (reply.ok() && is_error(reply->get()) &&
        reply_string(reply->get()).substr(0, 8) == "NOSCRIPT") {
      // SCRIPT FLUSH or a failover to a server that never saw them.
      SIMBA_RETURN_IF_ERROR(load_scripts_locked(*conn, deadline));
      command[1] = shas_[script];
      reply = call_locked(*conn, command, deadline);
    }
    return reply;
  }

  // Several commands in one round trip.
  Result<std::vector<Reply>> pipeline(const std::vector<Command>& commands, Deadline deadline) {
    const TurnGate::Turn turn = turn_.take(deadline);
    if (!turn.taken()) return busy();
    SIMBA_ASSIGN_OR_RETURN(Connection * conn, connected_locked(deadline));
    auto replies = conn->call(commands, deadline);
    if (!replies.ok()) drop_locked();
    return replies;
  }

  // `script` on each mutex, in one round trip. (The scripts' hashes do not
  // change while the channel lives; a NOSCRIPT reply is the caller's error.)
  Result<std::vector<Reply>> eval_each(Script script, const std::vector<std::string>& mutexes,
                                       Deadline deadline) {
    std::vector<Command> commands;
    {
      const TurnGate::Turn turn = turn_.take(deadline);
      if (!turn.taken()) return busy();
      SIMBA_RETURN_IF_ERROR(connected_locked(deadline).status());
      for (const std::string& mutex : mutexes) commands.push_back(eval_command(script, mutex));
    }
    return pipeline(commands, deadline);
  }

 private:
  // EVALSHA of `script` on the keys of `mutex` (shas_ is read with the turn).
  Command eval_command(Script script, std::string_view mutex) const {
    Command command = {"EVALSHA", shas_[script], "3"};
    for (std::string& key : mutex_keys(prefix_, mutex)) command.push_back(std::move(key));
    return command;
  }

  Status busy() const {
    return deadline_exceeded_error("redis at " + endpoint_.describe() +
                                   ": deadline passed while waiting for the command connection");
  }

  Result<Reply> call_locked(Connection& conn, const Command& command, Deadline deadline) {
    auto reply = conn.call(command, deadline);
    // After a failed or late call the connection may still carry its reply,
    // which the next call would take for its own: close it.
    if (!reply.ok()) drop_locked();
    return reply;
  }

  void drop_locked() {
    conn_.reset();
    // The first reconnect after a working connection is immediate.
    backoff_.reset();
  }

  Result<Connection*> connected_locked(Deadline deadline) {
    if (conn_) return conn_.get();
    SIMBA_RETURN_IF_ERROR(backoff_.ready());
    const Deadline connect_deadline = std::min(deadline, steady_clock::now() + connect_timeout_);
    auto opened = Connection::open(endpoint_, "simba-commands", connect_deadline);
    Status status = opened.status();
    if (opened.ok()) status = load_scripts_locked(**opened, connect_deadline);
    if (opened.ok() && status.ok()) status = read_facts_locked(**opened, connect_deadline);
    if (!status.ok()) {
      backoff_.failed(status);
      return status;
    }
    conn_ = std::move(*opened);
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
                                  "redis at " + endpoint_.describe() + ": loading the scripts");
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
                                                                  {"CONFIG", "GET", "appendfsync"}},
                                                                 deadline));
    const redisReply* time = replies[0].get();
    long long seconds = 0;
    long long micros = 0;
    if (time->type != REDIS_REPLY_ARRAY || time->elements != 2 ||
        !parse_int(reply_string(time->element[0]), &seconds) ||
        !parse_int(reply_string(time->element[1]), &micros)) {
      return internal_error("redis at " + endpoint_.describe() + ": unexpected reply to TIME");
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

  const Endpoint endpoint_;
  const std::string prefix_;
  const milliseconds connect_timeout_;
  const bool restart_guard_;
  std::string scripts_[kScriptCount];

  TurnGate turn_;  // a call that has it alone touches what follows
  std::unique_ptr<Connection> conn_;
  std::string shas_[kScriptCount];
  ServerFacts facts_;
  Backoff backoff_;
};

// ---------------------------------------------------------------------------
// The subscriber connection.

class Subscriber : public std::enable_shared_from_this<Subscriber> {
 public:
  Subscriber(Endpoint endpoint, std::string prefix, milliseconds connect_timeout,
             bool keyspace_events)
      : endpoint_(std::move(endpoint)),
        prefix_(std::move(prefix)),
        connect_timeout_(connect_timeout),
        use_keyspace_events_(keyspace_events),
        expired_channel_("__keyevent@" + std::to_string(endpoint_.database) + "__:expired") {}

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
    if (!stopping_) worker_.start([self = shared_from_this()] { self->run(); });
    std::vector<std::string> fresh;
    for (const std::string& channel : channels) {
      if (wanted_[channel]++ == 0) fresh.push_back(channel);
    }
    if (conn_ && !fresh.empty()) {
      Command command = {"SUBSCRIBE"};
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
    std::vector<std::string> gone;
    for (const std::string& channel : channels_of(slot)) {
      auto it = wanted_.find(channel);
      if (it != wanted_.end() && --it->second == 0) {
        wanted_.erase(it);
        confirmed_.erase(channel);
        gone.push_back(channel);
      }
    }
    if (conn_ && !gone.empty()) {
      Command command = {"UNSUBSCRIBE"};
      command.insert(command.end(), gone.begin(), gone.end());
      send_locked(command);
    }
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
      settled_.clear();
      // Releases published while we are away are lost: wake everyone once
      // the next connection has subscribed again.
      wake_on_confirm_ = true;
      cv_.notify_all();
      if (stopping_) break;
      milliseconds delay{0};
      if (status.ok()) {
        backoff.reset();
      } else {
        delay = backoff.failed();
        SIMBA_LOG(kDebug,
                  "redis subscriber: " << status << "; reconnecting in " << format_duration(delay));
      }
      cv_.wait_for(lock, delay, [&] { return stopping_; });
    }
  }

  // One connection's life: connect, subscribe to everything wanted, then
  // deliver messages until the connection fails or stop().
  Status session() {
    const Deadline connect_deadline = steady_clock::now() + connect_timeout_;
    SIMBA_ASSIGN_OR_RETURN(std::unique_ptr<Connection> opened,
                           Connection::open(endpoint_, "simba-events", connect_deadline));
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
    for (std::size_t i = 0; i < channels.size(); i += kChannelsPerSubscribe) {
      Command command = {"SUBSCRIBE"};
      const std::size_t end = std::min(channels.size(), i + kChannelsPerSubscribe);
      command.insert(command.end(), channels.begin() + static_cast<std::ptrdiff_t>(i),
                     channels.begin() + static_cast<std::ptrdiff_t>(end));
      std::lock_guard<std::mutex> lock(mu_);
      SIMBA_RETURN_IF_ERROR(conn->send({command}, connect_deadline));
    }
    bool ping_outstanding = false;
    for (;;) {
      auto reply = conn->read(steady_clock::now() + kSubscriberPing);
      if (!reply.ok()) {
        if (reply.status().code() != StatusCode::kDeadlineExceeded || ping_outstanding) {
          return reply.status();
        }
        ping_outstanding = true;
        std::lock_guard<std::mutex> lock(mu_);
        SIMBA_RETURN_IF_ERROR(conn->send({{"PING"}}, steady_clock::now() + connect_timeout_));
        continue;
      }
      ping_outstanding = false;
      const redisReply* r = reply->get();
      if (r->type != REDIS_REPLY_ARRAY || r->elements < 2) continue;
      const std::string_view kind = reply_string(r->element[0]);
      if (kind == "subscribe") {
        const std::string channel(reply_string(r->element[1]));
        ListenerHub::Work work;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (wanted_.count(channel) > 0) confirmed_.insert(channel);
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
      if (kind == "message" && r->elements == 3) {
        deliver(reply_string(r->element[1]), reply_string(r->element[2]));
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

  const Endpoint endpoint_;
  const std::string prefix_;
  const milliseconds connect_timeout_;
  const bool use_keyspace_events_;
  const std::string expired_channel_;

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
  std::set<std::string> confirmed_;
  // A connection was lost: subscribers may have missed a release.
  bool wake_on_confirm_ = false;
};

// ---------------------------------------------------------------------------

class RedisBackend final : public Backend {
 public:
  explicit RedisBackend(const RedisOptions& options)
      : options_(options),
        endpoint_{options.host, options.port, options.user, options.password, options.database},
        commands_(endpoint_, options.key_prefix, options.connect_timeout, options.restart_guard),
        subscriber_(std::make_shared<Subscriber>(
            endpoint_, options.key_prefix, options.connect_timeout, options.keyspace_events)) {
    capabilities_.push_release = true;
    capabilities_.cross_process = true;
    capabilities_.lists_waiters = true;
    capabilities_.fencing_source =
        "counter in simba:{M}:fence: max(last + 1, server time in microseconds)";
    capabilities_.max_mutex_length = kMaxNameLength;
    capabilities_.max_contender_id_length = kMaxNameLength;
  }

  ~RedisBackend() override { subscriber_->stop(); }

  std::string_view scheme() const override { return "redis"; }
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
    SIMBA_ASSIGN_OR_RETURN(Reply reply, commands_.eval(kAcquire, request.mutex,
                                                       {std::string(request.contender_id),
                                                        std::to_string(request.ttl.count()),
                                                        std::to_string(request.transition.count())},
                                                       deadline, &facts, std::optional(px)));
    const std::string what = "acquiring mutex " + internal::in_quotes(request.mutex);
    if (is_error(reply.get())) return error_reply_status(reply.get(), context(what));
    ReplyFields fields(reply.get(), what);
    SIMBA_RETURN_IF_ERROR(fields.check(7));
    const std::string outcome = fields.text(0);
    SIMBA_ASSIGN_OR_RETURN(LockFields lock, parse_lock(fields, 1));
    if (outcome == "free") {
      // Contenders come back when the guard ends (pttl), not at the next
      // step of their error backoff.
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
    std::string cursor = "0";
    do {
      SIMBA_ASSIGN_OR_RETURN(
          std::vector<Reply> replies,
          commands_.pipeline(
              {{"SCAN", cursor, "MATCH", options_.key_prefix + ":{*", "COUNT", "1000"}}, deadline));
      const redisReply* r = replies[0].get();
      if (is_error(r)) return error_reply_status(r, context("listing mutexes"));
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
          r->element[1]->type != REDIS_REPLY_ARRAY) {
        return internal_error(context("listing mutexes") + ": unexpected reply to SCAN");
      }
      cursor = std::string(reply_string(r->element[0]));
      for (std::size_t i = 0; i < r->element[1]->elements; ++i) {
        std::string mutex;
        std::string suffix;
        if (split_name(options_.key_prefix, reply_string(r->element[1]->element[i]), &mutex,
                       &suffix) &&
            (suffix.empty() || suffix == "contender" || suffix == "fence") &&
            validate_mutex(mutex).ok()) {
          mutexes.insert(std::move(mutex));
        }
      }
    } while (cursor != "0");

    std::vector<ListedMutex> listed;
    const std::vector<std::string> names(mutexes.begin(), mutexes.end());
    constexpr std::size_t kBatch = 500;
    for (std::size_t i = 0; i < names.size(); i += kBatch) {
      const std::size_t end = std::min(names.size(), i + kBatch);
      const std::vector<std::string> batch(names.begin() + static_cast<std::ptrdiff_t>(i),
                                           names.begin() + static_cast<std::ptrdiff_t>(end));
      SIMBA_ASSIGN_OR_RETURN(std::vector<Reply> replies,
                             commands_.eval_each(kRead, batch, deadline));
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

  Result<std::unique_ptr<Subscription>> do_subscribe(
      std::string_view mutex, std::string_view contender_id,
      std::function<void(const MutexEvent&)> listener) override {
    return subscriber_->add(std::string(mutex), std::string(contender_id), std::move(listener));
  }

 private:
  std::string context(std::string_view what) const {
    return "redis at " + endpoint_.describe() + ": " + std::string(what);
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
  const Endpoint endpoint_;
  Capabilities capabilities_;
  CommandChannel commands_;
  std::shared_ptr<Subscriber> subscriber_;
};

}  // namespace

Result<std::shared_ptr<Backend>> new_redis_backend(RedisOptions options) {
  SIMBA_RETURN_IF_ERROR(internal::validate_host_port("redis", options.host, options.port));
  if (options.database < 0) return invalid_argument_error("redis: database must not be negative");
  SIMBA_RETURN_IF_ERROR(
      internal::validate_timeout_and_prefix("redis", options.connect_timeout, options.key_prefix));
  return std::shared_ptr<Backend>(std::make_shared<RedisBackend>(options));
}

Result<RedisOptions> redis_options_from_uri(const Uri& uri) {
  constexpr char kForm[] = "redis://[user:password@]host[:port][/db]";
  SIMBA_RETURN_IF_ERROR(internal::check_scheme(uri, "redis"));
  if (uri.hosts.size() != 1) {
    return invalid_argument_error(std::string("redis: URI must name exactly one host; expected ") +
                                  kForm);
  }
  SIMBA_RETURN_IF_ERROR(
      uri.check_query_keys({"connect_timeout", "restart_guard", "keyspace_events", "key_prefix"})
          .with_context("redis"));
  RedisOptions options;
  options.host = uri.hosts.front().host;
  if (options.host.empty()) {
    return invalid_argument_error(std::string("redis: URI has no host; expected ") + kForm);
  }
  if (uri.hosts.front().port) options.port = *uri.hosts.front().port;
  if (uri.user) options.user = *uri.user;
  if (uri.password) options.password = *uri.password;
  if (!uri.path.empty() && uri.path != "/") {
    long long db = -1;
    if (!parse_int(std::string_view(uri.path).substr(1), &db) || db < 0 || db > 1'000'000) {
      return invalid_argument_error("redis: URI path " + internal::in_quotes(uri.path) +
                                    " is not a database number; expected " + kForm);
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
