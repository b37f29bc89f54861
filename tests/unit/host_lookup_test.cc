// Host lookups bounded by a deadline: numeric hosts inline, names on a shared
// worker that a caller may abandon at its deadline.
#include "core/host_lookup.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "testing/latch.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

namespace simba::internal {
namespace {

using simba::testing::eventually;
using simba::testing::Latch;
using simba::testing::StatusIs;
using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;
using ::testing::HasSubstr;

// A resolver that answers 127.0.0.1 (or fails with `error`) once released.
// Shared with the workers, which may outlive the test that made it.
struct FakeResolver {
  std::atomic<int> calls{0};
  Latch release;
  int error = 0;
};

class HostLookupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_get_addr_info_for_testing(
        [fake = fake_](const char*, const char* service, const addrinfo* hints, addrinfo** found) {
          ++fake->calls;
          // Bounded, so that a failing test cannot leave a worker behind forever.
          fake->release.wait(seconds(60));
          if (fake->error != 0) return fake->error;
          return ::getaddrinfo("127.0.0.1", service, hints, found);
        });
  }

  void TearDown() override {
    fake_->release.set();
    EXPECT_TRUE(eventually([] { return host_lookups_in_flight_for_testing() == 0; }, seconds(10)));
    set_get_addr_info_for_testing(nullptr);
  }

  std::shared_ptr<FakeResolver> fake_ = std::make_shared<FakeResolver>();
};

std::string address_text(const ResolvedAddress& a) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a.address())->sin_addr, text,
                sizeof(text));
  } else if (a.family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a.address())->sin6_addr, text,
                sizeof(text));
  }
  return text;
}

int port(const ResolvedAddress& a) {
  if (a.family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(a.address())->sin_port);
  }
  return ntohs(reinterpret_cast<const sockaddr_in6*>(a.address())->sin6_port);
}

TEST_F(HostLookupTest, NumericHostsResolveInlineEvenPastTheDeadline) {
  const auto expired = steady_clock::now() - seconds(1);

  const auto v4 = look_up_host("127.0.0.1", 6379, expired);
  SIMBA_ASSERT_OK(v4);
  ASSERT_EQ(v4->size(), 1u);
  EXPECT_EQ((*v4)[0].family, AF_INET);
  EXPECT_EQ((*v4)[0].socktype, SOCK_STREAM);
  EXPECT_EQ((*v4)[0].length, sizeof(sockaddr_in));
  EXPECT_EQ(address_text((*v4)[0]), "127.0.0.1");
  EXPECT_EQ(port((*v4)[0]), 6379);

  const auto v6 = look_up_host("::1", 2379, expired);
  SIMBA_ASSERT_OK(v6);
  ASSERT_EQ(v6->size(), 1u);
  EXPECT_EQ((*v6)[0].family, AF_INET6);
  EXPECT_EQ((*v6)[0].length, sizeof(sockaddr_in6));
  EXPECT_EQ(address_text((*v6)[0]), "::1");
  EXPECT_EQ(port((*v6)[0]), 2379);

  EXPECT_EQ(fake_->calls, 0);
  EXPECT_EQ(host_lookups_in_flight_for_testing(), 0u);
}

TEST_F(HostLookupTest, LocalhostResolvesThroughTheSystemResolver) {
  set_get_addr_info_for_testing(nullptr);
  const auto found = look_up_host("localhost", 80, steady_clock::now() + seconds(10));
  SIMBA_ASSERT_OK(found);
  ASSERT_FALSE(found->empty());
  for (const ResolvedAddress& a : *found) {
    EXPECT_THAT(address_text(a), ::testing::AnyOf("127.0.0.1", "::1"));
    EXPECT_EQ(port(a), 80);
  }
}

TEST_F(HostLookupTest, AHungResolverCostsACallerOnlyItsDeadline) {
  const auto start = steady_clock::now();
  const auto found = look_up_host("hung.invalid", 6379, start + milliseconds(200));
  const auto took = steady_clock::now() - start;
  EXPECT_THAT(found, StatusIs(StatusCode::kDeadlineExceeded, HasSubstr("within the deadline")));
  EXPECT_GE(took, milliseconds(200));
  EXPECT_LT(took, milliseconds(200) + simba::testing::scaled(milliseconds(500)));

  // The abandoned worker finishes once the resolver answers, and the answer
  // is not kept: the next lookup asks again.
  EXPECT_EQ(host_lookups_in_flight_for_testing(), 1u);
  fake_->release.set();
  ASSERT_TRUE(eventually([] { return host_lookups_in_flight_for_testing() == 0; }, seconds(10)));
  const auto again = look_up_host("hung.invalid", 6379, steady_clock::now() + seconds(10));
  SIMBA_ASSERT_OK(again);
  EXPECT_EQ(address_text(again->front()), "127.0.0.1");
  EXPECT_EQ(fake_->calls, 2);
}

TEST_F(HostLookupTest, ConcurrentLookupsOfOneHostShareOneWorker) {
  const auto deadline = steady_clock::now() + milliseconds(300);
  std::vector<Status> outcomes(3);
  std::vector<std::thread> callers;
  for (int i = 0; i < 3; ++i) {
    callers.emplace_back(
        [&, i] { outcomes[i] = look_up_host("hung.invalid", 6379, deadline).status(); });
  }
  for (std::thread& t : callers) t.join();
  for (const Status& s : outcomes) EXPECT_THAT(s, StatusIs(StatusCode::kDeadlineExceeded));
  EXPECT_EQ(fake_->calls, 1);
  EXPECT_EQ(host_lookups_in_flight_for_testing(), 1u);

  // Another port is another lookup.
  EXPECT_THAT(look_up_host("hung.invalid", 6380, steady_clock::now() + milliseconds(50)),
              StatusIs(StatusCode::kDeadlineExceeded));
  EXPECT_EQ(fake_->calls, 2);
  EXPECT_EQ(host_lookups_in_flight_for_testing(), 2u);
}

TEST_F(HostLookupTest, ACallerWithinItsDeadlineGetsTheWorkersAnswer) {
  std::thread releaser([fake = fake_] {
    std::this_thread::sleep_for(milliseconds(50));
    fake->release.set();
  });
  const auto found = look_up_host("slow.invalid", 6379, steady_clock::now() + seconds(30));
  releaser.join();
  SIMBA_ASSERT_OK(found);
  ASSERT_EQ(found->size(), 1u);
  EXPECT_EQ(address_text(found->front()), "127.0.0.1");
  EXPECT_EQ(port(found->front()), 6379);
  EXPECT_EQ(fake_->calls, 1);
}

TEST_F(HostLookupTest, AResolverFailureIsUnavailable) {
  fake_->error = EAI_NONAME;
  fake_->release.set();
  EXPECT_THAT(look_up_host("missing.invalid", 6379, steady_clock::now() + seconds(10)),
              StatusIs(StatusCode::kUnavailable,
                       "cannot resolve host: " + std::string(gai_strerror(EAI_NONAME))));
}

TEST_F(HostLookupTest, AnExpiredDeadlineStartsNoLookup) {
  EXPECT_THAT(look_up_host("late.invalid", 6379, steady_clock::now() - milliseconds(1)),
              StatusIs(StatusCode::kDeadlineExceeded));
  EXPECT_EQ(fake_->calls, 0);
  EXPECT_EQ(host_lookups_in_flight_for_testing(), 0u);
}

}  // namespace
}  // namespace simba::internal
