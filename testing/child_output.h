// The child side of Subprocess (testing/subprocess.h): the helper programs
// that tests and simba-bench start say what happens in lines on stdout and
// stop on SIGTERM/SIGINT. Header-only, no GoogleTest.
#ifndef SIMBA_TESTING_CHILD_OUTPUT_H_
#define SIMBA_TESTING_CHILD_OUTPUT_H_

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <string>

namespace simba::testing {

// Writes `line` and a newline in one write(2): the parent reads whole lines,
// stdio buffering would hold them back, and lines of several threads must
// not interleave.
inline void emit_line(const std::string& line) {
  const std::string out = line + "\n";
  const ssize_t ignored = write(STDOUT_FILENO, out.data(), out.size());
  (void)ignored;
}

inline std::atomic<bool>& stop_flag() {
  static std::atomic<bool> stop{false};
  return stop;
}

// From now on SIGTERM and SIGINT only set stop_requested().
inline void stop_on_signals() {
  struct sigaction action {};
  action.sa_handler = [](int) { stop_flag() = true; };
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

inline bool stop_requested() { return stop_flag().load(); }

}  // namespace simba::testing

#endif  // SIMBA_TESTING_CHILD_OUTPUT_H_
