// Small helpers shared by the tests of server-backed stores (tests/redis,
// tests/postgres, tests/mysql): deadlines, requests, opening a backend or a
// factory that must open, and a contender that records what it was told.
#ifndef SIMBA_TESTING_STORE_TEST_HELPERS_H_
#define SIMBA_TESTING_STORE_TEST_HELPERS_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "simba/backend.h"
#include "simba/contend_service.h"
#include "simba/contender.h"
#include "simba/registry.h"
#include "testing/latch.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

namespace simba::testing {

// A store-call deadline `d` from now.
inline Deadline in(std::chrono::milliseconds d) { return std::chrono::steady_clock::now() + d; }

// What `simba doctor` found about `topic`: one "severity: text" line per
// finding, in order ("" when there is none), for matching on and printing.
inline std::string findings_about(const StoreReport& report, std::string_view topic) {
  std::string out;
  for (const StoreFinding& finding : report.findings) {
    if (finding.topic != topic) continue;
    out += std::string(severity_name(finding.severity)) + ": " + finding.text + "\n";
  }
  return out;
}
// Every finding, "topic severity: text" per line (for failure messages).
inline std::string all_findings(const StoreReport& report) {
  std::string out;
  for (const StoreFinding& finding : report.findings) {
    out += finding.topic + " " + severity_name(finding.severity) + ": " + finding.text + "\n";
  }
  return out;
}

// An acquire_or_renew request with the suite's lease (ttl 2 s, transition 1 s).
inline AcquireRequest request_for(
    std::string_view mutex, std::string_view id,
    std::chrono::milliseconds ttl = std::chrono::milliseconds(2000),
    std::chrono::milliseconds transition = std::chrono::milliseconds(1000)) {
  return AcquireRequest{mutex, id, ttl, transition};
}

// The backend `uri` names; a failed expectation (and nullptr) if it fails.
inline std::shared_ptr<Backend> open(const std::string& uri) {
  auto backend = open_backend(uri);
  EXPECT_THAT(backend, IsOk()) << uri;
  return backend.ok() ? *backend : nullptr;
}

// A factory on `uri` with the given lease; a failed expectation (and
// nullptr) if it fails.
inline std::unique_ptr<MutexContendServiceFactory> make_factory(
    const std::string& uri, std::chrono::milliseconds ttl, std::chrono::milliseconds transition) {
  FactoryOptions options;
  options.contend.ttl = ttl;
  options.contend.transition = transition;
  auto factory = MutexContendServiceFactory::open(uri, options);
  EXPECT_THAT(factory, IsOk()) << uri;
  return factory.ok() ? std::move(factory).value() : nullptr;
}

// `backends` each acquire a mutex of their own at the same moment (the first
// use of a store, for instance); what each call returned.
inline std::vector<Status> acquire_all_at_once(
    const std::vector<std::shared_ptr<Backend>>& backends) {
  std::atomic<std::size_t> ready{0};
  std::vector<Status> results(backends.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < backends.size(); ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (ready.load() < backends.size()) std::this_thread::yield();
      results[i] = backends[i]
                       ->acquire_or_renew(request_for("m" + std::to_string(i), "c"),
                                          in(std::chrono::seconds(10)))
                       .status();
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

// A listener may drop the last references to its subscription and to the
// backend of `uri`, on the backend's own event thread. That thread cannot
// join itself: it must end by itself once the listener returns, touching
// nothing of the destroyed backend on the way (the ASan stage catches a use
// after free: before #21 the Redis and etcd event threads ran on in freed
// memory).
inline void expect_a_listener_may_destroy_its_backend(const std::string& uri) {
  using std::chrono::seconds;
  auto other = open(uri);
  ASSERT_TRUE(other);
  // Simba's threads are counted from here, all of them from after a first
  // call: a client library may start a pool of its own, once per process,
  // at the first call (gRPC does). `other` starts none before it acquires
  // (an etcd backend watches its owners), and is gone before the count.
  const int simba_threads = count_simba_threads();
  (void)other->read("gone", in(seconds(3)));
  const int threads = count_threads();
  std::mutex mu;
  std::shared_ptr<Backend> backend = open(uri);
  ASSERT_TRUE(backend);
  std::unique_ptr<Subscription> subscription;
  Latch destroyed;
  {
    std::lock_guard<std::mutex> lock(mu);
    // A retriever: it hears any event on the mutex, and a "look again" once
    // the store confirms the subscription.
    auto subscribed = backend->subscribe("gone", [&](const MutexEvent&) {
      std::lock_guard<std::mutex> listener_lock(mu);
      if (!backend) return;
      subscription.reset();
      backend.reset();
      destroyed.set();
    });
    ASSERT_TRUE(subscribed.ok()) << subscribed.status();
    subscription = std::move(*subscribed);
  }
  ASSERT_TRUE(eventually(
      [&] {
        (void)other->acquire_or_renew(request_for("gone", "someone"), in(seconds(3)));
        return destroyed.is_set();
      },
      seconds(20)));
  // The event thread ends by itself (`other`'s own are joined here).
  other.reset();
  EXPECT_TRUE(eventually(
      [&] { return count_threads() <= threads && count_simba_threads() <= simba_threads; },
      seconds(10)));
}

// Callbacks of several contenders on one timeline: what happened when
// (steady clock), the tokens given, and latches for the first of each.
struct Timeline {
  std::mutex mu;
  std::vector<std::pair<std::string, std::chrono::steady_clock::time_point>> events;
  std::vector<std::uint64_t> tokens;
  Latch acquired;
  Latch released;

  // Records "<name> acquired" / "<name> released"; `id` is the contender
  // id (a generated one if empty).
  std::shared_ptr<MutexContender> contender(const std::string& mutex, const std::string& name,
                                            const std::string& id = "") {
    return make_contender(
        mutex,
        [this, name](const MutexState& s) {
          {
            std::lock_guard<std::mutex> lock(mu);
            events.emplace_back(name + " acquired", std::chrono::steady_clock::now());
            tokens.push_back(s.after.fencing_token);
          }
          acquired.set();
        },
        [this, name](const MutexState&) {
          {
            std::lock_guard<std::mutex> lock(mu);
            events.emplace_back(name + " released", std::chrono::steady_clock::now());
          }
          released.set();
        },
        id.empty() ? MutexContender::generate_host_contender_id() : id);
  }
  // When `what` ("a released") first happened.
  std::optional<std::chrono::steady_clock::time_point> when(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [name, at] : events) {
      if (name == what) return at;
    }
    return std::nullopt;
  }
};

// A contender's acquisitions and releases: latches, the last token and when
// it last acquired.
struct Recorder {
  Latch acquired;
  Latch released;
  std::atomic<std::uint64_t> token{0};

  std::shared_ptr<MutexContender> contender(const std::string& mutex, const std::string& id) {
    return make_contender(
        mutex,
        [this](const MutexState& s) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            acquired_at_ = std::chrono::steady_clock::now();
          }
          token = s.after.fencing_token;
          acquired.set();
        },
        [this](const MutexState&) { released.set(); }, id);
  }
  std::chrono::steady_clock::time_point acquired_at() {
    std::lock_guard<std::mutex> lock(mu_);
    return acquired_at_;
  }

 private:
  std::mutex mu_;
  std::chrono::steady_clock::time_point acquired_at_{};
};

}  // namespace simba::testing

#endif  // SIMBA_TESTING_STORE_TEST_HELPERS_H_
