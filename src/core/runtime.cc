#include "core/runtime.h"

#include <exception>

#include "core/log.h"

namespace simba::internal {
namespace {

void RunGuarded(const Task& task, const char* where) {
  try {
    task();
  } catch (const std::exception& e) {
    SIMBA_LOG(kError, where << ": a task threw: " << e.what());
  } catch (...) {
    SIMBA_LOG(kError, where << ": a task threw a non-standard exception");
  }
}

}  // namespace

ThreadPool::ThreadPool(std::string name, int threads) : name_(std::move(name)) {
  if (threads < 1) threads = 1;
  threads_.reserve(static_cast<std::size_t>(threads));
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

ThreadPool::~ThreadPool() { Shutdown(); }

bool ThreadPool::Post(Task task, bool urgent) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    if (urgent) {
      queue_.push_front(std::move(task));
    } else {
      queue_.push_back(std::move(task));
    }
  }
  cv_.notify_one();
  return true;
}

void ThreadPool::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ && threads_.empty()) return;
    closed_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
  }
  for (auto& t : threads_) {
    // A pool shut down from one of its own threads cannot join that thread.
    if (t.joinable()) t.detach();
  }
  std::lock_guard<std::mutex> lock(mu_);
  threads_.clear();
}

bool ThreadPool::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

void ThreadPool::Work() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return closed_ || !queue_.empty(); });
      // Queued tasks still run after Shutdown(): they may be the last
      // notifications a service owes its contender.
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    RunGuarded(task, name_.c_str());
  }
}

Strand::Strand(std::shared_ptr<ThreadPool> pool) : pool_(std::move(pool)) {}

void Strand::Post(Task task) {
  bool schedule = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    if (!scheduled_) {
      scheduled_ = true;
      schedule = true;
    }
  }
  if (schedule && !pool_->Post([self = shared_from_this()] { self->Run(); })) {
    std::lock_guard<std::mutex> lock(mu_);
    SIMBA_LOG(kWarn, "callback dropped: the factory is closed");
    queue_.clear();
    scheduled_ = false;
    idle_cv_.notify_all();
  }
}

bool Strand::RunningInThisThread() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_thread_ == std::this_thread::get_id();
}

void Strand::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return !scheduled_ || pool_->closed(); });
}

void Strand::Run() {
  // A bounded batch, then yield the pool thread so one busy service cannot
  // starve the callbacks of others.
  constexpr int kBatch = 16;
  for (int i = 0; i < kBatch; ++i) {
    Task task;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) {
        scheduled_ = false;
        running_thread_ = std::thread::id();
        idle_cv_.notify_all();
        return;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
      running_thread_ = std::this_thread::get_id();
    }
    RunGuarded(task, "callback");
    std::lock_guard<std::mutex> lock(mu_);
    running_thread_ = std::thread::id();
  }
  if (!pool_->Post([self = shared_from_this()] { self->Run(); })) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.clear();
    scheduled_ = false;
    idle_cv_.notify_all();
  }
}

Runtime::Runtime(std::shared_ptr<Clock> clock, int io_threads, int callback_threads)
    : clock_(std::move(clock)),
      io_(std::make_shared<ThreadPool>("io", io_threads)),
      callbacks_(std::make_shared<ThreadPool>("callbacks", callback_threads)) {
  timer_thread_ = std::thread([this] { TimerLoop(); });
}

Runtime::~Runtime() { Shutdown(); }

Runtime::TimerId Runtime::ScheduleAt(Clock::TimePoint when, Task task) {
  TimerId id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return 0;
    id = next_id_++;
    timers_.emplace(std::make_pair(when, id), std::move(task));
    due_.emplace(id, when);
  }
  cv_.notify_one();
  return id;
}

void Runtime::Cancel(TimerId id) {
  if (id == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = due_.find(id);
  if (it == due_.end()) return;
  timers_.erase(std::make_pair(it->second, id));
  due_.erase(it);
}

void Runtime::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    timers_.clear();
    due_.clear();
  }
  cv_.notify_all();
  if (timer_thread_.joinable()) {
    if (timer_thread_.get_id() == std::this_thread::get_id()) {
      timer_thread_.detach();
    } else {
      timer_thread_.join();
    }
  }
  io_->Shutdown();
  callbacks_->Shutdown();
}

bool Runtime::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

void Runtime::TimerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!closed_) {
    if (timers_.empty()) {
      cv_.wait(lock);
      continue;
    }
    auto first = timers_.begin();
    const Clock::TimePoint when = first->first.first;
    if (clock_->Now() < when) {
      clock_->WaitUntil(cv_, lock, when);
      continue;
    }
    Task task = std::move(first->second);
    due_.erase(first->first.second);
    timers_.erase(first);
    lock.unlock();
    RunGuarded(task, "timer");
    lock.lock();
  }
}

}  // namespace simba::internal
