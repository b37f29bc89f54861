// Keyed locks inside one process: a fair FIFO queue per key, no store.
// Backends opened with the same name share their keys (as memory:// stores
// do), so two providers in one process exclude each other.
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "simba/backends/memory.h"
#include "simba/keyed_backend.h"

namespace simba {
namespace {

// One waiting acquirer, queued until the holder before it lets go.
struct Waiter {
  bool granted = false;
  std::uint64_t token = 0;
};

struct KeyQueue {
  bool held = false;
  std::deque<Waiter*> waiters;  // in arrival order
};

// The keys of one memory:// name.
class KeySpace {
 public:
  // Takes `key` now if nobody holds or waits for it; else queues and waits.
  // Returns the token, 0 on timeout, or kCancelled.
  Result<std::uint64_t> acquire(const std::string& key, Deadline wait_deadline,
                                const std::stop_token& cancel) {
    std::unique_lock<std::mutex> lock(mu_);
    KeyQueue& queue = keys_[key];
    if (!queue.held && queue.waiters.empty()) {
      queue.held = true;
      return ++last_token_;
    }
    if (cancel.stop_requested())
      return cancelled_error("acquiring key '" + key + "' was cancelled");
    if (std::chrono::steady_clock::now() >= wait_deadline) return std::uint64_t{0};
    Waiter self;
    queue.waiters.push_back(&self);
    // The queue entry stays valid while we wait: a key is erased only when
    // nobody holds or waits for it.
    const auto granted = [&] { return self.granted; };
    if (wait_deadline == Deadline::max()) {
      cv_.wait(lock, cancel, granted);
    } else {
      cv_.wait_until(lock, cancel, wait_deadline, granted);
    }
    if (self.granted) {
      if (!cancel.stop_requested()) return self.token;
      // Granted as the caller gave up: pass it on rather than hand over a
      // hold nobody wants.
      release_locked(key);
      return cancelled_error("acquiring key '" + key + "' was cancelled");
    }
    KeyQueue& mine = keys_[key];
    std::erase(mine.waiters, &self);
    if (cancel.stop_requested())
      return cancelled_error("acquiring key '" + key + "' was cancelled");
    return std::uint64_t{0};
  }

  void release(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    release_locked(key);
  }

 private:
  void release_locked(const std::string& key) {
    auto it = keys_.find(key);
    if (it == keys_.end() || !it->second.held) return;
    KeyQueue& queue = it->second;
    if (queue.waiters.empty()) {
      keys_.erase(it);  // nothing to remember: tokens come from one counter
      return;
    }
    Waiter* next = queue.waiters.front();
    queue.waiters.pop_front();
    next->granted = true;
    next->token = ++last_token_;
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable_any cv_;
  std::unordered_map<std::string, KeyQueue> keys_;
  // One counter for every key of the name: strictly increasing per key, and
  // nothing to keep for a key nobody holds.
  std::uint64_t last_token_ = 0;
};

class MemoryKeyHold final : public KeyHold {
 public:
  MemoryKeyHold(std::shared_ptr<KeySpace> space, std::string key, std::uint64_t token)
      : space_(std::move(space)), key_(std::move(key)), token_(token) {}
  ~MemoryKeyHold() override {
    if (!released_) space_->release(key_);
  }
  std::uint64_t fencing_token() const override { return token_; }
  Status release(Deadline) override {
    if (!released_) {
      released_ = true;
      space_->release(key_);
    }
    return ok_status();
  }

 private:
  const std::shared_ptr<KeySpace> space_;
  const std::string key_;
  const std::uint64_t token_;
  bool released_ = false;
};

class MemoryKeyedLockBackend final : public KeyedLockBackend {
 public:
  explicit MemoryKeyedLockBackend(std::shared_ptr<KeySpace> space) : space_(std::move(space)) {
    capabilities_.mechanism = "per-key FIFO queue in this process";
    capabilities_.cross_process = false;
    capabilities_.fencing_tokens = true;
    capabilities_.fifo = true;
    capabilities_.push_handoff = true;
    capabilities_.freed_with_session = true;  // the process is the session
    capabilities_.max_key_length = 4096;
  }
  std::string_view scheme() const override { return "memory"; }
  const KeyedLockCapabilities& capabilities() const override { return capabilities_; }
  Result<std::unique_ptr<KeyHold>> acquire(const KeyAcquireRequest& request) override {
    SIMBA_RETURN_IF_ERROR(validate_key(request.key));
    const std::string key(request.key);
    SIMBA_ASSIGN_OR_RETURN(std::uint64_t token,
                           space_->acquire(key, request.wait_deadline, request.cancel));
    if (token == 0) return std::unique_ptr<KeyHold>();
    return std::unique_ptr<KeyHold>(std::make_unique<MemoryKeyHold>(space_, key, token));
  }

 private:
  const std::shared_ptr<KeySpace> space_;
  KeyedLockCapabilities capabilities_;
};

std::mutex spaces_mu;
// By name; a space lives while a backend uses it.
std::map<std::string, std::weak_ptr<KeySpace>>& spaces() {
  static auto* spaces = new std::map<std::string, std::weak_ptr<KeySpace>>();
  return *spaces;
}

}  // namespace

Result<std::shared_ptr<KeyedLockBackend>> new_memory_keyed_lock_backend(std::string name) {
  if (name.empty()) return invalid_argument_error("memory keyed locks need a name (memory://NAME)");
  std::lock_guard<std::mutex> lock(spaces_mu);
  std::shared_ptr<KeySpace> space = spaces()[name].lock();
  if (space == nullptr) {
    space = std::make_shared<KeySpace>();
    spaces()[name] = space;
  }
  return std::shared_ptr<KeyedLockBackend>(std::make_shared<MemoryKeyedLockBackend>(space));
}

Result<std::shared_ptr<KeyedLockBackend>> new_memory_keyed_lock_backend(
    MemoryKeyedOptions options) {
  return new_memory_keyed_lock_backend(std::move(options.name));
}

Result<MemoryKeyedOptions> memory_keyed_options_from_uri(const Uri& uri) {
  SIMBA_ASSIGN_OR_RETURN(MemoryOptions memory, memory_options_from_uri(uri));
  return MemoryKeyedOptions{std::move(memory.name)};
}

}  // namespace simba
