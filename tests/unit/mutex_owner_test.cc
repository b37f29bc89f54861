#include "simba/mutex_owner.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <set>
#include <vector>

#include "simba/contender.h"

namespace simba {
namespace {

using std::chrono::milliseconds;

MutexOwner owner(std::string id, std::uint64_t token, std::int64_t ttl_at = 100,
                 std::int64_t transition_at = 200) {
  MutexOwner o;
  o.owner_id = std::move(id);
  o.ttl_at = milliseconds(ttl_at);
  o.transition_at = milliseconds(transition_at);
  o.fencing_token = token;
  return o;
}

TEST(MutexOwnerTest, TimePredicatesFollowSimba) {
  const MutexOwner o = owner("a", 1, 100, 200);
  EXPECT_TRUE(o.is_owner("a"));
  EXPECT_FALSE(o.is_owner("b"));
  EXPECT_TRUE(o.is_in_ttl(milliseconds(99)));
  EXPECT_FALSE(o.is_in_ttl(milliseconds(100)));        // strict
  EXPECT_TRUE(o.is_in_transition(milliseconds(200)));  // inclusive
  EXPECT_FALSE(o.is_in_transition(milliseconds(201)));
  EXPECT_TRUE(o.has_owner(milliseconds(200)));
  EXPECT_FALSE(o.has_owner(milliseconds(201)));
  EXPECT_FALSE(MutexOwner::none().has_owner(milliseconds(0)));
  EXPECT_FALSE(MutexOwner::none().is_owner(""));
}

TEST(MutexStateTest, ChangesAreIdOrTokenChanges) {
  const MutexState renewal{owner("a", 1, 100, 200), owner("a", 1, 300, 400)};
  EXPECT_FALSE(renewal.is_changed());
  EXPECT_FALSE(renewal.is_acquired("a"));
  EXPECT_FALSE(renewal.is_released("a"));
  EXPECT_TRUE(renewal.is_owner("a"));

  const MutexState handover{owner("a", 1), owner("b", 2)};
  EXPECT_TRUE(handover.is_changed());
  EXPECT_TRUE(handover.is_released("a"));
  EXPECT_TRUE(handover.is_acquired("b"));
  EXPECT_FALSE(handover.is_acquired("a"));

  const MutexState release{owner("a", 1), MutexOwner::none()};
  EXPECT_TRUE(release.is_released("a"));
  EXPECT_FALSE(release.is_acquired("a"));

  // Lost and re-acquired at once: a release and an acquisition.
  const MutexState reacquired{owner("a", 1), owner("a", 5)};
  EXPECT_TRUE(reacquired.is_changed());
  EXPECT_TRUE(reacquired.is_released("a"));
  EXPECT_TRUE(reacquired.is_acquired("a"));

  EXPECT_FALSE(MutexState::none().is_changed());
}

TEST(MutexContenderTest, DispatchesOnlyItsOwnChanges) {
  std::vector<std::string> calls;
  auto c = make_contender(
      "m", [&](const MutexState&) { calls.push_back("acquired"); },
      [&](const MutexState&) { calls.push_back("released"); }, "a");
  c->on_owner({MutexOwner::none(), owner("a", 1)});
  c->on_owner({owner("a", 1), owner("a", 1, 300, 400)});  // renewal
  c->on_owner({owner("a", 1), owner("a", 3)});            // lost + new
  c->on_owner({owner("a", 3), owner("b", 4)});
  c->on_owner({owner("b", 4), owner("c", 5)});  // others' handover
  EXPECT_EQ(calls, (std::vector<std::string>{"acquired", "released", "acquired", "released"}));
}

TEST(ContenderIdTest, HostIdsAreUniqueAndCarryPidAndRandomness) {
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) ids.insert(MutexContender::generate_host_contender_id());
  EXPECT_EQ(ids.size(), 1000u);
  const std::string id = *ids.begin();
  EXPECT_NE(id.find(':' + std::to_string(getpid()) + '@'), std::string::npos) << id;
  const auto slash = id.rfind('/');
  ASSERT_NE(slash, std::string::npos) << id;
  EXPECT_EQ(id.size() - slash - 1, 8u) << id;
  EXPECT_LE(id.size(), 128u);
  EXPECT_EQ(id.find("@@"), std::string::npos);
}

TEST(ContenderIdTest, UuidIdsAreVersion4Hex) {
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = MutexContender::generate_uuid_contender_id();
    ASSERT_EQ(id.size(), 32u);
    ASSERT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
    EXPECT_EQ(id[12], '4');
    EXPECT_NE(std::string("89ab").find(id[16]), std::string::npos);
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 1000u);
}

TEST(ContenderTest, DefaultIdIsAHostId) {
  MutexContender a("m"), b("m");
  EXPECT_NE(a.contender_id(), b.contender_id());
  EXPECT_EQ(a.mutex(), "m");
}

}  // namespace
}  // namespace simba
