// The backends' shared plumbing in core: the listener hub, the worker
// thread, the reconnect backoff, the turn, the wake fd and the TCP stream.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/listener_hub.h"
#include "core/net/stream.h"
#include "core/runtime.h"
#include "core/worker.h"
#include "testing/latch.h"
#include "testing/test_util.h"

namespace simba::internal {
namespace {

using simba::testing::eventually;
using simba::testing::Latch;
using simba::testing::scaled;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

MutexEvent released(const std::string& mutex) {
  return MutexEvent{MutexEvent::Kind::kReleased, mutex, "", 0};
}

// ---- ListenerHub ----------------------------------------------------------------

TEST(ListenerHubTest, DeliversToMatchingOpenSubscriptionsOnly) {
  auto hub = std::make_shared<ListenerHub>();
  std::vector<std::string> calls;
  auto a = hub->subscribe("m", "a", [&](const MutexEvent& e) { calls.push_back("a:" + e.mutex); });
  auto b = hub->subscribe("m", "", [&](const MutexEvent& e) { calls.push_back("b:" + e.mutex); });
  auto c = hub->subscribe("n", "c", [&](const MutexEvent& e) { calls.push_back("c:" + e.mutex); });
  hub->publish(released("m"), [](const ListenerHub::Slot& s) { return s.contender_id == "a"; });
  EXPECT_EQ(calls, (std::vector<std::string>{"a:m"}));
  calls.clear();
  ListenerHub::Work work;
  hub->collect_all(MutexEvent{MutexEvent::Kind::kLost, "", "", 0}, &work);
  hub->deliver(work);
  EXPECT_EQ(calls, (std::vector<std::string>{"a:m", "b:m", "c:n"}));
  calls.clear();
  int closed = 0;
  {
    ListenerHub::SlotPtr slot;
    auto d = hub->subscribe(
        "m", "d", [&](const MutexEvent&) { calls.push_back("d"); },
        [&](const ListenerHub::Slot& s) { closed += s.contender_id == "d"; }, &slot);
    ASSERT_NE(slot, nullptr);
    work.clear();
    hub->collect(released("m"), &work);  // d's call is queued, then d ends
  }
  EXPECT_EQ(closed, 1);
  b.reset();
  hub->deliver(work);  // neither the ended d nor b is called
  EXPECT_EQ(calls, (std::vector<std::string>{"a:m"}));
  EXPECT_TRUE(hub->any("m"));
  EXPECT_FALSE(hub->any("m", [](const ListenerHub::Slot& s) { return s.contender_id.empty(); }));
  EXPECT_FALSE(hub->any("x"));
  a.reset();
  c.reset();
  EXPECT_TRUE(hub->empty());
}

TEST(ListenerHubTest, DestroyingWaitsForTheListenerRunningOnAnotherThread) {
  auto hub = std::make_shared<ListenerHub>();
  Latch entered;
  Latch release;
  std::atomic<bool> destroyed{false};
  std::atomic<bool> returned_early{false};
  std::atomic<int> calls{0};
  auto sub = hub->subscribe("m", "", [&](const MutexEvent&) {
    ++calls;
    entered.set();
    ASSERT_TRUE(release.wait(milliseconds(10000)));
    // The destructor must not have returned while this call runs. It was
    // started before `release`; a destructor that does not wait returns
    // within microseconds, so 200 ms is ample to see it.
    returned_early = eventually([&] { return destroyed.load(); }, milliseconds(200));
  });
  std::thread deliverer([&] { hub->publish(released("m")); });
  ASSERT_TRUE(entered.wait(milliseconds(10000)));
  std::thread destroyer([&] {
    release.set();
    sub.reset();
    destroyed = true;
  });
  destroyer.join();
  deliverer.join();
  EXPECT_FALSE(returned_early.load());
  hub->publish(released("m"));
  EXPECT_EQ(calls.load(), 1);
}

TEST(ListenerHubTest, ASubscriptionEndsFromInsideItsOwnListener) {
  auto hub = std::make_shared<ListenerHub>();
  std::unique_ptr<Subscription> sub;
  std::unique_ptr<Subscription> other;
  int calls = 0;
  int other_calls = 0;
  sub = hub->subscribe("m", "", [&](const MutexEvent&) {
    ++calls;
    sub.reset();    // itself: must not deadlock
    other.reset();  // another one, queued in this very delivery
  });
  other = hub->subscribe("m", "", [&](const MutexEvent&) { ++other_calls; });
  std::thread deliverer([&] { hub->publish(released("m")); });
  deliverer.join();
  hub->publish(released("m"));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(other_calls, 0);
  EXPECT_TRUE(hub->empty());
}

TEST(ListenerHubTest, NoCallAfterTheSubscriptionIsGoneUnderConcurrentDelivery) {
  auto hub = std::make_shared<ListenerHub>();
  std::atomic<bool> stop{false};
  std::atomic<int> late_calls{0};
  std::thread deliverer([&] {
    while (!stop) {
      hub->publish(released("m"));
      std::this_thread::yield();  // lets close() take the delivery lock
    }
  });
  for (int i = 0; i < 300; ++i) {
    auto calls = std::make_shared<std::atomic<int>>(0);
    auto gone = std::make_shared<std::atomic<bool>>(false);
    auto sub = hub->subscribe("m", "", [calls, gone, &late_calls](const MutexEvent&) {
      ++*calls;
      std::this_thread::yield();  // a call still running when the handle goes
      if (*gone) ++late_calls;
    });
    ASSERT_TRUE(eventually([&] { return calls->load() > 0; }, milliseconds(10000)));
    sub.reset();
    *gone = true;
  }
  stop = true;
  deliverer.join();
  EXPECT_EQ(late_calls.load(), 0);
}

// ---- Worker ------------------------------------------------------------------------

TEST(WorkerTest, JoinWaitsForTheBody) {
  Worker worker;
  std::atomic<bool> done{false};
  Latch go;
  ASSERT_TRUE(worker.start("test", [&] {
    ASSERT_TRUE(go.wait(milliseconds(10000)));
    done = true;
  }));
  EXPECT_FALSE(worker.start("test", [] {}));
  EXPECT_TRUE(worker.running());
  go.set();
  worker.join();
  EXPECT_TRUE(done.load());
  EXPECT_FALSE(worker.running());
  EXPECT_FALSE(worker.start("test", [] {}));  // joined: never again
}

// Simba's threads carry its name, so tools (and the thread budget's tests)
// tell them from a client library's.
TEST(WorkerTest, NamesItsThread) {
  Worker worker;
  std::string name;
  ASSERT_TRUE(worker.start("a-long-thread-name", [&] {
    char buffer[16] = {};
    pthread_getname_np(pthread_self(), buffer, sizeof buffer);
    name = buffer;
  }));
  worker.join();
  EXPECT_EQ(name, "simba:a-long-th");
}

// What a backend does: its loop owns it through a shared_ptr, and the last
// reference may be dropped on the loop's own thread (a listener destroyed the
// backend), so its destructor joins the worker from the worker itself.
struct Owner {
  Worker worker;
  Latch* destroyed = nullptr;
  ~Owner() {
    worker.join();
    destroyed->set();
  }
};

TEST(WorkerTest, TheOwnerCanBeDestroyedOnTheWorkersOwnThread) {
  Latch destroyed;
  Latch go;
  std::thread::id body_thread;
  std::thread::id destructor_thread;
  {
    auto owner = std::make_shared<Owner>();
    owner->destroyed = &destroyed;
    ASSERT_TRUE(owner->worker.start("test", [owner, &go, &body_thread]() mutable {
      body_thread = std::this_thread::get_id();
      ASSERT_TRUE(go.wait(milliseconds(10000)));
      owner.reset();  // the last reference: ~Owner joins from this thread
    }));
  }
  const int threads = simba::testing::count_threads();
  go.set();
  ASSERT_TRUE(destroyed.wait(milliseconds(10000)));
  // The thread ends by itself.
  EXPECT_TRUE(
      eventually([&] { return simba::testing::count_threads() < threads; }, milliseconds(10000)));
}

// ---- ThreadPool (over Worker) -------------------------------------------------------

TEST(ThreadPoolTest, APoolDestroyedFromItsOwnTaskLetsThatThreadEndCleanly) {
  auto pool = std::make_shared<ThreadPool>("test", 2);
  const int threads = simba::testing::count_threads();
  Latch later_ran;
  Latch destroyed;
  Latch posted;
  ASSERT_TRUE(pool->post([&] {
    // Not before Post has returned: the caller of Post holds the pool.
    ASSERT_TRUE(posted.wait(milliseconds(10000)));
    // Queued before the pool goes: it still runs (Shutdown drains).
    ASSERT_TRUE(pool->post([&] { later_ran.set(); }));
    // The last reference, dropped from inside the pool's own thread.
    std::shared_ptr<ThreadPool> last = std::move(pool);
    last.reset();
    destroyed.set();
  }));
  posted.set();
  ASSERT_TRUE(destroyed.wait(milliseconds(10000)));
  EXPECT_TRUE(later_ran.wait(milliseconds(10000)));
  EXPECT_TRUE(eventually([&] { return simba::testing::count_threads() <= threads - 2; },
                         milliseconds(10000)));
}

// ---- Backoff and TurnGate ------------------------------------------------------------

TEST(BackoffTest, DoublesFromFirstToMaxAndResets) {
  Backoff backoff(milliseconds(100), milliseconds(500));
  EXPECT_TRUE(backoff.ready().ok());
  EXPECT_EQ(backoff.failed(unavailable_error("down")), milliseconds(100));
  const Status waiting = backoff.ready();
  EXPECT_EQ(waiting.code(), StatusCode::kUnavailable);
  EXPECT_NE(waiting.message().find("down (next reconnect in "), std::string::npos)
      << waiting.message();
  EXPECT_EQ(backoff.failed(unavailable_error("down")), milliseconds(200));
  EXPECT_EQ(backoff.failed(unavailable_error("down")), milliseconds(400));
  EXPECT_EQ(backoff.failed(unavailable_error("down")), milliseconds(500));
  EXPECT_EQ(backoff.failed(unavailable_error("down")), milliseconds(500));
  backoff.reset();
  EXPECT_TRUE(backoff.ready().ok());
  EXPECT_EQ(backoff.failed(), milliseconds(100));
}

TEST(TurnGateTest, OneTurnAtATimeWithinTheDeadline) {
  TurnGate gate;
  TurnGate::Turn first = gate.take(steady_clock::now() + milliseconds(1000));
  ASSERT_TRUE(first.taken());
  // Held: a second take gives up at its deadline.
  EXPECT_FALSE(gate.take(steady_clock::now() + milliseconds(20)).taken());
  std::atomic<bool> second_taken{false};
  std::thread waiter([&] {
    TurnGate::Turn second = gate.take(steady_clock::now() + scaled(milliseconds(10000)));
    second_taken = second.taken();
  });
  first.release();
  waiter.join();
  EXPECT_TRUE(second_taken.load());
  TurnGate::Turn moved = gate.take(steady_clock::now() + milliseconds(1000));
  TurnGate::Turn target(std::move(moved));
  EXPECT_FALSE(moved.taken());  // NOLINT(bugprone-use-after-move): the point of the test
  EXPECT_TRUE(target.taken());
}

// ---- WakeFd, wait_fd, connect_tcp and Stream -----------------------------------------

TEST(WaitFdTest, ReadyWokenOrTimedOut) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  WakeFd wake;
  ASSERT_TRUE(wake.ok());
  EXPECT_EQ(wait_fd(pipe_fds[0], POLLIN, steady_clock::now() + milliseconds(10), wake.fd()),
            FdWait::kTimedOut);
  wake.post();
  EXPECT_EQ(wait_fd(pipe_fds[0], POLLIN, steady_clock::now() + milliseconds(1000), wake.fd()),
            FdWait::kWoken);
  wake.drain();
  ASSERT_EQ(::write(pipe_fds[1], "x", 1), 1);
  EXPECT_EQ(wait_fd(pipe_fds[0], POLLIN, steady_clock::now() + milliseconds(1000), wake.fd()),
            FdWait::kReady);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

// A listening socket on 127.0.0.1; its port.
int listen(int* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) return -1;
  if (::listen(fd, 4) != 0) return -1;
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  *port = ntohs(address.sin_port);
  return fd;
}

TEST(StreamTest, ConnectsWritesReadsAndTimesOut) {
  int port = 0;
  const int listener = listen(&port);
  ASSERT_GE(listener, 0);
  auto stream = connect_tcp("127.0.0.1", static_cast<std::uint16_t>(port), "test at here",
                            steady_clock::now() + scaled(milliseconds(5000)));
  ASSERT_TRUE(stream.ok()) << stream.status();
  const int peer = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(peer, 0);
  ASSERT_TRUE((*stream)->write_all("ping", steady_clock::now() + milliseconds(1000)).ok());
  char buffer[16];
  ASSERT_EQ(::recv(peer, buffer, sizeof buffer, 0), 4);
  // Nothing to read: the deadline ends the wait, named by `what`.
  auto late = (*stream)->read_some(buffer, sizeof buffer, steady_clock::now() + milliseconds(20));
  EXPECT_EQ(late.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(late.status().message(), "test at here: reply timed out");
  ASSERT_EQ(::send(peer, "pong", 4, 0), 4);
  auto read = (*stream)->read_some(buffer, sizeof buffer, steady_clock::now() + milliseconds(5000));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(std::string(buffer, *read), "pong");
  // shutdown() from another thread ends a read blocked with a long deadline.
  std::thread stopper([&] { (*stream)->shutdown(); });
  auto ended = (*stream)->read_some(buffer, sizeof buffer,
                                    steady_clock::now() + scaled(milliseconds(60000)));
  stopper.join();
  EXPECT_TRUE(!ended.ok() || *ended == 0);
  ::close(peer);
  ::close(listener);
}

TEST(StreamTest, ARefusedConnectIsUnavailableWithTheContext) {
  int port = 0;
  const int listener = listen(&port);
  ASSERT_GE(listener, 0);
  ::close(listener);  // nobody listens on `port` now
  auto stream = connect_tcp("127.0.0.1", static_cast<std::uint16_t>(port), "test at here",
                            steady_clock::now() + scaled(milliseconds(5000)));
  ASSERT_FALSE(stream.ok());
  EXPECT_EQ(stream.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(stream.status().message().rfind("test at here: connect: ", 0), 0u) << stream.status();
}

}  // namespace
}  // namespace simba::internal
