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

WorkerEvent Ev(Kind kind, Nanos t, std::uint64_t token = 0) {
  WorkerEvent e;
  e.kind = kind;
  e.t = t;
  e.token = token;
  return e;
}
WorkerEvent Start(Nanos t) { return Ev(Kind::kStart, t); }
WorkerEvent Beat(Nanos t) { return Ev(Kind::kBeat, t); }
WorkerEvent Exit(Nanos t) { return Ev(Kind::kExit, t); }
WorkerEvent Acquired(Nanos t, std::uint64_t token) { return Ev(Kind::kAcquired, t, token); }
WorkerEvent Lost(Nanos t, std::uint64_t token) { return Ev(Kind::kLost, t, token); }
WorkerEvent Released(Nanos t, std::uint64_t token) { return Ev(Kind::kReleased, t, token); }
// A guarded write: is_owner() passed at `check`, answered 5 ms later.
WorkerEvent Write(Nanos check, std::uint64_t token, Nanos deadline, bool accepted = true) {
  WorkerEvent e = Ev(Kind::kWrite, check + ms(5), token);
  e.seq = check / ms(1);
  e.check = check;
  e.deadline = deadline;
  e.accepted = accepted;
  return e;
}

WorkerFate CleanExit() { return {false, true, ""}; }
WorkerFate KilledFate() { return {true, false, ""}; }
WorkerHistory Worker(int id, std::vector<WorkerEvent> events, WorkerFate fate = CleanExit()) {
  return {id, std::move(events), std::move(fate)};
}

// The resource's decision at `t` on the write Write() checked 5 ms before.
ResourceEvent Apply(int worker, std::uint64_t token, Nanos t, bool accepted = true) {
  return {worker, token, (t - ms(5)) / ms(1), accepted, t};
}

// Defaults: ttl 1 s, transition 0.5 s, slack 1 s, hang 3 s, takeover 3.5 s.
// run_end 0 means "never": liveness is checked after every heal.
CheckOptions Opts(Nanos run_end = 0) {
  CheckOptions o;
  o.run_end = run_end;
  return o;
}

CheckReport Check(const std::vector<WorkerHistory>& workers,
                  const std::vector<ResourceEvent>& resource = {},
                  const std::vector<FaultEvent>& faults = {},
                  const CheckOptions& options = Opts()) {
  return CheckHistory(workers, resource, faults, options);
}

std::vector<std::string> Rules(const CheckReport& report) {
  std::vector<std::string> rules;
  for (const Violation& v : report.violations) rules.push_back(v.rule);
  return rules;
}

void ExpectSame(const WorkerEvent& a, const WorkerEvent& b) {
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
  const std::vector<WorkerEvent> events = {Start(ms(1)),
                                           Acquired(ms(2), 7),
                                           Write(ms(3), 7, ms(9)),
                                           Write(ms(4), 7, ms(9), false),
                                           Lost(ms(5), 7),
                                           Released(ms(6), 8),
                                           Beat(ms(7)),
                                           Exit(ms(8))};
  for (const WorkerEvent& e : events) {
    const std::string line = FormatWorkerEvent(e);
    SCOPED_TRACE(line);
    const auto parsed = ParseWorkerEvent(line);
    ASSERT_TRUE(parsed.has_value());
    ExpectSame(*parsed, e);
  }
  // The documented layout of the richest line.
  EXPECT_EQ(FormatWorkerEvent(Write(12, 3, 20)),
            "ev=write t=5000012 token=3 seq=0 check=12 deadline=20 result=accepted");
}

TEST(FaultHistory, ResourceAndFaultEventsRoundTrip) {
  for (const bool accepted : {true, false}) {
    const ResourceEvent r{4, 11, 42, accepted, ms(3)};
    const auto parsed = ParseResourceEvent(FormatResourceEvent(r));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(parsed->worker, 4);
    EXPECT_EQ(parsed->token, 11u);
    EXPECT_EQ(parsed->seq, 42);
    EXPECT_EQ(parsed->accepted, accepted);
    EXPECT_EQ(parsed->t, ms(3));
  }
  for (const FaultEvent& f : {FaultEvent{"pause", 2, ms(1), ms(5)}, FaultEvent{"cut", 0, 9, 9}}) {
    const auto parsed = ParseFaultEvent(FormatFaultEvent(f));
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
    EXPECT_FALSE(ParseWorkerEvent(line).has_value()) << line;
  }
  for (const char* line :
       {"ev=apply worker=1 token=2 seq=3 res", "ev=apply worker=1 token=2",
        "ev=apply worker=1 token=2 seq=3 result=maybe t=4", "ev=beat t=4", "garbage"}) {
    EXPECT_FALSE(ParseResourceEvent(line).has_value()) << line;
  }
  for (const char* line :
       {"ev=fault kind=pause worker=1 start=5", "ev=fault kind= worker=1 start=1 end=2",
        "ev=fault worker=1 start=1 end=2", "ev=apply kind=cut worker=0 start=1 end=1", "%%%"}) {
    EXPECT_FALSE(ParseFaultEvent(line).has_value()) << line;
  }
}

// ---------------------------------------------------------------- a clean run

// Two workers taking turns, tokens 1, 2, 3, each writing inside its tenure.
std::vector<WorkerHistory> CleanWorkers() {
  return {Worker(1, {Start(ms(100)), Acquired(ms(100), 1), Write(ms(200), 1, ms(1100)),
                     Beat(ms(1000)), Released(ms(1200), 1), Beat(ms(2000)), Acquired(ms(2300), 3),
                     Write(ms(2400), 3, ms(3300)), Released(ms(2600), 3), Exit(ms(2700))}),
          Worker(2, {Start(ms(100)), Beat(ms(1000)), Acquired(ms(1300), 2),
                     Write(ms(1400), 2, ms(2300)), Released(ms(2200), 2), Exit(ms(2700))})};
}
std::vector<ResourceEvent> CleanResource() {
  return {Apply(1, 1, ms(205)), Apply(2, 2, ms(1405)), Apply(1, 3, ms(2405))};
}

TEST(FaultHistory, CleanHistoryPasses) {
  const CheckReport r = Check(CleanWorkers(), CleanResource());
  EXPECT_TRUE(r.ok()) << r.Summary();
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

// Worker 1 holds token 1 at 100..1000 ms, worker 2 token 2 at 1100..2000 ms.
std::vector<WorkerHistory> TwoTurns() {
  return {Worker(1, {Acquired(ms(100), 1), Released(ms(1000), 1)}),
          Worker(2, {Acquired(ms(1100), 2), Released(ms(2000), 2)})};
}

TEST(FaultHistory, StaleWrite) {
  // Token 1 accepted after token 2.
  EXPECT_THAT(Rules(Check(TwoTurns(),
                          {Apply(1, 1, ms(500)), Apply(2, 2, ms(1200)), Apply(1, 1, ms(1300))})),
              ElementsAre("stale-write"));
  // Token 1 from worker 2, which only ever held token 2.
  EXPECT_THAT(Rules(Check(TwoTurns(), {Apply(1, 1, ms(500)), Apply(2, 1, ms(1200))})),
              ElementsAre("stale-write"));
  // A fence that turns away its newest token is broken too.
  EXPECT_THAT(Rules(Check(TwoTurns(), {Apply(1, 1, ms(500)), Apply(2, 2, ms(1200), false)})),
              ElementsAre("stale-write"));
}

TEST(FaultHistory, ResourceMismatch) {
  // Worker 1 logged its first write as turned away; the resource accepted it.
  std::vector<WorkerHistory> workers = CleanWorkers();
  ASSERT_EQ(workers[0].events[2].kind, Kind::kWrite);
  workers[0].events[2].accepted = false;
  EXPECT_THAT(Rules(Check(workers, CleanResource())), ElementsAre("resource-mismatch"));
  // A write the resource never saw.
  std::vector<ResourceEvent> resource = CleanResource();
  resource.pop_back();
  EXPECT_THAT(Rules(Check(CleanWorkers(), resource)), ElementsAre("resource-mismatch"));
}

TEST(FaultHistory, WriteAfterDeadline) {
  auto with_check = [](Nanos check) {
    return Check(
        {Worker(1, {Acquired(ms(100), 1), Write(check, 1, ms(1000)), Released(ms(1100), 1)})});
  };
  // check == deadline is already too late; 1 ns before is fine.
  EXPECT_THAT(Rules(with_check(ms(1000))), ElementsAre("write-after-deadline"));
  EXPECT_TRUE(with_check(ms(1000) - 1).ok());
}

TEST(FaultHistory, WriteOutsideTenure) {
  // After its own release.
  EXPECT_THAT(Rules(Check({Worker(
                  1, {Acquired(ms(100), 1), Released(ms(500), 1), Write(ms(600), 1, ms(1000))})})),
              ElementsAre("write-outside-tenure"));
  // Inside a tenure, but with another token.
  EXPECT_THAT(Rules(Check({Worker(
                  1, {Acquired(ms(100), 1), Write(ms(200), 2, ms(1000)), Released(ms(500), 1)})})),
              ElementsAre("write-outside-tenure"));
}

TEST(FaultHistory, ActedAfterTakeover) {
  // Worker 1 learns of its loss within signal_slack (no overlap violation),
  // but passed an is_owner() check 500 ms after worker 2 acquired.
  const CheckReport r =
      Check({Worker(1, {Acquired(ms(100), 1), Write(ms(2500), 1, ms(2900)), Lost(ms(2600), 1)}),
             Worker(2, {Acquired(ms(2000), 2), Released(ms(3000), 2)})});
  EXPECT_THAT(Rules(r), ElementsAre("acted-after-takeover"));
}

// Worker 1 logs its loss at `lost`; worker 2 acquired at 2000 ms.
std::vector<WorkerHistory> LateLoss(Nanos lost) {
  return {Worker(1, {Acquired(ms(100), 1), Lost(lost, 1)}),
          Worker(2, {Acquired(ms(2000), 2), Released(ms(4000), 2)})};
}

TEST(FaultHistory, Overlap) {
  const CheckReport r = Check(LateLoss(ms(3500)));
  EXPECT_THAT(Rules(r), ElementsAre("overlap"));
  EXPECT_EQ(r.worst_overlap, ms(1500));
  EXPECT_EQ(r.losses, 1);
  EXPECT_TRUE(Check(LateLoss(ms(3000))).ok());  // exactly signal_slack late
}

TEST(FaultHistory, UnsignalledLoss) {
  // Worker 1 exits cleanly still believing it owns: flagged once for ending
  // without on_released, once for never being told of worker 2's takeover.
  const CheckReport r = Check({Worker(1, {Acquired(ms(100), 1), Exit(ms(1000))}),
                               Worker(2, {Acquired(ms(2000), 2), Released(ms(3000), 2)})});
  EXPECT_THAT(Rules(r), ElementsAre("unsignalled-loss", "unsignalled-loss"));
  EXPECT_FALSE(r.tenures[0].ended.has_value());
  // A second on_acquired without on_released in between.
  EXPECT_THAT(Rules(Check({Worker(
                  1, {Acquired(ms(100), 1), Acquired(ms(900), 2), Released(ms(1000), 2)})})),
              ElementsAre("unsignalled-loss"));
}

TEST(FaultHistory, TokenOrder) {
  // Worker 2 acquires token 3 after worker 1's token 5 ended.
  EXPECT_THAT(Rules(Check({Worker(1, {Acquired(ms(100), 5), Released(ms(1000), 5)}),
                           Worker(2, {Acquired(ms(2000), 3), Released(ms(3000), 3)})})),
              ElementsAre("token-order"));
  // One token granted to two workers.
  EXPECT_THAT(Rules(Check({Worker(1, {Acquired(ms(100), 4), Released(ms(1000), 4)}),
                           Worker(2, {Acquired(ms(2000), 4), Released(ms(3000), 4)})})),
              ElementsAre("token-order"));
  // One worker's tokens going down.
  EXPECT_THAT(Rules(Check({Worker(1, {Acquired(ms(100), 4), Released(ms(1000), 4),
                                      Acquired(ms(2000), 2), Released(ms(3000), 2)})})),
              ElementsAre("token-order"));
}

TEST(FaultHistory, Stuck) {
  // A cut healed at 1000 ms; the bound is 3500 ms, the run went on to 10 s.
  const std::vector<FaultEvent> cut = {{"cut", 0, ms(1000), ms(1000)}};
  const auto after = [](Nanos acquired) {
    return std::vector<WorkerHistory>{
        Worker(1, {Acquired(ms(100), 1), Released(ms(500), 1)}),
        Worker(2, {Acquired(acquired, 2), Released(acquired + ms(100), 2)})};
  };
  EXPECT_THAT(Rules(Check(after(ms(4600)), {}, cut, Opts(ms(10000)))), ElementsAre("stuck"));
  // A new owner within the bound.
  const CheckReport r = Check(after(ms(4000)), {}, cut, Opts(ms(10000)));
  EXPECT_TRUE(r.ok()) << r.Summary();
  EXPECT_EQ(r.worst_takeover, ms(3000));
  EXPECT_EQ(r.faults.at("cut"), 1);
  // The run ended before the bound passed: nothing to judge.
  EXPECT_TRUE(Check(after(ms(4600)), {}, cut, Opts(ms(4000))).ok());
}

TEST(FaultHistory, Crash) {
  const CheckReport r =
      Check({Worker(1, {Start(ms(100)), Exit(ms(200))}, {false, false, "exit status 3"})});
  EXPECT_THAT(Rules(r), ElementsAre("crash"));
  EXPECT_THAT(r.violations[0].detail, HasSubstr("exit status 3"));
}

TEST(FaultHistory, Hang) {
  auto with_gap = [](Nanos gap) {
    return Check(
        {Worker(1, {Start(ms(100)), Beat(ms(1000)), Beat(ms(1000) + gap), Exit(ms(1000) + gap)})});
  };
  EXPECT_THAT(Rules(with_gap(ms(3100))), ElementsAre("hang"));
  EXPECT_TRUE(with_gap(ms(3000)).ok());  // exactly hang_after
}

// ---------------------------------------------------------------- excuses
// Each excuse test runs the same history with and without the fault, so it
// is the fault that silences the rule. run_end is set before the takeover
// bound runs out, so liveness stays out of the way.

TEST(FaultHistory, PauseExcusesOverlap) {
  // Worker 1 stopped 1000..3400 ms: it could not log the loss while stopped.
  const std::vector<FaultEvent> pause = {{"pause", 1, ms(1000), ms(3400)}};
  EXPECT_THAT(Rules(Check(LateLoss(ms(3500)), {}, {}, Opts(ms(4500)))), ElementsAre("overlap"));
  const CheckReport r = Check(LateLoss(ms(3500)), {}, pause, Opts(ms(4500)));
  EXPECT_TRUE(r.ok()) << r.Summary();
  EXPECT_EQ(r.worst_overlap, ms(1500));
  // Another worker's pause excuses nothing.
  EXPECT_THAT(
      Rules(Check(LateLoss(ms(3500)), {}, {{"pause", 2, ms(1000), ms(3400)}}, Opts(ms(4500)))),
      ElementsAre("overlap"));
}

// The slack is for a late on_released after the takeover; a pause that
// ended before worker 2 acquired cannot explain worker 1 logging its loss
// 1.5 s after it: its lease deadline passed while it was stopped, so
// on_released was due the moment it resumed (include/simba/contender.h).
TEST(FaultHistory, PauseBeforeTakeoverDoesNotExcuseOverlap) {
  EXPECT_THAT(
      Rules(Check(LateLoss(ms(3500)), {}, {{"pause", 1, ms(600), ms(1900)}}, Opts(ms(4500)))),
      ElementsAre("overlap"));
}

TEST(FaultHistory, KillEndsTenure) {
  // Worker 1 dies holding token 1; worker 2 takes over 1.5 s after the kill.
  const std::vector<WorkerHistory> workers = {
      Worker(1, {Start(ms(100)), Acquired(ms(100), 1), Beat(ms(500))}, KilledFate()),
      Worker(2, {Acquired(ms(2500), 2), Released(ms(3000), 2)})};
  const CheckReport r = Check(workers, {}, {{"kill", 1, ms(1000), ms(1000)}});
  EXPECT_TRUE(r.ok()) << r.Summary();
  ASSERT_EQ(r.tenures.size(), 2u);
  EXPECT_TRUE(r.tenures[0].killed);
  EXPECT_EQ(r.tenures[0].ended, ms(1000));
  EXPECT_EQ(r.worst_takeover, ms(1500));
  // Without the kill in the fault log the open tenure is unexplained.
  EXPECT_THAT(Rules(Check(workers)), ElementsAre("unsignalled-loss", "unsignalled-loss"));
}

TEST(FaultHistory, PauseOrClockJumpExcusesHang) {
  const std::vector<WorkerHistory> silent = {
      Worker(1, {Start(ms(100)), Beat(ms(1000)), Beat(ms(5000)), Exit(ms(5100))})};
  const CheckOptions opts = Opts(ms(5200));
  EXPECT_THAT(Rules(Check(silent, {}, {}, opts)), ElementsAre("hang"));
  EXPECT_TRUE(Check(silent, {}, {{"pause", 1, ms(2000), ms(3000)}}, opts).ok());
  EXPECT_TRUE(Check(silent, {}, {{"clock-jump", 0, ms(2000), ms(2000)}}, opts).ok());
  EXPECT_THAT(Rules(Check(silent, {}, {{"pause", 2, ms(2000), ms(3000)}}, opts)),
              ElementsAre("hang"));
}

TEST(FaultHistory, NextFaultExcusesStuck) {
  // Nobody owns after the cut healed at 1000 ms, but a pause began at 2000 ms,
  // before the 3500 ms bound: the cut's window was cut short. After the pause
  // healed at 10 s, worker 2 acquires within the bound.
  const std::vector<WorkerHistory> workers = {
      Worker(2, {Acquired(ms(11000), 1), Released(ms(12000), 1)})};
  const FaultEvent cut{"cut", 0, ms(1000), ms(1000)};
  EXPECT_THAT(Rules(Check(workers, {}, {cut}, Opts(ms(100000)))), ElementsAre("stuck"));
  const CheckReport r =
      Check(workers, {}, {cut, {"pause", 1, ms(2000), ms(10000)}}, Opts(ms(100000)));
  EXPECT_TRUE(r.ok()) << r.Summary();
  EXPECT_EQ(r.worst_takeover, ms(1000));
}

TEST(FaultHistory, PauseExcusesLateLoggedAcquisition) {
  // Worker 1 was granted token 1, stopped before on_acquired ran, and logged
  // it at 5000 ms, after worker 2's token 2 tenure (2000..3000 ms) ended.
  const std::vector<WorkerHistory> workers = {
      Worker(1, {Acquired(ms(5000), 1), Lost(ms(5100), 1)}),
      Worker(2, {Acquired(ms(2000), 2), Released(ms(3000), 2)})};
  const CheckOptions opts = Opts(ms(6000));
  EXPECT_THAT(Rules(Check(workers, {}, {}, opts)), ElementsAre("token-order"));
  const CheckReport r = Check(workers, {}, {{"pause", 1, ms(800), ms(4900)}}, opts);
  EXPECT_TRUE(r.ok()) << r.Summary();
}

// ---------------------------------------------------------------- minimum activity

TEST(FaultHistory, WriteWithNoDeadlineEverReported) {
  // is_owner() passed but the service never gave a lease deadline for the
  // tenure (the worker logs 0): nothing bounds the check, it is reported.
  EXPECT_THAT(
      Rules(Check({Worker(1, {Acquired(ms(100), 1), Write(ms(200), 1, 0), Released(ms(300), 1)})})),
      ElementsAre("write-after-deadline"));
}

TEST(FaultHistory, TooFewWritesOrAcquisitions) {
  // CleanWorkers(): 3 acquisitions, 3 writes accepted.
  CheckOptions opts = Opts();
  opts.min_acquisitions = 3;
  opts.min_writes_accepted = 3;
  const CheckReport enough = Check(CleanWorkers(), CleanResource(), {}, opts);
  EXPECT_TRUE(enough.ok()) << enough.Summary();

  opts.min_writes_accepted = 4;
  const CheckReport few_writes = Check(CleanWorkers(), CleanResource(), {}, opts);
  EXPECT_THAT(Rules(few_writes), ElementsAre("too-little-activity"));
  EXPECT_THAT(few_writes.violations[0].detail, HasSubstr("only 3 writes accepted"));
  EXPECT_THAT(few_writes.violations[0].detail, HasSubstr("minimum 4"));

  opts.min_writes_accepted = 3;
  opts.min_acquisitions = 4;
  EXPECT_THAT(Rules(Check(CleanWorkers(), CleanResource(), {}, opts)),
              ElementsAre("too-little-activity"));

  // A run in which nobody ever wrote is the case that used to pass.
  opts.min_acquisitions = 1;
  opts.min_writes_accepted = 1;
  const CheckReport idle =
      Check({Worker(1, {Start(ms(100)), Beat(ms(200)), Exit(ms(300))})}, {}, {}, opts);
  EXPECT_THAT(Rules(idle), ElementsAre("too-little-activity", "too-little-activity"));
  EXPECT_TRUE(Check({Worker(1, {Start(ms(100)), Beat(ms(200)), Exit(ms(300))})}).ok())
      << "no minimum unless one is set";
}

TEST(FaultHistory, FaultsThatMissTheHolder) {
  // CleanWorkers(): worker 1 holds 100..1200 and 2300..2600 ms, worker 2
  // 1300..2200 ms. A cut of everyone is aimed at nobody.
  CheckOptions opts = Opts(ms(2700));
  opts.min_holder_faults = 1;
  const FaultEvent on_holder{"pause", 1, ms(500), ms(600)};
  const FaultEvent on_waiter{"pause", 2, ms(500), ms(600)};
  const FaultEvent on_nobody{"cut-all", 0, ms(500), ms(500)};
  const FaultEvent kill_at_grant{"kill", 2, ms(1300), ms(1300)};  // the instant it acquired

  const CheckReport hit = Check(CleanWorkers(), CleanResource(), {on_holder, on_nobody}, opts);
  EXPECT_TRUE(hit.ok()) << hit.Summary();
  EXPECT_EQ(hit.aimed_faults, 1);
  EXPECT_EQ(hit.holder_faults, 1);
  EXPECT_THAT(hit.Summary(), HasSubstr("1 of 1 aimed at a worker found it holding"));

  const CheckReport missed = Check(CleanWorkers(), CleanResource(), {on_waiter, on_nobody}, opts);
  EXPECT_EQ(missed.aimed_faults, 1);
  EXPECT_EQ(missed.holder_faults, 0);
  EXPECT_THAT(Rules(missed), ElementsAre("too-little-activity"));
  EXPECT_THAT(missed.violations[0].detail, HasSubstr("found it holding the mutex"));

  // The bounds of a tenure count (a kill ends one at its own instant).
  opts.min_holder_faults = 0;
  EXPECT_EQ(Check(CleanWorkers(), CleanResource(), {kill_at_grant}, opts).holder_faults, 1);
}

TEST(FaultHistory, ExpectedViolationsNeedAnOverlapRuleAndNothingElse) {
  auto report = [](std::vector<std::string> rules) {
    CheckReport r;
    for (auto& rule : rules) r.violations.push_back({std::move(rule), "made up"});
    return r;
  };
  EXPECT_EQ(UnprovenOverlap(report({"acted-after-takeover"})), "");
  EXPECT_EQ(UnprovenOverlap(report({"overlap", "overlap"})), "");
  EXPECT_EQ(UnprovenOverlap(report({"stale-write", "acted-after-takeover", "overlap"})), "");
  // Nothing, or only rules that do not speak of two owners: not proven.
  EXPECT_THAT(UnprovenOverlap(report({})), HasSubstr("did not see the two owners"));
  for (const char* other : {"stuck", "crash", "hang", "resource-mismatch", "token-order",
                            "unsignalled-loss", "write-after-deadline", "write-outside-tenure",
                            "too-little-activity"}) {
    EXPECT_THAT(UnprovenOverlap(report({other})), HasSubstr(std::string("[") + other + "]"))
        << other;
    EXPECT_THAT(UnprovenOverlap(report({"acted-after-takeover", other})),
                HasSubstr(std::string("[") + other + "]"))
        << "an overlap with " << other << " beside it proves nothing either";
  }
  // The real checker on a real overlap history.
  EXPECT_EQ(UnprovenOverlap(Check(LateLoss(ms(3500)))), "");
}

// ---------------------------------------------------------------- summary

TEST(FaultHistory, Summary) {
  EXPECT_THAT(Check(CleanWorkers(), CleanResource()).Summary(), HasSubstr("OK"));
  std::vector<WorkerHistory> bad = LateLoss(ms(3500));
  bad[1].fate = {false, false, "killed by signal 6"};
  const CheckReport r = Check(bad);
  ASSERT_THAT(Rules(r), ElementsAre("crash", "overlap"));  // per-worker rules come first
  const std::string summary = r.Summary();
  EXPECT_THAT(summary, HasSubstr("[overlap]"));
  EXPECT_THAT(summary, HasSubstr("[crash]"));
  EXPECT_THAT(summary, HasSubstr("2 violation(s)"));
  EXPECT_THAT(summary, ::testing::Not(HasSubstr("OK")));
}

}  // namespace
}  // namespace simba::testing
