// The fault-run history checker (testing/fault_history.h) on made-up
// histories: every rule must fire on a history that breaks it, and stay quiet
// when a fault of the run explains what it saw. Each broken history is kept
// as small as possible so that only the rule under test can fire; the tests
// assert the exact list of rules, so a rule firing by accident shows up too.
#include "testing/fault_history.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace simba::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Kind = WorkerEvent::Kind;

// Milliseconds to the checker's nanoseconds. Histories start at 100 ms, not
// 0: Tenure::last_check uses 0 for "no check", and real clocks never read 0.
constexpr Nanos ms(Nanos v) { return v * 1'000'000; }

WorkerEvent ev(Kind kind, Nanos t, std::uint64_t token = 0) {
  WorkerEvent e;
  e.kind = kind;
  e.t = t;
  e.token = token;
  return e;
}
WorkerEvent start(Nanos t) { return ev(Kind::kStart, t); }
WorkerEvent beat(Nanos t) { return ev(Kind::kBeat, t); }
WorkerEvent exit(Nanos t) { return ev(Kind::kExit, t); }
WorkerEvent acquired_at(Nanos t, std::uint64_t token) { return ev(Kind::kAcquired, t, token); }
WorkerEvent lost_at(Nanos t, std::uint64_t token) { return ev(Kind::kLost, t, token); }
WorkerEvent released_at(Nanos t, std::uint64_t token) { return ev(Kind::kReleased, t, token); }
// A guarded write: is_owner() passed at `check`, answered 5 ms later.
WorkerEvent write(Nanos check, std::uint64_t token, Nanos deadline, bool accepted = true) {
  WorkerEvent e = ev(Kind::kWrite, check + ms(5), token);
  e.seq = check / ms(1);
  e.check = check;
  e.deadline = deadline;
  e.accepted = accepted;
  return e;
}

// An acquisition begun at `asked` with `deadline` that ended on an error
// (`code`) at `t`.
WorkerEvent gave_up(Nanos t, Nanos asked, Nanos deadline, int code) {
  WorkerEvent e = ev(Kind::kGaveUp, t);
  e.seq = code;
  e.check = asked;
  e.deadline = deadline;
  return e;
}

WorkerFate clean_exit() { return {false, true, ""}; }
WorkerFate killed_fate() { return {true, false, ""}; }
WorkerHistory worker(int id, std::vector<WorkerEvent> events, WorkerFate fate = clean_exit()) {
  return {id, std::move(events), std::move(fate)};
}

// The resource's decision at `t` on the write write() checked 5 ms before.
ResourceEvent apply(int worker, std::uint64_t token, Nanos t, bool accepted = true) {
  return {worker, token, (t - ms(5)) / ms(1), accepted, t};
}

// Defaults: ttl 1 s, transition 0.5 s, slack 1 s, hang 3 s, takeover 3.5 s.
// run_end 0 means "never": liveness is checked after every heal.
CheckOptions options_for(Nanos run_end = 0) {
  CheckOptions o;
  o.run_end = run_end;
  return o;
}

CheckReport check_run(const std::vector<WorkerHistory>& workers,
                      const std::vector<ResourceEvent>& resource = {},
                      const std::vector<FaultEvent>& faults = {},
                      const CheckOptions& options = options_for()) {
  return check_history(workers, resource, faults, options);
}

std::vector<std::string> rules(const CheckReport& report) {
  std::vector<std::string> rules;
  for (const Violation& v : report.violations) rules.push_back(v.rule);
  return rules;
}

void expect_same(const WorkerEvent& a, const WorkerEvent& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.t, b.t);
  EXPECT_EQ(a.token, b.token);
  EXPECT_EQ(a.seq, b.seq);
  EXPECT_EQ(a.check, b.check);
  EXPECT_EQ(a.deadline, b.deadline);
  EXPECT_EQ(a.accepted, b.accepted);
}

// ---------------------------------------------------------------- lines

TEST(FaultHistory, WorkerEventsRoundTrip) {
  const std::vector<WorkerEvent> events = {start(ms(1)),
                                           acquired_at(ms(2), 7),
                                           write(ms(3), 7, ms(9)),
                                           write(ms(4), 7, ms(9), false),
                                           lost_at(ms(5), 7),
                                           released_at(ms(6), 8),
                                           beat(ms(7)),
                                           exit(ms(8)),
                                           gave_up(ms(9), ms(1), ms(20), 69)};
  for (const WorkerEvent& e : events) {
    const std::string line = format_worker_event(e);
    SCOPED_TRACE(line);
    const auto parsed = parse_worker_event(line);
    ASSERT_TRUE(parsed.has_value());
    expect_same(*parsed, e);
  }
  // The documented layout of the richest line.
  EXPECT_EQ(format_worker_event(write(12, 3, 20)),
            "ev=write t=5000012 token=3 seq=0 check=12 deadline=20 result=accepted");
}

TEST(FaultHistory, ResourceAndFaultEventsRoundTrip) {
  for (const bool accepted : {true, false}) {
    const ResourceEvent r{4, 11, 42, accepted, ms(3)};
    const auto parsed = parse_resource_event(format_resource_event(r));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(parsed->worker, 4);
    EXPECT_EQ(parsed->token, 11u);
    EXPECT_EQ(parsed->seq, 42);
    EXPECT_EQ(parsed->accepted, accepted);
    EXPECT_EQ(parsed->t, ms(3));
  }
  for (const FaultEvent& f : {FaultEvent{"pause", 2, ms(1), ms(5)}, FaultEvent{"cut", 0, 9, 9}}) {
    const auto parsed = parse_fault_event(format_fault_event(f));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(parsed->kind, f.kind);
    EXPECT_EQ(parsed->worker, f.worker);
    EXPECT_EQ(parsed->start, f.start);
    EXPECT_EQ(parsed->end, f.end);
  }
}

// A killed worker's last line may be cut anywhere: it must not parse into an
// event with made-up fields.
TEST(FaultHistory, TornAndGarbageLinesAreNotEvents) {
  for (const char* line : {"ev=write t=12 token=3 se", "ev=write t=12 token=3 seq=1 check=2",
                           "ev=write t=1 token=3 seq=1 check=2 deadline=3 result=acc",
                           "ev=acquired t=12", "ev=lost t=12 token=", "ev=acq", "ev=beat t=1x",
                           "ev=nonsense t=1", "", "hello world", "t=5 token=3"}) {
    EXPECT_FALSE(parse_worker_event(line).has_value()) << line;
  }
  for (const char* line :
       {"ev=apply worker=1 token=2 seq=3 res", "ev=apply worker=1 token=2",
        "ev=apply worker=1 token=2 seq=3 result=maybe t=4", "ev=beat t=4", "garbage"}) {
    EXPECT_FALSE(parse_resource_event(line).has_value()) << line;
  }
  for (const char* line :
       {"ev=fault kind=pause worker=1 start=5", "ev=fault kind= worker=1 start=1 end=2",
        "ev=fault worker=1 start=1 end=2", "ev=apply kind=cut worker=0 start=1 end=1", "%%%"}) {
    EXPECT_FALSE(parse_fault_event(line).has_value()) << line;
  }
}

// ---------------------------------------------------------------- a clean run

// Two workers taking turns, tokens 1, 2, 3, each writing inside its tenure.
std::vector<WorkerHistory> clean_workers() {
  return {
      worker(1, {start(ms(100)), acquired_at(ms(100), 1), write(ms(200), 1, ms(1100)),
                 beat(ms(1000)), released_at(ms(1200), 1), beat(ms(2000)), acquired_at(ms(2300), 3),
                 write(ms(2400), 3, ms(3300)), released_at(ms(2600), 3), exit(ms(2700))}),
      worker(2, {start(ms(100)), beat(ms(1000)), acquired_at(ms(1300), 2),
                 write(ms(1400), 2, ms(2300)), released_at(ms(2200), 2), exit(ms(2700))})};
}
std::vector<ResourceEvent> clean_resource() {
  return {apply(1, 1, ms(205)), apply(2, 2, ms(1405)), apply(1, 3, ms(2405))};
}

TEST(FaultHistory, CleanHistoryPasses) {
  const CheckReport r = check_run(clean_workers(), clean_resource());
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_EQ(r.acquisitions, 3);
  EXPECT_EQ(r.releases, 3);
  EXPECT_EQ(r.losses, 0);
  EXPECT_EQ(r.writes_accepted, 3);
  EXPECT_EQ(r.writes_rejected, 0);
  ASSERT_EQ(r.tenures.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(r.tenures[i].token, i + 1);  // by acquisition
  EXPECT_EQ(r.tenures[1].worker, 2);
  EXPECT_EQ(r.tenures[1].last_check, ms(1400));
  EXPECT_EQ(r.tenures[1].writes_accepted, 1);
}

// ---------------------------------------------------------------- each rule

// A worker whose acquisition ends on an error before its deadline gave up
// on a store it was to wait for (issue #34); at its deadline it waited as
// long as it was asked to.
TEST(FaultHistory, GaveUpBeforeItsDeadline) {
  std::vector<WorkerHistory> workers = clean_workers();
  // `simba run --timeout 1s` exiting 69 after 17 ms, and one exiting 69
  // when its second had passed.
  workers.push_back(worker(4, {start(ms(100)), gave_up(ms(217), ms(200), ms(1200), 69),
                               gave_up(ms(2310), ms(1300), ms(2300), 69), exit(ms(2400))}));
  const CheckReport r = check_run(workers, clean_resource());
  EXPECT_THAT(rules(r), ElementsAre("gave-up"));
  ASSERT_EQ(r.violations.size(), 1u);
  EXPECT_THAT(r.violations[0].detail, HasSubstr("code 69"));
  EXPECT_EQ(r.gave_up_early, 1);
  EXPECT_EQ(r.gave_up_at_deadline, 1);
  EXPECT_THAT(r.summary(), HasSubstr("1 at their deadline"));
}

// Worker 1 holds token 1 at 100..1000 ms, worker 2 token 2 at 1100..2000 ms.
std::vector<WorkerHistory> two_turns() {
  return {worker(1, {acquired_at(ms(100), 1), released_at(ms(1000), 1)}),
          worker(2, {acquired_at(ms(1100), 2), released_at(ms(2000), 2)})};
}

TEST(FaultHistory, StaleWrite) {
  // Token 1 accepted after token 2.
  EXPECT_THAT(rules(check_run(two_turns(), {apply(1, 1, ms(500)), apply(2, 2, ms(1200)),
                                            apply(1, 1, ms(1300))})),
              ElementsAre("stale-write"));
  // Token 1 from worker 2, which only ever held token 2.
  EXPECT_THAT(rules(check_run(two_turns(), {apply(1, 1, ms(500)), apply(2, 1, ms(1200))})),
              ElementsAre("stale-write"));
  // A fence that turns away its newest token is broken too.
  EXPECT_THAT(rules(check_run(two_turns(), {apply(1, 1, ms(500)), apply(2, 2, ms(1200), false)})),
              ElementsAre("stale-write"));
}

TEST(FaultHistory, ResourceMismatch) {
  // Worker 1 logged its first write as turned away; the resource accepted it.
  std::vector<WorkerHistory> workers = clean_workers();
  ASSERT_EQ(workers[0].events[2].kind, Kind::kWrite);
  workers[0].events[2].accepted = false;
  EXPECT_THAT(rules(check_run(workers, clean_resource())), ElementsAre("resource-mismatch"));
  // A write the resource never saw.
  std::vector<ResourceEvent> resource = clean_resource();
  resource.pop_back();
  EXPECT_THAT(rules(check_run(clean_workers(), resource)), ElementsAre("resource-mismatch"));
}

TEST(FaultHistory, WriteAfterDeadline) {
  auto with_check = [](Nanos check) {
    return check_run({worker(
        1, {acquired_at(ms(100), 1), write(check, 1, ms(1000)), released_at(ms(1100), 1)})});
  };
  // check == deadline is already too late; 1 ns before is fine.
  EXPECT_THAT(rules(with_check(ms(1000))), ElementsAre("write-after-deadline"));
  EXPECT_TRUE(with_check(ms(1000) - 1).ok());
}

TEST(FaultHistory, WriteOutsideTenure) {
  // After its own release.
  EXPECT_THAT(rules(check_run({worker(1, {acquired_at(ms(100), 1), released_at(ms(500), 1),
                                          write(ms(600), 1, ms(1000))})})),
              ElementsAre("write-outside-tenure"));
  // Inside a tenure, but with another token.
  EXPECT_THAT(rules(check_run({worker(1, {acquired_at(ms(100), 1), write(ms(200), 2, ms(1000)),
                                          released_at(ms(500), 1)})})),
              ElementsAre("write-outside-tenure"));
}

TEST(FaultHistory, ActedAfterTakeover) {
  // Worker 1 learns of its loss within signal_slack (no overlap violation),
  // but passed an is_owner() check 500 ms after worker 2 acquired.
  const CheckReport r = check_run(
      {worker(1, {acquired_at(ms(100), 1), write(ms(2500), 1, ms(2900)), lost_at(ms(2600), 1)}),
       worker(2, {acquired_at(ms(2000), 2), released_at(ms(3000), 2)})});
  EXPECT_THAT(rules(r), ElementsAre("acted-after-takeover"));
}

// Worker 1 logs its loss at `lost`; worker 2 acquired at 2000 ms.
std::vector<WorkerHistory> late_loss(Nanos lost) {
  return {worker(1, {acquired_at(ms(100), 1), lost_at(lost, 1)}),
          worker(2, {acquired_at(ms(2000), 2), released_at(ms(4000), 2)})};
}

TEST(FaultHistory, Overlap) {
  const CheckReport r = check_run(late_loss(ms(3500)));
  EXPECT_THAT(rules(r), ElementsAre("overlap"));
  EXPECT_EQ(r.worst_overlap, ms(1500));
  EXPECT_EQ(r.losses, 1);
  EXPECT_TRUE(check_run(late_loss(ms(3000))).ok());  // exactly signal_slack late
}

TEST(FaultHistory, UnsignalledLoss) {
  // Worker 1 exits cleanly still believing it owns: flagged once for ending
  // without on_released, once for never being told of worker 2's takeover.
  const CheckReport r =
      check_run({worker(1, {acquired_at(ms(100), 1), exit(ms(1000))}),
                 worker(2, {acquired_at(ms(2000), 2), released_at(ms(3000), 2)})});
  EXPECT_THAT(rules(r), ElementsAre("unsignalled-loss", "unsignalled-loss"));
  EXPECT_FALSE(r.tenures[0].ended.has_value());
  // A second on_acquired without on_released in between.
  EXPECT_THAT(rules(check_run({worker(1, {acquired_at(ms(100), 1), acquired_at(ms(900), 2),
                                          released_at(ms(1000), 2)})})),
              ElementsAre("unsignalled-loss"));
}

TEST(FaultHistory, TokenOrder) {
  // Worker 2 acquires token 3 after worker 1's token 5 ended.
  EXPECT_THAT(rules(check_run({worker(1, {acquired_at(ms(100), 5), released_at(ms(1000), 5)}),
                               worker(2, {acquired_at(ms(2000), 3), released_at(ms(3000), 3)})})),
              ElementsAre("token-order"));
  // One token granted to two workers.
  EXPECT_THAT(rules(check_run({worker(1, {acquired_at(ms(100), 4), released_at(ms(1000), 4)}),
                               worker(2, {acquired_at(ms(2000), 4), released_at(ms(3000), 4)})})),
              ElementsAre("token-order"));
  // One worker's tokens going down.
  EXPECT_THAT(rules(check_run({worker(1, {acquired_at(ms(100), 4), released_at(ms(1000), 4),
                                          acquired_at(ms(2000), 2), released_at(ms(3000), 2)})})),
              ElementsAre("token-order"));
}

TEST(FaultHistory, Stuck) {
  // A cut healed at 1000 ms; the bound is 3500 ms, the run went on to 10 s.
  const std::vector<FaultEvent> cut = {{"cut", 0, ms(1000), ms(1000)}};
  const auto after = [](Nanos acquired) {
    return std::vector<WorkerHistory>{
        worker(1, {acquired_at(ms(100), 1), released_at(ms(500), 1)}),
        worker(2, {acquired_at(acquired, 2), released_at(acquired + ms(100), 2)})};
  };
  EXPECT_THAT(rules(check_run(after(ms(4600)), {}, cut, options_for(ms(10000)))),
              ElementsAre("stuck"));
  // A new owner within the bound.
  const CheckReport r = check_run(after(ms(4000)), {}, cut, options_for(ms(10000)));
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_EQ(r.worst_takeover, ms(3000));
  EXPECT_EQ(r.faults.at("cut"), 1);
  // The run ended before the bound passed: nothing to judge.
  EXPECT_TRUE(check_run(after(ms(4600)), {}, cut, options_for(ms(4000))).ok());
}

TEST(FaultHistory, RecoveryFromEachFault) {
  // A store failover at 1000..1400 ms that worker 1 held through (released
  // at 2000 ms, after the fault healed); a kill of worker 2's store member
  // at 3000 ms that cost it the mutex (lost at 3500 ms), worker 3 the next
  // owner at 5000 ms; a pause at 6000 ms that found nobody holding, worker 1
  // owner again at 6250 ms.
  const std::vector<FaultEvent> faults = {{"failover", 0, ms(1000), ms(1400)},
                                          {"kill-leader", 0, ms(3000), ms(3200)},
                                          {"pause-leader", 0, ms(6000), ms(6100)}};
  const CheckReport r = check_run({worker(1, {acquired_at(ms(500), 1), released_at(ms(2000), 1),
                                              acquired_at(ms(6250), 4), released_at(ms(6500), 4)}),
                                   worker(2, {acquired_at(ms(2500), 2), lost_at(ms(3500), 2)}),
                                   worker(3, {acquired_at(ms(5000), 3), released_at(ms(5500), 3)})},
                                  {}, faults, options_for(ms(7000)));
  EXPECT_EQ(r.recovery_by_fault.at("failover").kept, 1);
  EXPECT_TRUE(r.recovery_by_fault.at("failover").to_next_owner.empty());
  EXPECT_EQ(r.recovery_by_fault.at("kill-leader").kept, 0);
  EXPECT_THAT(r.recovery_by_fault.at("kill-leader").to_next_owner, ElementsAre(ms(2000)));
  EXPECT_THAT(r.recovery_by_fault.at("pause-leader").to_next_owner, ElementsAre(ms(250)));
  EXPECT_THAT(r.summary(), HasSubstr("recovery from kill-leader: the holder kept the mutex 0 "
                                     "time(s); a new owner 1 time(s), after median 2000.0 ms, "
                                     "worst 2000.0 ms"));
  // A killed holder did not keep the mutex, even though its tenure was
  // open when the fault began.
  const CheckReport killed =
      check_run({worker(1, {acquired_at(ms(500), 1)}, {true, false, ""}),
                 worker(2, {acquired_at(ms(2600), 2), released_at(ms(3000), 2)})},
                {}, {{"kill", 1, ms(1000), ms(1000)}}, options_for(ms(3500)));
  EXPECT_EQ(killed.recovery_by_fault.at("kill").kept, 0);
  EXPECT_THAT(killed.recovery_by_fault.at("kill").to_next_owner, ElementsAre(ms(1600)));
  // Nor did a paused holder whose mutex another worker took while it was
  // stopped, though it heard of the loss only after the pause.
  const CheckReport paused =
      check_run({worker(1, {acquired_at(ms(500), 1), lost_at(ms(3050), 1)}),
                 worker(2, {acquired_at(ms(2600), 2), released_at(ms(3500), 2)})},
                {}, {{"pause", 1, ms(1000), ms(3000)}}, options_for(ms(3600)));
  EXPECT_EQ(paused.recovery_by_fault.at("pause").kept, 0);
  EXPECT_THAT(paused.recovery_by_fault.at("pause").to_next_owner, ElementsAre(ms(1600)));
  // A holder that let go while the store was down kept nothing: the next
  // acquisition says when the store served again.
  const CheckReport let_go =
      check_run({worker(1, {acquired_at(ms(500), 1), released_at(ms(1200), 1)}),
                 worker(2, {acquired_at(ms(1900), 2), released_at(ms(2500), 2)})},
                {}, {{"kill-leader", 0, ms(1000), ms(1400)}}, options_for(ms(3000)));
  EXPECT_EQ(let_go.recovery_by_fault.at("kill-leader").kept, 0);
  EXPECT_THAT(let_go.recovery_by_fault.at("kill-leader").to_next_owner, ElementsAre(ms(900)));
}

TEST(FaultHistory, Crash) {
  const CheckReport r =
      check_run({worker(1, {start(ms(100)), exit(ms(200))}, {false, false, "exit status 3"})});
  EXPECT_THAT(rules(r), ElementsAre("crash"));
  EXPECT_THAT(r.violations[0].detail, HasSubstr("exit status 3"));
}

TEST(FaultHistory, Hang) {
  auto with_gap = [](Nanos gap) {
    return check_run(
        {worker(1, {start(ms(100)), beat(ms(1000)), beat(ms(1000) + gap), exit(ms(1000) + gap)})});
  };
  EXPECT_THAT(rules(with_gap(ms(3100))), ElementsAre("hang"));
  EXPECT_TRUE(with_gap(ms(3000)).ok());  // exactly hang_after
}

// ---------------------------------------------------------------- excuses
// Each excuse test runs the same history with and without the fault, so it
// is the fault that silences the rule. run_end is set before the takeover
// bound runs out, so liveness stays out of the way.

TEST(FaultHistory, PauseExcusesOverlap) {
  // Worker 1 stopped 1000..3400 ms: it could not log the loss while stopped.
  const std::vector<FaultEvent> pause = {{"pause", 1, ms(1000), ms(3400)}};
  EXPECT_THAT(rules(check_run(late_loss(ms(3500)), {}, {}, options_for(ms(4500)))),
              ElementsAre("overlap"));
  const CheckReport r = check_run(late_loss(ms(3500)), {}, pause, options_for(ms(4500)));
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_EQ(r.worst_overlap, ms(1500));
  // Another worker's pause excuses nothing.
  EXPECT_THAT(rules(check_run(late_loss(ms(3500)), {}, {{"pause", 2, ms(1000), ms(3400)}},
                              options_for(ms(4500)))),
              ElementsAre("overlap"));
}

// The slack is for a late on_released after the takeover; a pause that
// ended before worker 2 acquired cannot explain worker 1 logging its loss
// 1.5 s after it: its lease deadline passed while it was stopped, so
// on_released was due the moment it resumed (include/simba/contender.h).
TEST(FaultHistory, PauseBeforeTakeoverDoesNotExcuseOverlap) {
  EXPECT_THAT(rules(check_run(late_loss(ms(3500)), {}, {{"pause", 1, ms(600), ms(1900)}},
                              options_for(ms(4500)))),
              ElementsAre("overlap"));
}

TEST(FaultHistory, KillEndsTenure) {
  // Worker 1 dies holding token 1; worker 2 takes over 1.5 s after the kill.
  const std::vector<WorkerHistory> workers = {
      worker(1, {start(ms(100)), acquired_at(ms(100), 1), beat(ms(500))}, killed_fate()),
      worker(2, {acquired_at(ms(2500), 2), released_at(ms(3000), 2)})};
  const CheckReport r = check_run(workers, {}, {{"kill", 1, ms(1000), ms(1000)}});
  EXPECT_TRUE(r.ok()) << r.summary();
  ASSERT_EQ(r.tenures.size(), 2u);
  EXPECT_TRUE(r.tenures[0].killed);
  EXPECT_EQ(r.tenures[0].ended, ms(1000));
  EXPECT_EQ(r.worst_takeover, ms(1500));
  // Without the kill in the fault log the open tenure is unexplained.
  EXPECT_THAT(rules(check_run(workers)), ElementsAre("unsignalled-loss", "unsignalled-loss"));
}

TEST(FaultHistory, PauseOrClockJumpExcusesHang) {
  const std::vector<WorkerHistory> silent = {
      worker(1, {start(ms(100)), beat(ms(1000)), beat(ms(5000)), exit(ms(5100))})};
  const CheckOptions opts = options_for(ms(5200));
  EXPECT_THAT(rules(check_run(silent, {}, {}, opts)), ElementsAre("hang"));
  EXPECT_TRUE(check_run(silent, {}, {{"pause", 1, ms(2000), ms(3000)}}, opts).ok());
  EXPECT_TRUE(check_run(silent, {}, {{"clock-jump", 0, ms(2000), ms(2000)}}, opts).ok());
  EXPECT_THAT(rules(check_run(silent, {}, {{"pause", 2, ms(2000), ms(3000)}}, opts)),
              ElementsAre("hang"));
}

TEST(FaultHistory, NextFaultExcusesStuck) {
  // Nobody owns after the cut healed at 1000 ms, but a pause began at 2000 ms,
  // before the 3500 ms bound: the cut's window was cut short. After the pause
  // healed at 10 s, worker 2 acquires within the bound.
  const std::vector<WorkerHistory> workers = {
      worker(2, {acquired_at(ms(11000), 1), released_at(ms(12000), 1)})};
  const FaultEvent cut{"cut", 0, ms(1000), ms(1000)};
  EXPECT_THAT(rules(check_run(workers, {}, {cut}, options_for(ms(100000)))), ElementsAre("stuck"));
  const CheckReport r =
      check_run(workers, {}, {cut, {"pause", 1, ms(2000), ms(10000)}}, options_for(ms(100000)));
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_EQ(r.worst_takeover, ms(1000));
}

TEST(FaultHistory, PauseExcusesLateLoggedAcquisition) {
  // Worker 1 was granted token 1, stopped before on_acquired ran, and logged
  // it at 5000 ms, after worker 2's token 2 tenure (2000..3000 ms) ended.
  const std::vector<WorkerHistory> workers = {
      worker(1, {acquired_at(ms(5000), 1), lost_at(ms(5100), 1)}),
      worker(2, {acquired_at(ms(2000), 2), released_at(ms(3000), 2)})};
  const CheckOptions opts = options_for(ms(6000));
  EXPECT_THAT(rules(check_run(workers, {}, {}, opts)), ElementsAre("token-order"));
  const CheckReport r = check_run(workers, {}, {{"pause", 1, ms(800), ms(4900)}}, opts);
  EXPECT_TRUE(r.ok()) << r.summary();
}

// ---------------------------------------------------------------- no deadline (simba run)

CheckOptions no_deadline(Nanos run_end = 0) {
  CheckOptions o = options_for(run_end);
  o.deadline_promised = false;
  return o;
}

TEST(FaultHistory, WithoutAPromisedDeadlineAWriteIsNotJudgedAgainstOne) {
  const std::vector<WorkerHistory> history = {
      worker(1, {acquired_at(ms(100), 1), write(ms(200), 1, 0), released_at(ms(300), 1)})};
  EXPECT_TRUE(check_run(history, {}, {}, no_deadline()).ok());
  EXPECT_THAT(rules(check_run(history)), ElementsAre("write-after-deadline"));
}

// Worker 1 passes a check at `check` with no deadline, after worker 2
// acquired at 2000 ms; it hears of its loss 10 ms after that check.
std::vector<WorkerHistory> acted_late(Nanos check) {
  return {worker(1, {acquired_at(ms(100), 1), write(check, 1, 0), lost_at(check + ms(10), 1)}),
          worker(2, {acquired_at(ms(2000), 2), released_at(ms(5000), 2)})};
}

TEST(FaultHistory, WithoutAPromisedDeadlineOnlyAPauseExcusesActingAfterATakeover) {
  // Unpaused, the CLI's lease check ends the hold before anyone else can
  // acquire: acting after a takeover is a violation as with a deadline.
  EXPECT_THAT(rules(check_run(acted_late(ms(2100)), {}, {}, no_deadline())),
              ElementsAre("acted-after-takeover"));
  // Paused 1000..3000 ms (across the takeover): a check within signal_slack
  // of resuming, before the CLI's SIGTERM lands, is excused and counted.
  const std::vector<FaultEvent> pause = {{"pause", 1, ms(1000), ms(3000)}};
  const CheckReport r = check_run(acted_late(ms(3020)), {}, pause, no_deadline(ms(6000)));
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_EQ(r.excused_acts, 1);
  EXPECT_EQ(r.worst_excused_act, ms(1020));
  EXPECT_THAT(r.summary(), HasSubstr("excused by a pause"));
  // Not one more than signal_slack after resuming (its loss then came too
  // late as well)...
  EXPECT_THAT(rules(check_run(acted_late(ms(4100)), {}, pause, no_deadline(ms(6000)))),
              ElementsAre("overlap", "acted-after-takeover"));
  // ...nor by a pause that began after the takeover (the CLI was running
  // when the lease ran out), nor by another worker's pause...
  EXPECT_THAT(rules(check_run(acted_late(ms(3020)), {}, {{"pause", 1, ms(2050), ms(3000)}},
                              no_deadline(ms(6000)))),
              ElementsAre("acted-after-takeover"));
  EXPECT_THAT(rules(check_run(acted_late(ms(3020)), {}, {{"pause", 2, ms(1000), ms(3000)}},
                              no_deadline(ms(6000)))),
              ElementsAre("overlap", "acted-after-takeover"));
  // ...and where a deadline is promised, never.
  EXPECT_THAT(rules(check_run(acted_late(ms(3020)), {}, pause, options_for(ms(6000)))),
              ElementsAre("write-after-deadline", "acted-after-takeover"));
}

TEST(FaultHistory, WithoutAPromisedDeadlineAnUnexcusedCheckBeforeAnExcusedOneIsReported) {
  // A check 100 ms after the takeover with no pause yet, then a pause and
  // an excused one: the first is the violation.
  const std::vector<WorkerHistory> history = {
      worker(1, {acquired_at(ms(100), 1), write(ms(2100), 1, 0), write(ms(3020), 1, 0),
                 lost_at(ms(3030), 1)}),
      worker(2, {acquired_at(ms(2000), 2), released_at(ms(5000), 2)})};
  const CheckReport r =
      check_run(history, {}, {{"pause", 1, ms(2200), ms(3000)}}, no_deadline(ms(6000)));
  ASSERT_THAT(rules(r), ElementsAre("acted-after-takeover"));
  EXPECT_THAT(r.violations[0].detail, HasSubstr("check 100.0 ms after"));
}

// ---------------------------------------------------------------- minimum activity

TEST(FaultHistory, WriteWithNoDeadlineEverReported) {
  // is_owner() passed but the service never gave a lease deadline for the
  // tenure (the worker logs 0): nothing bounds the check, it is reported.
  EXPECT_THAT(rules(check_run({worker(
                  1, {acquired_at(ms(100), 1), write(ms(200), 1, 0), released_at(ms(300), 1)})})),
              ElementsAre("write-after-deadline"));
}

TEST(FaultHistory, TooFewWritesOrAcquisitions) {
  // clean_workers(): 3 acquisitions, 3 writes accepted.
  CheckOptions opts = options_for();
  opts.min_acquisitions = 3;
  opts.min_writes_accepted = 3;
  const CheckReport enough = check_run(clean_workers(), clean_resource(), {}, opts);
  EXPECT_TRUE(enough.ok()) << enough.summary();

  opts.min_writes_accepted = 4;
  const CheckReport few_writes = check_run(clean_workers(), clean_resource(), {}, opts);
  EXPECT_THAT(rules(few_writes), ElementsAre("too-little-activity"));
  EXPECT_THAT(few_writes.violations[0].detail, HasSubstr("only 3 writes accepted"));
  EXPECT_THAT(few_writes.violations[0].detail, HasSubstr("minimum 4"));

  opts.min_writes_accepted = 3;
  opts.min_acquisitions = 4;
  EXPECT_THAT(rules(check_run(clean_workers(), clean_resource(), {}, opts)),
              ElementsAre("too-little-activity"));

  // A run in which nobody ever wrote is the case that used to pass.
  opts.min_acquisitions = 1;
  opts.min_writes_accepted = 1;
  const CheckReport idle =
      check_run({worker(1, {start(ms(100)), beat(ms(200)), exit(ms(300))})}, {}, {}, opts);
  EXPECT_THAT(rules(idle), ElementsAre("too-little-activity", "too-little-activity"));
  EXPECT_TRUE(check_run({worker(1, {start(ms(100)), beat(ms(200)), exit(ms(300))})}).ok())
      << "no minimum unless one is set";
}

TEST(FaultHistory, FaultsThatMissTheHolder) {
  // clean_workers(): worker 1 holds 100..1200 and 2300..2600 ms, worker 2
  // 1300..2200 ms. A cut of everyone is aimed at nobody.
  CheckOptions opts = options_for(ms(2700));
  opts.min_holder_faults = 1;
  const FaultEvent on_holder{"pause", 1, ms(500), ms(600)};
  const FaultEvent on_waiter{"pause", 2, ms(500), ms(600)};
  const FaultEvent on_nobody{"cut-all", 0, ms(500), ms(500)};
  const FaultEvent kill_at_grant{"kill", 2, ms(1300), ms(1300)};  // the instant it acquired

  const CheckReport hit =
      check_run(clean_workers(), clean_resource(), {on_holder, on_nobody}, opts);
  EXPECT_TRUE(hit.ok()) << hit.summary();
  EXPECT_EQ(hit.aimed_faults, 1);
  EXPECT_EQ(hit.holder_faults, 1);
  EXPECT_THAT(hit.summary(), HasSubstr("1 of 1 aimed at a worker found it holding"));

  const CheckReport missed =
      check_run(clean_workers(), clean_resource(), {on_waiter, on_nobody}, opts);
  EXPECT_EQ(missed.aimed_faults, 1);
  EXPECT_EQ(missed.holder_faults, 0);
  EXPECT_THAT(rules(missed), ElementsAre("too-little-activity"));
  EXPECT_THAT(missed.violations[0].detail, HasSubstr("found it holding the mutex"));

  // The bounds of a tenure count (a kill ends one at its own instant).
  opts.min_holder_faults = 0;
  EXPECT_EQ(check_run(clean_workers(), clean_resource(), {kill_at_grant}, opts).holder_faults, 1);
}

TEST(FaultHistory, ExpectedViolationsNeedAnOverlapRuleAndNothingElse) {
  auto report = [](std::vector<std::string> rules) {
    CheckReport r;
    for (auto& rule : rules) r.violations.push_back({std::move(rule), "made up"});
    return r;
  };
  EXPECT_EQ(unproven_overlap(report({"acted-after-takeover"})), "");
  EXPECT_EQ(unproven_overlap(report({"overlap", "overlap"})), "");
  EXPECT_EQ(unproven_overlap(report({"stale-write", "acted-after-takeover", "overlap"})), "");
  // Nothing, or only rules that do not speak of two owners: not proven.
  EXPECT_THAT(unproven_overlap(report({})), HasSubstr("did not see the two owners"));
  for (const char* other :
       {"stuck", "crash", "hang", "resource-mismatch", "token-order", "unsignalled-loss",
        "write-after-deadline", "write-outside-tenure", "too-little-activity"}) {
    EXPECT_THAT(unproven_overlap(report({other})), HasSubstr(std::string("[") + other + "]"))
        << other;
    EXPECT_THAT(unproven_overlap(report({"acted-after-takeover", other})),
                HasSubstr(std::string("[") + other + "]"))
        << "an overlap with " << other << " beside it proves nothing either";
  }
  // The real checker on a real overlap history.
  EXPECT_EQ(unproven_overlap(check_run(late_loss(ms(3500)))), "");
}

// ---------------------------------------------------------------- summary

TEST(FaultHistory, Summary) {
  EXPECT_THAT(check_run(clean_workers(), clean_resource()).summary(), HasSubstr("OK"));
  std::vector<WorkerHistory> bad = late_loss(ms(3500));
  bad[1].fate = {false, false, "killed by signal 6"};
  const CheckReport r = check_run(bad);
  ASSERT_THAT(rules(r), ElementsAre("crash", "overlap"));  // per-worker rules come first
  const std::string summary = r.summary();
  EXPECT_THAT(summary, HasSubstr("[overlap]"));
  EXPECT_THAT(summary, HasSubstr("[crash]"));
  EXPECT_THAT(summary, HasSubstr("2 violation(s)"));
  EXPECT_THAT(summary, ::testing::Not(HasSubstr("OK")));
}

}  // namespace
}  // namespace simba::testing
