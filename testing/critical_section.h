// Who is inside a critical section, by each holder's own view, for the
// mixed JVM Simba / Simba contention tests (Redis, MySQL): overlaps, the
// most inside at once, and how often the lock changed sides.
#ifndef SIMBA_TESTING_CRITICAL_SECTION_H_
#define SIMBA_TESTING_CRITICAL_SECTION_H_

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace simba::testing {

class CriticalSection {
 public:
  enum Side { kJvm, kCpp };

  void enter(const std::string& who, Side side) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!open_ || inside_.count(who) > 0 || retired_.count(who) > 0) return;
    inside_.insert(who);
    if (inside_.size() > 1) {
      std::ostringstream out;
      for (const auto& id : inside_) out << id << " ";
      overlaps_.push_back(out.str());
    }
    max_inside_ = std::max(max_inside_, inside_.size());
    if (!order_.empty() && order_.back() != side) {
      ++(side == kCpp ? jvm_to_cpp_ : cpp_to_jvm_);
    }
    order_.push_back(side);
    cv_.notify_all();
  }
  void exit(const std::string& who) {
    std::lock_guard<std::mutex> lock(mu_);
    inside_.erase(who);
    cv_.notify_all();
  }
  // The holder decided to stop: it leaves, and does no more work until it
  // contends again, whatever its callbacks say meanwhile (a JVM contender
  // that gets a stray wake-up while it holds re-acquires its own lock, which
  // reaches the application as onReleased + onAcquired; an application that
  // is stopping starts nothing on that).
  void leave(const std::string& who) {
    std::lock_guard<std::mutex> lock(mu_);
    inside_.erase(who);
    retired_.insert(who);
    cv_.notify_all();
  }
  // Before the holder contends again.
  void rejoin(const std::string& who) {
    std::lock_guard<std::mutex> lock(mu_);
    retired_.erase(who);
  }
  // Waits until `who` is inside or the run closed; true if inside.
  bool wait_inside(const std::string& who) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !open_ || inside_.count(who) > 0; });
    return inside_.count(who) > 0;
  }
  bool is_inside(const std::string& who) {
    std::lock_guard<std::mutex> lock(mu_);
    return inside_.count(who) > 0;
  }
  // No entries are recorded after this (a holder that acquires while the
  // run winds down would otherwise be reported without its hold).
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
    cv_.notify_all();
  }
  std::size_t max_inside() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_inside_;
  }
  std::vector<std::string> overlaps() {
    std::lock_guard<std::mutex> lock(mu_);
    return overlaps_;
  }
  std::size_t entries() {
    std::lock_guard<std::mutex> lock(mu_);
    return order_.size();
  }
  int jvm_to_cpp() {
    std::lock_guard<std::mutex> lock(mu_);
    return jvm_to_cpp_;
  }
  int cpp_to_jvm() {
    std::lock_guard<std::mutex> lock(mu_);
    return cpp_to_jvm_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  std::set<std::string> inside_;
  std::set<std::string> retired_;
  std::size_t max_inside_ = 0;
  std::vector<std::string> overlaps_;
  std::vector<Side> order_;
  int jvm_to_cpp_ = 0;
  int cpp_to_jvm_ = 0;
};

}  // namespace simba::testing

#endif  // SIMBA_TESTING_CRITICAL_SECTION_H_
