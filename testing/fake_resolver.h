// A stand-in for the system resolver in tests of host-name lookups
// (src/core/host_lookup.h): while a FakeResolverTest runs, every lookup of a
// name blocks until `release` is set, then answers `addresses` (what
// getaddrinfo gives for those numeric strings, in that order), or `error`,
// or EAI_NONAME for `unknown_host`. Numeric hosts never reach it.
#ifndef SIMBA_TESTING_FAKE_RESOLVER_H_
#define SIMBA_TESTING_FAKE_RESOLVER_H_

#include <gtest/gtest.h>
#include <netdb.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/host_lookup.h"
#include "testing/latch.h"
#include "testing/test_util.h"

namespace simba::testing {

struct FakeResolver {
  Latch release;
  std::vector<std::string> addresses = {"127.0.0.1"};
  int error = 0;
  std::string unknown_host;
};

class FakeResolverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    internal::set_get_addr_info_for_testing([fake = fake_](const char* host, const char* service,
                                                           const addrinfo* hints,
                                                           addrinfo** found) {
      // Bounded, so that a failing test cannot leave a worker behind forever.
      fake->release.wait(std::chrono::seconds(60));
      if (fake->error != 0) return fake->error;
      if (host == fake->unknown_host) return EAI_NONAME;
      // One list of every address: glibc's freeaddrinfo frees node by node.
      addrinfo* head = nullptr;
      addrinfo** tail = &head;
      for (const std::string& address : fake->addresses) {
        if (const int rc = ::getaddrinfo(address.c_str(), service, hints, tail); rc != 0) {
          if (head != nullptr) ::freeaddrinfo(head);
          return rc;
        }
        while (*tail != nullptr) tail = &(*tail)->ai_next;
      }
      *found = head;
      return 0;
    });
  }

  void TearDown() override {
    fake_->release.set();
    EXPECT_TRUE(eventually([] { return internal::host_lookups_in_flight_for_testing() == 0; },
                           std::chrono::seconds(10)));
    internal::set_get_addr_info_for_testing({});
  }

  std::shared_ptr<FakeResolver> fake_ = std::make_shared<FakeResolver>();
};

}  // namespace simba::testing

#endif  // SIMBA_TESTING_FAKE_RESOLVER_H_
