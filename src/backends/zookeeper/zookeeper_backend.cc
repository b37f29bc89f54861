// The ZooKeeper backend: Curator-style elections with Simba's leases on
// top. See include/simba/backends/zookeeper.h for the protocol.
//
// Threads: the C client's I/O and completion threads, plus the callers'.
// Completions only fill a Pending and wake its waiter; watchers only record
// and hand events to listeners (which only schedule work). A handle is
// never closed on the completion thread (zookeeper_close joins it).
#include "simba/backends/zookeeper.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <zookeeper/zookeeper.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "backends/zookeeper/zookeeper_errors.h"
#include "backends/zookeeper/zookeeper_sockets.h"
#include "core/listener_hub.h"
#include "core/log.h"
#include "core/store_options.h"
#include "core/worker.h"

namespace simba {
namespace {

using internal::ListenerHub;
using internal::TurnGate;
using std::chrono::duration_cast;
using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

constexpr std::size_t kMaxNameBytes = 512;
constexpr std::string_view kLatch = "latch-";
// Curator's protected prefix, then our uuid (36 characters), then "-latch-".
constexpr std::string_view kProtected = "_c_";
constexpr std::size_t kUuidLength = 36;
// Attempts inside one call when the election changes under it.
constexpr int kRounds = 5;
// A member that does not answer is left after a quarter of the session
// timeout, but never sooner than this (a busy member may take a moment).
constexpr milliseconds kMinSilenceLimit{500};
// How often the keepalive thread looks at whom the client is connecting to.
constexpr milliseconds kMemberCheck{100};
// The ACL id "world:anyone" (the C client's Id takes non-const strings, so
// these are variables, named as such).
char world_scheme[] = "world";
char anyone_id[] = "anyone";

// Set by ZkStore::await when a request failed because the connection was
// lost (not the session): the call may be tried again once reconnected.
thread_local bool t_connection_lost = false;

// Set while a thread runs one of our ZooKeeper callbacks.
thread_local bool t_in_zk_callback = false;
struct CallbackScope {
  CallbackScope() { t_in_zk_callback = true; }
  ~CallbackScope() { t_in_zk_callback = false; }
};

std::int64_t steady_ms(SteadyClock::time_point t) {
  return duration_cast<milliseconds>(t.time_since_epoch()).count();
}

std::int64_t wall_ms() {
  return duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Why tls=on|verify is refused (docs/backends/zookeeper.md has the evidence).
constexpr std::string_view kNoTls =
    "zookeeper: TLS is not supported: the ZooKeeper C client Simba is built with has no TLS "
    "(Debian 12's libzookeeper-mt 3.8.0 is built without OpenSSL: no zookeeper_init_ssl); "
    "use tls=off, or reach the ensemble over a TLS tunnel";

std::string zk_error(int rc) { return std::string(zerror(rc)) + " (" + std::to_string(rc) + ")"; }

using internal::zookeeper::is_connection_error;

// ---- one asynchronous request ---------------------------------------------------

struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  // When the request was handed to the client: a server that answers it
  // heard from our session at that time or later.
  SteadyClock::time_point sent{};
  bool done = false;
  int rc = ZSYSTEMERROR;
  std::string value;  // a node's data, or the path a create made
  Stat stat{};
  std::vector<std::string> children;
  // zoo_amulti writes these when it completes, so they live here.
  std::vector<zoo_op_result_t> results;
  Stat set_stat{};
};
using PendingPtr = std::shared_ptr<Pending>;

// The completion's `data`: a heap copy of the shared pointer, so a caller
// that gave up at its deadline leaves the Pending alive for a late reply.
PendingPtr take_holder(const void* data) {
  std::unique_ptr<PendingPtr> holder(static_cast<PendingPtr*>(const_cast<void*>(data)));
  return *holder;
}

template <typename Fill>
void complete(const void* data, int rc, Fill fill) {
  CallbackScope scope;
  PendingPtr p = take_holder(data);
  {
    std::lock_guard<std::mutex> lock(p->mu);
    p->rc = rc;
    if (rc == ZOK) fill(*p);
    p->done = true;
  }
  p->cv.notify_all();
}

void on_void(int rc, const void* data) {
  complete(data, rc, [](Pending&) {});
}
void on_stat(int rc, const Stat* stat, const void* data) {
  complete(data, rc, [stat](Pending& p) {
    if (stat != nullptr) p.stat = *stat;
  });
}
void on_data(int rc, const char* value, int length, const Stat* stat, const void* data) {
  complete(data, rc, [&](Pending& p) {
    if (value != nullptr && length > 0) p.value.assign(value, static_cast<std::size_t>(length));
    if (stat != nullptr) p.stat = *stat;
  });
}
void on_children(int rc, const String_vector* strings, const Stat* stat, const void* data) {
  complete(data, rc, [&](Pending& p) {
    if (strings != nullptr) {
      for (int i = 0; i < strings->count; ++i) p.children.emplace_back(strings->data[i]);
    }
    if (stat != nullptr) p.stat = *stat;
  });
}
void on_string(int rc, const char* value, const void* data) {
  complete(data, rc, [&](Pending& p) {
    if (value != nullptr) p.value = value;
  });
}
void on_create(int rc, const char* path, const Stat* stat, const void* data) {
  complete(data, rc, [&](Pending& p) {
    if (path != nullptr) p.value = path;
    if (stat != nullptr) p.stat = *stat;
  });
}

// Starts a request: `submit(data)` calls a zoo_a* function. If it is
// refused at once the completion never runs, so the result is set here.
// (A transaction passes the Pending its results are written into.)
template <typename Submit>
PendingPtr start(Submit submit, PendingPtr p = std::make_shared<Pending>()) {
  p->sent = SteadyClock::now();
  auto* holder = new PendingPtr(p);
  const int rc = submit(static_cast<const void*>(holder));
  if (rc != ZOK) {
    delete holder;
    p->rc = rc;
    p->done = true;
  }
  return p;
}

// Waits for `p` until `deadline`; false if it did not complete by then.
bool wait(const PendingPtr& p, Deadline deadline) {
  std::unique_lock<std::mutex> lock(p->mu);
  return p->cv.wait_until(lock, deadline, [&] { return p->done; });
}

// A watch id as a watcher context.
void* watch_context_of(std::uint64_t id) {
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(id));
}

// ---- node names -----------------------------------------------------------------

struct Child {
  std::string name;
  std::int64_t sequence = 0;
};

// The sequence after the last "latch-", as Curator sorts; nullopt for a
// node that is not a participant.
std::optional<std::int64_t> sequence_of(std::string_view name) {
  const std::size_t at = name.rfind(kLatch);
  if (at == std::string_view::npos) return std::nullopt;
  const std::string_view digits = name.substr(at + kLatch.size());
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty()) {
    return std::nullopt;
  }
  return value;
}

// Participants in election order.
std::vector<Child> participants(const std::vector<std::string>& names) {
  std::vector<Child> out;
  for (const std::string& name : names) {
    if (auto seq = sequence_of(name)) out.push_back(Child{name, *seq});
  }
  std::sort(out.begin(), out.end(),
            [](const Child& a, const Child& b) { return a.sequence < b.sequence; });
  return out;
}

std::uint32_t hex(std::string_view text) {
  std::uint32_t value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value, 16);
  return value;
}

// A version-8 UUID carrying a lease: ttl ms in the first 32 bits,
// transition ms in the next 28 (around the version nibble), then the
// variant and 62 random bits.
std::string lease_uuid(std::uint32_t ttl_ms, std::uint32_t transition_ms, std::uint64_t random) {
  char text[kUuidLength + 1];
  std::snprintf(text, sizeof text, "%08x-%04x-8%03x-%04x-%012llx", ttl_ms,
                (transition_ms >> 12) & 0xffffu, transition_ms & 0xfffu,
                static_cast<unsigned>(0x8000u | ((random >> 48) & 0x3fffu)),
                static_cast<unsigned long long>(random & 0xffffffffffffULL));
  return std::string(text, kUuidLength);
}

struct NodeLease {
  milliseconds ttl{0};
  milliseconds transition{0};
};

// The lease a C++ node carries in its name; nullopt for any other node
// (a JVM participant's random version-4 UUID).
std::optional<NodeLease> lease_of(std::string_view name) {
  if (name.size() < kProtected.size() + kUuidLength + 1 ||
      name.substr(0, kProtected.size()) != kProtected) {
    return std::nullopt;
  }
  const std::string_view uuid = name.substr(kProtected.size(), kUuidLength);
  if (uuid[8] != '-' || uuid[13] != '-' || uuid[18] != '-' || uuid[23] != '-' || uuid[14] != '8' ||
      std::string_view("89ab").find(uuid[19]) == std::string_view::npos) {
    return std::nullopt;
  }
  NodeLease lease;
  lease.ttl = milliseconds(hex(uuid.substr(0, 8)));
  lease.transition = milliseconds((hex(uuid.substr(9, 4)) << 12) | hex(uuid.substr(15, 3)));
  return lease;
}

// ---- the store -------------------------------------------------------------------

class ZkStore;

// One session: a zhandle_t, closed when the last user lets go (never on a
// callback thread).
class ZkHandle {
 public:
  ZkHandle(zhandle_t* zh, std::uint64_t generation, std::shared_ptr<ZkStore> store)
      : zh_(zh), generation_(generation), store_(std::move(store)) {}
  ~ZkHandle() {
    if (zh_ == nullptr) return;
    if (t_in_zk_callback) {
      // zookeeper_close joins the completion thread: not from there.
      std::thread([zh = zh_, store = std::move(store_)] {
        internal::name_this_thread("zk-close");
        zookeeper_close(zh);
      }).detach();
    } else {
      zookeeper_close(zh_);
    }
  }
  ZkHandle(const ZkHandle&) = delete;
  ZkHandle& operator=(const ZkHandle&) = delete;

  zhandle_t* get() const { return zh_; }
  std::uint64_t generation() const { return generation_; }

 private:
  zhandle_t* zh_;
  std::uint64_t generation_;
  // Keeps the watcher's context alive as long as the handle.
  std::shared_ptr<ZkStore> store_;
};

using Slot = ListenerHub::Slot;

// What a node watch is for.
struct WatchContext {
  enum class Kind { kPredecessor, kOwn, kChildren } kind;
  std::string mutex;
  std::string contender_id;
  std::uint64_t token = 0;
  // kOwn: our node's hard lease (ttl + transition, from its name).
  milliseconds hard{0};
};

// What this backend knows of one (mutex, contender).
struct Entry {
  // One call at a time.
  TurnGate turn;

  // Guarded by the turn.
  std::uint64_t session = 0;  // the session our node belongs to
  std::string uuid;           // of our node (being) created
  bool create_uncertain = false;
  std::string node;                     // our node's name; empty: none
  std::atomic<std::uint64_t> czxid{0};  // read by our own-node watcher
  bool owner = false;                   // we lead, as far as we know
  // Set by our own-node watch when the node is deleted under us.
  std::atomic<bool> lost{false};
  std::uint64_t own_watch = 0;
  std::string watching;  // the predecessor we watch
  std::uint64_t watch_id = 0;
  // The lowest node as first seen while it had not been written since its
  // creation (for evicting an owner that never renews).
  std::string seen_lowest;
  SteadyClock::time_point seen_at{};

  // Forgets the node (the turn stays taken).
  void reset(std::uint64_t new_session) {
    session = new_session;
    uuid.clear();
    create_uncertain = false;
    node.clear();
    czxid = 0;
    owner = false;
    lost = false;
    own_watch = 0;
    watching.clear();
    watch_id = 0;
    seen_lowest.clear();
    seen_at = {};
  }
};

class ZkStore : public std::enable_shared_from_this<ZkStore> {
 public:
  explicit ZkStore(ZookeeperOptions options)
      : options_(std::move(options)), random_(std::random_device{}()) {
    // With a user: all permissions for the authenticated creator (the
    // `auth` scheme stands for the session's digest id), and reading for
    // everyone if asked. Without one: open, as before.
    acl_entries_[0] = ACL{ZOO_PERM_ALL, ZOO_AUTH_IDS};
    acl_entries_[1] = ACL{ZOO_PERM_READ, Id{world_scheme, anyone_id}};
    acl_vector_.data = acl_entries_;
    acl_vector_.count = options_.read_acl == ZookeeperOptions::ReadAcl::kAnyone ? 2 : 1;
  }

  const ZookeeperOptions& options() const { return options_; }
  bool authenticated() const { return !options_.user.empty(); }
  // The ACL of every node we create.
  const ACL_vector* acl() const { return authenticated() ? &acl_vector_ : &ZOO_OPEN_ACL_UNSAFE; }

  void shutdown() {
    std::shared_ptr<ZkHandle> handle;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      handle = std::move(handle_);
    }
    cv_.notify_all();
    keepalive_.join();
    // `handle` closes here (or later, when the last call using it ends).
  }

  Result<OwnerRecord> acquire(const AcquireRequest& request, Deadline deadline);
  Result<bool> release(std::string_view mutex, std::string_view contender_id, std::uint64_t token,
                       Deadline deadline);
  Result<ForcedRelease> force_release(std::string_view mutex, Deadline deadline);
  Result<OwnerRecord> read(std::string_view mutex, Deadline deadline);
  Result<std::vector<ListedMutex>> list(Deadline deadline);
  Result<std::vector<std::string>> waiters(std::string_view mutex, Deadline deadline);
  // `simba doctor`: the member this session is on, the session timeout the
  // server granted, and the ensemble's voting members (/zookeeper/config).
  Status inspect(StoreReport& report, Deadline deadline);
  std::unique_ptr<Subscription> subscribe(std::string_view mutex, std::string_view contender_id,
                                          std::function<void(const MutexEvent&)> listener);

  static void global_watcher(zhandle_t* zh, int type, int state, const char* path, void* context);
  static void node_watcher(zhandle_t* zh, int type, int state, const char* path, void* context);

 private:
  using EntryKey = std::pair<std::string, std::string>;

  // One attempt of acquire(): a connection lost under it is an error here.
  Result<OwnerRecord> acquire_once(const AcquireRequest& request, Deadline deadline);
  // The keepalive thread: a read every eighth of the session timeout (so we
  // know when the server last heard from us), the loss of a suspended
  // session's owners once its hold bound passes (on_session_event), and
  // leaving a member that accepts connections but does not answer.
  void run_keepalive();
  // The member the client is connected or connecting to ("host:port"), or
  // "" when it cannot tell.
  static std::string current_member(zhandle_t* zh);
  // Ends the connections to `member`, which has been silent for `silent`:
  // the client moves to the next member with the same session.
  void leave_member(const std::string& member, milliseconds silent);
  // The server heard from the current session at `sent` or later.
  void note_contact(SteadyClock::time_point sent);

  // The current session, opening one if there is none or it expired, and
  // waiting (up to connect_timeout and `deadline`) until it is connected.
  Result<std::shared_ptr<ZkHandle>> session(Deadline deadline);
  // The error for an authentication that ended with `rc`.
  Status auth_failure(int rc) const;
  // Our entry for (mutex, contender), with its turn taken.
  struct TakenEntry {
    std::shared_ptr<Entry> entry;
    TurnGate::Turn turn;  // given back first
  };
  Result<TakenEntry> take_entry(const EntryKey& key, Deadline deadline);

  std::string mutex_path(std::string_view mutex) const {
    return options_.root + "/" + std::string(mutex);
  }
  // Creates the root's components and the mutex node (containers).
  Status create_parents(zhandle_t* zh, std::string_view mutex, Deadline deadline);
  // Creates the components of `path` but the last (containers).
  Status create_ancestors(zhandle_t* zh, const std::string& path, Deadline deadline);
  // Waits and turns a failure into a Status.
  Status await(const PendingPtr& p, Deadline deadline, const std::string& what,
               std::set<int> accepted = {});
  // The children of `parent` with the protected name of `uuid` (nodes a
  // create whose reply we never saw may have made), in the server's order;
  // all of them in *children when given.
  Result<std::vector<std::string>> protected_nodes(zhandle_t* zh, const std::string& parent,
                                                   const std::string& uuid, Deadline deadline,
                                                   std::vector<std::string>* children = nullptr);

  // Server time now, estimated from our own writes (never later than the
  // server's clock, as long as the clocks run at the same rate).
  std::int64_t server_now(SteadyClock::time_point now = SteadyClock::now()) const;
  void observe(std::int64_t server_ms);

  // Registers a node watch; its id is the watcher context.
  std::uint64_t add_watch(WatchContext context);
  bool watch_armed(std::uint64_t id);
  void arm_own_watch(zhandle_t* zh, const std::string& mutex, Entry& entry,
                     const std::string& contender_id);

  // `kind` to every listener of every mutex.
  void broadcast(MutexEvent::Kind kind);
  void on_session_event(zhandle_t* zh, int state);
  void on_node_event(std::uint64_t id, int type);

  // "<root>-sessions/<session id>": written by this session's calls.
  std::string heartbeat_path_of(std::int64_t session_id) const;
  // When the last heartbeat write of this session was sent, writing one
  // first if that is more than `fresh_within` ago.
  Result<SteadyClock::time_point> heartbeat(const std::shared_ptr<ZkHandle>& handle,
                                            milliseconds fresh_within, Deadline deadline);
  // The lease of the session that created `node` (its heartbeat's mtime and
  // version), or nullopt when that session keeps no heartbeat.
  Result<std::optional<Stat>> heartbeat_of(zhandle_t* zh, const Stat& node, Deadline deadline);
  // Our ownership as of the heartbeat sent at `heartbeat_sent`, for a call
  // that started at `call_start`.
  OwnerRecord owned(const Entry& entry, std::string_view contender_id,
                    SteadyClock::time_point call_start, SteadyClock::time_point heartbeat_sent,
                    const AcquireRequest& request) const;
  // The owner as seen from outside at server time `now`: the lowest node's
  // data and times. A JVM participant's times are unknown (its session is
  // its lease): `ask_again_at` is set to `now` plus `ask_after`.
  OwnerRecord seen(const Child& lowest, const Pending& node, std::int64_t start, std::int64_t now,
                   milliseconds ask_after = milliseconds(0)) const;

  const ZookeeperOptions options_;
  ACL acl_entries_[2];
  ACL_vector acl_vector_{};

  std::mutex session_mu_;  // serializes opening sessions; never in callbacks
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<ZkHandle> handle_;
  // The digest authentication of handle_ (nullptr without a user): its
  // completion comes once, at the session's first connection; the client
  // sends the credentials again on every reconnection.
  PendingPtr auth_;
  std::uint64_t generation_ = 0;
  bool connected_ = false;
  bool lost_ = false;  // the connection broke (or the session ended) since connected
  bool expired_ = false;
  bool closed_ = false;
  // A lower bound of when the server last heard from the current session
  // (the send time of a request it answered, or the start of a connection
  // attempt that it accepted), and when the session was opened.
  SteadyClock::time_point contact_{};
  SteadyClock::time_point session_opened_{};
  // When the oldest keepalive read still unanswered was sent (none while
  // every one sent has been answered).
  std::optional<SteadyClock::time_point> probe_unanswered_since_;
  // Since when the client has been reconnecting (valid while lost_ and the
  // session lives), and until when owners may keep acting as owners then:
  // contact_ + 2/3 of the granted session timeout (the server ends the
  // session a whole timeout after it last heard from us, at the earliest).
  SteadyClock::time_point connecting_since_{};
  SteadyClock::time_point hold_until_{};
  bool suspended_ = false;  // lost_ without an expiry, owners not told yet
  milliseconds granted_{0};
  internal::Worker keepalive_;
  std::int64_t offset_ms_ = 0;
  bool has_offset_ = false;
  // The session's heartbeat node: which session it was made for, and when
  // its last successful write was sent.
  std::uint64_t heartbeat_generation_ = 0;
  bool heartbeat_exists_ = false;
  SteadyClock::time_point heartbeat_sent_{};
  std::mt19937_64 random_;
  std::map<EntryKey, std::shared_ptr<Entry>> entries_;
  std::uint64_t next_watch_ = 0;
  std::map<std::uint64_t, WatchContext> watches_;
  std::set<std::string> children_watched_;
  const std::shared_ptr<ListenerHub> hub_ = std::make_shared<ListenerHub>();
};

// ---- requests ----------------------------------------------------------------------
// Each starts one zoo_a* call; a `watch` (an AddWatch id) other than 0 arms
// a node watch with it.

PendingPtr list_children(zhandle_t* zh, const std::string& path, std::uint64_t watch = 0) {
  return start([&](const void* data) {
    return zoo_awget_children2(zh, path.c_str(), watch != 0 ? &ZkStore::node_watcher : nullptr,
                               watch_context_of(watch), &on_children, data);
  });
}

PendingPtr exists_node(zhandle_t* zh, const std::string& path, std::uint64_t watch = 0) {
  return start([&](const void* data) {
    return zoo_awexists(zh, path.c_str(), watch != 0 ? &ZkStore::node_watcher : nullptr,
                        watch_context_of(watch), &on_stat, data);
  });
}

PendingPtr get_data(zhandle_t* zh, const std::string& path) {
  return start([&](const void* data) { return zoo_aget(zh, path.c_str(), 0, &on_data, data); });
}

PendingPtr delete_node(zhandle_t* zh, const std::string& path, int version = -1) {
  return start(
      [&](const void* data) { return zoo_adelete(zh, path.c_str(), version, &on_void, data); });
}

// `value` nullptr (length -1): a node without data; `acl` the store's
// (ZkStore::acl).
PendingPtr create(zhandle_t* zh, const std::string& path, const char* value, int length, int flags,
                  const ACL_vector* acl) {
  return start([&](const void* data) {
    return zoo_acreate2(zh, path.c_str(), value, length, acl, flags, &on_create, data);
  });
}

// A transaction of `ops`; `p->results` has a slot for each.
PendingPtr multi(zhandle_t* zh, std::vector<zoo_op_t>& ops, PendingPtr p) {
  return start(
      [&](const void* data) {
        return zoo_amulti(zh, static_cast<int>(ops.size()), ops.data(), p->results.data(), &on_void,
                          data);
      },
      p);
}

// ---- sessions and watches -----------------------------------------------------------

// What the C client last said of each member it could not reach (its
// "Socket HOST:PORT zk retcode=..., errno=...(...): why" error lines) or
// that we left for not answering, and when: a call that finds no
// connection names them. Process-wide, as the client's log callback has no
// context (one process rarely talks to two ensembles).
struct MemberCause {
  std::string cause;
  SteadyClock::time_point at;
};
std::mutex g_member_causes_mu;
std::map<std::string, MemberCause>& member_causes() {
  static auto* const kCauses = new std::map<std::string, MemberCause>;  // outlives statics
  return *kCauses;
}

void note_member_cause(std::string member, std::string cause) {
  std::lock_guard<std::mutex> lock(g_member_causes_mu);
  member_causes()[std::move(member)] = {std::move(cause), SteadyClock::now()};
}

}  // namespace

namespace internal::zookeeper {

std::optional<std::pair<std::string, std::string>> member_cause_of_log_line(std::string_view line) {
  constexpr std::string_view kSocket = "Socket ";
  constexpr std::string_view kRetcode = " zk retcode=";
  const std::size_t socket = line.find(kSocket);
  if (socket == std::string_view::npos) return std::nullopt;
  const std::size_t member_at = socket + kSocket.size();
  const std::size_t retcode = line.find(kRetcode, member_at);
  if (retcode == std::string_view::npos || retcode == member_at) return std::nullopt;
  std::string member(line.substr(member_at, retcode - member_at));
  // "errno=111(Connection refused): server refused to accept the client"
  const std::size_t errno_at = line.find("errno=", retcode);
  const std::size_t open = line.find('(', errno_at == std::string_view::npos ? retcode : errno_at);
  const std::size_t close = line.find("): ", open == std::string_view::npos ? retcode : open);
  if (errno_at == std::string_view::npos || open == std::string_view::npos ||
      close == std::string_view::npos) {
    return std::nullopt;
  }
  std::string cause(line.substr(close + 3));
  while (!cause.empty() && (cause.back() == '\n' || cause.back() == '\r')) cause.pop_back();
  const std::string_view errno_text = line.substr(open + 1, close - open - 1);
  if (line.substr(errno_at, 8) != "errno=0(" && !errno_text.empty()) {
    cause += " (" + std::string(errno_text) + ")";
  }
  return std::make_pair(std::move(member), std::move(cause));
}

std::string member_causes_since(std::chrono::steady_clock::time_point since) {
  std::lock_guard<std::mutex> lock(g_member_causes_mu);
  std::string out;
  for (const auto& [member, cause] : member_causes()) {
    if (cause.at < since) continue;
    out += (out.empty() ? "" : "; ") + member + ": " + cause.cause;
  }
  return out;
}

}  // namespace internal::zookeeper

namespace {

void log_to_simba(const char* message) {
  std::string text = message != nullptr ? message : "";
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (auto cause = internal::zookeeper::member_cause_of_log_line(text)) {
    note_member_cause(std::move(cause->first), std::move(cause->second));
  }
  SIMBA_LOG(kDebug, "zookeeper client: " << text);
}

Result<std::shared_ptr<ZkHandle>> ZkStore::session(Deadline deadline) {
  std::shared_ptr<ZkHandle> stale;
  {
    std::lock_guard<std::mutex> opening(session_mu_);
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) return unavailable_error("zookeeper: the backend is closed");
    if (handle_ == nullptr || expired_) {
      stale = std::move(handle_);
      const std::uint64_t generation = ++generation_;
      connected_ = false;
      expired_ = false;
      lost_ = false;
      suspended_ = false;
      // The server hears the handshake after this.
      session_opened_ = contact_ = connecting_since_ = SteadyClock::now();
      granted_ = options_.session_timeout;
      if (!keepalive_.running()) {
        keepalive_.start("zk-keepalive", [self = shared_from_this()] { self->run_keepalive(); });
      }
      lock.unlock();
      // Callbacks may run before zookeeper_init2 returns; they find the
      // handle by its generation once it is installed.
      zhandle_t* zh = zookeeper_init2(options_.connect_string.c_str(), &ZkStore::global_watcher,
                                      static_cast<int>(options_.session_timeout.count()), nullptr,
                                      this, 0, &log_to_simba);
      lock.lock();
      if (zh == nullptr) {
        return unavailable_error("zookeeper at " + options_.connect_string +
                                 ": cannot create a session: " + zk_error(errno));
      }
      handle_ = std::make_shared<ZkHandle>(zh, generation, shared_from_this());
      auth_.reset();
      if (authenticated()) {
        // Queued now, sent first thing once connected (and again after
        // every reconnection, by the client); never logged.
        const std::string credentials = options_.user + ":" + options_.password;
        auth_ = start([&](const void* data) {
          return zoo_add_auth(zh, "digest", credentials.data(),
                              static_cast<int>(credentials.size()), &on_void, data);
        });
      }
      // A state change that came before the handle was installed.
      const int state = zoo_state(zh);
      if (state == ZOO_CONNECTED_STATE) connected_ = true;
      // The keepalive thread watches whom the new handle connects to.
      cv_.notify_all();
    }
  }
  stale.reset();  // closes an expired session, outside our locks
  std::unique_lock<std::mutex> lock(mu_);
  const Deadline connect_by = std::min(deadline, SteadyClock::now() + options_.connect_timeout);
  cv_.wait_until(lock, connect_by, [&] {
    if (handle_ != nullptr && !connected_ && zoo_state(handle_->get()) == ZOO_CONNECTED_STATE) {
      connected_ = true;
    }
    return closed_ || connected_ || expired_;
  });
  if (closed_) return unavailable_error("zookeeper: the backend is closed");
  if (!connected_) {
    // A refused authentication ends the session (AUTH_FAILED): say so,
    // whichever of its completion and its session event came first.
    int auth_rc = ZOK;
    if (auth_ != nullptr) {
      std::lock_guard<std::mutex> done(auth_->mu);
      if (auth_->done) auth_rc = auth_->rc;
    }
    if (auth_rc == ZOK && auth_ != nullptr && handle_ != nullptr &&
        zoo_state(handle_->get()) == ZOO_AUTH_FAILED_STATE) {
      auth_rc = ZAUTHFAILED;
    }
    if (auth_rc != ZOK && !is_connection_error(auth_rc)) return auth_failure(auth_rc);
  }
  if (!connected_) {
    // The members the client tried meanwhile, and what each said.
    const std::string causes = internal::zookeeper::member_causes_since(connecting_since_);
    return unavailable_error(
        "zookeeper at " + options_.connect_string +
        (expired_
             ? ": the session expired"
             : ": no connection (connect_timeout " + format_duration(options_.connect_timeout) +
                   ")" + (causes.empty() ? std::string() : "; members tried: " + causes)));
  }
  std::shared_ptr<ZkHandle> handle = handle_;
  PendingPtr auth = auth_;
  lock.unlock();
  if (auth != nullptr) {
    // Nothing may be created before the credentials are in force (an
    // `auth` ACL needs them), so the first call waits for their reply.
    if (!wait(auth, connect_by)) {
      return unavailable_error(
          "zookeeper at " + options_.connect_string + ": no reply to the authentication of user '" +
          options_.user + "' (connect_timeout " + format_duration(options_.connect_timeout) + ")");
    }
    int rc;
    {
      std::lock_guard<std::mutex> done(auth->mu);
      rc = auth->rc;
    }
    if (rc != ZOK) return auth_failure(rc);
  }
  return handle;
}

Status ZkStore::auth_failure(int rc) const {
  const std::string message = "zookeeper at " + options_.connect_string +
                              ": authentication failed (digest scheme, user '" + options_.user +
                              "'): " + zk_error(rc);
  if (is_connection_error(rc)) return unavailable_error(message);
  return permission_denied_error(message);
}

void ZkStore::global_watcher(zhandle_t* zh, int type, int state, const char*, void* context) {
  CallbackScope scope;
  if (type != ZOO_SESSION_EVENT || context == nullptr) return;
  static_cast<ZkStore*>(context)->on_session_event(zh, state);
}

void ZkStore::on_session_event(zhandle_t* zh, int state) {
  bool lost_now = false;
  bool back = false;
  bool ended = false;
  milliseconds hold_left{0};
  const SteadyClock::time_point now = SteadyClock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Events of a replaced session, or of one not installed yet (it reads
    // its state after it is), change nothing.
    if (handle_ == nullptr || handle_->get() != zh) return;
    probe_unanswered_since_.reset();
    if (state == ZOO_CONNECTED_STATE) {
      back = lost_;
      connected_ = true;
      lost_ = false;
      suspended_ = false;
      // The server accepted a handshake sent after the client began
      // (re)connecting, and the session's expiry restarted there.
      contact_ = std::max(contact_, connecting_since_);
      if (const int granted = zoo_recv_timeout(zh); granted > 0) granted_ = milliseconds(granted);
    } else if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE) {
      ended = true;
      connected_ = false;
      expired_ = true;
      lost_ = true;
      suspended_ = false;
      watches_.clear();
      children_watched_.clear();
    } else if (state == ZOO_CONNECTING_STATE || state == ZOO_ASSOCIATING_STATE) {
      if (connected_) {
        // Curator's SUSPENDED. The session lives on at the servers for a
        // whole session timeout after they last heard from us, and the
        // client moves it to another member meanwhile: owners keep their
        // hold until 2/3 of the timeout after that contact (the client's
        // own margin), unless their lease ends first (the core's deadline),
        // and are told then (run_keepalive) if the session is not back.
        lost_ = true;
        connecting_since_ = now;
        hold_until_ = contact_ + granted_ * 2 / 3;
        if (now >= hold_until_) {
          lost_now = true;
        } else {
          suspended_ = true;
          hold_left = duration_cast<milliseconds>(hold_until_ - now);
        }
      }
      connected_ = false;
    }
  }
  cv_.notify_all();
  if (hold_left > milliseconds(0)) {
    SIMBA_LOG(kInfo, "zookeeper at " << options_.connect_string
                                     << ": connection lost; reconnecting, owners keep their hold "
                                        "for at most "
                                     << hold_left.count() << " ms more");
  }
  if (lost_now || ended) {
    // Curator's LOST (or SUSPENDED past the hold bound): nobody may act as
    // an owner until the store confirms it again.
    const char* what = !ended ? ": connection lost, and the session may end before it is back"
                       : state == ZOO_AUTH_FAILED_STATE
                           ? ": authentication failed, the session ended"
                           : ": the session expired";
    SIMBA_LOG(kWarn, "zookeeper at " << options_.connect_string << what
                                     << "; owners on this backend stop acting as owners");
    broadcast(MutexEvent::Kind::kLost);
  }
  if (back || ended) {
    // Anything may have changed meanwhile (and after an expiry every node
    // of ours is gone): everyone looks again.
    broadcast(MutexEvent::Kind::kReleased);
  }
}

std::uint64_t ZkStore::add_watch(WatchContext context) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::uint64_t id = ++next_watch_;
  watches_.emplace(id, std::move(context));
  return id;
}

bool ZkStore::watch_armed(std::uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  return id != 0 && watches_.count(id) != 0;
}

void ZkStore::node_watcher(zhandle_t* zh, int type, int, const char*, void* context) {
  CallbackScope scope;
  // The handle's context is its store (which outlives the handle); the
  // watcher's context is the watch id, so nothing is allocated per watch.
  auto* store = static_cast<ZkStore*>(const_cast<void*>(zoo_get_context(zh)));
  if (store != nullptr) store->on_node_event(reinterpret_cast<std::uintptr_t>(context), type);
}

void ZkStore::on_node_event(std::uint64_t id, int type) {
  WatchContext context;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = watches_.find(id);
    if (it == watches_.end()) return;
    context = std::move(it->second);
    watches_.erase(it);
    if (context.kind == WatchContext::Kind::kChildren) children_watched_.erase(context.mutex);
  }
  if (type == ZOO_SESSION_EVENT) return;  // the global watcher handles sessions
  switch (context.kind) {
    case WatchContext::Kind::kPredecessor:
      // Our predecessor left (or changed): this waiter alone looks again.
      hub_->publish(MutexEvent{MutexEvent::Kind::kReleased, context.mutex, "", 0},
                    [&](const Slot& s) { return s.contender_id == context.contender_id; });
      break;
    case WatchContext::Kind::kOwn:
      if (type == ZOO_DELETED_EVENT) {
        MutexEvent lost{MutexEvent::Kind::kLost, context.mutex, context.contender_id,
                        context.token};
        {
          std::lock_guard<std::mutex> lock(mu_);
          auto it = entries_.find({context.mutex, context.contender_id});
          if (it != entries_.end() && it->second->czxid == context.token) it->second->lost = true;
          // Our session is alive (its end clears the watches before they
          // fire), so somebody deleted the node. An eviction needs our
          // heartbeat older than the node's hard lease by the server's
          // clock; while it is younger than that by ours (it was sent
          // before the server stamped it), it was no eviction but a forced
          // release: the hold was taken away, not ended by its lease.
          lost.forced = heartbeat_exists_ && context.hard > milliseconds(0) &&
                        SteadyClock::now() - heartbeat_sent_ < context.hard;
        }
        // Forced out (an operator, or an eviction of a lease we did not
        // renew in time): the owner hears it now, not at its next renewal.
        hub_->publish(lost, [&](const Slot& s) { return s.contender_id == context.contender_id; });
        hub_->publish(MutexEvent{MutexEvent::Kind::kReleased, context.mutex, "", 0},
                      [](const Slot& s) { return s.contender_id.empty(); });
      }
      // A change is our own renewal; the renewal arms the next watch.
      break;
    case WatchContext::Kind::kChildren:
      hub_->publish(MutexEvent{MutexEvent::Kind::kReleased, context.mutex, "", 0},
                    [](const Slot& s) { return s.contender_id.empty(); });
      break;
  }
}

void ZkStore::arm_own_watch(zhandle_t* zh, const std::string& mutex, Entry& entry,
                            const std::string& contender_id) {
  // Our renewal (a data change) fires the armed watch, so a new one is
  // armed after every write of ours.
  const auto lease = lease_of(entry.node);
  const std::uint64_t id =
      add_watch(WatchContext{WatchContext::Kind::kOwn, mutex, contender_id, entry.czxid,
                             lease ? lease->ttl + lease->transition : milliseconds(0)});
  entry.own_watch = id;
  const std::string path = mutex_path(mutex) + "/" + entry.node;
  // Not waited for. If the server does not take it (the node is gone, the
  // connection broke), the watch is forgotten, so the next renewal asks
  // the server instead of trusting a watch that is not there.
  struct Arming {
    ZkStore* store;
    std::uint64_t id;
  };
  auto* arming = new Arming{this, id};
  const int rc = zoo_awexists(
      zh, path.c_str(), &ZkStore::node_watcher, watch_context_of(id),
      [](int result, const Stat*, const void* data) {
        CallbackScope scope;
        std::unique_ptr<Arming> done(static_cast<Arming*>(const_cast<void*>(data)));
        if (result != ZOK) {
          std::lock_guard<std::mutex> lock(done->store->mu_);
          done->store->watches_.erase(done->id);
        }
      },
      arming);
  if (rc != ZOK) {
    delete arming;
    std::lock_guard<std::mutex> lock(mu_);
    watches_.erase(id);
  }
}

void ZkStore::broadcast(MutexEvent::Kind kind) {
  ListenerHub::Work work;
  hub_->collect_all(MutexEvent{kind, "", "", 0}, &work);
  hub_->deliver(work);
}

std::unique_ptr<Subscription> ZkStore::subscribe(std::string_view mutex,
                                                 std::string_view contender_id,
                                                 std::function<void(const MutexEvent&)> listener) {
  return hub_->subscribe(std::string(mutex), std::string(contender_id), std::move(listener));
}

// ---- helpers for calls --------------------------------------------------------------

std::int64_t ZkStore::server_now(SteadyClock::time_point now) const {
  std::lock_guard<std::mutex> lock(mu_);
  // Before any write of ours, the local wall clock (ZooKeeper tells no time
  // otherwise); only used for display then, never for an eviction.
  return has_offset_ ? steady_ms(now) + offset_ms_ : wall_ms();
}

void ZkStore::observe(std::int64_t server_ms) {
  // The server stamped the write before we received the reply, so this is
  // a lower bound of the clock offset; the latest one follows clock steps.
  const std::int64_t offset = server_ms - steady_ms(SteadyClock::now());
  std::lock_guard<std::mutex> lock(mu_);
  offset_ms_ = offset;
  has_offset_ = true;
}

Status ZkStore::await(const PendingPtr& p, Deadline deadline, const std::string& what,
                      std::set<int> accepted) {
  if (!wait(p, deadline)) {
    return deadline_exceeded_error("zookeeper at " + options_.connect_string + ": " + what +
                                   ": no reply by the deadline");
  }
  int rc;
  {
    std::lock_guard<std::mutex> lock(p->mu);
    rc = p->rc;
  }
  // Any answer of the server (not one the client made up) means it heard
  // our session when the request was sent, or later.
  if (!is_connection_error(rc) && rc != ZSYSTEMERROR) note_contact(p->sent);
  if (rc == ZOK || accepted.count(rc) != 0) return ok_status();
  const std::string message =
      "zookeeper at " + options_.connect_string + ": " + what + ": " + zk_error(rc);
  if (is_connection_error(rc)) {
    if (rc != ZSESSIONEXPIRED && rc != ZCLOSING) t_connection_lost = true;
    return unavailable_error(message);
  }
  const StatusCode code = internal::zookeeper::status_code_of(rc);
  if (code == StatusCode::kUnavailable) return unavailable_error(message);
  if (code == StatusCode::kPermissionDenied) {
    // ZooKeeper's digest scheme takes any password when the session
    // authenticates; a wrong one shows here, when the nodes refuse it.
    if (authenticated()) {
      return permission_denied_error("zookeeper at " + options_.connect_string +
                                     ": authentication failed: " + what + " was refused to user '" +
                                     options_.user + "' (" + zk_error(rc) +
                                     "): a wrong password, or nodes that belong to another user");
    }
    return permission_denied_error(message +
                                   ": the node's ACL admits only some users; give "
                                   "user:password@ in the URI");
  }
  return internal_error(message);
}

Result<std::vector<std::string>> ZkStore::protected_nodes(zhandle_t* zh, const std::string& parent,
                                                          const std::string& uuid,
                                                          Deadline deadline,
                                                          std::vector<std::string>* children) {
  // A create whose reply was lost with its connection may have been
  // applied by the leader while the member we reconnected to has not caught
  // up yet: a sync first (the session's requests run in order, so the
  // listing sees everything the leader had applied by then).
  auto synced =
      start([&](const void* data) { return zoo_async(zh, parent.c_str(), &on_string, data); });
  auto listed = list_children(zh, parent);
  SIMBA_RETURN_IF_ERROR(await(synced, deadline, "syncing " + parent, {ZNONODE}));
  SIMBA_RETURN_IF_ERROR(await(listed, deadline, "listing " + parent, {ZNONODE}));
  const std::string prefix = std::string(kProtected) + uuid;
  std::vector<std::string> found;
  for (const std::string& name : listed->children) {
    if (name.rfind(prefix, 0) == 0) found.push_back(name);
  }
  if (children != nullptr) *children = std::move(listed->children);
  return found;
}

Status ZkStore::create_parents(zhandle_t* zh, std::string_view mutex, Deadline deadline) {
  return create_ancestors(zh, mutex_path(mutex) + "/x", deadline);
}

Status ZkStore::create_ancestors(zhandle_t* zh, const std::string& path, Deadline deadline) {
  std::vector<std::string> paths;
  for (std::size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1)) {
    paths.push_back(path.substr(0, at));
  }
  // Pipelined: the server applies them in order.
  std::vector<PendingPtr> pending;
  for (const std::string& parent : paths) {
    pending.push_back(create(zh, parent, nullptr, -1, ZOO_CONTAINER, acl()));
  }
  for (std::size_t i = 0; i < paths.size(); ++i) {
    SIMBA_RETURN_IF_ERROR(await(pending[i], deadline, "creating " + paths[i], {ZNODEEXISTS}));
  }
  return ok_status();
}

std::string ZkStore::heartbeat_path_of(std::int64_t session_id) const {
  char id[17];
  std::snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(session_id));
  return options_.root + "-sessions/" + id;
}

Result<SteadyClock::time_point> ZkStore::heartbeat(const std::shared_ptr<ZkHandle>& handle,
                                                   milliseconds fresh_within, Deadline deadline) {
  zhandle_t* const zh = handle->get();
  bool exists;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (heartbeat_generation_ != handle->generation()) {
      heartbeat_generation_ = handle->generation();
      heartbeat_exists_ = false;
      heartbeat_sent_ = {};
    }
    if (heartbeat_exists_ && SteadyClock::now() - heartbeat_sent_ < fresh_within) {
      return heartbeat_sent_;
    }
    exists = heartbeat_exists_;
  }
  const clientid_t* client = zoo_client_id(zh);
  const std::string path = heartbeat_path_of(client != nullptr ? client->client_id : 0);
  for (int round = 0; round < 3; ++round) {
    const SteadyClock::time_point sent = SteadyClock::now();
    PendingPtr written;
    if (exists) {
      written = start(
          [&](const void* data) { return zoo_aset(zh, path.c_str(), "", 0, -1, &on_stat, data); });
      SIMBA_RETURN_IF_ERROR(await(written, deadline, "writing " + path, {ZNONODE}));
      if (written->rc == ZNONODE) {
        exists = false;
        continue;
      }
      observe(written->stat.mtime);
    } else {
      written = create(zh, path, "", 0, ZOO_EPHEMERAL, acl());
      SIMBA_RETURN_IF_ERROR(await(written, deadline, "creating " + path, {ZNONODE, ZNODEEXISTS}));
      if (written->rc == ZNONODE) {
        SIMBA_RETURN_IF_ERROR(create_ancestors(zh, path, deadline));
        continue;
      }
      if (written->rc == ZNODEEXISTS) {
        exists = true;  // made by a call that gave up on its reply: write it
        continue;
      }
      observe(written->stat.ctime);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (heartbeat_generation_ == handle->generation()) {
      heartbeat_exists_ = true;
      heartbeat_sent_ = std::max(heartbeat_sent_, sent);
    }
    return sent;
  }
  return unavailable_error("zookeeper: cannot write the session heartbeat " + path);
}

Result<std::optional<Stat>> ZkStore::heartbeat_of(zhandle_t* zh, const Stat& node,
                                                  Deadline deadline) {
  if (node.ephemeralOwner == 0) return std::optional<Stat>();
  const std::string path = heartbeat_path_of(node.ephemeralOwner);
  auto read = exists_node(zh, path);
  SIMBA_RETURN_IF_ERROR(await(read, deadline, "reading " + path, {ZNONODE}));
  if (read->rc == ZNONODE) return std::optional<Stat>();
  return std::optional<Stat>(read->stat);
}

Result<ZkStore::TakenEntry> ZkStore::take_entry(const EntryKey& key, Deadline deadline) {
  for (;;) {
    TakenEntry taken;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& slot = entries_[key];
      if (slot == nullptr) slot = std::make_shared<Entry>();
      taken.entry = slot;
    }
    taken.turn = taken.entry->turn.take(deadline);
    if (!taken.turn.taken()) {
      return deadline_exceeded_error("zookeeper: another call for mutex '" + key.first +
                                     "' and contender '" + key.second +
                                     "' is still running at the deadline");
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second == taken.entry) return taken;
    // Released (and forgotten) while we waited: use the new entry.
  }
}

OwnerRecord ZkStore::owned(const Entry& entry, std::string_view contender_id,
                           SteadyClock::time_point call_start,
                           SteadyClock::time_point heartbeat_sent,
                           const AcquireRequest& request) const {
  // The lease runs from when the heartbeat write was sent (before the
  // server stamped it, so before anyone may evict us), and the core
  // measures what we report from when it sent this call (before
  // call_start): reporting what is left at call_start keeps its deadline
  // inside the lease.
  // (A heartbeat written during this call counts as written at its start:
  // never report more than the lease asked for.)
  const auto elapsed =
      std::max(milliseconds(0), duration_cast<milliseconds>(call_start - heartbeat_sent));
  const std::int64_t now = server_now(call_start);
  OwnerRecord record;
  record.store_now = StoreTime(now);
  record.owner.owner_id = std::string(contender_id);
  record.owner.acquired_at = StoreTime(now) - elapsed;
  record.owner.ttl_at = StoreTime(now) + request.ttl - elapsed;
  record.owner.transition_at = StoreTime(now) + request.ttl + request.transition - elapsed;
  record.owner.fencing_token = entry.czxid;
  return record;
}

OwnerRecord ZkStore::seen(const Child& lowest, const Pending& node, std::int64_t start,
                          std::int64_t now, milliseconds ask_after) const {
  OwnerRecord record;
  record.store_now = StoreTime(now);
  MutexOwner& owner = record.owner;
  owner.owner_id = node.value;
  owner.fencing_token = static_cast<std::uint64_t>(node.stat.czxid);
  owner.acquired_at = StoreTime(start);
  if (auto lease = lease_of(lowest.name)) {
    owner.ttl_at = StoreTime(start) + lease->ttl;
    owner.transition_at = StoreTime(start) + lease->ttl + lease->transition;
  } else {
    // A JVM participant: its session is its lease, whose end we cannot see.
    owner.acquired_at = StoreTime(node.stat.ctime);
    record.ask_again_at = StoreTime(now) + ask_after;
  }
  return record;
}

// ---- the calls ------------------------------------------------------------------------

Result<OwnerRecord> ZkStore::acquire(const AcquireRequest& request, Deadline deadline) {
  // A member that dies under a call (or an election) loses the connection,
  // not the session: the client moves the session to another member, and
  // the call tries again there (session() waits for it) while its deadline
  // allows, rather than report a failover as a failure. A create whose
  // reply was lost is found again by its protected name.
  for (int attempt = 0;; ++attempt) {
    t_connection_lost = false;
    Result<OwnerRecord> result = acquire_once(request, deadline);
    if (result.ok() || !t_connection_lost || attempt >= 3 ||
        SteadyClock::now() + milliseconds(20) >= deadline) {
      return result;
    }
    SIMBA_LOG(kDebug, "zookeeper: mutex '" << request.mutex << "': " << result.status()
                                           << "; trying again once reconnected");
  }
}

void ZkStore::note_contact(SteadyClock::time_point sent) {
  std::lock_guard<std::mutex> lock(mu_);
  if (sent >= session_opened_ && !expired_) contact_ = std::max(contact_, sent);
  // The member answers: no probe sent before this answer is outstanding.
  if (probe_unanswered_since_ && *probe_unanswered_since_ <= sent) probe_unanswered_since_.reset();
}

void ZkStore::run_keepalive() {
  std::unique_lock<std::mutex> lock(mu_);
  SteadyClock::time_point next_probe = SteadyClock::now();
  // The member the client has been connecting to (not connected), and
  // since when.
  std::string trying;
  SteadyClock::time_point trying_since{};
  SteadyClock::time_point left_at{};
  while (!closed_) {
    const SteadyClock::time_point now = SteadyClock::now();
    if (suspended_ && now >= hold_until_) {
      suspended_ = false;
      lock.unlock();
      SIMBA_LOG(kWarn, "zookeeper at " << options_.connect_string
                                       << ": still reconnecting at the hold bound (2/3 of the "
                                          "session timeout after the servers last heard from us); "
                                          "owners on this backend stop acting as owners");
      broadcast(MutexEvent::Kind::kLost);
      lock.lock();
      continue;
    }
    // A member that accepts connections but does not answer (a paused or
    // hung server) is left after a quarter of the session timeout, where
    // the client would wait two thirds: connected, when a probe stays
    // unanswered that long; connecting, when the client has been on the
    // same member that long. The session moves to a live member well before
    // the servers could end it.
    const milliseconds silence_limit = std::max(granted_ / 4, kMinSilenceLimit);
    if (handle_ != nullptr && !expired_ && now - left_at >= silence_limit) {
      std::shared_ptr<ZkHandle> handle = handle_;
      const bool connected = connected_;
      const std::optional<SteadyClock::time_point> unanswered = probe_unanswered_since_;
      lock.unlock();
      std::optional<milliseconds> silent;
      std::string member = current_member(handle->get());
      if (connected) {
        trying.clear();
        if (unanswered && now - *unanswered >= silence_limit) {
          silent = duration_cast<milliseconds>(now - *unanswered);
        }
      } else if (member != trying) {
        trying = member;
        trying_since = now;
      } else if (!member.empty() && now - trying_since >= silence_limit) {
        silent = duration_cast<milliseconds>(now - trying_since);
      }
      if (silent && !member.empty()) {
        leave_member(member, *silent);
        left_at = now;
        trying.clear();
      }
      handle.reset();
      lock.lock();
      if (silent) {
        probe_unanswered_since_.reset();
        continue;
      }
      // shutdown() may have come while the lock was released: its notice
      // is gone, and the wait below (no handle left) would be for ever.
      if (closed_) continue;
    }
    if (connected_ && handle_ != nullptr && now >= next_probe) {
      // A read (served by the member we talk to, no write) so that the
      // hold bound of a disconnection starts from a recent contact, and a
      // member that stops answering is noticed; it stands in for the
      // client's own ping, which it makes unnecessary.
      std::shared_ptr<ZkHandle> handle = handle_;
      const milliseconds period = std::max(granted_ / 8, milliseconds(100));
      next_probe = now + period;
      if (!probe_unanswered_since_) probe_unanswered_since_ = now;
      lock.unlock();
      // Not waited for (a stop need not wait for it); the handle keeps
      // this store alive until its completions have run.
      struct Probe {
        ZkStore* store;
        SteadyClock::time_point sent;
      };
      auto* probe = new Probe{this, SteadyClock::now()};
      const int rc = zoo_aexists(
          handle->get(), "/", 0,
          [](int result, const Stat*, const void* data) {
            CallbackScope scope;
            std::unique_ptr<Probe> done(static_cast<Probe*>(const_cast<void*>(data)));
            if (!is_connection_error(result)) done->store->note_contact(done->sent);
          },
          probe);
      if (rc != ZOK) delete probe;
      handle.reset();
      lock.lock();
      continue;
    }
    if (suspended_) {
      cv_.wait_until(lock, std::min(hold_until_, now + kMemberCheck));
    } else if (connected_) {
      cv_.wait_until(lock, std::min(next_probe, now + kMemberCheck));
    } else if (handle_ != nullptr && !expired_) {
      cv_.wait_until(lock, now + kMemberCheck);  // whom the client is trying
    } else {
      cv_.wait(lock);  // session events notify
    }
  }
}

std::string ZkStore::current_member(zhandle_t* zh) {
  // The client formats it into a buffer of its own that its I/O thread's
  // log lines also use: copied at once, and checked by parse_peer before
  // use.
  const char* member = zoo_get_current_server(zh);
  std::string copy = member != nullptr ? std::string(member) : std::string();
  return internal::zookeeper::parse_peer(copy) ? copy : std::string();
}

void ZkStore::leave_member(const std::string& member, milliseconds silent) {
  const std::optional<internal::zookeeper::TcpPeer> peer = internal::zookeeper::parse_peer(member);
  if (!peer) return;
  const int ended = internal::zookeeper::shut_down_connections_to(*peer);
  note_member_cause(member, "accepted the connection but did not answer for " +
                                format_duration(silent) + "; left for another member");
  SIMBA_LOG(kWarn, "zookeeper at " << options_.connect_string << ": member " << member
                                   << " has not answered for " << silent.count()
                                   << " ms; leaving it for another member, the session kept ("
                                   << ended << " connection(s) ended)");
}

Result<OwnerRecord> ZkStore::acquire_once(const AcquireRequest& request, Deadline deadline) {
  const std::string mutex(request.mutex);
  const std::string contender(request.contender_id);
  const SteadyClock::time_point call_start = SteadyClock::now();
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<ZkHandle> handle, session(deadline));
  zhandle_t* const zh = handle->get();
  // Our leases live in the session's heartbeat: one write per half ttl for
  // every mutex of the backend, instead of one per mutex.
  SIMBA_ASSIGN_OR_RETURN(const SteadyClock::time_point heartbeat_sent,
                         heartbeat(handle, request.ttl / 2, deadline));
  SIMBA_ASSIGN_OR_RETURN(TakenEntry taken, take_entry({mutex, contender}, deadline));
  Entry& e = *taken.entry;
  if (e.session != handle->generation()) {
    // Our node (if any) ended with its session.
    e.reset(handle->generation());
  }
  const std::string parent = mutex_path(mutex);
  const auto own_path = [&] { return parent + "/" + e.node; };

  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::string> names;
    if (e.node.empty()) {
      if (e.create_uncertain) {
        // A create whose reply we never saw: find the node by its
        // protected name before making another.
        std::vector<std::string> children;
        SIMBA_ASSIGN_OR_RETURN(std::vector<std::string> found,
                               protected_nodes(zh, parent, e.uuid, deadline, &children));
        if (!found.empty()) e.node = found.back();
        if (!e.node.empty()) {
          auto stat = exists_node(zh, own_path());
          SIMBA_RETURN_IF_ERROR(await(stat, deadline, "reading " + own_path()));
          e.czxid = static_cast<std::uint64_t>(stat->stat.czxid);
          names = std::move(children);
        }
        e.create_uncertain = false;
        if (e.node.empty()) continue;
      } else {
        {
          std::lock_guard<std::mutex> lock(mu_);
          e.uuid = lease_uuid(static_cast<std::uint32_t>(request.ttl.count()),
                              static_cast<std::uint32_t>(request.transition.count()), random_());
        }
        const std::string prefix =
            parent + "/" + std::string(kProtected) + e.uuid + "-" + std::string(kLatch);
        e.create_uncertain = true;
        // The create and the listing together: the server runs them in
        // order, so the listing includes our node. One round trip.
        auto created = create(zh, prefix, contender.data(), static_cast<int>(contender.size()),
                              ZOO_EPHEMERAL_SEQUENTIAL, acl());
        auto listed = list_children(zh, parent);
        SIMBA_RETURN_IF_ERROR(await(created, deadline, "joining " + parent, {ZNONODE}));
        if (created->rc == ZNONODE) {
          e.create_uncertain = false;
          SIMBA_RETURN_IF_ERROR(create_parents(zh, mutex, deadline));
          continue;
        }
        SIMBA_RETURN_IF_ERROR(await(listed, deadline, "listing " + parent));
        e.create_uncertain = false;
        e.node = created->value.substr(created->value.rfind('/') + 1);
        e.czxid = static_cast<std::uint64_t>(created->stat.czxid);
        observe(created->stat.ctime);
        names = listed->children;
      }
    } else if (e.owner && !e.lost) {
      // Renewal with our node watched: the heartbeat carries the lease, the
      // watch would have told us of a deletion (and nobody may evict us
      // while our heartbeat is fresh), so no request at all.
      if (watch_armed(e.own_watch)) return owned(e, contender, call_start, heartbeat_sent, request);
      // Without a watch: check that our node is still there (a read, no
      // write) and watch it again.
      auto exists = exists_node(zh, own_path());
      SIMBA_RETURN_IF_ERROR(await(exists, deadline, "renewing " + own_path(), {ZNONODE}));
      if (exists->rc == ZOK && !e.lost) {
        if (!watch_armed(e.own_watch)) arm_own_watch(zh, mutex, e, contender);
        return owned(e, contender, call_start, heartbeat_sent, request);
      }
      // Evicted or forced out: we lost that tenure.
      e.owner = false;
      e.node.clear();
      continue;
    } else {
      auto listed = list_children(zh, parent);
      SIMBA_RETURN_IF_ERROR(await(listed, deadline, "listing " + parent, {ZNONODE}));
      names = listed->children;
    }

    const std::vector<Child> children = participants(names);
    const auto ours = std::find_if(children.begin(), children.end(),
                                   [&](const Child& c) { return c.name == e.node; });
    if (ours == children.end()) {
      // Our node is gone (evicted, forced out): join again.
      e.node.clear();
      e.owner = false;
      continue;
    }
    if (ours == children.begin()) {
      // First in line: we lead, on the session's lease. Evictions check
      // that lease atomically, so no claim is needed.
      e.owner = true;
      e.lost = false;
      if (!watch_armed(e.own_watch)) arm_own_watch(zh, mutex, e, contender);
      return owned(e, contender, call_start, heartbeat_sent, request);
    }

    // A waiter: read the owner and watch our predecessor, together.
    const Child& lowest = children.front();
    const Child& predecessor = *(ours - 1);
    const std::string lowest_path = parent + "/" + lowest.name;
    auto owner_node = get_data(zh, lowest_path);
    PendingPtr watched;
    if (e.watching != predecessor.name || !watch_armed(e.watch_id)) {
      const std::uint64_t id =
          add_watch(WatchContext{WatchContext::Kind::kPredecessor, mutex, contender, 0});
      watched = exists_node(zh, parent + "/" + predecessor.name, id);
      e.watching = predecessor.name;
      e.watch_id = id;
    }
    SIMBA_RETURN_IF_ERROR(await(owner_node, deadline, "reading " + lowest_path, {ZNONODE}));
    if (watched != nullptr) {
      // ZNONODE: the predecessor left meanwhile (handled below).
      SIMBA_RETURN_IF_ERROR(await(watched, deadline, "watching " + predecessor.name, {ZNONODE}));
      if (watched->rc == ZNONODE) {
        // Gone before the watch was set (an exists watch on a missing
        // node waits for its creation): drop it and look again.
        std::lock_guard<std::mutex> lock(mu_);
        watches_.erase(e.watch_id);
        e.watching.clear();
        e.watch_id = 0;
      }
    }
    if (owner_node->rc == ZNONODE || (watched != nullptr && watched->rc == ZNONODE)) continue;

    const SteadyClock::time_point now = SteadyClock::now();
    std::int64_t start = owner_node->stat.mtime;
    if (const auto lease = lease_of(lowest.name)) {
      const milliseconds hard = lease->ttl + lease->transition;
      SIMBA_ASSIGN_OR_RETURN(std::optional<Stat> heartbeat,
                             heartbeat_of(zh, owner_node->stat, deadline));
      if (heartbeat.has_value()) {
        // The owner's session wrote its heartbeat at mtime (server clock);
        // its lease ends a hard lease later. Evict only if the heartbeat
        // is still the one we read: one transaction checks its version and
        // deletes the node, so a heartbeat written meanwhile wins.
        start = heartbeat->mtime;
        if (server_now(now) > heartbeat->mtime + hard.count()) {
          const std::string heartbeat_path = heartbeat_path_of(owner_node->stat.ephemeralOwner);
          auto p = std::make_shared<Pending>();
          p->results.resize(2);
          std::vector<zoo_op_t> ops(2);
          zoo_check_op_init(&ops[0], heartbeat_path.c_str(), heartbeat->version);
          zoo_delete_op_init(&ops[1], lowest_path.c_str(), -1);
          multi(zh, ops, p);
          SIMBA_RETURN_IF_ERROR(
              await(p, deadline, "evicting " + lowest_path, {ZNONODE, ZBADVERSION}));
          if (p->rc == ZOK) {
            SIMBA_LOG(kWarn, "zookeeper: mutex '" << mutex << "': evicted " << lowest.name
                                                  << " (owner '" << owner_node->value
                                                  << "'), whose session stopped renewing");
          }
          continue;
        }
      } else {
        // A C++ node without a heartbeat (its session never wrote one): its
        // own writes are its lease, and one never written gets a whole
        // lease from when we first saw it in front.
        bool evict;
        if (owner_node->stat.version > 0) {
          evict = server_now(now) > owner_node->stat.mtime + hard.count();
        } else {
          if (e.seen_lowest != lowest.name) {
            e.seen_lowest = lowest.name;
            e.seen_at = now;
          }
          evict = now - e.seen_at > hard;
          start = std::max<std::int64_t>(owner_node->stat.ctime, server_now(e.seen_at));
        }
        if (evict) {
          auto deleted = delete_node(zh, lowest_path, owner_node->stat.version);
          SIMBA_RETURN_IF_ERROR(
              await(deleted, deadline, "evicting " + lowest_path, {ZNONODE, ZBADVERSION}));
          continue;
        }
      }
    }
    // A JVM owner's end is unknown: the watch on our predecessor wakes us
    // when it goes; ask again a lease of ours from now in case none comes.
    return seen(lowest, *owner_node, start, server_now(now), request.ttl + request.transition);
  }
  // A race with other contenders, not a fault: the contend loop comes back
  // at once (plus its jitter) and logs it at info, not as a warning.
  return unavailable_error("zookeeper: the election of mutex '" + mutex +
                           "' kept changing during the call; try again")
      .with_retry_after(std::chrono::milliseconds(0));
}

Result<bool> ZkStore::release(std::string_view mutex_view, std::string_view contender_view,
                              std::uint64_t token, Deadline deadline) {
  const std::string mutex(mutex_view);
  const std::string contender(contender_view);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (entries_.count({mutex, contender}) == 0) return false;  // nothing of ours there
  }
  SIMBA_ASSIGN_OR_RETURN(TakenEntry taken, take_entry({mutex, contender}, deadline));
  Entry& e = *taken.entry;
  // Our node now is a later ownership than the one this release is for (its
  // token is the node's czxid): leave it.
  if (token != 0 && e.czxid != 0 && e.czxid != token) return false;
  bool released = false;
  std::shared_ptr<ZkHandle> handle;
  {
    // Our own deletion is no loss to report: drop the watch on our node
    // first (a failed delete leaves the next renewal to check and watch it
    // again).
    std::lock_guard<std::mutex> lock(mu_);
    watches_.erase(e.own_watch);
    if (handle_ != nullptr && handle_->generation() == e.session && !expired_) handle = handle_;
  }
  if (handle != nullptr && (!e.node.empty() || e.create_uncertain)) {
    zhandle_t* const zh = handle->get();
    const std::string parent = mutex_path(mutex);
    std::vector<std::string> nodes;
    if (!e.node.empty()) nodes.push_back(e.node);
    if (e.create_uncertain) {
      SIMBA_ASSIGN_OR_RETURN(std::vector<std::string> found,
                             protected_nodes(zh, parent, e.uuid, deadline));
      for (std::string& name : found) {
        if (name != e.node) nodes.push_back(std::move(name));
      }
    }
    for (const std::string& node : nodes) {
      const std::string path = parent + "/" + node;
      for (int attempt = 0;; ++attempt) {
        t_connection_lost = false;
        auto deleted = delete_node(handle->get(), path);
        Status left = await(deleted, deadline, "leaving " + path, {ZNONODE});
        if (left.ok()) {
          if (deleted->rc == ZOK && node == e.node && e.owner) released = true;
          break;
        }
        // The connection broke or timed out under the call (a server still
        // starting after a restart holds a new connection silent for 2/3 of
        // the session timeout before the client dials again; the fault runs'
        // restarts and ZookeeperFailures.RestartWhileALeaseIsHeld... met it
        // in stop()). Deleting is idempotent: ask again on the session once
        // it is back, as acquire() does. A session that ended took its
        // ephemeral nodes along.
        if (!t_connection_lost || attempt >= 3 ||
            SteadyClock::now() + milliseconds(20) >= deadline) {
          return left;
        }
        SIMBA_LOG(kDebug, "zookeeper: mutex '" << mutex << "': " << left
                                               << "; trying again once reconnected");
        SIMBA_ASSIGN_OR_RETURN(handle, session(deadline));
        if (handle->generation() != e.session) break;
      }
      if (handle->generation() != e.session) break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    watches_.erase(e.watch_id);
    auto it = entries_.find({mutex, contender});
    if (it != entries_.end() && it->second == taken.entry) entries_.erase(it);
  }
  e.reset(0);
  return released;
}

Result<ForcedRelease> ZkStore::force_release(std::string_view mutex_view, Deadline deadline) {
  const std::string mutex(mutex_view);
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<ZkHandle> handle, session(deadline));
  zhandle_t* const zh = handle->get();
  const std::string parent = mutex_path(mutex);
  ForcedRelease result;
  bool have_previous = false;
  for (int round = 0; round < kRounds; ++round) {
    auto listed = list_children(zh, parent);
    SIMBA_RETURN_IF_ERROR(await(listed, deadline, "listing " + parent, {ZNONODE}));
    if (listed->rc == ZNONODE) {
      SIMBA_RETURN_IF_ERROR(create_parents(zh, mutex, deadline));
      continue;
    }
    const std::vector<std::string> names = listed->children;
    const std::vector<Child> children = participants(names);
    if (!have_previous && !children.empty()) {
      const std::string path = parent + "/" + children.front().name;
      auto node = get_data(zh, path);
      SIMBA_RETURN_IF_ERROR(await(node, deadline, "reading " + path, {ZNONODE}));
      if (node->rc == ZNONODE) continue;
      const std::int64_t start = node->stat.version > 0 ? node->stat.mtime : node->stat.ctime;
      result.previous = seen(children.front(), *node, start, server_now()).owner;
      have_previous = true;
    }
    // Every node goes, and the mutex node is written, in one transaction:
    // its zxid is the floor, and every node left afterwards is newer.
    std::vector<std::string> paths;
    for (const std::string& name : names) paths.push_back(parent + "/" + name);
    auto p = std::make_shared<Pending>();
    p->results.resize(paths.size() + 1);
    std::vector<zoo_op_t> ops(paths.size() + 1);
    for (std::size_t i = 0; i < paths.size(); ++i)
      zoo_delete_op_init(&ops[i], paths[i].c_str(), -1);
    zoo_set_op_init(&ops.back(), parent.c_str(), "", 0, -1, &p->set_stat);
    multi(zh, ops, p);
    SIMBA_RETURN_IF_ERROR(await(p, deadline, "force-releasing " + parent, {ZNONODE}));
    if (p->rc != ZOK) continue;  // the election changed meanwhile
    // Nodes created between our listing and the transaction survived it
    // with older zxids: their sequence numbers (the parent's cversion when
    // they were made) are below the cversion before the transaction.
    const std::int64_t cversion_before =
        static_cast<std::int64_t>(p->set_stat.cversion) - static_cast<std::int64_t>(names.size());
    auto after = list_children(zh, parent);
    SIMBA_RETURN_IF_ERROR(await(after, deadline, "listing " + parent, {ZNONODE}));
    const auto survivors = participants(after->children);
    if (std::any_of(survivors.begin(), survivors.end(),
                    [&](const Child& c) { return c.sequence < cversion_before; })) {
      continue;
    }
    observe(p->set_stat.mtime);
    result.fencing_floor = static_cast<std::uint64_t>(p->set_stat.mzxid);
    result.store_now = StoreTime(p->set_stat.mtime);
    return result;
  }
  return unavailable_error("zookeeper: the election of mutex '" + mutex +
                           "' kept changing during the forced release; try again")
      .with_retry_after(std::chrono::milliseconds(0));
}

Result<OwnerRecord> ZkStore::read(std::string_view mutex_view, Deadline deadline) {
  const std::string mutex(mutex_view);
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<ZkHandle> handle, session(deadline));
  zhandle_t* const zh = handle->get();
  const std::string parent = mutex_path(mutex);
  for (int round = 0; round < kRounds; ++round) {
    // Retrievers get a child watch (id): any change of the election wakes them.
    std::uint64_t id = 0;
    if (hub_->any(mutex, [](const Slot& s) { return s.contender_id.empty(); })) {
      std::lock_guard<std::mutex> lock(mu_);
      if (children_watched_.insert(mutex).second) {
        id = ++next_watch_;
        watches_.emplace(id, WatchContext{WatchContext::Kind::kChildren, mutex, "", 0});
      }
    }
    auto listed = list_children(zh, parent, id);
    SIMBA_RETURN_IF_ERROR(await(listed, deadline, "listing " + parent, {ZNONODE}));
    if (listed->rc == ZNONODE && id != 0) {
      // No watch was left on a missing node; the next read tries again.
      std::lock_guard<std::mutex> lock(mu_);
      watches_.erase(id);
      children_watched_.erase(mutex);
    }
    const std::vector<Child> children = participants(listed->children);
    OwnerRecord record;
    if (children.empty()) {
      record.owner = MutexOwner::none();
      record.store_now = StoreTime(server_now());
      return record;
    }
    const std::string path = parent + "/" + children.front().name;
    auto node = get_data(zh, path);
    SIMBA_RETURN_IF_ERROR(await(node, deadline, "reading " + path, {ZNONODE}));
    if (node->rc == ZNONODE) continue;
    const std::int64_t now = server_now();
    // A node never written since its creation leads from its creation
    // (an owner that has not renewed yet; a waiter that just moved to the
    // front and has not claimed it yet would look expired for that moment).
    std::int64_t start = node->stat.version > 0 ? node->stat.mtime : node->stat.ctime;
    SIMBA_ASSIGN_OR_RETURN(std::optional<Stat> heartbeat, heartbeat_of(zh, node->stat, deadline));
    if (heartbeat.has_value()) start = heartbeat->mtime;
    return seen(children.front(), *node, start, now);
  }
  return unavailable_error("zookeeper: the election of mutex '" + mutex +
                           "' kept changing during the read; try again")
      .with_retry_after(std::chrono::milliseconds(0));
}

Result<std::vector<ListedMutex>> ZkStore::list(Deadline deadline) {
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<ZkHandle> handle, session(deadline));
  zhandle_t* const zh = handle->get();
  auto listed = list_children(zh, options_.root);
  SIMBA_RETURN_IF_ERROR(await(listed, deadline, "listing " + options_.root, {ZNONODE}));
  std::vector<std::string> mutexes = listed->children;
  std::sort(mutexes.begin(), mutexes.end());
  std::vector<ListedMutex> out;
  for (const std::string& mutex : mutexes) {
    SIMBA_ASSIGN_OR_RETURN(OwnerRecord record, read(mutex, deadline));
    out.push_back(ListedMutex{mutex, std::move(record)});
  }
  return out;
}

// The participants behind the lowest, in election order (the order they
// will lead in), by the ids their nodes hold. A contender with several nodes
// (one left from a create whose reply was lost) is listed once, at its
// first; the owner's id is left out.
Result<std::vector<std::string>> ZkStore::waiters(std::string_view mutex_view, Deadline deadline) {
  const std::string mutex(mutex_view);
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<ZkHandle> handle, session(deadline));
  zhandle_t* const zh = handle->get();
  const std::string parent = mutex_path(mutex);
  auto listed = list_children(zh, parent);
  SIMBA_RETURN_IF_ERROR(await(listed, deadline, "listing " + parent, {ZNONODE}));
  const std::vector<Child> children = participants(listed->children);
  std::vector<std::string> waiters;
  if (children.size() < 2) return waiters;
  // Every node's data at once (pipelined), the owner's included.
  std::vector<PendingPtr> reads;
  reads.reserve(children.size());
  for (const Child& child : children) {
    reads.push_back(get_data(zh, parent + "/" + child.name));
  }
  std::string owner;
  bool owner_seen = false;
  std::set<std::string> seen;
  for (std::size_t i = 0; i < children.size(); ++i) {
    // ZNONODE: the node left meanwhile (released, evicted, session ended).
    SIMBA_RETURN_IF_ERROR(
        await(reads[i], deadline, "reading " + parent + "/" + children[i].name, {ZNONODE}));
    if (reads[i]->rc == ZNONODE) continue;
    const std::string& id = reads[i]->value;
    if (!owner_seen) {
      // The lowest node still there leads.
      owner = id;
      owner_seen = true;
      continue;
    }
    if (id.empty() || id == owner || !seen.insert(id).second) continue;
    waiters.push_back(id);
  }
  return waiters;
}

// "host:port" of a socket address; "" for one that is neither IPv4 nor IPv6.
std::string describe_address(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(address);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) == nullptr) return {};
    return std::string(text) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (address->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(address);
    if (inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text) == nullptr) return {};
    return "[" + std::string(text) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return {};
}

Status ZkStore::inspect(StoreReport& report, Deadline deadline) {
  using Severity = StoreFinding::Severity;
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<ZkHandle> handle, session(deadline));
  zhandle_t* const zh = handle->get();
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  const sockaddr* connected =
      zookeeper_get_connected_host(zh, reinterpret_cast<sockaddr*>(&address), &length);
  const std::string member = connected != nullptr ? describe_address(connected) : std::string();
  const int granted = zoo_recv_timeout(zh);
  report.add(Severity::kOk, "session",
             "on member " + (member.empty() ? std::string("(unknown)") : member) +
                 ", session timeout " + format_duration(milliseconds(granted)) + " (asked " +
                 format_duration(options_.session_timeout) +
                 "): an owner cut off from the ensemble keeps its hold at most " +
                 format_duration(milliseconds(granted) * 2 / 3) + ", never past its lease");
  // The ensemble's configuration (ZooKeeper 3.5+): "server.N=host:quorum:
  // election:role;client" lines and a version. A standalone server has none;
  // under a chroot the node is out of reach.
  auto config = get_data(zh, "/zookeeper/config");
  SIMBA_RETURN_IF_ERROR(await(config, deadline, "reading /zookeeper/config", {ZNONODE}));
  std::vector<std::string> voters;
  int observers = 0;
  std::size_t at = 0;
  const std::string& text = config->value;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    if (line.rfind("server.", 0) != 0) continue;
    const std::size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    if (line.find(":observer") != std::string::npos) {
      ++observers;
      continue;
    }
    // The client address after ';' (the part a client URI names).
    const std::size_t semi = line.find(';', eq);
    std::string client = semi == std::string::npos ? std::string() : line.substr(semi + 1);
    if (client.rfind("0.0.0.0:", 0) == 0) {
      // Listening on every address: the client port on the quorum host.
      const std::string host = line.substr(eq + 1, line.find(':', eq) - eq - 1);
      client = host + client.substr(std::string_view("0.0.0.0").size());
    }
    voters.push_back(line.substr(0, eq) + (client.empty() ? "" : " (" + client + ")"));
  }
  const std::size_t named = static_cast<std::size_t>(
      std::count(options_.connect_string.begin(), options_.connect_string.end(), ',') + 1);
  if (config->rc == ZNONODE) {
    report.add(Severity::kNote, "members",
               "the ensemble's configuration (/zookeeper/config) is not readable here (a chroot "
               "in the connect string hides it)");
  } else if (voters.empty()) {
    report.add(Severity::kNote, "topology",
               "a standalone server: if it stops, so does every lock; an ensemble of 3 survives "
               "losing one");
  } else {
    std::string list;
    for (const std::string& v : voters) list += (list.empty() ? "" : ", ") + v;
    const bool fragile = voters.size() < 3;
    report.add(fragile ? Severity::kNote : Severity::kOk, "members",
               std::to_string(voters.size()) + " voting member(s)" +
                   (observers > 0 ? " and " + std::to_string(observers) + " observer(s)" : "") +
                   ": " + list +
                   (fragile ? "; losing one stops every lock (3 survive losing one)"
                            : "; a majority (" + std::to_string(voters.size() / 2 + 1) +
                                  ") must be up for locks to change hands"));
    if (named < voters.size()) {
      report.add(Severity::kNote, "members",
                 "the URI names " + std::to_string(named) + " of the " +
                     std::to_string(voters.size()) +
                     " voting members: a session moves only among the members it names");
    }
  }
  return ok_status();
}

// ---- the Backend -------------------------------------------------------------------

class ZookeeperBackend final : public Backend {
 public:
  explicit ZookeeperBackend(ZookeeperOptions options)
      : store_(std::make_shared<ZkStore>(std::move(options))) {
    capabilities_.push_release = true;
    capabilities_.cross_process = true;
    capabilities_.fifo = true;  // the queue of sequential nodes
    capabilities_.lists_waiters = true;
    capabilities_.ends_with_session = true;  // ephemeral nodes
    capabilities_.fencing_source = "creation zxid of the owner's ZooKeeper node";
    capabilities_.transport = "plain text";  // the C client has no TLS (kNoTls)
    capabilities_.max_mutex_length = kMaxNameBytes;
    capabilities_.max_contender_id_length = kMaxNameBytes;
    // Both are written into the node's name (LeaseUuid): 32 and 28 bits.
    capabilities_.max_ttl = milliseconds(0xffffffffLL);
    capabilities_.max_transition = milliseconds(0x0fffffffLL);
  }
  ~ZookeeperBackend() override { store_->shutdown(); }

  std::string_view scheme() const override { return "zookeeper"; }
  const Capabilities& capabilities() const override { return capabilities_; }

  Status validate_store_mutex(std::string_view mutex) const override {
    if (mutex.find('/') != std::string_view::npos || mutex == "." || mutex == "..") {
      return invalid_argument_error("mutex: '" + std::string(mutex) +
                                    "' cannot be a ZooKeeper node name (no '/', not . or ..)");
    }
    return ok_status();
  }

  Result<OwnerRecord> do_acquire_or_renew(const AcquireRequest& request,
                                          Deadline deadline) override {
    return store_->acquire(request, deadline);
  }
  Result<bool> do_release(std::string_view mutex, std::string_view contender_id,
                          std::uint64_t fencing_token, Deadline deadline) override {
    return store_->release(mutex, contender_id, fencing_token, deadline);
  }
  // The node this backend made for the contender, by its path: a later
  // acquisition's node is another one.
  Status do_leave(std::string_view mutex, std::string_view contender_id,
                  Deadline deadline) override {
    return store_->release(mutex, contender_id, 0, deadline).status();
  }
  Result<ForcedRelease> do_force_release(std::string_view mutex, Deadline deadline) override {
    return store_->force_release(mutex, deadline);
  }
  Result<OwnerRecord> do_read(std::string_view mutex, Deadline deadline) override {
    return store_->read(mutex, deadline);
  }
  Result<std::vector<ListedMutex>> do_list(Deadline deadline) override {
    return store_->list(deadline);
  }
  Result<std::vector<std::string>> do_waiters(std::string_view mutex, Deadline deadline) override {
    return store_->waiters(mutex, deadline);
  }
  Status do_inspect(StoreReport& report, Deadline deadline) override {
    return store_->inspect(report, deadline);
  }
  Result<std::unique_ptr<Subscription>> do_subscribe(
      std::string_view mutex, std::string_view contender_id,
      std::function<void(const MutexEvent&)> listener) override {
    return store_->subscribe(mutex, contender_id, std::move(listener));
  }

 private:
  std::shared_ptr<ZkStore> store_;
  Capabilities capabilities_;
};

// The checks both doors share (the URI's also makes the connect string).
Status validate_options(const ZookeeperOptions& options) {
  if (options.connect_string.empty()) {
    return invalid_argument_error("zookeeper: the connect string is empty");
  }
  if (options.root.size() < 2 || options.root.front() != '/' || options.root.back() == '/' ||
      options.root.find("//") != std::string::npos) {
    return invalid_argument_error("zookeeper: root must be an absolute path like /simba, not '" +
                                  options.root + "'");
  }
  if (options.session_timeout.count() <= 0 || options.connect_timeout.count() <= 0) {
    return invalid_argument_error(
        "zookeeper: session_timeout and connect_timeout must be positive");
  }
  if (!options.user.empty() && options.password.empty()) {
    return invalid_argument_error("zookeeper: user '" + options.user +
                                  "' has no password (give user:password@ in the URI, or "
                                  "password_file)");
  }
  if (options.user.empty() && !options.password.empty()) {
    return invalid_argument_error("zookeeper: a password without a user");
  }
  if (options.user.find(':') != std::string::npos) {
    return invalid_argument_error("zookeeper: the user must not contain ':' (digest scheme)");
  }
  if (options.tls.enabled()) return invalid_argument_error(std::string(kNoTls));
  return options.tls.validate("zookeeper");
}

}  // namespace

Result<std::shared_ptr<Backend>> new_zookeeper_backend(ZookeeperOptions options) {
  SIMBA_RETURN_IF_ERROR(validate_options(options));
  return std::shared_ptr<Backend>(std::make_shared<ZookeeperBackend>(std::move(options)));
}

Result<ZookeeperOptions> zookeeper_options_from_uri(const Uri& uri) {
  SIMBA_RETURN_IF_ERROR(internal::check_scheme(uri, "zookeeper"));
  if (uri.hosts.empty()) {
    return invalid_argument_error("zookeeper: the URI names no host: " + uri.to_string());
  }
  std::vector<std::string_view> keys = {"root", "session_timeout", "connect_timeout",
                                        "password_file", "read_acl"};
  keys.insert(keys.end(), std::begin(kTlsQueryKeys), std::end(kTlsQueryKeys));
  SIMBA_RETURN_IF_ERROR(uri.check_query_keys(keys));
  ZookeeperOptions options;
  // Digest authentication: user:password@, or user@ and password_file.
  if (uri.user) options.user = *uri.user;
  if (options.user.empty() && (uri.password || uri.query_value("password_file"))) {
    return invalid_argument_error("zookeeper: a password needs a user (user:password@host): " +
                                  uri.to_string());
  }
  if (auto file = uri.query_value("password_file")) {
    if (uri.password) {
      return invalid_argument_error(
          "zookeeper: give the password in the URI or in password_file, not both");
    }
    SIMBA_ASSIGN_OR_RETURN(options.password, read_secret_file("zookeeper", "password_file", *file));
  } else if (uri.password) {
    options.password = *uri.password;
  }
  if (auto read_acl = uri.query_value("read_acl")) {
    if (options.user.empty()) {
      return invalid_argument_error(
          "zookeeper: read_acl needs a user (without one every node is open)");
    }
    if (*read_acl == "creator") {
      options.read_acl = ZookeeperOptions::ReadAcl::kCreator;
    } else if (*read_acl == "anyone") {
      options.read_acl = ZookeeperOptions::ReadAcl::kAnyone;
    } else {
      return invalid_argument_error("zookeeper: read_acl must be creator or anyone, not '" +
                                    *read_acl + "'");
    }
  }
  // TLS is refused before its files are looked at; tls=off is fine.
  const std::optional<std::string> tls_mode = uri.query_value("tls");
  const bool tls_files =
      std::any_of(std::begin(kTlsQueryKeys) + 1, std::end(kTlsQueryKeys),
                  [&](std::string_view key) { return uri.query_value(key).has_value(); });
  if ((tls_mode && *tls_mode != "off") || (!tls_mode && tls_files)) {
    return invalid_argument_error(std::string(kNoTls));
  }
  SIMBA_ASSIGN_OR_RETURN(options.tls, tls_options_from_uri(uri, "zookeeper"));
  std::string hosts;
  for (const UriHost& host : uri.hosts) {
    if (!hosts.empty()) hosts += ",";
    const bool v6 = host.host.find(':') != std::string::npos;
    hosts +=
        (v6 ? "[" + host.host + "]" : host.host) + ":" + std::to_string(host.port.value_or(2181));
  }
  if (!uri.path.empty() && uri.path != "/") {
    if (uri.path.back() == '/' || uri.path.find("//") != std::string::npos) {
      return invalid_argument_error("zookeeper: bad chroot '" + uri.path + "'");
    }
    hosts += uri.path;
  }
  options.connect_string = hosts;
  if (auto root = uri.query_value("root")) options.root = *root;
  SIMBA_RETURN_IF_ERROR(internal::read_positive_duration(uri, "zookeeper", "session_timeout",
                                                         &options.session_timeout));
  SIMBA_RETURN_IF_ERROR(internal::read_positive_duration(uri, "zookeeper", "connect_timeout",
                                                         &options.connect_timeout));
  SIMBA_RETURN_IF_ERROR(validate_options(options));
  return options;
}

}  // namespace simba
