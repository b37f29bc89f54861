// A child command run in a process group of its own, so that it (and its own
// children, e.g. a shell pipeline) can be signalled as one. The group dies
// with simba: if simba is killed (SIGKILL, the OOM killer) while the child
// runs, a small reaper process kills the group at once, so a job never runs
// on without the lease that made it safe to run.
#ifndef SIMBA_TOOLS_CLI_CHILD_H_
#define SIMBA_TOOLS_CLI_CHILD_H_

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "simba/status.h"

namespace simba::cli {

class Child {
 public:
  // Starts `command` (looked up in PATH) with the current environment plus
  // `env`. kNotFound when it does not exist, kPermissionDenied when it cannot
  // be executed.
  static Result<Child> start(const std::vector<std::string>& command,
                             const std::map<std::string, std::string>& env);

  Child(Child&& other) noexcept;
  Child& operator=(Child&& other) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  // A child still running when its Child is destroyed is killed (by its
  // reaper): nothing may outlive the simba that started it.
  ~Child();

  pid_t pid() const { return pid_; }
  // Sends `signal` to the child's process group.
  void signal(int signal) const;
  // The child's exit status (as a shell reports it: the code, or 128 + N when
  // killed by signal N) once it has exited; nullopt while it runs.
  std::optional<int> poll();

 private:
  Child(pid_t pid, pid_t reaper, int reaper_fd)
      : pid_(pid), reaper_(reaper), reaper_fd_(reaper_fd) {}
  // Tells the reaper the child has exited (it then exits without killing)
  // and collects it.
  void dismiss_reaper();
  // Closes the reaper's pipe without a word (it kills the group) and
  // collects it.
  void release_reaper();

  pid_t pid_;
  std::optional<int> status_;
  pid_t reaper_ = -1;
  int reaper_fd_ = -1;
};

// Stops `child`: SIGTERM to its group, then SIGKILL after `kill_after`.
// Returns its exit status.
int stop_child(Child& child, std::chrono::milliseconds kill_after);

// Signals to simba that the CLI forwards or reacts to (SIGINT, SIGTERM,
// SIGHUP): installs handlers; take_signal() returns the last one received
// (0 if none) and clears it.
void install_signal_handlers();
int take_signal();

}  // namespace simba::cli

#endif  // SIMBA_TOOLS_CLI_CHILD_H_
