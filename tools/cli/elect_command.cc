// simba elect: a leader-gated process supervisor (docs/cli.md).
#include <signal.h>

#include <cstdio>
#include <thread>

#include "simba/contend_service.h"
#include "tools/cli/child.h"
#include "tools/cli/cli.h"

namespace simba::cli {

int elect_command(const std::vector<std::string>& argv) {
  using std::chrono::milliseconds;
  FlagSpec spec;
  spec.with_value = {"--store", "--mutex", "--ttl", "--transition", "--kill-after", "--log-format"};
  spec.switches = {"--verbose"};
  spec.command = true;
  auto parsed = parse_args(argv, spec);
  auto usage = [](const std::string& message) {
    print_error(message + " (see 'simba elect --help')");
    return kExitUsage;
  };
  if (!parsed.ok()) return usage(parsed.status().message());
  const Args& args = *parsed;
  if (args.has("--help")) {
    std::fputs(help_for("elect"), stdout);
    return kExitOk;
  }
  auto job = parse_lease_job(args);
  if (!job.ok()) return usage(job.status().message());
  set_log_format(job->log_format);
  // Before anything that takes time (the store's first connection): a
  // SIGTERM from then on is ours to handle (exit 0), never the default
  // death by the signal a supervisor would see while we start.
  install_signal_handlers();
  auto factory = open_factory(*job);
  if (!factory.ok()) {
    print_error(factory.status().message());
    return exit_code_for(factory.status());
  }
  auto service = (*factory)->create_contend_service(make_contender(job->mutex, nullptr, nullptr));
  if (!service.ok()) return usage("--mutex: " + service.status().message());
  {
    // Until the store first answers: a store that cannot be reached yet is
    // waited for (for ever, each new cause printed once), one that refuses
    // us ends the command. After that the service rides out every outage.
    std::stop_source cancel;
    std::jthread watcher([&](std::stop_token stop) {
      while (!stop.stop_requested()) {
        if (take_signal() != 0) {
          cancel.request_stop();
          return;
        }
        std::this_thread::sleep_for(milliseconds(10));
      }
    });
    const Status reached = wait_for_store(*job, *(*factory)->backend(), cancel.get_token());
    watcher.request_stop();
    watcher.join();
    if (reached.code() == StatusCode::kCancelled) return kExitOk;
    if (!reached.ok()) {
      print_error(reached.message());
      return exit_code_for(reached);
    }
  }
  if (Status s = (*service)->start(); !s.ok()) {
    print_error(s.message());
    return exit_code_for(s);
  }
  auto say = [&](const std::string& line) {
    if (job->verbose) print_info(line);
  };
  say("contending for mutex '" + job->mutex + "' as " + (*service)->contender_id());

  std::optional<Child> child;
  std::uint64_t child_token = 0;
  int exit_code = kExitOk;
  for (;;) {
    if (take_signal() != 0) {
      if (child) {
        say("stopping the command");
        const int status = stop_child(*child, job->kill_after);
        // Killed after ignoring SIGTERM: say so in the exit code.
        if (status == 128 + SIGKILL) exit_code = status;
      }
      break;
    }
    // The lease, not the cached owner: 0 once the deadline has passed.
    const std::uint64_t token = (*service)->fencing_token();
    if (child) {
      if (auto status = child->poll()) {
        print_error("the command exited with status " + std::to_string(*status) +
                    " while leading; giving up leadership");
        exit_code = *status;
        break;
      }
      if (token != child_token) {
        print_error("lost leadership of mutex '" + job->mutex + "' (token " +
                    std::to_string(child_token) + "); stopping the command");
        (void)stop_child(*child, job->kill_after);
        child.reset();
        continue;
      }
    } else if (token != 0) {
      say("leading mutex '" + job->mutex + "' with fencing token " + std::to_string(token) +
          "; starting the command");
      auto started = Child::start(job->command, {{"SIMBA_MUTEX", job->mutex},
                                                 {"SIMBA_CONTENDER_ID", (*service)->contender_id()},
                                                 {"SIMBA_FENCING_TOKEN", std::to_string(token)}});
      if (!started.ok()) {
        print_error(started.status().message());
        exit_code =
            started.status().code() == StatusCode::kNotFound ? kExitNotFound : kExitCannotExecute;
        break;
      }
      child = std::move(*started);
      child_token = token;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  if (Status s = (*service)->stop(); !s.ok()) print_error(s.message());
  return exit_code;
}

}  // namespace simba::cli
