// The histories of a fault run (tests/faults) and the checker that judges
// them, Jepsen-style: workers contend for one mutex and, while they own it,
// write to a fenced resource; every worker logs what it did, the resource
// logs what it accepted, the harness logs the faults it injected; afterwards
// the checker reads all of it and names every broken guarantee.
//
// The logs are text, one event per line, `key=value` words:
//   worker side   ev=start|acquired|write|lost|released|beat|exit ...
//   resource      ev=apply worker=W token=T seq=S result=accepted|rejected t=...
//   faults        ev=fault kind=K [worker=W] start=... end=...
// Times are nanoseconds of one monotonic clock shared by every writer of a
// run: CLOCK_MONOTONIC for processes on one host, the ManualClock of an
// in-process (memory) run. No two clocks are ever compared.
//
// Pure logic: no I/O but parsing strings, so it is unit tested on made-up
// histories (tests/unit/fault_history_test.cc).
#ifndef SIMBA_TESTING_FAULT_HISTORY_H_
#define SIMBA_TESTING_FAULT_HISTORY_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace simba::testing {

using Nanos = std::int64_t;

// One line of a worker's log.
struct WorkerEvent {
  enum class Kind {
    kStart,     // the worker began (t)
    kAcquired,  // on_acquired with `token` (t)
    kWrite,     // a guarded write: is_owner() was true for `token` at `check`
                // (read before the call), the last lease deadline the service
                // reported for this tenure was `deadline` (0: none ever); the
                // resource answered `accepted` at `t`
    kLost,      // on_released that the worker did not ask for (t)
    kReleased,  // on_released after the worker's own stop() (t)
    kBeat,      // the worker's loop is alive (t)
    kExit,      // the worker stopped cleanly (t)
    kGaveUp,    // an acquisition begun at `check` with the deadline `deadline`
                // ended on an error at `t` (`seq`: the CLI's exit status, or
                // the StatusCode); before its deadline it is a failure: a
                // store that cannot be reached is waited for (issue #34)
  };
  Kind kind = Kind::kBeat;
  Nanos t = 0;
  std::uint64_t token = 0;
  std::int64_t seq = 0;
  Nanos check = 0;
  Nanos deadline = 0;
  bool accepted = false;
};

// One decision of the fenced resource, in the order it made them.
struct ResourceEvent {
  int worker = 0;
  std::uint64_t token = 0;
  std::int64_t seq = 0;
  bool accepted = false;
  Nanos t = 0;
};

// One injected fault. `end` is when it healed (== start for instant ones:
// a kill, a cut). `worker` is 0 when the fault hits no single worker.
struct FaultEvent {
  std::string kind;  // kill, pause, restart, cut, blackhole, clock-jump, hang, crash
  int worker = 0;
  Nanos start = 0;
  Nanos end = 0;
};

// How a worker's process (or thread) ended.
struct WorkerFate {
  bool killed = false;          // by the harness (a kill or crash fault): no exit expected
  bool exited_cleanly = false;  // stopped when asked, exit status 0
  std::string detail;           // what happened otherwise (exit status, signal, timeout)
};

struct WorkerHistory {
  int worker = 0;
  std::vector<WorkerEvent> events;
  WorkerFate fate;
};

// The `key=value` words of a log line (other words are skipped).
std::map<std::string, std::string> line_words(const std::string& line);

// Formatting and parsing of the lines above. Parse* return nullopt for a line
// that is not an event (a torn last line of a killed worker is skipped).
std::string format_worker_event(const WorkerEvent& e);
std::optional<WorkerEvent> parse_worker_event(const std::string& line);
std::string format_resource_event(const ResourceEvent& e);
std::optional<ResourceEvent> parse_resource_event(const std::string& line);
std::string format_fault_event(const FaultEvent& e);
std::optional<FaultEvent> parse_fault_event(const std::string& line);

struct CheckOptions {
  std::chrono::milliseconds ttl{1000};
  std::chrono::milliseconds transition{500};
  // How late on_released may be logged after the moment it became due (a
  // newer owner took over): callback dispatch and scheduling, not protocol.
  std::chrono::milliseconds signal_slack{1000};
  // The mutex must have an owner again this long after every fault healed:
  // ttl + transition + 2 s unless set.
  std::optional<std::chrono::milliseconds> takeover_bound;
  // Whether the API tells its holder until when a hold lasts (a lease
  // deadline, a max_hold watchdog). `simba run` does not: its command acts
  // until SIGTERM, which the CLI sends once its own lease check fails. Then
  // no write is judged against a deadline, and a check that passed after a
  // newer owner acquired is excused only when the worker's process tree was
  // paused from before that acquisition and the check came within
  // signal_slack of the pause's end (the CLI notices the loss on resuming,
  // and until its signal lands the command cannot know; its fencing token
  // is what keeps such a write out). Everywhere else the rule stands.
  bool deadline_promised = true;
  // Longest silence of a worker's loop (beats, writes) not explained by a
  // pause fault.
  std::chrono::milliseconds hang_after{3000};
  // When the run ended (the harness stopped the workers); liveness after the
  // last heal is checked only if the run went on long enough.
  Nanos run_end = 0;
  // Minimum activity: a run below any of these proves nothing about the
  // store (nobody wrote, nobody took over, the faults missed the holder)
  // and fails with `too-little-activity`. 0: not required. The harness
  // sets them from the run's length (tests/faults/fault_run.cc, Judge,
  // which says why each number is what it is).
  int min_acquisitions = 0;
  int min_writes_accepted = 0;
  // Faults aimed at one worker (worker != 0) that found it holding the
  // mutex: a tenure of that worker open at the fault's start.
  int min_holder_faults = 0;
};

// A stretch of ownership as one worker saw it: from its on_acquired to its
// on_released (or to its death, or open when neither came).
struct Tenure {
  int worker = 0;
  std::uint64_t token = 0;
  Nanos acquired = 0;
  std::optional<Nanos> ended;  // lost/released logged, or killed at
  bool killed = false;         // ended by a kill, not by a signal
  bool released = false;       // ended by the worker's own stop() (on_released it asked for)
  Nanos last_check = 0;        // last is_owner() check that passed (0: none)
  int writes_accepted = 0;
  int writes_rejected = 0;
};

struct Violation {
  std::string rule;    // stale-write, acted-after-takeover, overlap, token-order,
                       // unsignalled-loss, write-after-deadline, write-outside-tenure,
                       // resource-mismatch, stuck, crash, hang, gave-up,
                       // too-little-activity
  std::string detail;  // what, who, when
};

struct CheckReport {
  std::vector<Violation> violations;
  std::vector<Tenure> tenures;  // by acquisition time
  int acquisitions = 0;
  int losses = 0;    // lost events
  int releases = 0;  // released events
  int writes_accepted = 0;
  int writes_rejected = 0;  // stale tokens the resource turned away
  // Acquisitions that ended on an error: at or after their deadline (the
  // store could not be reached until then), and before it (each a gave-up
  // violation).
  int gave_up_at_deadline = 0;
  int gave_up_early = 0;
  std::map<std::string, int> faults;  // by kind
  int aimed_faults = 0;               // faults aimed at one worker
  int holder_faults = 0;              // of those, the ones that found it holding the mutex
  // Longest time the mutex went without an owner after a fault healed, in
  // all and by kind of fault.
  Nanos worst_takeover = 0;
  std::map<std::string, Nanos> worst_takeover_by_fault;
  // The bound the liveness rule held every fault to (a new owner this long
  // after it healed).
  Nanos takeover_bound = 0;
  // Longest belief overlap seen (positive only while a worker was paused).
  Nanos worst_overlap = 0;
  // (deadline_promised off) Checks that passed after a newer owner had
  // acquired, excused by a pause of the worker's tree, and the latest of
  // them after that acquisition.
  int excused_acts = 0;
  Nanos worst_excused_act = 0;
  // Recovery from each kind of fault: how often the holder kept the mutex
  // through it (a tenure open when the fault began that outlasted it, that
  // nobody else's acquisition interrupted, and that was not killed or lost
  // before one lease had passed after the fault healed), and otherwise
  // (no holder, a holder that lost it or let go during the fault) the time
  // from the fault's start to the next acquisition. A fault after which
  // nobody acquired before the run ended is in neither.
  struct Recovery {
    int kept = 0;
    std::vector<Nanos> to_next_owner;  // in the order of the faults
    Nanos median() const;              // 0 when empty
    Nanos worst() const;               // 0 when empty
  };
  std::map<std::string, Recovery> recovery_by_fault;

  bool ok() const { return violations.empty(); }
  // A few lines for people: counts, the worst figures, each violation.
  std::string summary() const;
};

// The verdict on a run set up to break mutual exclusion (a negative
// control, `--expect-violations on`): it shows the checker sees two owners
// only if the report names at least one of the rules that two owners break
// (acted-after-takeover, overlap, stale-write) and no other rule, since a
// stuck mutex, a crash, a hang, a mismatch or too little activity proves
// nothing about overlaps. Empty when it does; otherwise why not.
std::string unproven_overlap(const CheckReport& report);

CheckReport check_history(const std::vector<WorkerHistory>& workers,
                          const std::vector<ResourceEvent>& resource,
                          const std::vector<FaultEvent>& faults, const CheckOptions& options);

}  // namespace simba::testing

#endif  // SIMBA_TESTING_FAULT_HISTORY_H_
