#include "testing/test_util.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace simba::testing {

std::string unique_test_name(const std::string& prefix) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = prefix + info->name() + "-" + std::to_string(getpid());
  std::replace(name.begin(), name.end(), '/', '-');
  return name;
}

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + scaled(timeout);
  for (;;) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return condition();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int count_threads() {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    (void)entry;
    ++count;
  }
  return count;
}

int count_simba_threads() {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(entry.path() / "comm");
    std::string name;
    if (std::getline(comm, name) && name.rfind("simba:", 0) == 0) ++count;
  }
  return count;
}

std::string thread_names() {
  std::map<std::string, int> counts;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(entry.path() / "comm");
    std::string name;
    if (!std::getline(comm, name)) name = "?";
    ++counts[name];
  }
  std::string out;
  for (const auto& [name, count] : counts) {
    if (!out.empty()) out += ", ";
    out += name + " x" + std::to_string(count);
  }
  return out;
}

// Where scratch directories go: $SIMBA_TEST_TMPDIR, else $TMPDIR, else
// /dev/shm, else /tmp. Memory first, because the tests' servers and SQLite
// files fsync on every commit, and on a shared CI disk an fsync sometimes
// stalls for seconds: long enough to lapse the 1-2 s leases the tests hold
// although neither Simba nor the store did anything wrong. The stores behave
// the same on tmpfs (a killed server still finds its data on restart).
std::string scratch_parent() {
  for (const char* name : {"SIMBA_TEST_TMPDIR", "TMPDIR"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && value[0] != '\0') return value;
  }
  if (access("/dev/shm", W_OK | X_OK) == 0) return "/dev/shm";
  return "/tmp";
}

TempDir::TempDir(const std::string& base) {
  const std::string parent = !base.empty() ? base : scratch_parent();
  std::string tmpl = parent + "/simba-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  // Tests may leave read-only directories behind; make them writable first.
  std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::add, ec);
  for (const auto& entry : std::filesystem::recursive_directory_iterator(path_, ec)) {
    std::filesystem::permissions(entry.path(), std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
  }
  std::filesystem::remove_all(path_, ec);
}

}  // namespace simba::testing
