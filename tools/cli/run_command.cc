// simba run: hold a mutex while a child command runs (docs/cli.md).
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "simba/contend_service.h"
#include "simba/locker.h"
#include "tools/cli/child.h"
#include "tools/cli/cli.h"

namespace simba::cli {
namespace {

using std::chrono::milliseconds;

// "held by X, its lease ends in 3.2s" (or "free"; "" when `self` holds it),
// read from the store.
std::string DescribeHolder(Backend& backend, const std::string& mutex,
                           const std::string& self = "") {
  auto record = backend.read(mutex, std::chrono::steady_clock::now() + std::chrono::seconds(2));
  if (!record.ok()) return "owner unknown (" + record.status().message() + ")";
  const MutexOwner& owner = record->owner;
  if (!record->held()) return "free";
  if (owner.owner_id == self) return "";
  return "held by " + owner.owner_id + " (token " + std::to_string(owner.fencing_token) + "), " +
         (record->owner_times_unknown()
              ? std::string("its lease end unknown to the store")
              : "its lease ends in " + Human(owner.transition_at - record->store_now));
}

void Verbose(bool verbose, const std::string& line) {
  if (verbose) PrintInfo(line);
}

}  // namespace

int RunCommand(const std::vector<std::string>& argv) {
  FlagSpec spec;
  spec.with_value = {"--store", "--mutex",      "--ttl",       "--transition",
                     "--timeout", "--kill-after", "--log-format"};
  spec.switches = {"--wait", "--no-wait", "--verbose"};
  spec.command = true;
  auto parsed = ParseArgs(argv, spec);
  if (!parsed.ok()) {
    PrintError(parsed.status().message() + " (see 'simba run --help')");
    return kExitUsage;
  }
  const Args& args = *parsed;
  if (args.Has("--help")) {
    std::fputs(HelpFor("run"), stdout);
    return kExitOk;
  }
  auto usage = [](const std::string& message) {
    PrintError(message + " (see 'simba run --help')");
    return kExitUsage;
  };
  auto job = ParseLeaseJob(args);
  if (!job.ok()) return usage(job.status().message());
  SetLogFormat(job->log_format);
  const int modes = (args.Has("--wait") ? 1 : 0) + (args.Has("--no-wait") ? 1 : 0) +
                    (args.Has("--timeout") ? 1 : 0);
  if (modes > 1) return usage("--wait, --no-wait and --timeout exclude each other");
  auto timeout = args.Duration("--timeout", milliseconds(0));
  if (!timeout.ok()) return usage(timeout.status().message());

  auto factory = OpenFactory(*job);
  if (!factory.ok()) {
    PrintError(factory.status().message());
    return ExitCodeFor(factory.status());
  }
  auto locker = Locker::create(**factory, job->mutex);
  if (!locker.ok()) return usage("--mutex: " + locker.status().message());
  Backend& backend = *(*factory)->backend();

  InstallSignalHandlers();
  // Acquire, watching for signals (which cancel the wait) and, with
  // --verbose, telling the user who holds the mutex.
  std::atomic<int> received{0};
  Status acquired;
  bool held = false;
  if (args.Has("--no-wait")) {
    auto attempt = (*locker)->try_acquire();
    if (!attempt.ok()) {
      PrintError(attempt.status().message());
      return ExitCodeFor(attempt.status());
    }
    held = *attempt;
  } else {
    std::stop_source cancel;
    std::jthread watcher([&](std::stop_token stop) {
      std::string last;
      // The first report after a moment: an immediate acquisition needs none.
      auto next_report = std::chrono::steady_clock::now() + milliseconds(200);
      while (!stop.stop_requested()) {
        if (const int sig = TakeSignal(); sig != 0) {
          received = sig;
          cancel.request_stop();
          return;
        }
        if (job->verbose && std::chrono::steady_clock::now() >= next_report) {
          // Ourselves as the holder means the acquisition just landed.
          const std::string holder = DescribeHolder(backend, job->mutex, (*locker)->contender_id());
          if (!holder.empty() && holder != last) {
            Verbose(true, "waiting for mutex '" + job->mutex + "': " + holder);
          }
          last = holder;
          next_report = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        }
        std::this_thread::sleep_for(milliseconds(10));
      }
    });
    acquired = args.Has("--timeout") ? (*locker)->acquire(*timeout, cancel.get_token())
                                     : (*locker)->acquire(cancel.get_token());
    watcher.request_stop();
    watcher.join();
    if (acquired.code() == StatusCode::kCancelled) return 128 + received.load();
    if (!acquired.ok() && acquired.code() != StatusCode::kDeadlineExceeded) {
      PrintError(acquired.message());
      return ExitCodeFor(acquired);
    }
    held = acquired.ok();
  }
  if (!held) {
    PrintError("mutex '" + job->mutex + "' not acquired: " + DescribeHolder(backend, job->mutex));
    return kExitNotAcquired;
  }
  // (--verbose has printed the acquisition event with its token.)
  const std::uint64_t token = (*locker)->fencing_token();

  auto child = Child::Start(job->command, {{"SIMBA_MUTEX", job->mutex},
                                           {"SIMBA_CONTENDER_ID", (*locker)->contender_id()},
                                           {"SIMBA_FENCING_TOKEN", std::to_string(token)}});
  if (!child.ok()) {
    PrintError(child.status().message());
    (void)(*locker)->release();
    return child.status().code() == StatusCode::kNotFound ? kExitNotFound : kExitCannotExecute;
  }

  // Supervise: the child's exit, signals to forward, and the lease.
  bool lost = false;
  // A plain flag + time point: GCC 12 warns (falsely) about an optional here.
  bool kill_pending = false;
  std::chrono::steady_clock::time_point kill_at{};
  std::optional<int> status;
  for (;;) {
    status = child->Poll();
    if (status) break;
    if (const int sig = TakeSignal(); sig != 0) {
      child->Signal(sig);
      if (!kill_pending) {
        kill_pending = true;
        kill_at = std::chrono::steady_clock::now() + job->kill_after;
      }
    }
    if (!lost && !(*locker)->is_held()) {
      lost = true;
      PrintError("lost the lease of mutex '" + job->mutex + "' (token " + std::to_string(token) +
                 "); stopping the command");
      child->Signal(SIGTERM);
      kill_pending = true;
      kill_at = std::chrono::steady_clock::now() + job->kill_after;
    }
    if (kill_pending && std::chrono::steady_clock::now() >= kill_at) {
      child->Signal(SIGKILL);
      kill_pending = false;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  // (--verbose prints the release event.)
  if (Status s = (*locker)->release(); !s.ok()) {
    PrintError("releasing mutex '" + job->mutex + "': " + s.message() + " (the lease will expire)");
  }
  return lost ? kExitLeaseLost : *status;
}

}  // namespace simba::cli
