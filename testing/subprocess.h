// Child processes read line by line, and the scale of real-time waits:
// shared by the tests and by simba-bench, so no GoogleTest in here.
#ifndef SIMBA_TESTING_SUBPROCESS_H_
#define SIMBA_TESTING_SUBPROCESS_H_

#include <chrono>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

namespace simba::testing {

// Real-time waits in tests scale with SIMBA_TEST_TIME_SCALE (default 1), so a
// slow machine (sanitizers) can stretch them without editing tests.
double time_scale();
std::chrono::milliseconds scaled(std::chrono::milliseconds d);

// How a Subprocess starts.
struct SpawnOptions {
  // Its stdout goes to a pipe read_line() reads; false: inherited.
  bool read_stdout = true;
  // Its stderr appended to this file (made if missing); empty: inherited.
  std::string stderr_path;
  // PR_SET_PDEATHSIG SIGKILL, set in the child before it execs and checked
  // against the parent it was forked from, so it dies with the thread that
  // started it (the kernel sends the signal when that thread exits: start
  // it from a thread that lives as long as the process) even when the
  // parent dies while it starts.
  bool die_with_parent = false;
};

// A child process whose stdout is read line by line.
class Subprocess {
 public:
  // Starts `argv[0]` with `argv`; stderr is inherited.
  explicit Subprocess(const std::vector<std::string>& argv) : Subprocess(argv, SpawnOptions{}) {}
  Subprocess(const std::vector<std::string>& argv, const SpawnOptions& options);
  ~Subprocess();  // SIGKILLs and reaps the child if it still runs
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0; }
  // The next line of output, or nullopt on EOF or when `timeout` (real,
  // scaled) passes first.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout);
  // Reads lines until one starts with `prefix`; returns it, or nullopt.
  // Every line read is appended to `seen` when given.
  std::optional<std::string> wait_for_line(const std::string& prefix,
                                           std::chrono::milliseconds timeout,
                                           std::vector<std::string>* seen = nullptr);
  void signal(int signal);
  // Waits for the child to exit; returns its wait status.
  int wait();
  // Waits at most `timeout` (real, not scaled) for the child to exit; its
  // wait status, or nullopt if it still runs.
  std::optional<int> wait_for(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string buffer_;
  bool reaped_ = false;
};

// `root` and every process descended from it (children, theirs, ...), root
// first, read from /proc. A process whose parent died has been re-parented
// and is no longer found.
std::vector<pid_t> process_tree(pid_t root);

// Stops `root` and all its descendants with SIGSTOP, looking again until no
// process of the tree is left running (a fork under way when the first
// look was taken shows up in the next), and returns them: nothing in the
// tree can act, or fork, until they get SIGCONT (or SIGKILL).
std::vector<pid_t> freeze_process_tree(pid_t root);

// Sends `signal` to each of `pids`.
void signal_processes(const std::vector<pid_t>& pids, int signal);

// A command line run by the shell to its end: its exit status (-1 when it
// did not exit), what it wrote to stdout and stderr, and how long it took.
struct CommandRun {
  int exit_code = -1;
  std::string output;
  std::chrono::milliseconds elapsed{0};
};
// Runs `command_line` (sh -c, stderr into the output) and waits for it.
CommandRun run_command_line(const std::string& command_line);
// The same, started now on a thread of its own (for a command that must
// run while the test does something else, e.g. a store failing over).
std::future<CommandRun> start_command_line(const std::string& command_line);

}  // namespace simba::testing

#endif  // SIMBA_TESTING_SUBPROCESS_H_
