#include "core/worker.h"

#include <pthread.h>

#include <algorithm>
#include <string>
#include <utility>

#include "simba/uri.h"

namespace simba::internal {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

namespace {

std::string thread_name(std::string_view name) {
  std::string full = "simba:" + std::string(name);
  full.resize(std::min<std::size_t>(full.size(), 15));
  return full;
}

}  // namespace

void name_this_thread(std::string_view name) {
  pthread_setname_np(pthread_self(), thread_name(name).c_str());
}

bool Worker::start(std::string_view name, std::function<void()> body) {
  std::lock_guard<std::mutex> lock(mu_);
  if (used_) return false;
  // Only `body` (a copy the thread owns) runs there: nothing of *this.
  // The thread names itself before `body` runs, so nothing (body, a test,
  // a thread count) ever sees it unnamed.
  thread_ = std::thread([full = thread_name(name), body = std::move(body)] {
    pthread_setname_np(pthread_self(), full.c_str());
    body();
  });
  used_ = true;
  return true;
}

void Worker::join() {
  std::thread thread;
  {
    std::lock_guard<std::mutex> lock(mu_);
    used_ = true;
    thread = std::move(thread_);
  }
  if (!thread.joinable()) return;
  if (thread.get_id() == std::this_thread::get_id()) {
    // Called from inside `body`: the thread cannot join itself. It ends when
    // `body` returns, and touches nothing of this Worker on the way.
    thread.detach();
  } else {
    thread.join();
  }
}

bool Worker::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return thread_.joinable();
}

milliseconds Backoff::failed(Status error) {
  last_error_ = std::move(error);
  delay_ = std::clamp(delay_ * 2, first_, max_);
  next_ = steady_clock::now() + delay_;
  return delay_;
}

void Backoff::reset() {
  delay_ = milliseconds(0);
  next_ = {};
}

Status Backoff::ready() const {
  const auto now = steady_clock::now();
  if (now >= next_) return ok_status();
  const auto wait = std::chrono::ceil<milliseconds>(next_ - now);
  return Status(last_error_.code(),
                last_error_.message() + " (next reconnect in " + format_duration(wait) + ")");
}

TurnGate::Turn& TurnGate::Turn::operator=(Turn&& other) noexcept {
  if (this != &other) {
    release();
    gate_ = std::exchange(other.gate_, nullptr);
  }
  return *this;
}

void TurnGate::Turn::release() {
  TurnGate* gate = std::exchange(gate_, nullptr);
  if (gate == nullptr) return;
  std::lock_guard<std::mutex> lock(gate->mu_);
  gate->busy_ = false;
  gate->wake_first_locked();
}

void TurnGate::wake_first_locked() {
  // Under mu_: the condition lives in its waiter's frame, which cannot
  // return before it gets mu_ back.
  if (!waiting_.empty()) waiting_.begin()->second->notify_one();
}

TurnGate::Turn TurnGate::take(Deadline deadline, const std::stop_token& cancel) {
  // Each waiter sleeps on its own condition, so a release wakes only the
  // next in line (not every thread waiting for a busy connection).
  std::condition_variable mine;
  // Registered before taking mu_: a stop already requested runs it here.
  std::stop_callback wake(cancel, [this, &mine] {
    std::lock_guard<std::mutex> lock(mu_);
    mine.notify_one();
  });
  std::unique_lock<std::mutex> lock(mu_);
  const std::uint64_t ticket = next_ticket_++;
  waiting_.emplace(ticket, &mine);
  for (;;) {
    if (!busy_ && waiting_.begin()->first == ticket) {
      waiting_.erase(waiting_.begin());
      busy_ = true;
      return Turn(this);
    }
    if (cancel.stop_requested() || std::chrono::steady_clock::now() >= deadline) {
      // Give up this place in line: the next must not wait for it.
      const bool first = waiting_.begin()->first == ticket;
      waiting_.erase(ticket);
      if (first) wake_first_locked();
      return Turn();
    }
    if (deadline == Deadline::max()) {
      mine.wait(lock);
    } else {
      mine.wait_until(lock, deadline);
    }
  }
}

}  // namespace simba::internal
