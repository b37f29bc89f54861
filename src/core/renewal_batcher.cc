#include "core/renewal_batcher.h"

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <utility>

namespace simba::internal {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

RenewalBatcher::RenewalBatcher(std::shared_ptr<Runtime> runtime, std::shared_ptr<Backend> backend)
    : runtime_(std::move(runtime)), backend_(std::move(backend)) {}

milliseconds RenewalBatcher::meeting_delay(Clock::TimePoint now, milliseconds delay,
                                           milliseconds ttl) const {
  const milliseconds step = std::max(ttl / 8, milliseconds(1));
  const auto due = duration_cast<milliseconds>((now + delay).time_since_epoch());
  const milliseconds meeting = due - due % step;
  const milliseconds from_now = meeting - duration_cast<milliseconds>(now.time_since_epoch());
  return std::max(from_now, delay - delay / 4);
}

bool RenewalBatcher::submit(std::string mutex, std::string contender_id, milliseconds ttl,
                            milliseconds transition, Deadline deadline, Answer answer) {
  bool schedule = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(Entry{std::move(mutex), std::move(contender_id), ttl, transition, deadline,
                             std::move(answer)});
    schedule = !std::exchange(flush_due_, true);
  }
  if (!schedule) return true;
  // On the timer thread, which then hands the call to the I/O pool: the
  // renewals due at the same meeting point all fire before it.
  std::weak_ptr<RenewalBatcher> weak = weak_from_this();
  const bool scheduled = runtime_->schedule_at(runtime_->clock()->now() + kGather, [weak] {
    auto self = weak.lock();
    if (!self) return;
    if (!self->runtime_->post_io([self] { self->flush(); }, true)) self->drop_pending();
  }) != 0;
  if (!scheduled) drop_pending();
  return scheduled;
}

void RenewalBatcher::drop_pending() {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.clear();
  flush_due_ = false;
}

void RenewalBatcher::flush() {
  std::vector<Entry> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(pending_);
    flush_due_ = false;
  }
  // More than one call's worth (a meeting point of 10,000 owners): every
  // chunk after the first goes to the I/O pool now, so the calls overlap
  // where the store has connections for them and each chunk's answers are
  // applied while the next is out, instead of each chunk waiting for the
  // one before it to be answered.
  for (std::size_t first = kMaxBatch; first < batch.size(); first += kMaxBatch) {
    const auto end = static_cast<std::ptrdiff_t>(std::min(batch.size(), first + kMaxBatch));
    auto chunk = std::make_shared<std::vector<Entry>>(
        std::make_move_iterator(batch.begin() + static_cast<std::ptrdiff_t>(first)),
        std::make_move_iterator(batch.begin() + end));
    // A closed pool (the runtime shut down): nothing will send it.
    (void)runtime_->post_io([self = shared_from_this(), chunk] { self->send(*chunk); }, true);
  }
  if (batch.size() > kMaxBatch) {
    batch.erase(batch.begin() + static_cast<std::ptrdiff_t>(kMaxBatch), batch.end());
  }
  send(batch);
}

void RenewalBatcher::send(std::vector<Entry>& chunk) {
  std::vector<AcquireRequest> requests;
  requests.reserve(chunk.size());
  Deadline deadline = Deadline::max();
  for (const Entry& entry : chunk) {
    requests.push_back({entry.mutex, entry.contender_id, entry.ttl, entry.transition});
    deadline = std::min(deadline, entry.deadline);
  }
  const Clock::TimePoint sent = runtime_->clock()->now();
  Result<std::vector<OwnerRecord>> records = backend_->renew(requests, deadline);
  for (std::size_t i = 0; i < chunk.size(); ++i) {
    if (records.ok()) {
      chunk[i].answer(std::move((*records)[i]), sent);
    } else {
      chunk[i].answer(records.status(), sent);
    }
  }
}

}  // namespace simba::internal
