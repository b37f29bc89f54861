#include "simba/registry.h"

#include <atomic>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "simba/internal/backends_config.h"
#include "simba/keyed_lock.h"
#include "testing/status_matchers.h"

namespace simba {

namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

using ::simba::testing::IsOk;
using ::simba::testing::IsOkAndHolds;
using ::simba::testing::StatusIs;

// Stands in for a store: the registry only hands it back, never calls it.
class FakeBackend : public Backend {
 public:
  explicit FakeBackend(std::string scheme) : scheme_(std::move(scheme)) {}
  std::string_view scheme() const override { return scheme_; }
  const Capabilities& capabilities() const override { return capabilities_; }
  Result<OwnerRecord> do_acquire_or_renew(const AcquireRequest&, Deadline) override {
    return unimplemented_error("fake");
  }
  Result<bool> do_release(std::string_view, std::string_view, std::uint64_t, Deadline) override {
    return unimplemented_error("fake");
  }
  Result<ForcedRelease> do_force_release(std::string_view, Deadline) override {
    return unimplemented_error("fake");
  }
  Result<OwnerRecord> do_read(std::string_view, Deadline) override {
    return unimplemented_error("fake");
  }
  Result<std::vector<ListedMutex>> do_list(Deadline) override {
    return unimplemented_error("fake");
  }

 private:
  std::string scheme_;
  Capabilities capabilities_;
};

BackendRegistry::Opener fake_opener(std::string scheme) {
  return [scheme](const Uri&) -> Result<std::shared_ptr<Backend>> {
    return std::shared_ptr<Backend>(std::make_shared<FakeBackend>(scheme));
  };
}

TEST(BackendRegistryTest, SchemesAreSortedAndLowerCased) {
  BackendRegistry registry;
  EXPECT_THAT(registry.schemes(), ElementsAre());
  ASSERT_TRUE(registry.add("sqlite", fake_opener("sqlite")).ok());
  ASSERT_TRUE(registry.add("Memory", fake_opener("memory")).ok());
  ASSERT_TRUE(registry.add("etcd", fake_opener("etcd")).ok());
  EXPECT_THAT(registry.schemes(), ElementsAre("etcd", "memory", "sqlite"));
}

TEST(BackendRegistryTest, DuplicateSchemeIsAlreadyExists) {
  BackendRegistry registry;
  ASSERT_TRUE(registry.add("memory", fake_opener("first")).ok());
  EXPECT_THAT(registry.add("memory", fake_opener("second")),
              StatusIs(StatusCode::kAlreadyExists, HasSubstr("'memory' is registered already")));
  EXPECT_THAT(registry.add("MEMORY", fake_opener("third")),
              StatusIs(StatusCode::kAlreadyExists, HasSubstr("'memory'")));
  // The first registration still wins.
  const Result<std::shared_ptr<Backend>> backend = registry.open("memory://x");
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->scheme(), "first");
}

TEST(BackendRegistryTest, RejectsSchemesNoUriCouldName) {
  BackendRegistry registry;
  for (const std::string scheme : {"", "1db", "my db", "a:b", "x_y"}) {
    EXPECT_THAT(registry.add(scheme, fake_opener("x")),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("invalid store scheme")))
        << scheme;
  }
  EXPECT_THAT(registry.add("a+b-c.d", fake_opener("x")), StatusIs(StatusCode::kOk, ""));
}

TEST(BackendRegistryTest, RejectsAnEmptyOpener) {
  BackendRegistry registry;
  EXPECT_THAT(registry.add("memory", nullptr),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("no opener")));
  EXPECT_THAT(registry.schemes(), ElementsAre());
}

TEST(BackendRegistryTest, OpenCallsTheOpenerWithTheParsedUri) {
  BackendRegistry registry;
  std::optional<Uri> seen;
  ASSERT_TRUE(registry
                  .add("redis",
                       [&seen](const Uri& uri) -> Result<std::shared_ptr<Backend>> {
                         seen = uri;
                         return std::shared_ptr<Backend>(std::make_shared<FakeBackend>("redis"));
                       })
                  .ok());
  const std::string text = "REDIS://u:pw@h1:6379,[::1]:6380/0?lease=10s";
  const Result<std::shared_ptr<Backend>> backend = registry.open(text);
  ASSERT_TRUE(backend.ok()) << backend.status();
  ASSERT_NE(*backend, nullptr);
  EXPECT_EQ((*backend)->scheme(), "redis");
  ASSERT_TRUE(seen.has_value());
  const Result<Uri> expected = Uri::parse(text);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_TRUE(*seen == *expected);
  EXPECT_EQ(seen->scheme, "redis");
  EXPECT_EQ(seen->password, "pw");  // the opener needs the real one
}

TEST(BackendRegistryTest, UnknownSchemeListsTheSupportedOnes) {
  BackendRegistry registry;
  ASSERT_TRUE(registry.add("sqlite", fake_opener("sqlite")).ok());
  ASSERT_TRUE(registry.add("memory", fake_opener("memory")).ok());
  const Result<std::shared_ptr<Backend>> backend = registry.open("foo://x");
  EXPECT_THAT(backend, StatusIs(StatusCode::kUnimplemented,
                                "unknown store scheme 'foo' in 'foo://x'; this build supports: "
                                "memory, sqlite"));
}

TEST(BackendRegistryTest, UnknownSchemeInAnEmptyRegistry) {
  BackendRegistry registry;
  EXPECT_THAT(
      registry.open("memory://x"),
      StatusIs(StatusCode::kUnimplemented, AllOf(HasSubstr("unknown store scheme 'memory'"),
                                                 HasSubstr("no store schemes are registered"))));
}

TEST(BackendRegistryTest, UnknownSchemeMessageHidesThePassword) {
  BackendRegistry registry;
  ASSERT_TRUE(registry.add("memory", fake_opener("memory")).ok());
  EXPECT_THAT(registry.open("rediss://u:Zq7s3cr3tPW@h:6379/0?password=Zq7s3cr3tPW"),
              StatusIs(StatusCode::kUnimplemented,
                       AllOf(HasSubstr("'rediss://u:****@h:6379/0?password=****'"),
                             Not(HasSubstr("s3cr3t")))));
}

TEST(BackendRegistryTest, MalformedUriIsInvalidArgumentAndSkipsTheOpener) {
  BackendRegistry registry;
  bool called = false;
  ASSERT_TRUE(registry
                  .add("redis",
                       [&called](const Uri&) -> Result<std::shared_ptr<Backend>> {
                         called = true;
                         return unimplemented_error("not reached");
                       })
                  .ok());
  EXPECT_THAT(registry.open("redis://:Zq7s3cr3tPW@h:99999"),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("port '99999'"), Not(HasSubstr("s3cr3t")))));
  EXPECT_THAT(registry.open("redis:/h"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("missing \"://\"")));
  EXPECT_FALSE(called);
}

TEST(BackendRegistryTest, OpenerErrorKeepsItsCodeAndNamesTheUri) {
  BackendRegistry registry;
  ASSERT_TRUE(registry
                  .add("redis",
                       [](const Uri&) -> Result<std::shared_ptr<Backend>> {
                         return unavailable_error("connection refused");
                       })
                  .ok());
  EXPECT_THAT(
      registry.open("redis://u:Zq7s3cr3tPW@h:6379"),
      StatusIs(StatusCode::kUnavailable, "opening redis://u:****@h:6379: connection refused"));
}

TEST(BackendRegistryTest, OpenerReturningNullIsInternal) {
  BackendRegistry registry;
  ASSERT_TRUE(registry
                  .add("memory",
                       [](const Uri&) -> Result<std::shared_ptr<Backend>> {
                         return std::shared_ptr<Backend>();
                       })
                  .ok());
  EXPECT_THAT(registry.open("memory://x"),
              StatusIs(StatusCode::kInternal, HasSubstr("returned no backend")));
}

// An opener may take long (it connects) or use the registry itself; Open must
// not hold the registry's lock around it.
TEST(BackendRegistryTest, OpenerMayUseTheRegistry) {
  BackendRegistry registry;
  ASSERT_TRUE(registry
                  .add("alias",
                       [&registry](const Uri& uri) -> Result<std::shared_ptr<Backend>> {
                         EXPECT_THAT(registry.schemes(), Contains("alias"));
                         return registry.open("memory://" + uri.hosts.at(0).host);
                       })
                  .ok());
  ASSERT_TRUE(registry.add("memory", fake_opener("memory")).ok());
  const Result<std::shared_ptr<Backend>> backend = registry.open("alias://x");
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->scheme(), "memory");
}

TEST(BackendRegistryTest, ConcurrentRegisterAndOpen) {
  BackendRegistry registry;
  ASSERT_TRUE(registry.add("memory", fake_opener("memory")).ok());
  std::atomic<int> opened{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&registry, &opened, t] {
      for (int i = 0; i < 50; ++i) {
        const std::string scheme = "s" + std::to_string(t) + "x" + std::to_string(i);
        EXPECT_TRUE(registry.add(scheme, fake_opener(scheme)).ok());
        if (registry.open("memory://m").ok()) ++opened;
        if (registry.open(scheme + "://h").ok()) ++opened;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(opened.load(), 4 * 50 * 2);
  EXPECT_EQ(registry.schemes().size(), 1u + 4 * 50);
}

// ---------------------------------------------------------------------------
// The process-wide registry, with the real built-in backends.

// A keyed backend that only says where it came from.
class FakeKeyedBackend : public KeyedLockBackend {
 public:
  explicit FakeKeyedBackend(std::string mechanism) {
    capabilities_.mechanism = std::move(mechanism);
  }
  std::string_view scheme() const override { return "fake"; }
  const KeyedLockCapabilities& capabilities() const override { return capabilities_; }
  Result<std::unique_ptr<KeyHold>> acquire(const KeyAcquireRequest&) override {
    return unimplemented_error("fake");
  }

 private:
  KeyedLockCapabilities capabilities_;
};

TEST(BackendRegistryTest, OneEntryGivesTheStoreItsKeyedLocksAndItsSchema) {
  BackendRegistry registry;
  BackendRegistry::StoreEntry entry;
  entry.open = fake_opener("sql");
  std::optional<Uri> keyed_uri;
  std::chrono::milliseconds keyed_ttl{0};
  entry.open_keyed =
      [&](const Uri& uri,
          const KeyedLockOptions& options) -> Result<std::shared_ptr<KeyedLockBackend>> {
    keyed_uri = uri;
    keyed_ttl = options.lease.ttl;
    return std::shared_ptr<KeyedLockBackend>(std::make_shared<FakeKeyedBackend>("native"));
  };
  entry.schema = [](const Uri& uri) -> Result<std::string> {
    return "CREATE TABLE " + uri.path.substr(1);
  };
  ASSERT_THAT(registry.add("sql", entry), IsOk());

  KeyedLockOptions options;
  options.lease.ttl = std::chrono::seconds(7);
  auto keyed = registry.open_keyed("sql://h/t1", options);
  ASSERT_THAT(keyed, IsOk());
  EXPECT_EQ((*keyed)->capabilities().mechanism, "native");
  ASSERT_TRUE(keyed_uri.has_value());
  EXPECT_EQ(keyed_uri->path, "/t1");
  EXPECT_EQ(keyed_ttl, std::chrono::seconds(7));
  EXPECT_THAT(registry.schema("sql://h/t2"), IsOkAndHolds(std::string("CREATE TABLE t2")));
}

TEST(BackendRegistryTest, WithoutAKeyedOpenerKeysAreLeasesOnTheStoresMutexes) {
  BackendRegistry registry;
  int opened = 0;
  ASSERT_THAT(registry.add("kv",
                           [&opened](const Uri&) -> Result<std::shared_ptr<Backend>> {
                             ++opened;
                             return std::shared_ptr<Backend>(std::make_shared<FakeBackend>("kv"));
                           }),
              IsOk());
  auto keyed = registry.open_keyed("kv://h", KeyedLockOptions());
  ASSERT_THAT(keyed, IsOk());
  EXPECT_EQ(opened, 1);
  EXPECT_EQ((*keyed)->scheme(), "kv");
  EXPECT_THAT((*keyed)->capabilities().mechanism, HasSubstr("lease on the store's mutexes"));
  // No schema: the store makes what it needs.
  EXPECT_THAT(registry.schema("kv://h"),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("no table for a DBA")));
  // An unknown scheme is the same error as Open's.
  EXPECT_THAT(registry.open_keyed("nosuch://h", KeyedLockOptions()),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("unknown store scheme 'nosuch'")));
}

TEST(BackendRegistryTest, AKeyedOpenerReturningNullIsInternal) {
  BackendRegistry registry;
  BackendRegistry::StoreEntry entry;
  entry.open = fake_opener("kv");
  entry.open_keyed = [](const Uri&, const KeyedLockOptions&) {
    return Result<std::shared_ptr<KeyedLockBackend>>(std::shared_ptr<KeyedLockBackend>());
  };
  ASSERT_THAT(registry.add("kv", entry), IsOk());
  EXPECT_THAT(registry.open_keyed("kv://h", KeyedLockOptions()),
              StatusIs(StatusCode::kInternal, HasSubstr("returned no backend")));
}

TEST(DefaultRegistryTest, HoldsTheBuiltinBackends) {
  const std::vector<std::string> schemes = BackendRegistry::global().schemes();
  EXPECT_THAT(schemes, Contains("memory"));
#if SIMBA_HAVE_SQLITE
  EXPECT_THAT(schemes, Contains("sqlite"));
#else
  EXPECT_THAT(schemes, Not(Contains("sqlite")));
#endif
  EXPECT_EQ(&BackendRegistry::global(), &BackendRegistry::global());
}

TEST(DefaultRegistryTest, RegisterBuiltinBackendsTwiceIsAlreadyExists) {
  BackendRegistry registry;
  ASSERT_TRUE(register_builtin_backends(registry).ok());
  EXPECT_EQ(registry.schemes(), BackendRegistry::global().schemes());
  EXPECT_THAT(register_builtin_backends(registry),
              StatusIs(StatusCode::kAlreadyExists, HasSubstr("'memory'")));
}

TEST(DefaultRegistryTest, OpenBackendOpensMemory) {
  const Result<std::shared_ptr<Backend>> backend = open_backend("memory://registry_test");
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->scheme(), "memory");
}

TEST(DefaultRegistryTest, OpenBackendUnknownSchemeListsMemory) {
  EXPECT_THAT(open_backend("nosuchstore://h"),
              StatusIs(StatusCode::kUnimplemented,
                       AllOf(HasSubstr("unknown store scheme 'nosuchstore'"),
                             HasSubstr("this build supports: "), HasSubstr("memory"))));
}

}  // namespace
}  // namespace simba
