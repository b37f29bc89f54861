// The in-process reference store. Exact by construction (one mutex guards
// every decision), push-capable, and driven by an injected clock so the core
// can be tested on virtual time.
//
// Waiters: a contender that is refused while it listens for the release (it
// subscribed with its id, as the core's contenders do) joins its mutex's
// line, in the order of its first refusal, until it acquires, calls
// release, or stops listening. Nobody is served from that line (any asker
// may take a free mutex: not fifo); it is only what waiters() reports, as
// Redis's queue of listening contenders is.
#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "simba/backends/memory.h"

namespace simba {
namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

// One named store, shared by every MemoryBackend opened with its name.
class MemoryStore {
 public:
  explicit MemoryStore(std::shared_ptr<Clock> clock)
      : clock_(std::move(clock)),
        origin_local_(clock_->now()),
        // Store time looks like epoch milliseconds, like other stores', but
        // advances with the injected clock.
        origin_epoch_(
            duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch())) {}

  StoreTime store_now() const {
    return origin_epoch_ + duration_cast<milliseconds>(clock_->now() - origin_local_);
  }

  OwnerRecord acquire_or_renew(const AcquireRequest& request) {
    std::lock_guard<std::mutex> lock(mu_);
    const StoreTime now = store_now();
    Row& row = rows_[std::string(request.mutex)];
    const bool free = row.owner.owner_id.empty() || row.owner.transition_at < now;
    const bool mine = !free && row.owner.owner_id == request.contender_id;
    if (free || mine) {
      if (free) {
        row.owner.owner_id = std::string(request.contender_id);
        row.owner.fencing_token = ++row.fence;
      }
      row.owner.acquired_at = now;
      row.owner.ttl_at = now + request.ttl;
      row.owner.transition_at = now + request.ttl + request.transition;
      forget(&row, request.contender_id);
    } else if (listens_locked(request.mutex, request.contender_id) &&
               std::find(row.waiting.begin(), row.waiting.end(), request.contender_id) ==
                   row.waiting.end()) {
      row.waiting.emplace_back(request.contender_id);
    }
    return OwnerRecord{visible(row.owner, now), now};
  }

  bool release(std::string_view mutex, std::string_view contender_id, std::uint64_t token,
               std::vector<std::function<void(const MutexEvent&)>>* to_notify) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = rows_.find(mutex);
    if (it == rows_.end()) return false;
    // A release from a waiter means it gives up waiting.
    forget(&it->second, contender_id);
    if (it->second.owner.owner_id != contender_id) return false;
    if (token != 0 && it->second.owner.fencing_token != token) return false;
    it->second.owner = MutexOwner::none();
    listeners_locked(mutex, to_notify);
    return true;
  }

  // A waiter gives up: out of the line, whatever it owns left alone.
  void leave(std::string_view mutex, std::string_view contender_id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = rows_.find(mutex);
    if (it != rows_.end()) forget(&it->second, contender_id);
  }

  ForcedRelease force_release(std::string_view mutex,
                              std::vector<std::function<void(const MutexEvent&)>>* to_notify) {
    std::lock_guard<std::mutex> lock(mu_);
    const StoreTime now = store_now();
    Row& row = rows_[std::string(mutex)];
    ForcedRelease result;
    result.previous = visible(row.owner, now);
    result.store_now = now;
    // Burn a token: the next owner's token exceeds every one handed out.
    result.fencing_floor = ++row.fence;
    row.owner = MutexOwner::none();
    listeners_locked(mutex, to_notify);
    return result;
  }

  OwnerRecord read(std::string_view mutex) const {
    std::lock_guard<std::mutex> lock(mu_);
    const StoreTime now = store_now();
    auto it = rows_.find(mutex);
    if (it == rows_.end()) return OwnerRecord{MutexOwner::none(), now};
    return OwnerRecord{visible(it->second.owner, now), now};
  }

  std::vector<ListedMutex> list() const {
    std::lock_guard<std::mutex> lock(mu_);
    const StoreTime now = store_now();
    std::vector<ListedMutex> out;
    out.reserve(rows_.size());
    for (const auto& [name, row] : rows_) {
      out.push_back(ListedMutex{name, OwnerRecord{visible(row.owner, now), now}});
    }
    return out;
  }

  // The contenders in line for `mutex` (see the top of this file), the
  // owner left out.
  std::vector<std::string> waiters(std::string_view mutex) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = rows_.find(mutex);
    if (it == rows_.end()) return {};
    const MutexOwner owner = visible(it->second.owner, store_now());
    std::vector<std::string> out;
    for (const std::string& id : it->second.waiting) {
      if (id != owner.owner_id) out.push_back(id);
    }
    return out;
  }

  std::uint64_t subscribe(std::string_view mutex, std::string_view contender_id,
                          std::function<void(const MutexEvent&)> listener) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::uint64_t id = next_subscription_++;
    subscribers_[std::string(mutex)].emplace(
        id, Subscriber{std::string(contender_id), std::move(listener)});
    return id;
  }

  void unsubscribe(const std::string& mutex, std::uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = subscribers_.find(mutex);
    if (it == subscribers_.end()) return;
    auto sub = it->second.find(id);
    if (sub == it->second.end()) return;
    const std::string contender_id = std::move(sub->second.contender_id);
    it->second.erase(sub);
    if (it->second.empty()) subscribers_.erase(it);
    // A contender that no longer listens leaves the line.
    auto row = rows_.find(mutex);
    if (row != rows_.end() && !contender_id.empty() && !listens_locked(mutex, contender_id)) {
      forget(&row->second, contender_id);
    }
  }

 private:
  struct Row {
    MutexOwner owner;
    std::uint64_t fence = 0;  // the last token handed out for this mutex
    // Contenders refused while listening, first refused first.
    std::vector<std::string> waiting;
  };

  struct Subscriber {
    std::string contender_id;  // empty: a retriever
    std::function<void(const MutexEvent&)> listener;
  };

  static void forget(Row* row, std::string_view contender_id) {
    auto& waiting = row->waiting;
    waiting.erase(std::remove(waiting.begin(), waiting.end(), contender_id), waiting.end());
  }

  // Whether `contender_id` has a subscription to `mutex`.
  bool listens_locked(std::string_view mutex, std::string_view contender_id) const {
    auto it = subscribers_.find(mutex);
    if (it == subscribers_.end()) return false;
    return std::any_of(it->second.begin(), it->second.end(), [&](const auto& entry) {
      return entry.second.contender_id == contender_id;
    });
  }

  void listeners_locked(std::string_view mutex,
                        std::vector<std::function<void(const MutexEvent&)>>* out) const {
    auto it = subscribers_.find(mutex);
    if (it == subscribers_.end()) return;
    for (const auto& [id, sub] : it->second) out->push_back(sub.listener);
  }

  // An expired lease reads as "no owner", as it would from a store that
  // expires keys.
  static MutexOwner visible(const MutexOwner& owner, StoreTime now) {
    if (owner.owner_id.empty() || owner.transition_at < now) return MutexOwner::none();
    return owner;
  }

  const std::shared_ptr<Clock> clock_;
  const Clock::TimePoint origin_local_;
  const StoreTime origin_epoch_;
  mutable std::mutex mu_;
  std::map<std::string, Row, std::less<>> rows_;
  std::map<std::string, std::map<std::uint64_t, Subscriber>, std::less<>> subscribers_;
  std::uint64_t next_subscription_ = 1;
};

// Named stores live as long as some backend uses them.
std::shared_ptr<MemoryStore> find_or_create_store(const std::string& name,
                                                  const std::shared_ptr<Clock>& clock) {
  static std::mutex mu;
  static auto* stores = new std::unordered_map<std::string, std::weak_ptr<MemoryStore>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& weak = (*stores)[name];
  if (auto store = weak.lock()) return store;
  auto store = std::make_shared<MemoryStore>(clock);
  weak = store;
  return store;
}

class MemorySubscription final : public Subscription {
 public:
  MemorySubscription(std::shared_ptr<MemoryStore> store, std::string mutex, std::uint64_t id)
      : store_(std::move(store)), mutex_(std::move(mutex)), id_(id) {}
  ~MemorySubscription() override { store_->unsubscribe(mutex_, id_); }

 private:
  std::shared_ptr<MemoryStore> store_;
  std::string mutex_;
  std::uint64_t id_;
};

class MemoryBackend final : public Backend {
 public:
  explicit MemoryBackend(std::shared_ptr<MemoryStore> store) : store_(std::move(store)) {
    capabilities_.push_release = true;
    capabilities_.cross_process = false;
    capabilities_.lists_waiters = true;
    capabilities_.fencing_source = "per-mutex counter in process memory";
    capabilities_.transport = "in process";
    capabilities_.max_mutex_length = 255;
    capabilities_.max_contender_id_length = 128;
  }

  std::string_view scheme() const override { return "memory"; }
  const Capabilities& capabilities() const override { return capabilities_; }

  Result<OwnerRecord> do_acquire_or_renew(const AcquireRequest& request, Deadline) override {
    return store_->acquire_or_renew(request);
  }

  Result<bool> do_release(std::string_view mutex, std::string_view contender_id,
                          std::uint64_t fencing_token, Deadline) override {
    std::vector<std::function<void(const MutexEvent&)>> to_notify;
    const bool released = store_->release(mutex, contender_id, fencing_token, &to_notify);
    // Listeners run outside the store's lock: they may call back into it.
    const MutexEvent event{MutexEvent::Kind::kReleased, std::string(mutex),
                           std::string(contender_id)};
    for (auto& listener : to_notify) listener(event);
    return released;
  }

  Status do_inspect(StoreReport& report, Deadline) override {
    report.add(StoreFinding::Severity::kNote, "topology",
               "in this process only: other processes have stores of their own");
    return ok_status();
  }

  Result<ForcedRelease> do_force_release(std::string_view mutex, Deadline) override {
    std::vector<std::function<void(const MutexEvent&)>> to_notify;
    ForcedRelease result = store_->force_release(mutex, &to_notify);
    // The holder hears at once that its hold was taken away (not at its
    // next renewal); then waiters may try.
    if (result.previous.has_owner_id()) {
      MutexEvent lost{MutexEvent::Kind::kLost, std::string(mutex), result.previous.owner_id,
                      result.previous.fencing_token};
      lost.forced = true;
      for (auto& listener : to_notify) listener(lost);
    }
    const MutexEvent event{MutexEvent::Kind::kReleased, std::string(mutex),
                           result.previous.owner_id};
    for (auto& listener : to_notify) listener(event);
    return result;
  }

  Result<OwnerRecord> do_read(std::string_view mutex, Deadline) override {
    return store_->read(mutex);
  }

  Status do_leave(std::string_view mutex, std::string_view contender_id, Deadline) override {
    store_->leave(mutex, contender_id);
    return ok_status();
  }

  Result<std::vector<ListedMutex>> do_list(Deadline) override { return store_->list(); }

  Result<std::vector<std::string>> do_waiters(std::string_view mutex, Deadline) override {
    return store_->waiters(mutex);
  }

  // Every subscriber hears every release; the contender id only says who
  // waits (see waiters()).
  Result<std::unique_ptr<Subscription>> do_subscribe(
      std::string_view mutex, std::string_view contender_id,
      std::function<void(const MutexEvent&)> listener) override {
    const std::uint64_t id = store_->subscribe(mutex, contender_id, std::move(listener));
    return std::unique_ptr<Subscription>(
        std::make_unique<MemorySubscription>(store_, std::string(mutex), id));
  }

 private:
  std::shared_ptr<MemoryStore> store_;
  Capabilities capabilities_;
};

}  // namespace

Result<std::shared_ptr<Backend>> new_memory_backend(MemoryOptions options) {
  if (options.name.empty()) {
    return invalid_argument_error("memory: the store name must not be empty (memory://NAME)");
  }
  auto clock = options.clock ? options.clock : Clock::steady();
  return std::shared_ptr<Backend>(
      std::make_shared<MemoryBackend>(find_or_create_store(options.name, clock)));
}

Result<MemoryOptions> memory_options_from_uri(const Uri& uri) {
  if (uri.scheme != "memory") {
    return invalid_argument_error("memory: expected a memory:// URI, got '" + uri.to_string() +
                                  "'");
  }
  if (uri.user || uri.password) {
    return invalid_argument_error("memory: a memory:// URI takes no user or password");
  }
  if (uri.hosts.size() != 1 || uri.hosts[0].host.empty()) {
    return invalid_argument_error("memory: expected memory://NAME, got '" + uri.to_string() + "'");
  }
  if (uri.hosts[0].port) return invalid_argument_error("memory: memory://NAME takes no port");
  if (!uri.path.empty() && uri.path != "/") {
    return invalid_argument_error("memory: memory://NAME takes no path (got '" + uri.path + "')");
  }
  SIMBA_RETURN_IF_ERROR(uri.check_query_keys({}));
  MemoryOptions options;
  options.name = uri.hosts[0].host;
  return options;
}

}  // namespace simba
