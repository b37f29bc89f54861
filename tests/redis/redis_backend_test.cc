// The Redis backend beyond the conformance suite: its names and wire layout,
// the hand-off queue, key expiry events, a server that dies, restarts,
// hangs or drops our connections, and how many connections and threads many
// mutexes cost. The tests run against a real redis-server, but for URI
// parsing and the error-reply table, which need none.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "backends/redis/redis_connection.h"
#include "simba/backends/redis.h"
#include "simba/contend_service.h"
#include "simba/contender.h"
#include "simba/registry.h"
#include "testing/fixed_random.h"
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
using ::testing::HasSubstr;

// Arguments for a private server that writes durably, so the backend's
// restart guard does not hold back the first acquisitions. Tests that kill
// clients or count connections use one, not to disturb tests running in
// parallel on the shared server.
const std::vector<std::string> kDurable = {"--appendonly", "yes", "--appendfsync", "always"};

// A key prefix of this test's own on the shared server.
std::string test_prefix() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string("rt-") + info->name() + "-" + std::to_string(::getpid());
}

std::string shared_uri(const std::string& query = "") {
  return shared_server_uri("redis") + "?key_prefix=" + test_prefix() + query;
}

std::string key(const std::string& mutex, const std::string& suffix = "") {
  return test_prefix() + ":{" + mutex + "}" + suffix;
}

// ---- names and URIs -----------------------------------------------------------

TEST(RedisNames, BracesAndDelimitersAreRejectedClearly) {
  auto backend = open(shared_uri());
  ASSERT_TRUE(backend);
  const Deadline deadline = in(seconds(3));
  EXPECT_THAT(backend->acquire_or_renew(request_for("a{b}", "c"), deadline),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("'{' or '}'")));
  EXPECT_THAT(backend->read("x}", deadline), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(backend->acquire_or_renew(request_for("a@@b", "c"), deadline),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("@@")));
  EXPECT_THAT(backend->acquire_or_renew(request_for("m", "id@@x"), deadline),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("contender_id")));
  EXPECT_THAT(backend->release("m", "id@@x", deadline), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(backend->subscribe("a{b", [](const MutexEvent&) {}),
              StatusIs(StatusCode::kInvalidArgument));
  // A single '@' or other punctuation is fine.
  SIMBA_EXPECT_OK(backend->acquire_or_renew(request_for("a@b:c/d", "e@f"), deadline));
}

TEST(RedisUri, Parses) {
  auto uri = Uri::parse(
      "redis://alice:s3cret@db.example:6380/3?connect_timeout=2s&"
      "restart_guard=off&keyspace_events=off&key_prefix=app1");
  ASSERT_THAT(uri, IsOk());
  auto options = redis_options_from_uri(*uri);
  ASSERT_THAT(options, IsOk());
  EXPECT_EQ(options->host, "db.example");
  EXPECT_EQ(options->port, 6380);
  EXPECT_EQ(options->user, "alice");
  EXPECT_EQ(options->password, "s3cret");
  EXPECT_EQ(options->database, 3);
  EXPECT_EQ(options->connect_timeout, seconds(2));
  EXPECT_FALSE(options->restart_guard);
  EXPECT_FALSE(options->keyspace_events);
  EXPECT_EQ(options->key_prefix, "app1");

  auto defaults = redis_options_from_uri(*Uri::parse("redis://h"));
  ASSERT_THAT(defaults, IsOk());
  EXPECT_EQ(defaults->port, 6379);
  EXPECT_EQ(defaults->database, 0);
  EXPECT_TRUE(defaults->restart_guard);
  EXPECT_EQ(defaults->key_prefix, "simba");

  for (const char* bad : {"redis://h/x", "redis://h/-1", "redis://h?key_prefix=a{b}",
                          "redis://h?key_prefix=", "redis://h?keyspace_events=on",
                          "redis://h?connect_timeout=0s", "sqlite://h"}) {
    auto parsed = Uri::parse(bad);
    if (!parsed.ok()) continue;
    EXPECT_THAT(redis_options_from_uri(*parsed), StatusIs(StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(RedisUri, WrongPasswordAndDatabaseAreClearErrors) {
  // The shared server has no password: AUTH with one is refused.
  auto with_password = open("redis://:nope@" + shared_server_uri("redis").substr(8));
  ASSERT_TRUE(with_password);
  EXPECT_THAT(with_password->read("m", in(seconds(3))),
              StatusIs(StatusCode::kPermissionDenied, HasSubstr("AUTH")));
  auto bad_db = open(shared_server_uri("redis") + "/999");
  ASSERT_TRUE(bad_db);
  EXPECT_THAT(bad_db->read("m", in(seconds(3))),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("database 999")));
}

TEST(RedisUri, PasswordUserAndDatabaseComeFromTheUri) {
  auto server = TestServer::start("redis", kDurable);
  ASSERT_THAT(server, IsOk());
  const std::string address = (*server)->uri().substr(std::string("redis://").size());
  {
    RawRedis admin((*server)->uri());
    ASSERT_FALSE(
        admin.call({"ACL", "SETUSER", "alice", "on", ">alice-pw", "~*", "&*", "+@all"}).error());
    ASSERT_FALSE(admin.call({"CONFIG", "SET", "requirepass", "s3cret"}).error());
  }
  // The default user's password, database 3.
  auto with_password = open("redis://:s3cret@" + address + "/3");
  ASSERT_TRUE(with_password);
  ASSERT_THAT(with_password->acquire_or_renew(request_for("m", "a"), in(seconds(3))), IsOk());
  // An ACL user, database 5: a different database, so the mutex is free.
  auto as_alice = open("redis://alice:alice-pw@" + address + "/5");
  ASSERT_TRUE(as_alice);
  auto alice = as_alice->acquire_or_renew(request_for("m", "b"), in(seconds(3)));
  ASSERT_THAT(alice, IsOk());
  EXPECT_EQ(alice->owner.owner_id, "b");
  // Check where the keys went, as alice.
  RawRedis raw((*server)->uri());
  ASSERT_FALSE(raw.call({"AUTH", "alice", "alice-pw"}).error());
  ASSERT_FALSE(raw.call({"SELECT", "3"}).error());
  EXPECT_EQ(raw.call({"GET", "simba:{m}"}).str, "a");
  ASSERT_FALSE(raw.call({"SELECT", "5"}).error());
  EXPECT_EQ(raw.call({"GET", "simba:{m}"}).str, "b");
  // Without the password: a clear error, not a hang.
  auto without = open((*server)->uri());
  ASSERT_TRUE(without);
  EXPECT_THAT(without->read("m", in(seconds(3))), StatusIs(StatusCode::kPermissionDenied));
  auto wrong_user = open("redis://alice:nope@" + address);
  ASSERT_TRUE(wrong_user);
  EXPECT_THAT(wrong_user->read("m", in(seconds(3))),
              StatusIs(StatusCode::kPermissionDenied, HasSubstr("AUTH")));
  // The server script stops the server by PID; it needs no password.
}

TEST(RedisUri, UnreachableServerFailsWithinTheDeadline) {
  // A port nobody listens on (the server on it was stopped).
  auto server = TestServer::start("redis");
  ASSERT_THAT(server, IsOk());
  const std::string uri = (*server)->uri();
  SIMBA_ASSERT_OK((*server)->stop());
  auto backend = open(uri);
  ASSERT_TRUE(backend);
  const auto started = steady_clock::now();
  EXPECT_THAT(backend->read("m", in(seconds(2))), StatusIs(StatusCode::kUnavailable));
  // Within the reconnect backoff a second call fails at once, saying so.
  EXPECT_THAT(backend->read("m", in(seconds(2))),
              StatusIs(StatusCode::kUnavailable, HasSubstr("reconnect")));
  EXPECT_LT(steady_clock::now() - started, seconds(2));
}

// How an error reply becomes a Status (no server): what a retry may get
// past is kUnavailable, refused credentials or permissions
// kPermissionDenied, anything else kInternal.
TEST(RedisErrors, ErrorRepliesMapToStatusCodes) {
  using internal::redis::error_reply_status;
  const std::vector<std::pair<std::string, StatusCode>> cases = {
      {"WRONGPASS invalid username-password pair or user is disabled.",
       StatusCode::kPermissionDenied},
      {"NOAUTH Authentication required.", StatusCode::kPermissionDenied},
      {"NOPERM this user has no permissions to run the 'evalsha' command",
       StatusCode::kPermissionDenied},
      {"LOADING Redis is loading the dataset in memory", StatusCode::kUnavailable},
      {"BUSY Redis is busy running a script.", StatusCode::kUnavailable},
      {"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
       StatusCode::kUnavailable},
      {"TRYAGAIN Multiple keys request during rehashing of slot", StatusCode::kUnavailable},
      {"CLUSTERDOWN The cluster is down", StatusCode::kUnavailable},
      {"READONLY You can't write against a read only replica.", StatusCode::kUnavailable},
      {"NOSCRIPT No matching script. Please use EVAL.", StatusCode::kUnavailable},
      {"OOM command not allowed when used memory > 'maxmemory'.", StatusCode::kUnavailable},
      {"NOREPLICAS Not enough good replicas to write.", StatusCode::kUnavailable},
      {"MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist "
       "to disk.",
       StatusCode::kUnavailable},
      {"ERR max number of clients reached", StatusCode::kUnavailable},
      {"ERR max number of clients + cluster connections reached", StatusCode::kUnavailable},
      {"ERR unknown command 'FOO', with args beginning with: ", StatusCode::kInternal},
      {"ERR Error running script (call to f_0123): @user_script:1: oops", StatusCode::kInternal},
      {"WRONGTYPE Operation against a key holding the wrong kind of value", StatusCode::kInternal},
      // A word that only starts like a known one is not it.
      {"LOADINGX something", StatusCode::kInternal},
  };
  for (const auto& [text, expected] : cases) {
    std::string bytes = text;
    redisReply reply{};
    reply.type = REDIS_REPLY_ERROR;
    reply.str = bytes.data();
    reply.len = bytes.size();
    const Status status = error_reply_status(&reply, "redis at h:1");
    EXPECT_EQ(status.code(), expected) << text;
    EXPECT_EQ(status.message(), "redis at h:1: " + text);
  }
}

// subscribe() returns before the server confirms; tests that need the
// subscription live at the server wait for it.
// True once contender `id` of `mutex` has tried (it is in the mutex's queue)
// and listens for its wake-up (the server confirmed its personal channel).
bool tried_and_listening(RawRedis& raw, const std::string& mutex, const std::string& id) {
  return eventually(
      [&] {
        RawReply score = raw.call({"ZSCORE", key(mutex, ":contender"), id});
        RawReply r = raw.call({"PUBSUB", "NUMSUB", key(mutex, ":" + id)});
        return !score.nil() && r.elements.size() == 2 && r.elements[1].integer >= 1;
      },
      seconds(5));
}

bool subscribed(RawRedis& raw, const std::string& channel) {
  return eventually(
      [&] {
        RawReply r = raw.call({"PUBSUB", "NUMSUB", channel});
        return r.elements.size() == 2 && r.elements[1].integer >= 1;
      },
      seconds(5));
}

// Collects events from a subscription.
struct EventLog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<MutexEvent> events;
  std::function<void(const MutexEvent&)> listener() {
    return [this](const MutexEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(e);
      cv.notify_all();
    };
  }
  // Waits for a release event (since the last Clear), by `by` if given.
  bool wait_released(milliseconds timeout, const std::string& by = "") {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] {
      return std::any_of(events.begin(), events.end(), [&](const MutexEvent& e) {
        return e.kind == MutexEvent::Kind::kReleased && (by.empty() || e.owner_id == by);
      });
    });
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu);
    events.clear();
  }
};

// `contender` listens on `backend` for `mutex` and queues for it (its
// attempt finds it held). The wake-up that comes with the server's
// confirmation of the subscription is consumed: `log` is empty after.
// Null (with a failure recorded) when any step went wrong.
std::unique_ptr<Subscription> queued_waiter(Backend& backend, RawRedis& raw,
                                            const std::string& mutex, const std::string& contender,
                                            EventLog& log) {
  auto sub = backend.subscribe(mutex, contender, log.listener());
  EXPECT_THAT(sub, IsOk());
  if (!sub.ok() || !subscribed(raw, key(mutex, ":" + contender))) return nullptr;
  auto attempt = backend.acquire_or_renew(request_for(mutex, contender), in(seconds(3)));
  EXPECT_THAT(attempt, IsOk());
  if (!attempt.ok() || attempt->owner.is_owner(contender)) return nullptr;
  if (!log.wait_released(seconds(2))) return nullptr;
  log.clear();
  return std::move(*sub);
}

// ---- wire layout (what JVM Simba sees) ------------------------------------------

TEST(RedisWire, KeysValuesAndMessagesFollowJvmSimba) {
  const std::string uri = shared_uri();
  auto backend = open(uri);
  ASSERT_TRUE(backend);
  RawRedis raw(uri);
  RawRedis listener(uri);
  listener.call({"SUBSCRIBE", key("m")});

  auto held = backend->acquire_or_renew(request_for("m", "c1"), in(seconds(3)));
  ASSERT_THAT(held, IsOk());
  EXPECT_EQ(held->owner.owner_id, "c1");
  EXPECT_GT(held->owner.fencing_token, 0u);
  EXPECT_EQ(held->owner.transition_at - held->store_now, milliseconds(3000));
  EXPECT_EQ(held->owner.ttl_at - held->store_now, milliseconds(2000));

  EXPECT_EQ(raw.call({"GET", key("m")}).str, "c1");
  const long long pttl = raw.call({"PTTL", key("m")}).integer;
  EXPECT_GT(pttl, 2500);
  EXPECT_LE(pttl, 3000);
  RawReply message = listener.next(2000);
  ASSERT_EQ(message.elements.size(), 3u);
  EXPECT_EQ(message.elements[0].str, "message");
  EXPECT_EQ(message.elements[1].str, key("m"));
  EXPECT_EQ(message.elements[2].str, "acquired@@c1");

  // A failed acquisition queues the contender with ZADD NX, scored in
  // server seconds, and reports the owner. (c2 listens for its wake-up;
  // queue entries of contenders that do not are dropped.)
  EventLog c2_events;
  auto c2_subscription = backend->subscribe("m", "c2", c2_events.listener());
  ASSERT_THAT(c2_subscription, IsOk());
  ASSERT_TRUE(subscribed(raw, key("m", ":c2")));
  auto other = backend->acquire_or_renew(request_for("m", "c2"), in(seconds(3)));
  ASSERT_THAT(other, IsOk());
  EXPECT_EQ(other->owner.owner_id, "c1");
  EXPECT_EQ(other->owner.fencing_token, held->owner.fencing_token);
  RawReply score = raw.call({"ZSCORE", key("m", ":contender"), "c2"});
  const long long now_seconds = std::stoll(raw.call({"TIME"}).elements[0].str);
  EXPECT_NEAR(std::stoll(score.str), now_seconds, 2);

  // Renewal keeps the token and resets PX to ttl + transition.
  std::this_thread::sleep_for(milliseconds(300));
  auto renewed = backend->acquire_or_renew(request_for("m", "c1"), in(seconds(3)));
  ASSERT_THAT(renewed, IsOk());
  EXPECT_EQ(renewed->owner.fencing_token, held->owner.fencing_token);
  EXPECT_GT(raw.call({"PTTL", key("m")}).integer, 2800);

  // Release deletes the key and wakes c2 (the oldest waiter), taking it
  // off the queue as JVM Simba does.
  ASSERT_THAT(backend->release("m", "c1", in(seconds(3))), IsOkAndHolds(true));
  EXPECT_TRUE(raw.call({"GET", key("m")}).nil());
  EXPECT_EQ(raw.call({"ZCARD", key("m", ":contender")}).integer, 0);
  ASSERT_TRUE(c2_events.wait_released(seconds(2), "c1"));
  ASSERT_THAT(backend->release("m", "c1", in(seconds(3))), IsOkAndHolds(false));

  // The next acquisition has a greater token.
  auto again = backend->acquire_or_renew(request_for("m", "c2"), in(seconds(3)));
  ASSERT_THAT(again, IsOk());
  EXPECT_GT(again->owner.fencing_token, held->owner.fencing_token);
}

// A lock key of ours whose fence hash is gone (evicted under a maxmemory
// policy, deleted by hand, or lost by a replica that got the lock key back
// from a replicated renewal): a renewal, one at a time or together, answers
// with a token above the last one and fences the hold anew. It used to
// answer token 0, a JVM Simba owner's, which gave our contender a new hold
// under a token below its previous one.
TEST(RedisWire, ALockWhoseFenceIsGoneIsFencedAnewAboveTheLastToken) {
  const std::string uri = shared_uri();
  auto backend = open(uri);
  ASSERT_TRUE(backend);
  RawRedis raw(uri);
  auto held = backend->acquire_or_renew(request_for("m", "c1"), in(seconds(3)));
  ASSERT_THAT(held, IsOk());
  std::uint64_t last = held->owner.fencing_token;
  ASSERT_GT(last, 0u);

  raw.call({"DEL", key("m", ":fence")});
  auto renewed = backend->acquire_or_renew(request_for("m", "c1"), in(seconds(3)));
  ASSERT_THAT(renewed, IsOk());
  EXPECT_EQ(renewed->owner.owner_id, "c1");
  EXPECT_GT(renewed->owner.fencing_token, last);
  EXPECT_EQ(raw.call({"HGET", key("m", ":fence"), "owner"}).str, "c1");
  last = renewed->owner.fencing_token;
  // The fenced hold renews under its token from then on.
  auto again = backend->acquire_or_renew(request_for("m", "c1"), in(seconds(3)));
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->owner.fencing_token, last);

  raw.call({"DEL", key("m", ":fence")});
  auto together = backend->renew({request_for("m", "c1")}, in(seconds(3)));
  ASSERT_THAT(together, IsOk());
  ASSERT_EQ(together->size(), 1u);
  EXPECT_EQ((*together)[0].owner.owner_id, "c1");
  EXPECT_GT((*together)[0].owner.fencing_token, last);
  EXPECT_EQ(raw.call({"HGET", key("m", ":fence"), "owner"}).str, "c1");
}

// ---- forced release ---------------------------------------------------------------

// An operator's force_release tells the owner at once, on its personal
// channel, in the form JVM Simba reads there (`released@@<id>`: "the owner
// is gone, try now"); our subscriber turns its own id as the releaser into a
// forced kLost, so the holder stops long before its next renewal.
TEST(RedisForce, ForcedReleaseTellsTheOwnerAtOnce) {
  const std::string uri = shared_uri();
  auto backend = open(uri);
  ASSERT_TRUE(backend);
  RawRedis raw(uri);
  RawRedis jvm_owner(uri);  // what a JVM owner's personal channel receives
  jvm_owner.call({"SUBSCRIBE", key("m", ":holder")});
  EventLog holder_events, waiter_events;
  auto holder_sub = backend->subscribe("m", "holder", holder_events.listener());
  auto waiter_sub = backend->subscribe("m", "waiter", waiter_events.listener());
  ASSERT_THAT(holder_sub, IsOk());
  ASSERT_THAT(waiter_sub, IsOk());
  ASSERT_TRUE(subscribed(raw, key("m", ":waiter")));
  auto held = backend->acquire_or_renew(request_for("m", "holder"), in(seconds(3)));
  ASSERT_THAT(held, IsOk());
  ASSERT_THAT(backend->acquire_or_renew(request_for("m", "waiter"), in(seconds(3))), IsOk());

  auto forced = backend->force_release("m", in(seconds(3)));
  ASSERT_THAT(forced, IsOk());
  EXPECT_EQ(forced->previous.owner_id, "holder");
  RawReply message = jvm_owner.next(2000);
  ASSERT_EQ(message.elements.size(), 3u);
  EXPECT_EQ(message.elements[2].str, "released@@holder");
  {
    // (The holder may also hear a "look again" release once its
    // subscription is confirmed.)
    std::unique_lock<std::mutex> lock(holder_events.mu);
    const auto is_lost = [](const MutexEvent& e) { return e.kind == MutexEvent::Kind::kLost; };
    ASSERT_TRUE(holder_events.cv.wait_for(lock, seconds(2), [&] {
      return std::any_of(holder_events.events.begin(), holder_events.events.end(), is_lost);
    }));
    const MutexEvent& lost =
        *std::find_if(holder_events.events.begin(), holder_events.events.end(), is_lost);
    EXPECT_EQ(lost.owner_id, "holder");
    EXPECT_EQ(lost.fencing_token, 0u);  // the message names no token
    EXPECT_TRUE(lost.forced);
  }
  // The oldest waiter is woken as by a release, and hears no loss.
  ASSERT_TRUE(waiter_events.wait_released(seconds(2), "holder"));
  std::lock_guard<std::mutex> lock(waiter_events.mu);
  for (const MutexEvent& e : waiter_events.events) EXPECT_NE(e.kind, MutexEvent::Kind::kLost);
}

TEST(RedisEvents, AListenerMayDestroyTheBackendAndItsOwnSubscription) {
  expect_a_listener_may_destroy_its_backend(shared_uri());
}

TEST(RedisForce, HolderStopsAtOnceNotAtItsNextRenewal) {
  const std::string uri = shared_uri();
  const milliseconds ttl(20000), transition(5000);
  auto factory = make_factory(uri, ttl, transition);
  ASSERT_TRUE(factory);
  Recorder a;
  auto holder = factory->create_contend_service(a.contender("m", "a")).value();
  SIMBA_ASSERT_OK(holder->start());
  ASSERT_TRUE(a.acquired.wait(seconds(5)));
  const std::uint64_t token = holder->fencing_token();
  // Force only once the server confirmed the holder's personal channel: a
  // forced release published before that does not reach it (its first
  // attempt does not wait for the subscription, and the wake-up sent once
  // the channel is confirmed is a release, which an owner ignores), and the
  // holder would learn at its renewal, 20 s later.
  RawRedis raw(shared_server_uri("redis"));
  ASSERT_TRUE(subscribed(raw, key("m", ":a")));
  auto operator_backend = open(uri);
  ASSERT_TRUE(operator_backend);
  const auto forced_at = steady_clock::now();
  auto forced = operator_backend->force_release("m", in(seconds(3)));
  ASSERT_THAT(forced, IsOk());
  // Without the push A would hold on until its renewal, 20 s later.
  ASSERT_TRUE(a.released.wait(seconds(2)));
  EXPECT_LT(steady_clock::now() - forced_at, seconds(2));
  // It contends again, and any new hold is above the floor.
  ASSERT_TRUE(eventually([&] { return holder->is_owner(); }, seconds(5)));
  EXPECT_GT(holder->fencing_token(), forced->fencing_floor);
  EXPECT_GT(holder->fencing_token(), token);
  SIMBA_ASSERT_OK(holder->stop());
}

// ---- hand-off -------------------------------------------------------------------

TEST(RedisHandOff, ReleaseWakesTheOldestLiveWaiterSkippingDeadOnes) {
  const std::string uri = shared_uri();
  auto backend = open(uri);
  ASSERT_TRUE(backend);
  RawRedis raw(uri);
  ASSERT_THAT(backend->acquire_or_renew(request_for("m", "owner"), in(seconds(3))), IsOk());
  // Two crashed waiters that queued long ago (nobody listens for them) and
  // two live ones, queued in order.
  raw.call({"ZADD", key("m", ":contender"), "1", "ghost-1", "2", "ghost-2"});
  EventLog first, second;
  auto sub1 = backend->subscribe("m", "live-1", first.listener());
  auto sub2 = backend->subscribe("m", "live-2", second.listener());
  ASSERT_THAT(sub1, IsOk());
  ASSERT_THAT(sub2, IsOk());
  ASSERT_TRUE(subscribed(raw, key("m", ":live-1")));
  ASSERT_TRUE(subscribed(raw, key("m", ":live-2")));
  // live-1's failed attempt queues it, and also drops the two oldest
  // entries nobody listens for.
  ASSERT_THAT(backend->acquire_or_renew(request_for("m", "live-1"), in(seconds(3))), IsOk());
  std::this_thread::sleep_for(milliseconds(1100));  // a later score for live-2
  ASSERT_THAT(backend->acquire_or_renew(request_for("m", "live-2"), in(seconds(3))), IsOk());
  raw.call({"ZADD", key("m", ":contender"), "3", "ghost-3"});

  // Each subscription was woken once when the server confirmed it (a
  // release may have slipped in before); forget those.
  ASSERT_TRUE(first.wait_released(seconds(2)));
  ASSERT_TRUE(second.wait_released(seconds(2)));
  first.clear();
  second.clear();
  ASSERT_THAT(backend->release("m", "owner", in(seconds(3))), IsOkAndHolds(true));
  // ghost-3 (the oldest now) is skipped, live-1 woken; live-2 is not.
  ASSERT_TRUE(first.wait_released(seconds(2)));
  EXPECT_FALSE(second.wait_released(milliseconds(300)));
  {
    std::lock_guard<std::mutex> lock(first.mu);
    ASSERT_EQ(first.events.size(), 1u);
    EXPECT_EQ(first.events[0].owner_id, "owner");
  }
  RawReply queue = raw.call({"ZRANGE", key("m", ":contender"), "0", "-1"});
  ASSERT_EQ(queue.elements.size(), 1u);
  EXPECT_EQ(queue.elements[0].str, "live-2");
}

// Waiters are woken in the order they came, also within one second (JVM
// Simba's whole-second scores tied them, and Redis broke the tie by the id:
// the same waiter first at every release, the others starved), and the one
// woken is the heir: the releaser coming straight back queues behind it
// instead of taking the mutex again (16 processes on one Locker: the
// least-served got 2 acquisitions of 20,000 before, 877 of 14,000 after).
TEST(RedisHandOff, WaitersGoInTheOrderTheyCameAndTheReleaserCannotBargeIn) {
  const std::string uri = shared_uri();
  auto backend = open(uri);
  ASSERT_TRUE(backend);
  RawRedis raw(uri);
  ASSERT_THAT(backend->acquire_or_renew(request_for("m", "owner"), in(seconds(3))), IsOk());
  EventLog later_id, earlier_id;
  // w-z queues first, w-a a moment later (within the same second, as a
  // rule): w-a's id sorts first, its arrival does not.
  auto sub_z = queued_waiter(*backend, raw, "m", "w-z", later_id);
  ASSERT_TRUE(sub_z);
  auto sub_a = queued_waiter(*backend, raw, "m", "w-a", earlier_id);
  ASSERT_TRUE(sub_a);

  // The owner's streak is over (it began at the epoch): its release hands
  // the mutex to the oldest waiter.
  raw.call({"HSET", key("m", ":fence"), "streak_since", "0"});
  ASSERT_THAT(backend->release("m", "owner", in(seconds(3))), IsOkAndHolds(true));
  ASSERT_TRUE(later_id.wait_released(seconds(2)));
  // The releaser is back at once: the mutex is kept for w-z, and the
  // releaser queues (behind w-a).
  auto back = backend->acquire_or_renew(request_for("m", "owner"), in(seconds(3)));
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->owner.owner_id, "w-z");
  EXPECT_EQ(back->owner.fencing_token, 0u);
  EXPECT_TRUE(raw.call({"GET", key("m")}).nil());
  auto heir = backend->acquire_or_renew(request_for("m", "w-z"), in(seconds(3)));
  ASSERT_THAT(heir, IsOk());
  EXPECT_TRUE(heir->owner.is_owner("w-z"));
  EXPECT_FALSE(earlier_id.wait_released(milliseconds(100)));
  RawReply queue = raw.call({"ZRANGE", key("m", ":contender"), "0", "-1"});
  ASSERT_EQ(queue.elements.size(), 2u);
  EXPECT_EQ(queue.elements[0].str, "w-a");
  EXPECT_EQ(queue.elements[1].str, "owner");
}

// Within its streak (2 ms from the acquisition that made it the owner) a
// releaser may take the mutex straight back: the oldest waiter is woken
// and keeps its place, but is not the heir. A holder in a loop then runs at
// its own pace instead of one hand-off per acquisition (16 processes on one
// key: 2,900-3,100 acquisitions a second before, 3,700-4,000 after, the
// least-served process still at 0.9x of the mean), and the waiter is the
// heir at the first release after the streak.
TEST(RedisHandOff, WithinItsStreakTheReleaserMayComeBackAndTheWaiterKeepsItsPlace) {
  const std::string uri = shared_uri();
  auto backend = open(uri);
  ASSERT_TRUE(backend);
  RawRedis raw(uri);
  ASSERT_THAT(backend->acquire_or_renew(request_for("m", "owner"), in(seconds(3))), IsOk());
  const std::string fence = key("m", ":fence");
  const std::string since = raw.call({"HGET", fence, "streak_since"}).str;
  ASSERT_FALSE(since.empty()) << "an acquisition starts a streak";
  EventLog waiter;
  auto sub = queued_waiter(*backend, raw, "m", "w", waiter);
  ASSERT_TRUE(sub);

  // A streak that is still young, whatever this machine's pace (it began in
  // the year 5138).
  const std::string young = "99999999999999";
  raw.call({"HSET", fence, "streak_since", young});
  ASSERT_THAT(backend->release("m", "owner", in(seconds(3))), IsOkAndHolds(true));
  ASSERT_TRUE(waiter.wait_released(seconds(2))) << "the oldest waiter is woken all the same";
  EXPECT_EQ(raw.call({"HGET", fence, "heir"}).str, "");
  auto back = backend->acquire_or_renew(request_for("m", "owner"), in(seconds(3)));
  ASSERT_THAT(back, IsOk());
  EXPECT_TRUE(back->owner.is_owner("owner")) << "the releaser takes it straight back";
  RawReply queue = raw.call({"ZRANGE", key("m", ":contender"), "0", "-1"});
  ASSERT_EQ(queue.elements.size(), 1u);
  EXPECT_EQ(queue.elements[0].str, "w") << "the waiter keeps its place";
  EXPECT_EQ(raw.call({"HGET", fence, "streak_since"}).str, young)
      << "the same owner's acquisition goes on with its streak";

  // Once the streak is over, the release hands the mutex to the waiter.
  raw.call({"HSET", fence, "streak_since", "0"});
  waiter.clear();
  ASSERT_THAT(backend->release("m", "owner", in(seconds(3))), IsOkAndHolds(true));
  ASSERT_TRUE(waiter.wait_released(seconds(2)));
  EXPECT_EQ(raw.call({"HGET", fence, "heir"}).str, "w");
  auto turned_away = backend->acquire_or_renew(request_for("m", "owner"), in(seconds(3)));
  ASSERT_THAT(turned_away, IsOk());
  EXPECT_EQ(turned_away->owner.owner_id, "w") << "the heir's, until it comes";
  auto heir = backend->acquire_or_renew(request_for("m", "w"), in(seconds(3)));
  ASSERT_THAT(heir, IsOk());
  EXPECT_TRUE(heir->owner.is_owner("w"));
  // A new owner, a new streak.
  EXPECT_NE(raw.call({"HGET", fence, "streak_since"}).str, "0");
}

// A waiter woken for a free mutex that leaves instead of taking it (it
// gave up as the release came) passes the wake-up on: the next waiter is
// woken and is the heir, instead of sleeping until its next poll.
TEST(RedisHandOff, AWokenWaiterThatLeavesPassesTheWakeUpOn) {
  const std::string uri = shared_uri();
  auto backend = open(uri);
  ASSERT_TRUE(backend);
  RawRedis raw(uri);
  ASSERT_THAT(backend->acquire_or_renew(request_for("m", "owner"), in(seconds(3))), IsOk());
  EventLog first, second;
  auto sub1 = queued_waiter(*backend, raw, "m", "w1", first);
  ASSERT_TRUE(sub1);
  auto sub2 = queued_waiter(*backend, raw, "m", "w2", second);
  ASSERT_TRUE(sub2);

  raw.call({"HSET", key("m", ":fence"), "streak_since", "0"});
  ASSERT_THAT(backend->release("m", "owner", in(seconds(3))), IsOkAndHolds(true));
  ASSERT_TRUE(first.wait_released(seconds(2)));
  EXPECT_EQ(raw.call({"HGET", key("m", ":fence"), "heir"}).str, "w1");
  EXPECT_FALSE(second.wait_released(milliseconds(100)));

  SIMBA_ASSERT_OK(backend->leave("m", "w1", in(seconds(3))));
  EXPECT_TRUE(second.wait_released(seconds(2))) << "w1's wake-up went on to w2";
  EXPECT_EQ(raw.call({"HGET", key("m", ":fence"), "heir"}).str, "w2");
  auto taken = backend->acquire_or_renew(request_for("m", "w2"), in(seconds(3)));
  ASSERT_THAT(taken, IsOk());
  EXPECT_TRUE(taken->owner.is_owner("w2"));
}

// A subscription dropped and made again at once (a Locker's release and
// next acquire) finds its channel still subscribed and confirmed: no
// SUBSCRIBE goes out, so no confirmation comes to wake it to look again,
// and releases reach it. The channel is unsubscribed a moment (1 s) after
// nobody wants it; a subscription after that is confirmed again.
TEST(RedisHandOff, AChannelWantedAgainAtOnceStaysSubscribed) {
  const std::string uri = shared_uri();
  auto backend = open(uri);
  ASSERT_TRUE(backend);
  RawRedis raw(uri);
  const std::string channel = key("m", ":w");
  EventLog first;
  auto sub = backend->subscribe("m", "w", first.listener());
  ASSERT_THAT(sub, IsOk());
  ASSERT_TRUE(subscribed(raw, channel));
  ASSERT_TRUE(first.wait_released(seconds(2))) << "confirmed: look again";

  sub->reset();
  EventLog second;
  auto again = backend->subscribe("m", "w", second.listener());
  ASSERT_THAT(again, IsOk());
  EXPECT_FALSE(second.wait_released(milliseconds(300))) << "no new confirmation";
  ASSERT_THAT(backend->acquire_or_renew(request_for("m", "owner"), in(seconds(3))), IsOk());
  ASSERT_THAT(backend->acquire_or_renew(request_for("m", "w"), in(seconds(3))), IsOk());
  raw.call({"HSET", key("m", ":fence"), "streak_since", "0"});
  ASSERT_THAT(backend->release("m", "owner", in(seconds(3))), IsOkAndHolds(true));
  EXPECT_TRUE(second.wait_released(seconds(2), "owner")) << "the release reaches it";

  again->reset();
  EXPECT_TRUE(eventually(
      [&] {
        RawReply r = raw.call({"PUBSUB", "NUMSUB", channel});
        return r.elements.size() == 2 && r.elements[1].integer == 0;
      },
      seconds(5)))
      << "unsubscribed once nobody wanted it for a while";
  EventLog third;
  auto later = backend->subscribe("m", "w", third.listener());
  ASSERT_THAT(later, IsOk());
  EXPECT_TRUE(third.wait_released(seconds(2))) << "subscribed and confirmed again";
}

TEST(RedisHandOff, WaitingServiceTakesOverRightAfterARelease) {
  auto factory = make_factory(shared_uri(), seconds(10), seconds(6));
  ASSERT_TRUE(factory);
  Recorder a, b;
  auto holder = factory->create_contend_service(a.contender("m", "a")).value();
  auto waiter = factory->create_contend_service(b.contender("m", "b")).value();
  SIMBA_ASSERT_OK(holder->start());
  ASSERT_TRUE(a.acquired.wait(seconds(5)));
  SIMBA_ASSERT_OK(waiter->start());
  RawRedis raw(shared_server_uri("redis"));
  ASSERT_TRUE(tried_and_listening(raw, "m", "b"));
  EXPECT_FALSE(b.acquired.is_set());
  const auto released_at = steady_clock::now();
  SIMBA_ASSERT_OK(holder->stop());
  // Polling would take the hard lease (16 s); push takes a round trip or two.
  ASSERT_TRUE(b.acquired.wait(seconds(2)));
  EXPECT_LT(steady_clock::now() - released_at, seconds(1));
  EXPECT_GT(b.token.load(), a.token.load());
  SIMBA_ASSERT_OK(waiter->stop());
}

// How long after a never-renewing owner's lock key expires a waiter on `uri`
// owns the mutex, at the latest: measured from the latest instant the key can
// expire (the end of the owner's acquire call + its 1.5 s hard lease). The
// waiter's jitter is pinned at its largest value (+999 ms after the hard
// lease), so a waiter that only polls owns it ~1 s after the expiry.
std::optional<milliseconds> takeover_after_expiry(const std::string& uri) {
  auto crashed = open(uri);
  if (!crashed) return std::nullopt;
  // Connected and scripts loaded first, so the acquire below is one round
  // trip and `expired_by` is within about a millisecond of the expiry.
  EXPECT_THAT(crashed->read("m", in(seconds(3))), IsOk());
  // An owner that never renews: its hard lease is 1.5 s.
  constexpr milliseconds kHardLease(1500);
  auto held = crashed->acquire_or_renew(
      request_for("m", "crashed", milliseconds(1000), milliseconds(500)), in(seconds(3)));
  const auto expired_by = steady_clock::now() + kHardLease;
  EXPECT_THAT(held, IsOk());
  if (!held.ok() || !held->owner.is_owner("crashed")) return std::nullopt;
  // The waiter's own lease is long (ttl 20 s) and does not matter: it asks
  // again at the owner's transition_at plus its jitter, or when pushed.
  FactoryOptions options;
  options.contend.ttl = seconds(20);
  options.contend.transition = seconds(10);
  options.random = std::make_shared<FixedRandom>(ContendPeriod::kJitterMax);
  auto factory = MutexContendServiceFactory::open(uri, options);
  EXPECT_THAT(factory, IsOk());
  if (!factory.ok()) return std::nullopt;
  Recorder b;
  auto waiter = (*factory)->create_contend_service(b.contender("m", "b")).value();
  EXPECT_THAT(waiter->start(), IsOk());
  EXPECT_TRUE(b.acquired.wait(kHardLease + seconds(5)));
  EXPECT_THAT(waiter->stop(), IsOk());
  if (!b.acquired.is_set()) return std::nullopt;
  return std::chrono::duration_cast<milliseconds>(b.acquired_at() - expired_by);
}

// Redis deletes an expired key within ~100 ms on an idle server (its active
// expiry runs hz = 10 times a second), then publishes the event; the waiter
// needs one push and one round trip on localhost more. 500 ms leaves 400 ms
// of that for scheduling, and stays half a second below where polling lands
// (the pinned jitter: expiry + 999 ms), which the control below shows. Not
// scaled: Redis tests do not run sanitized, and a bound stretched past
// 999 ms could no longer tell push from polling.
constexpr milliseconds kExpiryPushBound(500);

TEST(RedisHandOff, ExpiryIsPushedWhenTheServerPublishesKeyEvents) {
  auto server = TestServer::start("redis", {"--notify-keyspace-events", "Ex", "--appendonly", "yes",
                                            "--appendfsync", "always"});
  ASSERT_THAT(server, IsOk());
  const auto after_expiry = takeover_after_expiry((*server)->uri());
  ASSERT_TRUE(after_expiry);
  RecordProperty("after_expiry_ms", static_cast<int>(after_expiry->count()));
  EXPECT_LT(*after_expiry, kExpiryPushBound);
}

// The control: the same server and timeline, but the backend told not to use
// the expiry events. The waiter finds the expiry at its poll, ~1 s after it,
// and so misses the bound above: the test above can tell push from polling.
// And the polling bound of docs/backends/redis.md: the takeover comes at the
// end of the hard lease plus the jitter (< 1 s), plus the waiter's timer and
// one round trip; 250 ms of room for those on a loaded machine.
TEST(RedisHandOff, WithoutKeyEventsExpiryIsFoundOnlyAtThePoll) {
  auto server = TestServer::start("redis", {"--notify-keyspace-events", "Ex", "--appendonly", "yes",
                                            "--appendfsync", "always"});
  ASSERT_THAT(server, IsOk());
  const auto after_expiry = takeover_after_expiry((*server)->uri() + "?keyspace_events=off");
  ASSERT_TRUE(after_expiry);
  RecordProperty("after_expiry_ms", static_cast<int>(after_expiry->count()));
  EXPECT_GE(*after_expiry, kExpiryPushBound);
  EXPECT_LT(*after_expiry, milliseconds(ContendPeriod::kJitterMax) + milliseconds(250));
}

// ---- failures ---------------------------------------------------------------------

TEST(RedisFailures, ServerRestartWithoutDurabilityNeverOverlapsOwners) {
  // A server that keeps nothing across a restart (the script's defaults).
  auto server = TestServer::start("redis");
  ASSERT_THAT(server, IsOk());
  const std::string uri = (*server)->uri();
  const milliseconds ttl(1000), transition(1000);

  // Wait out the guard of the fresh server.
  auto factory_a = make_factory(uri, ttl, transition);
  ASSERT_TRUE(factory_a);
  Recorder a;
  std::atomic<steady_clock::rep> a_lost{0};
  auto contender_a = make_contender(
      "m",
      [&](const MutexState& s) {
        a.token = s.after.fencing_token;
        a.acquired.set();
      },
      [&](const MutexState&) {
        a_lost = steady_clock::now().time_since_epoch().count();
        a.released.set();
      },
      "a");
  auto holder = factory_a->create_contend_service(contender_a).value();
  SIMBA_ASSERT_OK(holder->start());
  ASSERT_TRUE(a.acquired.wait(seconds(10)));

  SIMBA_ASSERT_OK((*server)->kill());
  SIMBA_ASSERT_OK((*server)->restart());
  const auto restarted = steady_clock::now();

  auto factory_b = make_factory(uri, ttl, transition);
  ASSERT_TRUE(factory_b);
  Recorder b;
  std::atomic<steady_clock::rep> b_won{0};
  auto contender_b = make_contender(
      "m",
      [&](const MutexState& s) {
        b_won = steady_clock::now().time_since_epoch().count();
        b.token = s.after.fencing_token;
        b.acquired.set();
      },
      [](const MutexState&) {}, "b");
  auto taker = factory_b->create_contend_service(contender_b).value();
  SIMBA_ASSERT_OK(taker->start());

  // A cannot renew (its key is gone and the guard refuses new leases): it
  // is revoked by its lease deadline, ttl + transition after its last
  // renewal.
  ASSERT_TRUE(a.released.wait(ttl + transition + seconds(1)));
  // A would contend again and might win once the guard is over; this test
  // is about B taking over, so A leaves.
  SIMBA_ASSERT_OK(holder->stop());
  // B gets the mutex after the guard (ttl + transition after the restart)
  // plus its error backoff, and never before A let go.
  ASSERT_TRUE(b.acquired.wait(ttl + transition + seconds(4)));
  EXPECT_GE(b_won.load(), a_lost.load());
  EXPECT_GE(steady_clock::now() - restarted, ttl + transition - milliseconds(1000));
  // Tokens keep growing although the server forgot the counter.
  EXPECT_GT(b.token.load(), a.token.load());
  SIMBA_ASSERT_OK(taker->stop());
}

// Found by the fault runs (issue #9): INFO's uptime_in_seconds reads 1 a
// moment after a server that started late in a wall-clock second, and the
// guard, taking the start as now - uptime, ended up to a second early while
// the owner of a forgotten lease still held it.
TEST(RedisFailures, RestartGuardLastsTheWholeLeaseFromTheServersStart) {
  using std::chrono::system_clock;
  auto server = TestServer::start("redis");  // keeps nothing across restarts
  ASSERT_THAT(server, IsOk());
  auto millis_of_second = [] {
    return std::chrono::duration_cast<milliseconds>(system_clock::now().time_since_epoch())
               .count() %
           1000;
  };
  // Restart late in a second...
  while (millis_of_second() < 600 || millis_of_second() > 700) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  const auto before_restart = system_clock::now();
  SIMBA_ASSERT_OK((*server)->kill());
  SIMBA_ASSERT_OK((*server)->restart());
  // ...and look at the server first just after the next second begins.
  std::this_thread::sleep_for(milliseconds(1030 - millis_of_second()));
  auto backend = open((*server)->uri());
  ASSERT_TRUE(backend);
  const AcquireRequest request =
      request_for("guarded", "c", milliseconds(1000), milliseconds(1000));
  const auto give_up = steady_clock::now() + seconds(10);
  bool won = false;
  while (!won && steady_clock::now() < give_up) {
    auto reply = backend->acquire_or_renew(request, in(seconds(3)));
    won = reply.ok() && reply->owner.owner_id == "c";
    if (!won) std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_TRUE(won);
  // The server started after `before_restart`; a lease granted before the
  // restart may be in use until ttl + transition after the start.
  EXPECT_GE(system_clock::now() - before_restart, milliseconds(2000));
}

// simba doctor on one server: durable (appendonly + always) is ok; one
// that keeps nothing is a note while the restart guard covers it, and
// unsafe with restart_guard=off (the negative control, exit 78 in the CLI).
TEST(RedisDoctor, DurabilityAndTheRestartGuard) {
  auto durable = TestServer::start("redis", kDurable);
  ASSERT_THAT(durable, IsOk());
  auto backend = open((*durable)->uri());
  ASSERT_TRUE(backend);
  auto report = backend->inspect(in(seconds(10)));
  ASSERT_THAT(report, IsOk());
  EXPECT_FALSE(report->unsafe()) << all_findings(*report);
  EXPECT_THAT(findings_about(*report, "topology"), HasSubstr("ok: a single server"))
      << all_findings(*report);
  EXPECT_THAT(findings_about(*report, "durability"),
              HasSubstr("ok: appendonly yes, appendfsync always"))
      << all_findings(*report);

  auto forgetful = TestServer::start("redis");
  ASSERT_THAT(forgetful, IsOk());
  auto guarded = open((*forgetful)->uri());
  ASSERT_TRUE(guarded);
  auto noted = guarded->inspect(in(seconds(10)));
  ASSERT_THAT(noted, IsOk());
  EXPECT_FALSE(noted->unsafe()) << all_findings(*noted);
  EXPECT_THAT(findings_about(*noted, "durability"), HasSubstr("note: appendonly no"))
      << all_findings(*noted);
  auto unguarded = open((*forgetful)->uri() + "?restart_guard=off");
  ASSERT_TRUE(unguarded);
  auto unsafe = unguarded->inspect(in(seconds(10)));
  ASSERT_THAT(unsafe, IsOk());
  EXPECT_TRUE(unsafe->unsafe()) << all_findings(*unsafe);
  EXPECT_THAT(findings_about(*unsafe, "durability"),
              HasSubstr("restart_guard=off: after a restart"))
      << all_findings(*unsafe);
}

// The guard says when leases resume; a contender comes back then, not at
// the next step of its error backoff (with ttl 6 s: tries at 0.1, 0.3, 0.7,
// 1.5, 3.1, 6.3 s, then 12.3 s, up to 5 s after a guard of 6.5-7.5 s).
TEST(RedisFailures, ContenderAcquiresWhenTheRestartGuardEnds) {
  const milliseconds ttl(6000), transition(500);
  const auto before_start = steady_clock::now();
  auto server = TestServer::start("redis");  // keeps nothing: a guard from its start
  ASSERT_THAT(server, IsOk());
  const auto after_start = steady_clock::now();
  auto factory = make_factory((*server)->uri(), ttl, transition);
  ASSERT_TRUE(factory);
  Recorder a;
  auto service = factory->create_contend_service(a.contender("m", "a")).value();
  SIMBA_ASSERT_OK(service->start());
  // The guard lasts ttl + transition from the start, up to a second more
  // (INFO's uptime counts whole seconds); then one jitter (< 100 ms) and a
  // round trip.
  ASSERT_TRUE(a.acquired.wait(std::chrono::duration_cast<milliseconds>(
      after_start + ttl + transition + milliseconds(1500) - steady_clock::now())));
  EXPECT_GE(steady_clock::now() - before_start, ttl + transition);
  SIMBA_ASSERT_OK(service->stop());
}

TEST(RedisFailures, ServicesStartWhileTheServerIsDownAndAcquireWhenItIsBack) {
  auto server = TestServer::start("redis", kDurable);
  ASSERT_THAT(server, IsOk());
  SIMBA_ASSERT_OK((*server)->stop());
  auto factory = make_factory((*server)->uri(), seconds(2), seconds(1));
  ASSERT_TRUE(factory);
  Recorder a;
  auto service = factory->create_contend_service(a.contender("m", "a")).value();
  // start() does not wait for the store (subscribing included).
  const auto started = steady_clock::now();
  SIMBA_ASSERT_OK(service->start());
  EXPECT_LT(steady_clock::now() - started, milliseconds(500));
  EXPECT_FALSE(a.acquired.wait(milliseconds(500)));
  SIMBA_ASSERT_OK((*server)->restart());
  // Retries back off to at most ttl (2 s) plus jitter.
  ASSERT_TRUE(a.acquired.wait(seconds(5)));
  EXPECT_TRUE(service->is_owner());
  SIMBA_ASSERT_OK(service->stop());
}

TEST(RedisFailures, PausedServerMakesCallsFailByTheirDeadline) {
  auto server = TestServer::start("redis");
  ASSERT_THAT(server, IsOk());
  auto backend = open((*server)->uri() + "?restart_guard=off");
  ASSERT_TRUE(backend);
  ASSERT_THAT(backend->read("m", in(seconds(3))), IsOk());
  SIMBA_ASSERT_OK((*server)->pause());
  const auto started = steady_clock::now();
  EXPECT_THAT(backend->acquire_or_renew(request_for("m", "a"), in(milliseconds(300))),
              StatusIs(StatusCode::kDeadlineExceeded));
  EXPECT_LT(steady_clock::now() - started, milliseconds(1000));
  SIMBA_ASSERT_OK((*server)->resume());
  // The late reply was never taken for another call's: the connection was
  // replaced and the next call works.
  auto after = backend->acquire_or_renew(request_for("m", "a"), in(seconds(3)));
  ASSERT_THAT(after, IsOk());
  EXPECT_EQ(after->owner.owner_id, "a");
}

TEST(RedisFailures, ClientKillOfBothConnectionsIsSurvived) {
  auto server = TestServer::start("redis", kDurable);
  ASSERT_THAT(server, IsOk());
  const std::string uri = (*server)->uri();
  auto factory = make_factory(uri, seconds(2), seconds(1));
  ASSERT_TRUE(factory);
  Recorder a, b;
  auto holder = factory->create_contend_service(a.contender("m", "a")).value();
  auto waiter = factory->create_contend_service(b.contender("m", "b")).value();
  SIMBA_ASSERT_OK(holder->start());
  ASSERT_TRUE(a.acquired.wait(seconds(5)));
  SIMBA_ASSERT_OK(waiter->start());
  // The waiter has tried (it is queued) and listens (both connections are
  // up) before they are killed. The default key prefix: "simba".
  RawRedis raw(uri);
  ASSERT_TRUE(eventually(
      [&] {
        RawReply r = raw.call({"PUBSUB", "NUMSUB", "simba:{m}:b"});
        return !raw.call({"ZSCORE", "simba:{m}:contender", "b"}).nil() && r.elements.size() == 2 &&
               r.elements[1].integer >= 1;
      },
      seconds(5)));
  for (const char* name : {"simba-commands", "simba-events"}) {
    // Only this process's connections: CLIENT LIST shows every client.
    RawReply list = raw.call({"CLIENT", "LIST"});
    std::istringstream lines(list.str);
    std::string line;
    int killed = 0;
    while (std::getline(lines, line)) {
      if (line.find(std::string("name=") + name + " ") == std::string::npos) continue;
      const std::string id = line.substr(3, line.find(' ') - 3);
      raw.call({"CLIENT", "KILL", "ID", id});
      ++killed;
    }
    EXPECT_GT(killed, 0) << name;
  }
  // The holder renews through a new command connection (several times over
  // 3 s, longer than ttl) and keeps the lease.
  std::this_thread::sleep_for(seconds(3));
  EXPECT_TRUE(holder->is_owner());
  EXPECT_FALSE(a.released.is_set());
  // The waiter's subscription was renewed: a release still reaches it at once.
  const auto released_at = steady_clock::now();
  SIMBA_ASSERT_OK(holder->stop());
  ASSERT_TRUE(b.acquired.wait(seconds(3)));
  EXPECT_LT(steady_clock::now() - released_at, milliseconds(900));
  SIMBA_ASSERT_OK(waiter->stop());
}

// ---- scale --------------------------------------------------------------------------

TEST(RedisScale, TenThousandMutexesShareTwoConnections) {
  auto server = TestServer::start("redis", kDurable);
  ASSERT_THAT(server, IsOk());
  const std::string uri = (*server)->uri();
  const int before_threads = count_threads();
  auto factory = make_factory(uri, seconds(10), seconds(6));
  ASSERT_TRUE(factory);
  constexpr int kMutexes = 10000;
  std::atomic<int> acquired{0};
  std::vector<std::unique_ptr<MutexContendService>> services;
  services.reserve(kMutexes);
  for (int i = 0; i < kMutexes; ++i) {
    auto contender = make_contender(
        "m" + std::to_string(i), [&](const MutexState&) { ++acquired; }, [](const MutexState&) {});
    services.push_back(factory->create_contend_service(contender).value());
    SIMBA_ASSERT_OK(services.back()->start());
  }
  ASSERT_TRUE(eventually([&] { return acquired.load() == kMutexes; }, seconds(60)))
      << acquired.load();
  EXPECT_LE(count_threads() - before_threads, 8);
  RawRedis raw(uri);
  RawReply list = raw.call({"CLIENT", "LIST"});
  std::istringstream lines(list.str);
  std::string line;
  int clients = 0;
  int subscriber = 0;
  while (std::getline(lines, line)) {
    if (line.find("name=simba-") == std::string::npos) continue;
    ++clients;
    if (line.find(" sub=" + std::to_string(kMutexes) + " ") != std::string::npos) ++subscriber;
  }
  EXPECT_EQ(clients, 2) << list.str;
  EXPECT_EQ(subscriber, 1) << "one subscriber connection holds all 10,000 subscriptions";
  for (auto& service : services) SIMBA_ASSERT_OK(service->stop());
}

}  // namespace
}  // namespace simba::testing
