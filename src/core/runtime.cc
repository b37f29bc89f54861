#include "core/runtime.h"

#include <atomic>
#include <exception>
#include <map>
#include <set>
#include <unordered_map>

#include "core/log.h"

namespace simba::internal {
namespace {

void run_guarded(const Task& task, const char* where) {
  try {
    task();
  } catch (const std::exception& e) {
    SIMBA_LOG(kError, where << ": a task threw: " << e.what());
  } catch (...) {
    SIMBA_LOG(kError, where << ": a task threw a non-standard exception");
  }
}

// Every live Runtime, and a count of tasks handed on between threads, for
// Runtime::all_idle.
//
// Never destroyed: a Runtime released on its own timer thread ends there
// after join() detached that thread (see Worker), possibly while main() has
// returned and static destructors run; its erase must still find the set.
std::mutex& registry_mutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::set<const Runtime*>& registry() {
  static auto* runtimes = new std::set<const Runtime*>();
  return *runtimes;
}
std::atomic<std::uint64_t> posts{0};

}  // namespace

struct ThreadPool::State {
  explicit State(std::string n) : name(std::move(n)) {}
  const std::string name;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Task> queue;
  std::size_t running = 0;
  bool closed = false;
};

ThreadPool::ThreadPool(std::string name, int threads)
    : state_(std::make_shared<State>(std::move(name))) {
  if (threads < 1) threads = 1;
  threads_.reserve(static_cast<std::size_t>(threads));
  for (int i = 0; i < threads; ++i) {
    threads_.push_back(std::make_unique<Worker>());
    threads_.back()->start(state_->name, [state = state_] { work(state); });
  }
}

ThreadPool::~ThreadPool() { shutdown(); }

bool ThreadPool::post(Task task, bool urgent) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->closed) return false;
    if (urgent) {
      state_->queue.push_front(std::move(task));
    } else {
      state_->queue.push_back(std::move(task));
    }
    posts.fetch_add(1);
  }
  state_->cv.notify_one();
  return true;
}

void ThreadPool::shutdown() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->closed = true;
  }
  state_->cv.notify_all();
  // From one of the pool's own tasks, that thread is left to end by itself
  // (Worker::join) once the queue is drained: it holds the state it uses.
  for (auto& thread : threads_) thread->join();
}

bool ThreadPool::closed() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->closed;
}

std::size_t ThreadPool::busy() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->queue.size() + state_->running;
}

void ThreadPool::work(const std::shared_ptr<State>& state) {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(state->mu);
      state->cv.wait(lock, [&] { return state->closed || !state->queue.empty(); });
      // Queued tasks still run after shutdown(): they may be the last
      // notifications a service owes its contender.
      if (state->queue.empty()) return;
      task = std::move(state->queue.front());
      state->queue.pop_front();
      ++state->running;
    }
    run_guarded(task, state->name.c_str());
    task = nullptr;  // its captures may own the pool: drop them before the lock
    std::lock_guard<std::mutex> lock(state->mu);
    --state->running;
  }
}

Strand::Strand(std::shared_ptr<ThreadPool> pool) : pool_(std::move(pool)) {}

void Strand::post(Task task) {
  bool to_schedule = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    if (!scheduled_) {
      scheduled_ = true;
      to_schedule = true;
    }
  }
  if (to_schedule) schedule();
}

void Strand::schedule() {
  if (pool_->post([self = shared_from_this()] { self->run(); })) return;
  std::lock_guard<std::mutex> lock(mu_);
  SIMBA_LOG(kWarn, "callback dropped: the factory is closed");
  queue_.clear();
  scheduled_ = false;
  idle_cv_.notify_all();
}

bool Strand::running_in_this_thread() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_thread_ == std::this_thread::get_id();
}

void Strand::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return !scheduled_ || pool_->closed(); });
}

void Strand::run() {
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
    run_guarded(task, "callback");
    std::lock_guard<std::mutex> lock(mu_);
    running_thread_ = std::thread::id();
  }
  schedule();
}

struct Runtime::Timers {
  explicit Timers(std::shared_ptr<Clock> c) : clock(std::move(c)) {}
  const std::shared_ptr<Clock> clock;
  std::mutex mu;
  std::condition_variable cv;
  bool closed = false;
  TimerId next_id = 1;
  bool running = false;
  // When the timer thread, asleep, wakes by itself (max(): only when told);
  // min() while it is awake, and looks at `due` before it sleeps again.
  Clock::TimePoint sleeps_until = Clock::TimePoint::min();
  std::map<std::pair<Clock::TimePoint, TimerId>, Task> due;
  std::unordered_map<TimerId, Clock::TimePoint> when;
};

Runtime::Runtime(std::shared_ptr<Clock> clock, int io_threads, int callback_threads)
    : clock_(std::move(clock)),
      io_(std::make_shared<ThreadPool>("io", io_threads)),
      callbacks_(std::make_shared<ThreadPool>("callbacks", callback_threads)),
      timers_(std::make_shared<Timers>(clock_)) {
  timer_thread_.start("timer", [timers = timers_] { timer_loop(timers); });
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().insert(this);
}

Runtime::~Runtime() {
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry().erase(this);
  }
  shutdown();
}

bool Runtime::all_idle(std::size_t blocked_io) {
  std::lock_guard<std::mutex> registry_lock(registry_mutex());
  const std::uint64_t before = posts.load();
  std::size_t io = 0;
  for (const Runtime* runtime : registry()) {
    {
      Timers& timers = *runtime->timers_;
      std::lock_guard<std::mutex> lock(timers.mu);
      if (timers.running) return false;
      if (!timers.closed && !timers.due.empty() &&
          timers.due.begin()->first.first <= timers.clock->now()) {
        return false;
      }
    }
    if (runtime->callbacks_->busy() > 0) return false;
    io += runtime->io_->busy();
  }
  // Work moves between threads only by a post: none while we looked means
  // nothing moved from a part not yet looked at into one already seen idle.
  return io <= blocked_io && posts.load() == before;
}

Runtime::TimerId Runtime::schedule_at(Clock::TimePoint when, Task task) {
  TimerId id;
  bool sooner = false;
  {
    std::lock_guard<std::mutex> lock(timers_->mu);
    if (timers_->closed) return 0;
    id = timers_->next_id++;
    timers_->due.emplace(std::make_pair(when, id), std::move(task));
    timers_->when.emplace(id, when);
    posts.fetch_add(1);
    sooner = when < timers_->sleeps_until;
  }
  // Only a timer due before the timer thread wakes anyway needs it now: a
  // later one is found when it does (a lease deadline and a renewal set at
  // every acquisition each woke it for nothing, a context switch apiece).
  if (sooner) timers_->cv.notify_one();
  return id;
}

void Runtime::cancel(TimerId id) {
  if (id == 0) return;
  std::lock_guard<std::mutex> lock(timers_->mu);
  auto it = timers_->when.find(id);
  if (it == timers_->when.end()) return;
  timers_->due.erase(std::make_pair(it->second, id));
  timers_->when.erase(it);
}

void Runtime::shutdown() {
  {
    std::lock_guard<std::mutex> lock(timers_->mu);
    if (timers_->closed) return;
    timers_->closed = true;
    timers_->due.clear();
    timers_->when.clear();
  }
  timers_->cv.notify_all();
  // From one of its own timers, the timer thread is left to end by itself
  // (Worker::join) when that timer returns: it holds the state it uses.
  timer_thread_.join();
  io_->shutdown();
  callbacks_->shutdown();
}

bool Runtime::closed() const {
  std::lock_guard<std::mutex> lock(timers_->mu);
  return timers_->closed;
}

void Runtime::timer_loop(const std::shared_ptr<Timers>& timers) {
  std::unique_lock<std::mutex> lock(timers->mu);
  while (!timers->closed) {
    if (timers->due.empty()) {
      timers->sleeps_until = Clock::TimePoint::max();
      timers->cv.wait(lock);
      timers->sleeps_until = Clock::TimePoint::min();
      continue;
    }
    auto first = timers->due.begin();
    const Clock::TimePoint when = first->first.first;
    if (timers->clock->now() < when) {
      timers->sleeps_until = when;
      timers->clock->wait_until(timers->cv, lock, when);
      timers->sleeps_until = Clock::TimePoint::min();
      continue;
    }
    Task task = std::move(first->second);
    timers->when.erase(first->first.second);
    timers->due.erase(first);
    timers->running = true;
    posts.fetch_add(1);
    lock.unlock();
    run_guarded(task, "timer");
    task = nullptr;  // its captures may own the Runtime: drop them before the lock
    lock.lock();
    timers->running = false;
  }
}

}  // namespace simba::internal
