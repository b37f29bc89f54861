// Small helpers shared by the unit and conformance tests.
#ifndef SIMBA_TESTING_TEST_UTIL_H_
#define SIMBA_TESTING_TEST_UTIL_H_

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "testing/subprocess.h"

namespace simba::testing {

// `prefix` + the running test's name + "-" + the pid, with '/' made '-': a
// name no other test (or run) uses, for stores and keys shared by tests.
std::string unique_test_name(const std::string& prefix = "");

// Polls `condition` every millisecond of real time until it holds or
// `timeout` (scaled) passes. Returns whether it held.
bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout);

// Threads of this process, counted from /proc/self/task.
int count_threads();
// Threads of this process that Simba started (named "simba:..."): not a
// client library's own pool (gRPC's, ZooKeeper's).
int count_simba_threads();
// The names of this process's threads with their counts, sorted
// ("grpc_global_tim x2, simba:watch x1, ..."): what a failed thread bound
// prints, so the failure says whose thread it was.
std::string thread_names();

// The folder scratch files go under: $SIMBA_TEST_TMPDIR, else $TMPDIR,
// else /dev/shm (memory: no fsync stalls under short leases), else /tmp.
std::string scratch_parent();

// A fresh directory under scratch_parent() (or `base`), removed with its contents when
// the object is destroyed.
class TempDir {
 public:
  explicit TempDir(const std::string& base = "");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace simba::testing

#endif  // SIMBA_TESTING_TEST_UTIL_H_
