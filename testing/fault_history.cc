#include "testing/fault_history.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <sstream>
#include <utility>

namespace simba::testing {
namespace {

using std::chrono::duration_cast;
using std::chrono::nanoseconds;

constexpr Nanos kForever = std::numeric_limits<Nanos>::max();

Nanos to_nanos(std::chrono::milliseconds d) { return duration_cast<nanoseconds>(d).count(); }

// How much earlier than its deadline an acquisition may end on an error
// and still count as having waited (the caller measures its deadline from a
// moment a little before the library does).
constexpr Nanos kGaveUpSlack = 50'000'000;

std::string ms(Nanos d) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(1);
  out << static_cast<double>(d) / 1e6 << " ms";
  return out.str();
}

bool int_field(const std::map<std::string, std::string>& w, const char* key, std::int64_t* out) {
  const auto it = w.find(key);
  if (it == w.end() || it->second.empty()) return false;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (*end != '\0') return false;
  *out = v;
  return true;
}

const char* kind_name(WorkerEvent::Kind k) {
  switch (k) {
    case WorkerEvent::Kind::kStart:
      return "start";
    case WorkerEvent::Kind::kAcquired:
      return "acquired";
    case WorkerEvent::Kind::kWrite:
      return "write";
    case WorkerEvent::Kind::kLost:
      return "lost";
    case WorkerEvent::Kind::kReleased:
      return "released";
    case WorkerEvent::Kind::kBeat:
      return "beat";
    case WorkerEvent::Kind::kExit:
      return "exit";
    case WorkerEvent::Kind::kGaveUp:
      return "gave-up";
  }
  return "?";
}

// Time worker `worker` spent stopped (pause faults) inside [from, to].
Nanos paused_within(const std::vector<FaultEvent>& faults, int worker, Nanos from, Nanos to) {
  Nanos total = 0;
  for (const FaultEvent& f : faults) {
    if (f.kind != "pause" || f.worker != worker) continue;
    const Nanos lo = std::max(from, f.start), hi = std::min(to, f.end);
    if (hi > lo) total += hi - lo;
  }
  return total;
}

// A gap of a worker's loop [from, to] is explained when the worker was
// paused, or virtual time jumped, inside it.
bool explained(const std::vector<FaultEvent>& faults, int worker, Nanos from, Nanos to) {
  for (const FaultEvent& f : faults) {
    const bool mine = f.kind == "pause" && f.worker == worker;
    if ((mine || f.kind == "clock-jump") && f.start <= to && f.end >= from) return true;
  }
  return false;
}

std::string who(const Tenure& t) {
  return "worker " + std::to_string(t.worker) + " (token " + std::to_string(t.token) + ")";
}

}  // namespace

std::map<std::string, std::string> line_words(const std::string& line) {
  std::map<std::string, std::string> words;
  std::istringstream in(line);
  std::string word;
  while (in >> word) {
    const auto eq = word.find('=');
    if (eq != std::string::npos) words[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return words;
}

std::string format_worker_event(const WorkerEvent& e) {
  std::string line = std::string("ev=") + kind_name(e.kind) + " t=" + std::to_string(e.t);
  switch (e.kind) {
    case WorkerEvent::Kind::kAcquired:
    case WorkerEvent::Kind::kLost:
    case WorkerEvent::Kind::kReleased:
      line += " token=" + std::to_string(e.token);
      break;
    case WorkerEvent::Kind::kWrite:
      line += " token=" + std::to_string(e.token) + " seq=" + std::to_string(e.seq) +
              " check=" + std::to_string(e.check) + " deadline=" + std::to_string(e.deadline) +
              " result=" + (e.accepted ? "accepted" : "rejected");
      break;
    case WorkerEvent::Kind::kGaveUp:
      line += " code=" + std::to_string(e.seq) + " check=" + std::to_string(e.check) +
              " deadline=" + std::to_string(e.deadline);
      break;
    default:
      break;
  }
  return line;
}

std::optional<WorkerEvent> parse_worker_event(const std::string& line) {
  const auto w = line_words(line);
  const auto ev = w.find("ev");
  if (ev == w.end()) return std::nullopt;
  WorkerEvent e;
  static const std::pair<const char*, WorkerEvent::Kind> kKinds[] = {
      {"start", WorkerEvent::Kind::kStart},       {"acquired", WorkerEvent::Kind::kAcquired},
      {"write", WorkerEvent::Kind::kWrite},       {"lost", WorkerEvent::Kind::kLost},
      {"released", WorkerEvent::Kind::kReleased}, {"beat", WorkerEvent::Kind::kBeat},
      {"exit", WorkerEvent::Kind::kExit},         {"gave-up", WorkerEvent::Kind::kGaveUp}};
  bool known = false;
  for (const auto& [name, kind] : kKinds) {
    if (ev->second == name) {
      e.kind = kind;
      known = true;
    }
  }
  if (!known || !int_field(w, "t", &e.t)) return std::nullopt;
  std::int64_t token = 0;
  const bool has_token = int_field(w, "token", &token);
  e.token = static_cast<std::uint64_t>(token);
  switch (e.kind) {
    case WorkerEvent::Kind::kAcquired:
    case WorkerEvent::Kind::kLost:
    case WorkerEvent::Kind::kReleased:
      if (!has_token) return std::nullopt;
      break;
    case WorkerEvent::Kind::kWrite: {
      const auto result = w.find("result");
      if (!has_token || !int_field(w, "seq", &e.seq) || !int_field(w, "check", &e.check) ||
          !int_field(w, "deadline", &e.deadline) || result == w.end() ||
          (result->second != "accepted" && result->second != "rejected")) {
        return std::nullopt;
      }
      e.accepted = result->second == "accepted";
      break;
    }
    case WorkerEvent::Kind::kGaveUp:
      if (!int_field(w, "code", &e.seq) || !int_field(w, "check", &e.check) ||
          !int_field(w, "deadline", &e.deadline)) {
        return std::nullopt;
      }
      break;
    default:
      break;
  }
  return e;
}

std::string format_resource_event(const ResourceEvent& e) {
  return "ev=apply worker=" + std::to_string(e.worker) + " token=" + std::to_string(e.token) +
         " seq=" + std::to_string(e.seq) + " result=" + (e.accepted ? "accepted" : "rejected") +
         " t=" + std::to_string(e.t);
}

std::optional<ResourceEvent> parse_resource_event(const std::string& line) {
  const auto w = line_words(line);
  const auto ev = w.find("ev");
  const auto result = w.find("result");
  ResourceEvent e;
  std::int64_t worker = 0, token = 0;
  if (ev == w.end() || ev->second != "apply" || result == w.end() ||
      !int_field(w, "worker", &worker) || !int_field(w, "token", &token) ||
      !int_field(w, "seq", &e.seq) || !int_field(w, "t", &e.t)) {
    return std::nullopt;
  }
  if (result->second != "accepted" && result->second != "rejected") return std::nullopt;
  e.worker = static_cast<int>(worker);
  e.token = static_cast<std::uint64_t>(token);
  e.accepted = result->second == "accepted";
  return e;
}

std::string format_fault_event(const FaultEvent& e) {
  return "ev=fault kind=" + e.kind + " worker=" + std::to_string(e.worker) +
         " start=" + std::to_string(e.start) + " end=" + std::to_string(e.end);
}

std::optional<FaultEvent> parse_fault_event(const std::string& line) {
  const auto w = line_words(line);
  const auto ev = w.find("ev");
  const auto kind = w.find("kind");
  FaultEvent e;
  std::int64_t worker = 0;
  if (ev == w.end() || ev->second != "fault" || kind == w.end() || kind->second.empty() ||
      !int_field(w, "worker", &worker) || !int_field(w, "start", &e.start) ||
      !int_field(w, "end", &e.end)) {
    return std::nullopt;
  }
  e.kind = kind->second;
  e.worker = static_cast<int>(worker);
  return e;
}

std::string CheckReport::summary() const {
  std::ostringstream out;
  out << acquisitions << " acquisitions, " << losses << " losses signalled, " << releases
      << " releases; " << writes_accepted << " writes accepted, " << writes_rejected
      << " stale writes rejected by the fence\n";
  out << "faults:";
  if (faults.empty()) out << " none";
  for (const auto& [kind, n] : faults) out << " " << kind << "=" << n;
  out << "; " << holder_faults << " of " << aimed_faults
      << " aimed at a worker found it holding the mutex";
  out << "\nworst time to a new owner after a fault healed: " << ms(worst_takeover);
  if (!worst_takeover_by_fault.empty()) {
    out << " (";
    const char* sep = "";
    for (const auto& [kind, worst] : worst_takeover_by_fault) {
      out << sep << kind << " " << ms(worst);
      sep = ", ";
    }
    out << ")";
  }
  out << "; worst ownership overlap (paused holders): " << ms(worst_overlap) << "\n";
  if (excused_acts > 0) {
    out << "  checks passed after a takeover, excused by a pause (no deadline promised): "
        << excused_acts << ", the latest " << ms(worst_excused_act) << " after it\n";
  }
  if (gave_up_at_deadline + gave_up_early > 0) {
    out << "acquisitions that ended on an error: " << gave_up_at_deadline
        << " at their deadline (the store unreachable until then), " << gave_up_early
        << " before it\n";
  }
  out << "bound: a new owner within " << ms(takeover_bound) << " of a fault's healing\n";
  for (const auto& [kind, r] : recovery_by_fault) {
    out << "recovery from " << kind << ": the holder kept the mutex " << r.kept << " time(s)";
    if (!r.to_next_owner.empty()) {
      out << "; a new owner " << r.to_next_owner.size() << " time(s), after median "
          << ms(r.median()) << ", worst " << ms(r.worst()) << " from the fault's start";
    }
    out << "\n";
  }
  if (violations.empty()) {
    out << "checker: OK, no violation\n";
  } else {
    out << "checker: " << violations.size() << " violation(s)\n";
    for (const Violation& v : violations) out << "  [" << v.rule << "] " << v.detail << "\n";
  }
  return out.str();
}

Nanos CheckReport::Recovery::median() const {
  if (to_next_owner.empty()) return 0;
  std::vector<Nanos> sorted = to_next_owner;
  std::sort(sorted.begin(), sorted.end());
  return sorted[sorted.size() / 2];
}

Nanos CheckReport::Recovery::worst() const {
  return to_next_owner.empty() ? 0 : *std::max_element(to_next_owner.begin(), to_next_owner.end());
}

std::string unproven_overlap(const CheckReport& report) {
  static const char* const kOverlapRules[] = {"acted-after-takeover", "overlap", "stale-write"};
  bool overlap = false;
  std::string others;
  for (const Violation& v : report.violations) {
    if (std::find_if(std::begin(kOverlapRules), std::end(kOverlapRules),
                     [&](const char* rule) { return v.rule == rule; }) != std::end(kOverlapRules)) {
      overlap = true;
    } else if (others.find("[" + v.rule + "]") == std::string::npos) {
      others += (others.empty() ? "" : " ") + ("[" + v.rule + "]");
    }
  }
  if (!others.empty()) {
    return "the checker reported " + others +
           ", which says nothing about two owners: the control did not run as set up";
  }
  if (!overlap) {
    return "no acted-after-takeover, overlap or stale-write: the checker did not see the two "
           "owners this run was set up to make";
  }
  return "";
}

CheckReport check_history(const std::vector<WorkerHistory>& workers,
                          const std::vector<ResourceEvent>& resource,
                          const std::vector<FaultEvent>& faults, const CheckOptions& options) {
  CheckReport report;
  auto violate = [&](std::string rule, std::string detail) {
    report.violations.push_back({std::move(rule), std::move(detail)});
  };
  for (const FaultEvent& f : faults) ++report.faults[f.kind];

  // Who was killed, and when.
  std::map<int, Nanos> killed_at;
  for (const FaultEvent& f : faults) {
    if ((f.kind == "kill" || f.kind == "crash") && f.worker != 0) killed_at[f.worker] = f.start;
  }

  // Tenures, per worker, from its own log; and the checks one log can make.
  struct Checked {
    Nanos check;
    std::uint64_t token;
    int worker;
  };
  std::vector<Checked> checks;  // every passed ownership check
  for (const WorkerHistory& h : workers) {
    const std::size_t first_tenure = report.tenures.size();
    std::optional<Tenure> open;
    Nanos last_loop = -1;
    auto close = [&](Nanos at, bool killed) {
      open->ended = at;
      open->killed = killed;
      report.tenures.push_back(*open);
      open.reset();
    };
    for (const WorkerEvent& e : h.events) {
      const bool loop_event =
          e.kind == WorkerEvent::Kind::kStart || e.kind == WorkerEvent::Kind::kBeat ||
          e.kind == WorkerEvent::Kind::kWrite || e.kind == WorkerEvent::Kind::kExit;
      if (loop_event) {
        if (last_loop >= 0 && e.t - last_loop > to_nanos(options.hang_after) &&
            !explained(faults, h.worker, last_loop, e.t)) {
          violate("hang", "worker " + std::to_string(h.worker) + " was silent for " +
                              ms(e.t - last_loop) + " (no pause explains it)");
        }
        last_loop = e.t;
      }
      switch (e.kind) {
        case WorkerEvent::Kind::kAcquired:
          ++report.acquisitions;
          if (open) {
            violate("unsignalled-loss", who(*open) + " got on_acquired for token " +
                                            std::to_string(e.token) +
                                            " without on_released for its lease");
            close(e.t, false);
          }
          open = Tenure{h.worker, e.token, e.t, std::nullopt, false, false, 0, 0, 0};
          break;
        case WorkerEvent::Kind::kLost:
        case WorkerEvent::Kind::kReleased:
          (e.kind == WorkerEvent::Kind::kLost ? report.losses : report.releases)++;
          if (open) {
            open->released = e.kind == WorkerEvent::Kind::kReleased;
            close(e.t, false);
          }
          break;
        case WorkerEvent::Kind::kGaveUp:
          // A store that cannot be reached is waited for until the
          // caller's deadline; giving up before it (a store error
          // mistaken for a refusal, or not retried) fails the caller
          // while the store recovers.
          if (e.t + kGaveUpSlack < e.deadline) {
            ++report.gave_up_early;
            violate("gave-up", "worker " + std::to_string(h.worker) +
                                   ": an acquisition ended on an error (code " +
                                   std::to_string(e.seq) + ") after " + ms(e.t - e.check) + ", " +
                                   ms(e.deadline - e.t) + " before its deadline");
          } else {
            ++report.gave_up_at_deadline;
          }
          break;
        case WorkerEvent::Kind::kWrite:
          // Matched to a tenure below, by its check time: a write is logged
          // when the resource answers, which for a paused worker is after
          // its on_released.
          if (!options.deadline_promised) {
            // Nothing to judge it against (see CheckOptions).
          } else if (e.deadline == 0) {
            violate("write-after-deadline",
                    "worker " + std::to_string(h.worker) +
                        ": is_owner() was true but the service never reported a lease "
                        "deadline for that tenure (token " +
                        std::to_string(e.token) + ")");
          } else if (e.check >= e.deadline) {
            violate("write-after-deadline",
                    "worker " + std::to_string(h.worker) + ": is_owner() was true " +
                        ms(e.check - e.deadline) + " after its own lease deadline (token " +
                        std::to_string(e.token) + ")");
          }
          checks.push_back({e.check, e.token, h.worker});
          (e.accepted ? report.writes_accepted : report.writes_rejected)++;
          break;
        default:
          break;
      }
    }
    const auto kill = killed_at.find(h.worker);
    if (open) {
      if (kill != killed_at.end()) {
        close(std::max(kill->second, open->acquired), true);
      } else {
        violate("unsignalled-loss", who(*open) + " ended without on_released");
        open->ended.reset();
        report.tenures.push_back(*open);
      }
    }
    // Every write belongs to a tenure of its worker with its token whose
    // on_acquired..on_released spans the ownership check.
    for (const WorkerEvent& e : h.events) {
      if (e.kind != WorkerEvent::Kind::kWrite) continue;
      Tenure* home = nullptr;
      for (std::size_t i = first_tenure; i < report.tenures.size(); ++i) {
        Tenure& t = report.tenures[i];
        if (t.token == e.token && e.check >= t.acquired && e.check <= t.ended.value_or(kForever)) {
          home = &t;
        }
      }
      if (home == nullptr) {
        violate("write-outside-tenure",
                "worker " + std::to_string(h.worker) + " wrote with token " +
                    std::to_string(e.token) + " (seq " + std::to_string(e.seq) +
                    ") outside its on_acquired..on_released for that token");
        continue;
      }
      home->last_check = std::max(home->last_check, e.check);
      (e.accepted ? home->writes_accepted : home->writes_rejected)++;
    }
    if (!h.fate.killed && !h.fate.exited_cleanly) {
      violate("crash", "worker " + std::to_string(h.worker) + ": " + h.fate.detail);
    }
  }
  std::sort(report.tenures.begin(), report.tenures.end(),
            [](const Tenure& a, const Tenure& b) { return a.acquired < b.acquired; });
  auto end_of = [](const Tenure& t) { return t.ended.value_or(kForever); };

  // Pairs of tenures of different workers.
  for (std::size_t i = 0; i < report.tenures.size(); ++i) {
    for (std::size_t j = 0; j < report.tenures.size(); ++j) {
      const Tenure& p = report.tenures[i];  // the lower token
      const Tenure& q = report.tenures[j];
      if (p.worker == q.worker) {
        // One worker: tokens never go down (the same token again is a lease
        // it still held at the store when it re-contended).
        if (i < j && q.token < p.token) {
          violate("token-order",
                  who(q) + " acquired after its own token " + std::to_string(p.token));
        }
        continue;
      }
      if (p.token == q.token) {
        if (i < j) {
          violate("token-order", "token " + std::to_string(p.token) + " was granted to worker " +
                                     std::to_string(p.worker) + " and to worker " +
                                     std::to_string(q.worker));
        }
        continue;
      }
      if (p.token > q.token) continue;
      // p ended before q began, yet q's token is not higher: tokens did not
      // increase. A worker paused between its grant and its on_acquired logs
      // the acquisition late, so q is excused if it was paused before.
      // (Here p.token < q.token; the reverse order is checked from q's side.)
      // Overlap: how long p still believed it owned after q began to.
      const Nanos overlap = std::min(end_of(p), end_of(q)) - std::max(p.acquired, q.acquired);
      if (overlap > 0) {
        const Nanos from = std::max(p.acquired, q.acquired);
        const Nanos allowed = to_nanos(options.signal_slack) +
                              paused_within(faults, p.worker, from, std::min(end_of(p), end_of(q)));
        if (!p.ended) {
          violate("unsignalled-loss",
                  who(p) + " was never told it lost the mutex that " + who(q) + " acquired");
        } else if (overlap > allowed) {
          violate("overlap", who(p) + " still believed it owned the mutex " + ms(overlap) +
                                 " after " + who(q) + " acquired it (allowed " + ms(allowed) + ")");
        }
        report.worst_overlap = std::max(report.worst_overlap, std::min(overlap, kForever / 2));
      }
      // Acting as owner (a passed is_owner() check) after a newer owner
      // acquired: the local lease deadline must have ended p first, paused
      // or not, because the check reads the clock.
      if (p.last_check >= q.acquired) {
        // Without a deadline (see CheckOptions::deadline_promised) each such
        // check must lie within signal_slack of the end of a pause of p's
        // worker that began before q acquired; the first that does not is
        // the violation.
        Nanos unexcused = p.last_check;
        if (!options.deadline_promised) {
          unexcused = -1;
          for (const Checked& c : checks) {
            if (c.worker != p.worker || c.token != p.token || c.check < q.acquired) continue;
            const bool excused =
                std::any_of(faults.begin(), faults.end(), [&](const FaultEvent& f) {
                  return f.kind == "pause" && f.worker == p.worker && f.start <= q.acquired &&
                         c.check <= f.end + to_nanos(options.signal_slack);
                });
            if (!excused) {
              unexcused = c.check;
              break;
            }
            ++report.excused_acts;
            report.worst_excused_act = std::max(report.worst_excused_act, c.check - q.acquired);
          }
        }
        if (unexcused >= 0) {
          violate("acted-after-takeover", who(p) + " passed an is_owner() check " +
                                              ms(unexcused - q.acquired) + " after " + who(q) +
                                              " acquired the mutex");
        }
      }
    }
  }
  // Tokens in time: a tenure that began after another ended has a higher
  // token, unless its worker was paused in between (grant before the pause,
  // on_acquired after it).
  for (const Tenure& p : report.tenures) {
    for (const Tenure& q : report.tenures) {
      if (p.worker == q.worker || !p.ended || *p.ended >= q.acquired || q.token > p.token) continue;
      if (p.token == q.token) continue;  // reported above
      if (paused_within(faults, q.worker, p.acquired - to_nanos(options.ttl + options.transition),
                        q.acquired) > 0) {
        continue;
      }
      violate("token-order",
              who(q) + " acquired after " + who(p) + " had ended, with a lower token");
    }
  }

  // The resource: in the order it decided, no accepted token below one it
  // accepted before, and every accepted token one its writer was granted.
  std::uint64_t highest = 0;
  for (const ResourceEvent& r : resource) {
    if (r.accepted) {
      if (r.token < highest) {
        violate("stale-write", "the resource accepted token " + std::to_string(r.token) +
                                   " from worker " + std::to_string(r.worker) + " after token " +
                                   std::to_string(highest));
      }
      highest = std::max(highest, r.token);
      const bool granted =
          std::any_of(report.tenures.begin(), report.tenures.end(),
                      [&](const Tenure& t) { return t.worker == r.worker && t.token == r.token; });
      if (!granted) {
        violate("stale-write", "the resource accepted token " + std::to_string(r.token) +
                                   " from worker " + std::to_string(r.worker) +
                                   ", which that worker never acquired");
      }
    } else if (r.token >= highest) {
      violate("stale-write", "the resource rejected token " + std::to_string(r.token) +
                                 " from worker " + std::to_string(r.worker) +
                                 " although its highest was " + std::to_string(highest));
    }
  }

  // What a worker logged of a write is what the resource decided (a killed
  // worker may not have logged its last one; the resource has them all).
  std::map<std::pair<int, std::int64_t>, const ResourceEvent*> decided;
  for (const ResourceEvent& r : resource) decided[{r.worker, r.seq}] = &r;
  if (!resource.empty()) {
    for (const WorkerHistory& h : workers) {
      for (const WorkerEvent& e : h.events) {
        if (e.kind != WorkerEvent::Kind::kWrite) continue;
        const auto it = decided.find({h.worker, e.seq});
        if (it == decided.end() || it->second->token != e.token ||
            it->second->accepted != e.accepted) {
          violate("resource-mismatch", "worker " + std::to_string(h.worker) + " logged write seq " +
                                           std::to_string(e.seq) + " (token " +
                                           std::to_string(e.token) + ", " +
                                           (e.accepted ? "accepted" : "rejected") +
                                           ") but the resource decided otherwise or never saw it");
        }
      }
    }
  }

  // Faults that hit a holder: the worker they aimed at had a tenure open
  // when they began (a kill ends one at that very instant).
  for (const FaultEvent& f : faults) {
    if (f.worker == 0) continue;
    ++report.aimed_faults;
    const bool holding =
        std::any_of(report.tenures.begin(), report.tenures.end(), [&](const Tenure& t) {
          return t.worker == f.worker && t.acquired <= f.start && end_of(t) >= f.start;
        });
    if (holding) ++report.holder_faults;
  }
  // Minimum activity: a run that wrote, changed hands or hit holders less
  // than this exercised nothing the rules above could fail on.
  auto too_little = [&](const char* what, int seen, int minimum) {
    if (seen < minimum) {
      violate("too-little-activity", std::string("only ") + std::to_string(seen) + " " + what +
                                         " (minimum " + std::to_string(minimum) +
                                         "): the run proves nothing");
    }
  };
  too_little("acquisitions", report.acquisitions, options.min_acquisitions);
  too_little("writes accepted by the fence", report.writes_accepted, options.min_writes_accepted);
  too_little("faults aimed at a worker found it holding the mutex", report.holder_faults,
             options.min_holder_faults);

  // Recovery: did the holder keep the mutex through each fault, and if not,
  // how long from the fault to the next owner (docs/reliability.md). The
  // holder kept it when its tenure outlasted the fault, nobody else
  // acquired meanwhile, and no loss came before one lease had passed after
  // the fault healed (a store outage ends a lease that could not be renewed
  // only at its deadline). A holder that let go during the fault kept
  // nothing: the next acquisition says when the store served again.
  const Nanos lease = to_nanos(options.ttl + options.transition);
  for (const FaultEvent& f : faults) {
    CheckReport::Recovery& r = report.recovery_by_fault[f.kind];
    const bool kept =
        std::any_of(report.tenures.begin(), report.tenures.end(), [&](const Tenure& t) {
          if (t.acquired > f.start || end_of(t) <= f.end || t.killed) return false;
          if (!t.released && end_of(t) <= f.end + lease) return false;
          const Nanos until = f.end;
          return std::none_of(report.tenures.begin(), report.tenures.end(), [&](const Tenure& o) {
            return o.worker != t.worker && o.acquired >= f.start && o.acquired <= until;
          });
        });
    if (kept) {
      ++r.kept;
      continue;
    }
    Nanos next = kForever;
    for (const Tenure& t : report.tenures) {
      if (t.acquired >= f.start) next = std::min(next, t.acquired);
    }
    if (next != kForever) r.to_next_owner.push_back(next - f.start);
  }

  // Liveness: after each fault healed, somebody owns the mutex again within
  // the bound (an acquisition or a passed ownership check in the window).
  const Nanos bound = to_nanos(options.takeover_bound.value_or(options.ttl + options.transition +
                                                               std::chrono::milliseconds(2000)));
  report.takeover_bound = bound;
  std::vector<Nanos> owned_at;
  for (const Tenure& t : report.tenures) owned_at.push_back(t.acquired);
  for (const Checked& c : checks) owned_at.push_back(c.check);
  std::sort(owned_at.begin(), owned_at.end());
  for (const FaultEvent& f : faults) {
    const Nanos healed = f.end;
    Nanos next = options.run_end > 0 ? options.run_end : kForever;
    for (const FaultEvent& g : faults) {
      if (g.start > healed && g.start < next) next = g.start;
      if (g.start <= healed && g.end > healed) next = -1;  // another fault still active
    }
    if (next < healed + bound) continue;  // the run moved on before the bound
    const auto it = std::lower_bound(owned_at.begin(), owned_at.end(), healed);
    if (it == owned_at.end() || *it > healed + bound) {
      violate("stuck", "nobody owned the mutex within " + ms(bound) + " after the " + f.kind +
                           " fault healed");
    } else {
      report.worst_takeover = std::max(report.worst_takeover, *it - healed);
      Nanos& by_kind = report.worst_takeover_by_fault[f.kind];
      by_kind = std::max(by_kind, *it - healed);
    }
  }
  return report;
}

}  // namespace simba::testing
