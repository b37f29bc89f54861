// A mutex holder in a child process of its own, for tests of what a store
// sees when a holder dies or is paused: its process can be SIGKILLed or
// SIGSTOPped without touching the test's own threads.
#ifndef SIMBA_TESTING_CHILD_HOLDER_H_
#define SIMBA_TESTING_CHILD_HOLDER_H_

#include <sys/types.h>

#include <chrono>
#include <string>

namespace simba::testing {

// One byte from `fd` (a pipe from a child) within `timeout`; '\0' on
// timeout, EOF or error.
char read_byte(int fd, std::chrono::milliseconds timeout);

class ChildHolder {
 public:
  // Forks a child that runs a contend service for `mutex` on `uri` (ttl 10 s,
  // transition 5 s: a lease far longer than any bound a test asserts) under
  // the contender id "child". Once it owns the mutex, it writes what
  // is_owner() says ('1' or '0') to a pipe every 5 ms. Returns once it owns
  // the mutex; started() is false if it did not within 10 s (scaled).
  ChildHolder(const std::string& uri, const std::string& mutex);
  // SIGKILLs the child if it still runs, and reaps it.
  ~ChildHolder();
  ChildHolder(const ChildHolder&) = delete;
  ChildHolder& operator=(const ChildHolder&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  // Sends `signal`; SIGKILL also reaps the child.
  bool signal(int signal);
  // The next byte the child wrote within `timeout`; '\0' when none came.
  char next(std::chrono::milliseconds timeout);
  // Discards what the child has written so far.
  void drain();

 private:
  pid_t pid_ = -1;
  int out_ = -1;
};

}  // namespace simba::testing

#endif  // SIMBA_TESTING_CHILD_HOLDER_H_
