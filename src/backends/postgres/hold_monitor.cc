#include "backends/postgres/hold_monitor.h"

#include <poll.h>

#include <cerrno>
#include <chrono>
#include <utility>
#include <vector>

#include "core/log.h"

namespace simba::internal::pg {

namespace {

// Whether the session of an idle connection whose socket reported `revents`
// has ended. Reading here is safe: nobody else uses a watched connection.
bool SessionEnded(PGconn* conn, short revents) {
  if ((revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) != 0) return true;
  // Readable: the server's goodbye ("terminating connection due to
  // administrator command") or a harmless notice; libpq keeps either.
  return PQconsumeInput(conn) != 1 || PQstatus(conn) == CONNECTION_BAD;
}

}  // namespace

HoldMonitor::HoldMonitor() : state_(std::make_shared<State>()) {}

HoldMonitor::~HoldMonitor() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopping = true;
  }
  state_->wake.Post();
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // destroyed from an on_lost: the loop ends by itself
  } else {
    thread_.join();
  }
}

HoldMonitor::WatchId HoldMonitor::Watch(PGconn* conn, std::function<void()> on_lost) {
  WatchId id = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    id = state_->next_id++;
    state_->watched.emplace(id, Watched{conn, std::move(on_lost)});
    if (!thread_.joinable()) thread_ = std::thread(Run, state_);
  }
  state_->wake.Post();  // poll the new socket too
  return id;
}

bool HoldMonitor::Unwatch(WatchId id) {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->watched.erase(id) == 1;
}

void HoldMonitor::Run(const std::shared_ptr<State>& state) {
  std::vector<pollfd> fds;
  std::vector<WatchId> ids;
  for (;;) {
    // The poll set is rebuilt each time around: a socket unwatched while we
    // slept may wake us once more, and is then skipped by its id.
    fds.assign(1, pollfd{state->wake.fd(), POLLIN, 0});
    ids.assign(1, 0);
    {
      std::lock_guard<std::mutex> lock(state->mu);
      if (state->stopping) return;
      for (const auto& [id, watched] : state->watched) {
        fds.push_back(pollfd{PQsocket(watched.conn), POLLIN | POLLRDHUP, 0});
        ids.push_back(id);
      }
    }
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      SIMBA_LOG(kWarn, "postgresql: hold monitor: poll failed (errno " << errno << ")");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (fds[0].revents != 0) state->wake.Drain();
    std::vector<std::function<void()>> lost;
    {
      std::lock_guard<std::mutex> lock(state->mu);
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        auto it = state->watched.find(ids[i]);
        if (it == state->watched.end()) continue;
        if (!SessionEnded(it->second.conn, fds[i].revents)) continue;
        lost.push_back(std::move(it->second.on_lost));
        state->watched.erase(it);
      }
    }
    // Outside the lock: a callback may release or destroy holds.
    for (auto& on_lost : lost) {
      if (on_lost) on_lost();
    }
  }
}

}  // namespace simba::internal::pg
