// Which thread ran a hook: a test that asks whether a call ran on the
// caller's own thread (one thread hop less) records from the hook and
// reads back on the caller's.
#ifndef SIMBA_TESTING_THREAD_RECORDER_H_
#define SIMBA_TESTING_THREAD_RECORDER_H_

#include <mutex>
#include <thread>

namespace simba::testing {

class ThreadRecorder {
 public:
  // From the hook: the thread running it now.
  void record() {
    std::lock_guard<std::mutex> lock(mu_);
    recorded_ = std::this_thread::get_id();
  }
  // Whether the last record() ran on the calling thread.
  bool recorded_here() const {
    std::lock_guard<std::mutex> lock(mu_);
    return recorded_ == std::this_thread::get_id();
  }

 private:
  mutable std::mutex mu_;
  std::thread::id recorded_;
};

}  // namespace simba::testing

#endif  // SIMBA_TESTING_THREAD_RECORDER_H_
