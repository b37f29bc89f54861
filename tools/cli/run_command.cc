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
std::string describe_holder(Backend& backend, const std::string& mutex,
                            const std::string& self = "") {
  auto record = backend.read(mutex, std::chrono::steady_clock::now() + std::chrono::seconds(2));
  if (!record.ok()) return "owner unknown (" + record.status().message() + ")";
  const MutexOwner& owner = record->owner;
  if (!record->held()) return "free";
  if (owner.owner_id == self) return "";
  return "held by " + owner.owner_id + " (token " + std::to_string(owner.fencing_token) + "), " +
         (record->owner_times_unknown()
              ? std::string("its lease end unknown to the store")
              : "its lease ends in " + human(owner.transition_at - record->store_now));
}

void verbose(bool verbose, const std::string& line) {
  if (verbose) print_info(line);
}

}  // namespace

int run_command(const std::vector<std::string>& argv) {
  FlagSpec spec;
  spec.with_value = {"--store",   "--mutex",      "--ttl",       "--transition",
                     "--timeout", "--kill-after", "--log-format"};
  spec.switches = {"--wait", "--no-wait", "--verbose"};
  spec.command = true;
  auto parsed = parse_args(argv, spec);
  if (!parsed.ok()) {
    print_error(parsed.status().message() + " (see 'simba run --help')");
    return kExitUsage;
  }
  const Args& args = *parsed;
  if (args.has("--help")) {
    std::fputs(help_for("run"), stdout);
    return kExitOk;
  }
  auto usage = [](const std::string& message) {
    print_error(message + " (see 'simba run --help')");
    return kExitUsage;
  };
  auto job = parse_lease_job(args);
  if (!job.ok()) return usage(job.status().message());
  set_log_format(job->log_format);
  const int modes = (args.has("--wait") ? 1 : 0) + (args.has("--no-wait") ? 1 : 0) +
                    (args.has("--timeout") ? 1 : 0);
  if (modes > 1) return usage("--wait, --no-wait and --timeout exclude each other");
  auto timeout = args.duration("--timeout", milliseconds(0));
  if (!timeout.ok()) return usage(timeout.status().message());

  // Before the store's first connection, as `simba elect` does: a signal
  // that comes while we start cancels the wait below.
  install_signal_handlers();
  auto factory = open_factory(*job);
  if (!factory.ok()) {
    print_error(factory.status().message());
    return exit_code_for(factory.status());
  }
  auto locker = Locker::create(**factory, job->mutex);
  if (!locker.ok()) return usage("--mutex: " + locker.status().message());
  Backend& backend = *(*factory)->backend();

  // Acquire, watching for signals (which cancel the wait) and, with
  // --verbose, telling the user who holds the mutex.
  std::atomic<int> received{0};
  Status acquired;
  bool held = false;
  if (args.has("--no-wait")) {
    auto attempt = (*locker)->try_acquire();
    if (!attempt.ok()) {
      print_error(store_error(job->store, attempt.status()));
      return exit_code_for(attempt.status());
    }
    held = *attempt;
  } else {
    std::stop_source cancel;
    std::jthread watcher([&](std::stop_token stop) {
      std::string last;
      // The first report after a moment: an immediate acquisition needs none.
      auto next_report = std::chrono::steady_clock::now() + milliseconds(200);
      while (!stop.stop_requested()) {
        if (const int sig = take_signal(); sig != 0) {
          received = sig;
          cancel.request_stop();
          return;
        }
        if (job->verbose && std::chrono::steady_clock::now() >= next_report) {
          // Ourselves as the holder means the acquisition just landed.
          const std::string holder =
              describe_holder(backend, job->mutex, (*locker)->contender_id());
          if (!holder.empty() && holder != last) {
            verbose(true, "waiting for mutex '" + job->mutex + "': " + holder);
          }
          last = holder;
          next_report = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        }
        std::this_thread::sleep_for(milliseconds(10));
      }
    });
    acquired = args.has("--timeout") ? (*locker)->acquire(*timeout, cancel.get_token())
                                     : (*locker)->acquire(cancel.get_token());
    watcher.request_stop();
    watcher.join();
    if (acquired.code() == StatusCode::kCancelled) return 128 + received.load();
    if (!acquired.ok() && acquired.code() != StatusCode::kDeadlineExceeded) {
      // A store that refused us at once, or one that could not be reached
      // until --timeout ran out (the message names the hosts and causes).
      print_error(store_error(job->store, acquired));
      return exit_code_for(acquired);
    }
    held = acquired.ok();
  }
  if (!held) {
    print_error("mutex '" + job->mutex + "' not acquired: " + describe_holder(backend, job->mutex));
    return kExitNotAcquired;
  }
  // (--verbose has printed the acquisition event with its token.)
  const std::uint64_t token = (*locker)->fencing_token();

  auto child = Child::start(job->command, {{"SIMBA_MUTEX", job->mutex},
                                           {"SIMBA_CONTENDER_ID", (*locker)->contender_id()},
                                           {"SIMBA_FENCING_TOKEN", std::to_string(token)}});
  if (!child.ok()) {
    print_error(child.status().message());
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
    status = child->poll();
    if (status) break;
    if (const int sig = take_signal(); sig != 0) {
      child->signal(sig);
      if (!kill_pending) {
        kill_pending = true;
        kill_at = std::chrono::steady_clock::now() + job->kill_after;
      }
    }
    if (!lost && !(*locker)->is_held()) {
      lost = true;
      print_error("lost the lease of mutex '" + job->mutex + "' (token " + std::to_string(token) +
                  "); stopping the command");
      child->signal(SIGTERM);
      kill_pending = true;
      kill_at = std::chrono::steady_clock::now() + job->kill_after;
    }
    if (kill_pending && std::chrono::steady_clock::now() >= kill_at) {
      child->signal(SIGKILL);
      kill_pending = false;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  // (--verbose prints the release event.)
  if (Status s = (*locker)->release(); !s.ok()) {
    print_error("releasing mutex '" + job->mutex + "': " + s.message() +
                " (the lease will expire)");
  }
  return lost ? kExitLeaseLost : *status;
}

}  // namespace simba::cli
