// A JVM Simba process and C++ processes contending for one mutex on one
// Redis. The JVM side is played by FakeJvmContender: raw commands and Lua
// scripts with exactly the effects of JVM Simba's mutex_acquire.lua,
// mutex_guard.lua and mutex_release.lua, driven by the loop of
// SpringRedisMutexContendService (v3.1.1+), bugs included
// (simba-behaviour.md §3.2, §8.2). The C++ side is the real library.
//
// Every test runs its own durable redis-server (appendonly + fsync always,
// so the backend's restart guard does not hold acquisitions back) with the
// default key prefix `simba`: JVM Simba's names are fixed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

#include "simba/contend_period.h"
#include "simba/contend_service.h"
#include "simba/contender.h"
#include "testing/critical_section.h"
#include "testing/latch.h"
#include "testing/status_matchers.h"
#include "testing/store_test_helpers.h"
#include "testing/test_servers.h"
#include "testing/test_util.h"
#include "tests/redis/raw_redis.h"

namespace simba::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

// ---- JVM Simba's scripts --------------------------------------------------------
//
// As JVM Simba calls them: KEYS[1] = "{M}" and the scripts prefix "simba:"
// themselves; ARGV = contender id [, ttl + transition in ms]. Replies are
// "<owner>@@<ms>" ("@@": no owner) and 1/0 for release.

// §3.2.2. A successful acquisition does not remove the acquirer from the
// queue (JVM Simba's behaviour, kept on purpose).
constexpr char kJvmAcquire[] = R"lua(
redis.replicate_commands()
local lock = 'simba:' .. KEYS[1]
local queue = lock .. ':contender'
local id, px = ARGV[1], ARGV[2]
if redis.call('SET', lock, id, 'NX', 'PX', px) then
  redis.call('PUBLISH', lock, 'acquired@@' .. id)
  return id .. '@@' .. px
end
local seconds = redis.call('TIME')[1]
redis.call('ZADD', queue, 'NX', seconds, id)
local owner = redis.call('GET', lock)
local pttl = redis.call('PTTL', lock)
return owner .. '@@' .. pttl
)lua";

// §3.2.3. No publish on renewal.
constexpr char kJvmGuard[] = R"lua(
local lock = 'simba:' .. KEYS[1]
local id, px = ARGV[1], ARGV[2]
local function current()
  local owner = redis.call('GET', lock)
  if not owner then return '@@' end
  return owner .. '@@' .. redis.call('PTTL', lock)
end
if redis.call('GET', lock) ~= id then return current() end
if redis.call('SET', lock, id, 'XX', 'PX', px) then return id .. '@@' .. px end
return current()
)lua";

// §3.2.4. Pops the oldest waiter (lowest score, ties: lowest member) and
// wakes it without checking that anybody listens: a dead waiter, or the
// releaser's own stale entry, swallows the wake-up (kept on purpose).
constexpr char kJvmRelease[] = R"lua(
local lock = 'simba:' .. KEYS[1]
local queue = lock .. ':contender'
local id = ARGV[1]
if redis.call('GET', lock) ~= id then
  redis.call('ZREM', queue, id)
  return 0
end
redis.call('DEL', lock)
local waiters = redis.call('ZREVRANGE', queue, 0, -1)
local waiter = waiters[#waiters]
if not waiter then return 1 end
redis.call('ZREM', queue, waiter)
redis.call('PUBLISH', lock .. ':' .. waiter, 'released@@' .. id)
return 1
)lua";

std::string lock_key(const std::string& mutex) { return "simba:{" + mutex + "}"; }
std::string queue_key(const std::string& mutex) { return lock_key(mutex) + ":contender"; }

// Splits "<a>@@<b>" at its first "@@" (JVM Simba requires exactly two parts;
// ids never contain "@@").
bool split_pair(const std::string& text, std::string* first, std::string* second) {
  const std::size_t at = text.find("@@");
  if (at == std::string::npos || text.find("@@", at + 2) != std::string::npos) return false;
  *first = text.substr(0, at);
  *second = text.substr(at + 2);
  return true;
}

// ---- the JVM contender ------------------------------------------------------------

// One JVM Simba contender: SpringRedisMutexContendService with its own
// listener connection (a thread reads it) and one scheduling thread, with
// the JVM's local view of the owner (id plus transitionAt on the local
// clock). Callbacks run on those threads, under the contender's lock, in
// the order of the owner updates (JVM Simba runs them serialized too).
class FakeJvmContender {
 public:
  struct Hooks {
    std::function<void()> on_acquired;
    std::function<void()> on_released;
  };
  struct Message {
    std::string channel;
    std::string payload;
  };

  FakeJvmContender(std::string uri, std::string mutex, std::string id, milliseconds ttl,
                   milliseconds transition, Hooks hooks = {})
      : uri_(std::move(uri)),
        mutex_(std::move(mutex)),
        id_(std::move(id)),
        ttl_(ttl),
        transition_(transition),
        hooks_(std::move(hooks)),
        commands_(uri_),
        random_(std::random_device{}()) {}

  ~FakeJvmContender() {
    if (running()) stop();
  }

  const std::string& id() const { return id_; }
  std::string personal_channel() const { return lock_key(mutex_) + ":" + id_; }

  // startContend: listen on the broadcast and the personal channel, then
  // attempt at once. Returns once the server has confirmed both
  // subscriptions, so a release from now on reaches us.
  void start() {
    subscriber_ = std::make_unique<RawRedis>(uri_);
    subscriber_->send({"SUBSCRIBE", lock_key(mutex_), personal_channel()});
    subscriber_->flush();
    int confirmed = 0;
    const auto until = steady_clock::now() + seconds(5);
    while (confirmed < 2) {
      if (steady_clock::now() > until) throw std::runtime_error("SUBSCRIBE not confirmed");
      auto reply = subscriber_->poll(100);
      if (reply && reply->elements.size() == 3 && reply->elements[0].str == "subscribe") {
        ++confirmed;
      }
    }
    std::uint64_t gen = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      gen = ++generation_;
      active_ = true;
      view_ = Owner{};
      schedule_locked(milliseconds(0));
    }
    stop_reader_ = false;
    reader_ = std::thread([this] { read_messages(); });
    loop_ = std::thread([this, gen] { loop(gen); });
  }

  // stopContend: stop listening first (so we never receive our own
  // wake-up), drop the pending attempt, run the release script (which may
  // wake one waiter), then apply "no owner" locally.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      active_ = false;
      pending_.reset();
    }
    cv_.notify_all();
    stop_reader_ = true;
    reader_.join();  // it unsubscribes before it returns
    subscriber_.reset();
    try {
      release();
    } catch (const std::exception&) {
      // JVM Simba logs it; the lease expires at the store.
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      notify_owner_locked(Owner{});
    }
    loop_.join();
  }

  bool running() const { return loop_.joinable(); }

  // The local view (JVM's isOwner: the cached id, no time check).
  bool is_owner() const {
    std::lock_guard<std::mutex> lock(mu_);
    return view_.id == id_;
  }
  std::string owner_id() const {
    std::lock_guard<std::mutex> lock(mu_);
    return view_.id;
  }
  std::vector<Message> messages() const {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }
  // The reply of the latest acquire/guard script.
  std::string last_reply() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_reply_;
  }
  int attempts() const {
    std::lock_guard<std::mutex> lock(mu_);
    return attempts_;
  }

 private:
  struct Owner {
    std::string id;  // "" = NONE
    steady_clock::time_point transition_at{};
  };

  std::string px() const { return std::to_string((ttl_ + transition_).count()); }

  RawReply eval(const char* script, std::vector<std::string> argv) {
    std::vector<std::string> args = {"EVAL", script, "1", "{" + mutex_ + "}"};
    args.insert(args.end(), argv.begin(), argv.end());
    std::lock_guard<std::mutex> lock(commands_mu_);
    return commands_.call(args);
  }

  void release() { eval(kJvmRelease, {id_}); }

  // One attempt: guard when we believe we own the mutex, else acquire.
  // §3.2.5: the owner's transitionAt is local receipt time + the reply's ms.
  std::optional<Owner> attempt(bool guard) {
    const RawReply reply = eval(guard ? kJvmGuard : kJvmAcquire, {id_, px()});
    const auto received = steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_reply_ = reply.str;
      ++attempts_;
    }
    if (reply.type != REDIS_REPLY_STRING) return std::nullopt;  // an "exception"
    if (reply.str == "@@") return Owner{};
    std::string owner;
    std::string ms;
    if (!split_pair(reply.str, &owner, &ms)) return std::nullopt;
    return Owner{owner, received + milliseconds(std::stoll(ms))};
  }

  // ContendPeriod: the owner comes back at ttlAt (= transitionAt - its
  // transition, with the local config), others at transitionAt + J.
  milliseconds next_delay_locked(const Owner& owner) {
    const auto now = steady_clock::now();
    if (owner.id.empty()) return milliseconds(0);  // NONE: all zeros, clamps to 0
    milliseconds delay;
    if (owner.id == id_) {
      delay = std::chrono::duration_cast<milliseconds>(owner.transition_at - transition_ - now);
    } else {
      const bool zero_transition = transition_ == milliseconds(0);
      std::uniform_int_distribution<long long> jitter(
          zero_transition ? 0 : ContendPeriod::kJitterMin, ContendPeriod::kJitterMax - 1);
      delay = std::chrono::duration_cast<milliseconds>(owner.transition_at - now) +
              milliseconds(jitter(random_));
    }
    return std::max(delay, milliseconds(0));
  }

  // At most one pending attempt: a new one replaces it.
  void schedule_locked(milliseconds delay) {
    if (!active_) return;
    pending_ = steady_clock::now() + delay;
    cv_.notify_all();
  }

  void notify_owner_locked(const Owner& owner) {
    const bool was = view_.id == id_;
    const bool is = owner.id == id_;
    const bool changed = view_.id != owner.id;
    view_ = owner;
    if (changed && was && hooks_.on_released) hooks_.on_released();
    if (changed && is && hooks_.on_acquired) hooks_.on_acquired();
  }

  void loop(std::uint64_t gen) {
    std::unique_lock<std::mutex> lock(mu_);
    while (active_ && generation_ == gen) {
      if (!pending_) {
        cv_.wait(lock);
        continue;
      }
      if (steady_clock::now() < *pending_) {
        cv_.wait_until(lock, *pending_);
        continue;
      }
      pending_.reset();
      const bool guard = view_.id == id_;
      lock.unlock();
      std::optional<Owner> owner;
      try {
        owner = attempt(guard);
      } catch (const std::exception&) {
        owner.reset();
      }
      lock.lock();
      if (active_ && generation_ == gen) {
        if (owner) {
          notify_owner_locked(*owner);
          schedule_locked(next_delay_locked(*owner));
        } else {
          // After an exception: revoke if owner, retry after ttl.
          if (view_.id == id_) notify_owner_locked(Owner{});
          schedule_locked(ttl_);
        }
      } else if (owner && owner->id == id_) {
        // A result that lands after stop: give the mutex back.
        lock.unlock();
        try {
          release();
        } catch (const std::exception&) {
        }
        lock.lock();
      }
    }
  }

  // The listener: `released@@X` -> forget the owner and attempt at once;
  // `acquired@@X` -> X owns it until now + ttl + transition (local config).
  void read_messages() {
    try {
      while (!stop_reader_) {
        auto reply = subscriber_->poll(10);
        if (!reply || reply->elements.size() != 3 || reply->elements[0].str != "message") {
          continue;
        }
        on_message(reply->elements[1].str, reply->elements[2].str);
      }
      subscriber_->send({"UNSUBSCRIBE", lock_key(mutex_), personal_channel()});
      subscriber_->flush();
      const auto until = steady_clock::now() + seconds(5);
      while (steady_clock::now() < until) {
        auto reply = subscriber_->poll(100);
        if (reply && reply->elements.size() == 3 && reply->elements[0].str == "unsubscribe" &&
            reply->elements[2].integer == 0) {
          return;
        }
      }
    } catch (const std::exception&) {
      // The connection failed: nothing listens any more either.
    }
  }

  void on_message(const std::string& channel, const std::string& payload) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!active_) return;
    messages_.push_back(Message{channel, payload});
    std::string event;
    std::string who;
    if (!split_pair(payload, &event, &who)) return;
    if (event == "released") {
      notify_owner_locked(Owner{});
      schedule_locked(milliseconds(0));
    } else if (event == "acquired") {
      notify_owner_locked(Owner{who, steady_clock::now() + ttl_ + transition_});
    }
  }

  const std::string uri_;
  const std::string mutex_;
  const std::string id_;
  const milliseconds ttl_;
  const milliseconds transition_;
  const Hooks hooks_;

  std::mutex commands_mu_;
  RawRedis commands_;

  std::unique_ptr<RawRedis> subscriber_;  // the reader thread's while it runs
  std::atomic<bool> stop_reader_{false};
  std::thread reader_;
  std::thread loop_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool active_ = false;
  std::uint64_t generation_ = 0;
  std::optional<steady_clock::time_point> pending_;
  Owner view_;
  std::mt19937_64 random_;
  std::vector<Message> messages_;
  std::string last_reply_;
  int attempts_ = 0;
};

// ---- helpers ----------------------------------------------------------------------

// JVM Simba's defaults. With them a waiter's poll comes at least
// ttl + transition + J (J >= -200 ms) after the holder's last lease write,
// which is far later than any hand-off in these tests: an acquisition
// before that moment can only come from a pushed wake-up.
constexpr milliseconds kSlowTtl{10000};
constexpr milliseconds kSlowTransition{6000};

// The earliest moment a waiter may poll the mutex by itself, if the holder
// wrote its lease (acquired, no renewal since) no earlier than `written`.
steady_clock::time_point earliest_poll(steady_clock::time_point written) {
  return written + kSlowTtl + kSlowTransition + milliseconds(ContendPeriod::kJitterMin);
}

std::unique_ptr<TestServer> start_durable_server() {
  auto server = TestServer::start("redis", {"--appendonly", "yes", "--appendfsync", "always"});
  EXPECT_THAT(server, IsOk());
  return server.ok() ? std::move(server).value() : nullptr;
}

std::string make_cpp_id(const std::string& name) {
  return name + ":" + std::to_string(::getpid()) + "@cpp-host/0123abcd";
}
std::string jvm_id(const std::string& name) { return name + ":4242@jvm-host"; }

bool in_queue(RawRedis& raw, const std::string& mutex, const std::string& id) {
  return !raw.call({"ZSCORE", queue_key(mutex), id}).nil();
}

// ---- a. a JVM owner, a C++ waiter ----------------------------------------------------

TEST(RedisJvmInterop, JvmHoldsCppWaits) {
  auto server = start_durable_server();
  ASSERT_TRUE(server);
  const std::string uri = server->uri();
  const std::string mutex = "interop-a";
  RawRedis raw(uri);

  Latch jvm_acquired;
  FakeJvmContender jvm(uri, mutex, jvm_id("0"), kSlowTtl, kSlowTransition,
                       {[&] { jvm_acquired.set(); }, nullptr});
  const auto jvm_started = steady_clock::now();
  jvm.start();
  ASSERT_TRUE(jvm_acquired.wait(seconds(5))) << jvm.last_reply();
  // Its own acquired@@ broadcast may tell it before the script's reply does
  // (as in JVM Simba: the listener and the loop race).
  ASSERT_TRUE(eventually([&] { return jvm.attempts() >= 1; }, seconds(5)));
  EXPECT_EQ(jvm.last_reply(), jvm.id() + "@@16000");
  EXPECT_EQ(raw.call({"GET", lock_key(mutex)}).str, jvm.id());

  auto factory = make_factory(uri, kSlowTtl, kSlowTransition);
  ASSERT_TRUE(factory);
  Recorder cpp;
  const std::string cpp_id = make_cpp_id("cpp-a");
  auto service = factory->create_contend_service(cpp.contender(mutex, cpp_id)).value();
  SIMBA_ASSERT_OK(service->start());

  // Its first attempt found the JVM owner and queued it (ZADD NX, JVM's
  // layout); it is listening on its personal channel.
  ASSERT_TRUE(eventually([&] { return in_queue(raw, mutex, cpp_id); }, seconds(5)));
  EXPECT_EQ(raw.call({"PUBSUB", "NUMSUB", lock_key(mutex) + ":" + cpp_id}).elements[1].integer, 1);
  ASSERT_TRUE(eventually([&] { return service->after_owner().owner_id == jvm.id(); }, seconds(5)));
  EXPECT_FALSE(service->is_owner());
  EXPECT_FALSE(cpp.acquired.is_set());
  EXPECT_TRUE(jvm.is_owner());

  // The backend reads the JVM's lock: its id and its hard lease end (PTTL);
  // no fencing token, JVM Simba has none.
  auto read = factory->backend()->read(mutex, steady_clock::now() + seconds(3));
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(read->owner.owner_id, jvm.id());
  EXPECT_EQ(read->owner.fencing_token, 0u);
  EXPECT_GT(read->owner.transition_at - read->store_now, milliseconds(0));
  EXPECT_LE(read->owner.transition_at - read->store_now, kSlowTtl + kSlowTransition);

  // JVM Simba's release pops the oldest waiter, the C++ contender, and
  // publishes released@@<jvm> on its channel: it acquires at once.
  const auto released_at = steady_clock::now();
  jvm.stop();
  EXPECT_FALSE(in_queue(raw, mutex, cpp_id));
  ASSERT_TRUE(cpp.acquired.wait(seconds(3)));
  EXPECT_LT(cpp.acquired_at(), earliest_poll(jvm_started))
      << "acquired no earlier than its own poll: the wake-up was lost";
  EXPECT_LT(cpp.acquired_at() - released_at, scaled(seconds(2)));
  EXPECT_TRUE(service->is_owner());
  EXPECT_GT(service->fencing_token(), 0u);
  EXPECT_EQ(cpp.token.load(), service->fencing_token());
  EXPECT_EQ(raw.call({"GET", lock_key(mutex)}).str, cpp_id);
  SIMBA_EXPECT_OK(service->stop());
}

// ---- b. a C++ owner, a JVM waiter -------------------------------------------------

TEST(RedisJvmInterop, CppHoldsJvmWaits) {
  auto server = start_durable_server();
  ASSERT_TRUE(server);
  const std::string uri = server->uri();
  const std::string mutex = "interop-b";
  RawRedis raw(uri);

  auto factory = make_factory(uri, kSlowTtl, kSlowTransition);
  ASSERT_TRUE(factory);
  Recorder cpp;
  const std::string cpp_id = make_cpp_id("cpp-b");
  auto service = factory->create_contend_service(cpp.contender(mutex, cpp_id)).value();
  const auto cpp_started = steady_clock::now();
  SIMBA_ASSERT_OK(service->start());
  ASSERT_TRUE(cpp.acquired.wait(seconds(5)));
  EXPECT_EQ(raw.call({"GET", lock_key(mutex)}).str, cpp_id);
  // The C++ lease has JVM Simba's shape: PX = ttl + transition.
  const long long pttl = raw.call({"PTTL", lock_key(mutex)}).integer;
  EXPECT_GT(pttl, (kSlowTtl + kSlowTransition - seconds(5)).count());
  EXPECT_LE(pttl, (kSlowTtl + kSlowTransition).count());

  Latch jvm_acquired;
  std::atomic<bool> cpp_was_owner_at_jvm_acquire{true};
  FakeJvmContender jvm(uri, mutex, jvm_id("1"), kSlowTtl, kSlowTransition,
                       {[&] {
                          cpp_was_owner_at_jvm_acquire = service->is_owner();
                          jvm_acquired.set();
                        },
                        nullptr});
  jvm.start();
  // JVM's acquire fails: it is queued and names the C++ owner.
  ASSERT_TRUE(eventually([&] { return jvm.owner_id() == cpp_id; }, seconds(5))) << jvm.last_reply();
  EXPECT_TRUE(in_queue(raw, mutex, jvm.id()));
  EXPECT_EQ(jvm.attempts(), 1);
  EXPECT_FALSE(jvm.is_owner());
  EXPECT_TRUE(service->is_owner());

  // The C++ release wakes the oldest live waiter on its personal channel.
  const auto released_at = steady_clock::now();
  SIMBA_ASSERT_OK(service->stop());
  ASSERT_TRUE(cpp.released.is_set());
  ASSERT_TRUE(jvm_acquired.wait(seconds(3))) << jvm.last_reply();
  const auto acquired_at = steady_clock::now();
  EXPECT_FALSE(cpp_was_owner_at_jvm_acquire.load());
  EXPECT_LT(acquired_at, earliest_poll(cpp_started))
      << "acquired no earlier than its own poll: the wake-up was lost";
  EXPECT_LT(acquired_at - released_at, scaled(seconds(2)));
  // The failed attempt, then the one the wake-up started (whose reply may
  // come after the acquired@@ broadcast that already told it).
  EXPECT_TRUE(eventually([&] { return jvm.attempts() >= 2; }, seconds(3)));
  EXPECT_EQ(jvm.attempts(), 2);
  EXPECT_EQ(jvm.last_reply(), jvm.id() + "@@16000");

  bool woken = false;
  for (const auto& m : jvm.messages()) {
    if (m.channel == jvm.personal_channel() && m.payload == "released@@" + cpp_id) woken = true;
  }
  EXPECT_TRUE(woken);
  EXPECT_EQ(raw.call({"GET", lock_key(mutex)}).str, jvm.id());
  jvm.stop();
  EXPECT_TRUE(raw.call({"GET", lock_key(mutex)}).nil());
}

// ---- c. both sides, many hand-offs --------------------------------------------------

// Safety only holds if every contender uses the same ttl and transition: JVM
// Simba reads an `acquired` broadcast with its own config, and neither side
// checks the other's lease beyond PTTL (testing/critical_section.h counts who
// is inside).

TEST(RedisJvmInterop, MixedContentionKeepsMutualExclusion) {
  auto server = start_durable_server();
  ASSERT_TRUE(server);
  const std::string uri = server->uri();
  const std::string mutex = "interop-c";
  // The same on both sides (see CriticalSection). Holds are far shorter than
  // ttl, so no holder needs to renew, and a holder would have to stall for
  // more than ttl + transition to outlive its lease.
  constexpr milliseconds kTtl{2000};
  constexpr milliseconds kTransition{1000};
  CriticalSection section;
  std::atomic<bool> done{false};

  // Each holder: contend; once inside by its own view (C++: on_acquired;
  // JVM: its acquire reply or its own acquired@@ broadcast), hold 100-300 ms
  // or until its callbacks say it lost the mutex; leave the section; stop
  // contending, which releases at the store; rest 0-100 ms; contend again.
  // The exit is recorded *before* the release: the release hands the mutex
  // on at once, and a C++ contender's revocation is local, so an exit
  // recorded after it would overlap the next holder with no overlap at the
  // store.
  auto hold_then_leave = [&done](std::mt19937& random, const std::function<bool()>& still_inside,
                                 const std::function<void()>& leave) {
    const auto hold = milliseconds(std::uniform_int_distribution<int>(100, 300)(random));
    const auto end = steady_clock::now() + hold;
    while (steady_clock::now() < end && still_inside() && !done) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    leave();
  };

  // Declared before the workers' state so it outlives the services.
  std::vector<std::unique_ptr<MutexContendServiceFactory>> factories;
  for (int i = 0; i < 2; ++i) {
    // One factory each: separate connections, like separate processes.
    factories.push_back(make_factory(uri, kTtl, kTransition));
    ASSERT_TRUE(factories.back());
  }
  std::vector<std::unique_ptr<FakeJvmContender>> jvms;
  std::vector<std::thread> workers;
  for (int i = 0; i < 2; ++i) {
    const std::string id = make_cpp_id("cpp-" + std::to_string(i));
    auto contender = make_contender(
        mutex, [&section, id](const MutexState&) { section.enter(id, CriticalSection::kCpp); },
        // A lease lost locally (e.g. a renewal that failed) ends the hold.
        [&section, id](const MutexState&) { section.exit(id); }, id);
    std::shared_ptr<MutexContendService> service =
        factories[static_cast<std::size_t>(i)]->create_contend_service(contender).value();
    workers.emplace_back([&, id, service] {
      std::mt19937 random(std::random_device{}());
      while (!done) {
        section.rejoin(id);
        if (!service->start().ok()) break;
        if (section.wait_inside(id)) {
          hold_then_leave(
              random, [&] { return section.is_inside(id); }, [&] { section.leave(id); });
        }
        SIMBA_EXPECT_OK(service->stop());
        std::this_thread::sleep_for(
            milliseconds(std::uniform_int_distribution<int>(0, 100)(random)));
      }
    });
  }
  for (int i = 0; i < 2; ++i) {
    const std::string id = jvm_id("jvm-" + std::to_string(i));
    jvms.push_back(std::make_unique<FakeJvmContender>(
        uri, mutex, id, kTtl, kTransition,
        FakeJvmContender::Hooks{[&section, id] { section.enter(id, CriticalSection::kJvm); },
                                [&section, id] { section.exit(id); }}));
    FakeJvmContender* jvm = jvms.back().get();
    workers.emplace_back([&, id, jvm] {
      std::mt19937 random(std::random_device{}());
      while (!done) {
        section.rejoin(id);
        jvm->start();
        if (section.wait_inside(id)) {
          hold_then_leave(
              random, [&] { return section.is_inside(id); }, [&] { section.leave(id); });
        }
        jvm->stop();
        std::this_thread::sleep_for(
            milliseconds(std::uniform_int_distribution<int>(0, 100)(random)));
      }
    });
  }

  // At least 8 s, and on until ownership crossed sides a few times each way
  // (a wake-up lost to JVM Simba's release leaves the mutex idle until a
  // poll, up to ttl + transition + 1 s), within a generous cap.
  constexpr int kCrossings = 3;
  const auto started = steady_clock::now();
  while (steady_clock::now() - started < seconds(8) ||
         ((section.jvm_to_cpp() < kCrossings || section.cpp_to_jvm() < kCrossings) &&
          steady_clock::now() - started < scaled(seconds(60)))) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  section.close();
  done = true;
  for (auto& worker : workers) worker.join();

  EXPECT_EQ(section.max_inside(), 1u) << ::testing::PrintToString(section.overlaps());
  EXPECT_TRUE(section.overlaps().empty());
  EXPECT_GE(section.jvm_to_cpp(), kCrossings);
  EXPECT_GE(section.cpp_to_jvm(), kCrossings);
  RecordProperty("entries", static_cast<int>(section.entries()));
  RecordProperty("jvm_to_cpp", section.jvm_to_cpp());
  RecordProperty("cpp_to_jvm", section.cpp_to_jvm());
  std::cout << "entries " << section.entries() << ", JVM->C++ " << section.jvm_to_cpp()
            << ", C++->JVM " << section.cpp_to_jvm() << ", elapsed "
            << std::chrono::duration_cast<milliseconds>(steady_clock::now() - started).count()
            << " ms\n";
}

// ---- d. dead JVM entries in the queue --------------------------------------------

// Passes a contender's owner updates on, counting them: a waiter's service
// applies one per answered attempt.
class AnswerCounter final : public MutexContender {
 public:
  explicit AnswerCounter(std::shared_ptr<MutexContender> inner)
      : MutexContender(inner->mutex(), inner->contender_id()), inner_(std::move(inner)) {}
  void on_owner(const MutexState& state) override {
    inner_->on_owner(state);
    answers.fetch_add(1);
  }
  std::atomic<int> answers{0};

 private:
  std::shared_ptr<MutexContender> inner_;
};

TEST(RedisJvmInterop, StaleJvmQueueEntriesDoNotSwallowCppWakeUps) {
  auto server = start_durable_server();
  ASSERT_TRUE(server);
  const std::string uri = server->uri();
  const std::string mutex = "interop-d";
  RawRedis raw(uri);
  const long long now_s = std::stoll(raw.call({"TIME"}).elements[0].str);

  auto factory = make_factory(uri, kSlowTtl, kSlowTransition);
  ASSERT_TRUE(factory);
  Recorder a;
  Recorder b;
  const std::string a_id = make_cpp_id("cpp-owner");
  const std::string b_id = make_cpp_id("cpp-waiter");
  auto holder = factory->create_contend_service(a.contender(mutex, a_id)).value();
  auto b_answers = std::make_shared<AnswerCounter>(b.contender(mutex, b_id));
  auto waiter = factory->create_contend_service(b_answers).value();
  const auto holder_started = steady_clock::now();
  SIMBA_ASSERT_OK(holder->start());
  ASSERT_TRUE(a.acquired.wait(seconds(5)));

  // Left by a JVM contender that died an hour ago (nobody listens on its
  // channel). The waiter's failed acquisition drops it on the way: entries
  // nobody listens for at the head of the queue are trimmed.
  const std::string dead_before = jvm_id("dead-before");
  raw.call({"ZADD", queue_key(mutex), std::to_string(now_s - 3600), dead_before});
  SIMBA_ASSERT_OK(waiter->start());
  ASSERT_TRUE(eventually([&] { return in_queue(raw, mutex, b_id); }, seconds(5)));
  EXPECT_FALSE(in_queue(raw, mutex, dead_before));
  // subscribe() does not wait for the server; once the server confirms, the
  // waiter looks once more (and that attempt trims too). Let that happen
  // before planting the entries below, or it would trim them first. A
  // confirmation that reaches the service while start() is still under way
  // is dropped instead, rightly: the first attempt goes out after it. So:
  // the subscription was confirmed, and either a second answer came in or
  // none came in a while (the look it would be is a loopback round trip).
  ASSERT_TRUE(eventually(
      [&] {
        return raw.call({"PUBSUB", "NUMSUB", lock_key(mutex) + ":" + b_id}).elements[1].integer ==
               1;
      },
      seconds(5)));
  ASSERT_TRUE(eventually([&] { return b_answers->answers.load() >= 1; }, seconds(5)));
  eventually([&] { return b_answers->answers.load() >= 2; }, scaled(seconds(2)));
  ASSERT_TRUE(in_queue(raw, mutex, b_id));

  // Dead JVM entries that appear after the waiter's attempt sit ahead of it
  // when the owner releases. JVM Simba's release would pop the first and
  // lose the wake-up; ours skips them and wakes the live waiter.
  const std::vector<std::string> dead = {jvm_id("dead-1"), jvm_id("dead-2")};
  for (const auto& id : dead) {
    raw.call({"ZADD", queue_key(mutex), std::to_string(now_s - 60), id});
    EXPECT_EQ(raw.call({"PUBSUB", "NUMSUB", lock_key(mutex) + ":" + id}).elements[1].integer, 0);
  }
  ASSERT_EQ(raw.call({"ZRANGE", queue_key(mutex), "0", "0"}).elements[0].str, dead[0]);

  const auto released_at = steady_clock::now();
  SIMBA_ASSERT_OK(holder->stop());
  ASSERT_TRUE(b.acquired.wait(seconds(3)));
  EXPECT_LT(b.acquired_at(), earliest_poll(holder_started))
      << "acquired no earlier than its own poll: the wake-up was lost";
  EXPECT_LT(b.acquired_at() - released_at, scaled(seconds(2)));
  EXPECT_TRUE(waiter->is_owner());
  for (const auto& id : dead) EXPECT_FALSE(in_queue(raw, mutex, id)) << id;
  EXPECT_EQ(raw.call({"ZCARD", queue_key(mutex)}).integer, 0);
  SIMBA_EXPECT_OK(waiter->stop());
}

}  // namespace
}  // namespace simba::testing
