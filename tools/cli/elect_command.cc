// simba elect: a leader-gated process supervisor (docs/cli.md).
#include <signal.h>

#include <cstdio>
#include <thread>

#include "simba/contend_service.h"
#include "tools/cli/child.h"
#include "tools/cli/cli.h"

namespace simba::cli {

int ElectCommand(const std::vector<std::string>& argv) {
  using std::chrono::milliseconds;
  FlagSpec spec;
  spec.with_value = {"--store", "--mutex", "--ttl", "--transition", "--kill-after", "--log-format"};
  spec.switches = {"--verbose"};
  spec.command = true;
  auto parsed = ParseArgs(argv, spec);
  auto usage = [](const std::string& message) {
    PrintError(message + " (see 'simba elect --help')");
    return kExitUsage;
  };
  if (!parsed.ok()) return usage(parsed.status().message());
  const Args& args = *parsed;
  if (args.Has("--help")) {
    std::fputs(HelpFor("elect"), stdout);
    return kExitOk;
  }
  auto job = ParseLeaseJob(args);
  if (!job.ok()) return usage(job.status().message());
  SetLogFormat(job->log_format);
  auto factory = OpenFactory(*job);
  if (!factory.ok()) {
    PrintError(factory.status().message());
    return ExitCodeFor(factory.status());
  }
  auto service = (*factory)->create_contend_service(MakeContender(job->mutex, nullptr, nullptr));
  if (!service.ok()) return usage("--mutex: " + service.status().message());
  InstallSignalHandlers();
  if (Status s = (*service)->start(); !s.ok()) {
    PrintError(s.message());
    return ExitCodeFor(s);
  }
  auto say = [&](const std::string& line) {
    if (job->verbose) PrintInfo(line);
  };
  say("contending for mutex '" + job->mutex + "' as " + (*service)->contender_id());

  std::optional<Child> child;
  std::uint64_t child_token = 0;
  int exit_code = kExitOk;
  for (;;) {
    if (TakeSignal() != 0) {
      if (child) {
        say("stopping the command");
        const int status = StopChild(*child, job->kill_after);
        // Killed after ignoring SIGTERM: say so in the exit code.
        if (status == 128 + SIGKILL) exit_code = status;
      }
      break;
    }
    // The lease, not the cached owner: 0 once the deadline has passed.
    const std::uint64_t token = (*service)->fencing_token();
    if (child) {
      if (auto status = child->Poll()) {
        PrintError("the command exited with status " + std::to_string(*status) +
                   " while leading; giving up leadership");
        exit_code = *status;
        break;
      }
      if (token != child_token) {
        PrintError("lost leadership of mutex '" + job->mutex + "' (token " +
                   std::to_string(child_token) + "); stopping the command");
        (void)StopChild(*child, job->kill_after);
        child.reset();
        continue;
      }
    } else if (token != 0) {
      say("leading mutex '" + job->mutex + "' with fencing token " + std::to_string(token) +
          "; starting the command");
      auto started = Child::Start(job->command,
                                  {{"SIMBA_MUTEX", job->mutex},
                                   {"SIMBA_CONTENDER_ID", (*service)->contender_id()},
                                   {"SIMBA_FENCING_TOKEN", std::to_string(token)}});
      if (!started.ok()) {
        PrintError(started.status().message());
        exit_code = started.status().code() == StatusCode::kNotFound ? kExitNotFound
                                                                      : kExitCannotExecute;
        break;
      }
      child = std::move(*started);
      child_token = token;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  if (Status s = (*service)->stop(); !s.ok()) PrintError(s.message());
  return exit_code;
}

}  // namespace simba::cli
