// Small helpers shared by the unit and conformance tests.
#ifndef SIMBA_TESTING_TEST_UTIL_H_
#define SIMBA_TESTING_TEST_UTIL_H_

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

namespace simba::testing {

// Real-time waits in tests scale with SIMBA_TEST_TIME_SCALE (default 1), so a
// slow machine (sanitizers) can stretch them without editing tests.
double TimeScale();
std::chrono::milliseconds Scaled(std::chrono::milliseconds d);

// `prefix` + the running test's name + "-" + the pid, with '/' made '-': a
// name no other test (or run) uses, for stores and keys shared by tests.
std::string UniqueTestName(const std::string& prefix = "");

// Polls `condition` every millisecond of real time until it holds or
// `timeout` (scaled) passes. Returns whether it held.
bool Eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout);

// Threads of this process, counted from /proc/self/task.
int CountThreads();

// A fresh directory under $TMPDIR (or /tmp), removed with its contents when
// the object is destroyed.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A child process whose stdout is read line by line.
class Subprocess {
 public:
  // Starts `argv[0]` with `argv`; stderr is inherited.
  explicit Subprocess(const std::vector<std::string>& argv);
  ~Subprocess();  // SIGKILLs and reaps the child if it still runs
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0; }
  // The next line of output, or nullopt on EOF or when `timeout` (real,
  // scaled) passes first.
  std::optional<std::string> ReadLine(std::chrono::milliseconds timeout);
  // Reads lines until one starts with `prefix`; returns it, or nullopt.
  // Every line read is appended to `seen` when given.
  std::optional<std::string> WaitForLine(const std::string& prefix,
                                         std::chrono::milliseconds timeout,
                                         std::vector<std::string>* seen = nullptr);
  void Signal(int signal);
  // Waits for the child to exit; returns its wait status.
  int Wait();

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string buffer_;
  bool reaped_ = false;
};

}  // namespace simba::testing

#endif  // SIMBA_TESTING_TEST_UTIL_H_
