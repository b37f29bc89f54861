#include "backends/postgres/keyed_connection_pool.h"

#include <poll.h>

#include <utility>

namespace simba::internal::pg {

namespace {

// An idle connection may have lost its session meanwhile (terminated, the
// server restarted): look without waiting. A server says nothing to an idle
// session but its goodbye ("terminating connection ...", whose end of
// stream may not be here yet), so anything to read disqualifies it; a rare
// notice only costs a new connection.
bool StillConnected(PGconn* conn) {
  if (PQstatus(conn) != CONNECTION_OK) return false;
  pollfd p{PQsocket(conn), POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 0;
}

}  // namespace

KeyedConnectionPool::Loan& KeyedConnectionPool::Loan::operator=(Loan&& other) noexcept {
  if (this != &other) {
    Return();
    pool_ = std::move(other.pool_);
    conn_ = std::move(other.conn_);
  }
  return *this;
}

void KeyedConnectionPool::Loan::Return() {
  if (pool_ && conn_) pool_->TakeBack(std::move(conn_));
  pool_.reset();
}

void KeyedConnectionPool::Loan::Discard() {
  if (pool_ && conn_) pool_->Forget(std::move(conn_));
  pool_.reset();
}

KeyedConnectionPool::KeyedConnectionPool(std::map<std::string, std::string> params,
                                         std::string description, int budget,
                                         std::chrono::milliseconds connect_timeout)
    : params_(std::move(params)),
      description_(std::move(description)),
      budget_(budget),
      connect_timeout_(connect_timeout) {}

Result<std::optional<KeyedConnectionPool::Loan>> KeyedConnectionPool::Borrow(
    Deadline wait_deadline, const std::stop_token& cancel, int wake_fd) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto ticket = line_.insert(line_.end(), next_ticket_++);
  auto leave_line = [&] {
    line_.erase(ticket);
    changed_.notify_all();  // the next in line may be able to go now
  };
  auto my_turn = [&] { return line_.front() == *ticket && (!idle_.empty() || open_ < budget_); };
  for (;;) {
    if (!my_turn()) {
      const bool ready = wait_deadline == Deadline::max()
                             ? changed_.wait(lock, cancel, my_turn)
                             : changed_.wait_until(lock, cancel, wait_deadline, my_turn);
      if (!ready) {
        leave_line();
        if (cancel.stop_requested()) {
          return CancelledError(description_ + ": cancelled while waiting for a connection");
        }
        return std::optional<Loan>();
      }
    }
    if (!idle_.empty()) {
      PgConn conn = std::move(idle_.back());
      idle_.pop_back();
      if (StillConnected(conn.get())) {
        leave_line();
        return std::optional<Loan>(Loan(shared_from_this(), std::move(conn)));
      }
      --open_;
      lock.unlock();
      conn.reset();  // PQfinish outside the lock
      lock.lock();
      continue;
    }
    ++open_;
    leave_line();
    break;
  }
  lock.unlock();
  auto conn =
      Connect(params_, description_, std::chrono::steady_clock::now() + connect_timeout_, wake_fd);
  if (!conn.ok()) {
    lock.lock();
    --open_;
    changed_.notify_all();
    return conn.status();
  }
  return std::optional<Loan>(Loan(shared_from_this(), std::move(*conn)));
}

int KeyedConnectionPool::open_connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

void KeyedConnectionPool::TakeBack(PgConn conn) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(std::move(conn));
  changed_.notify_all();
}

void KeyedConnectionPool::Forget(PgConn conn) {
  conn.reset();  // PQfinish outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  --open_;
  changed_.notify_all();
}

}  // namespace simba::internal::pg
