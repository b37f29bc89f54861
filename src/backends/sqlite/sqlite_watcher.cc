#include "backends/sqlite/sqlite_watcher.h"

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <system_error>
#include <utility>

#include "backends/sql/sql_backend.h"
#include "core/log.h"

namespace simba::internal::sql::sqlite {
namespace {

using std::chrono::milliseconds;

// After a reported write, the looks until the version moves: the first
// this long after the write, each next one twice as late, for this long
// in all (a commit's sync takes a fraction of a millisecond on a local
// disk; a loaded machine's scheduler more). Then the tick again.
constexpr std::chrono::microseconds kFirstRecheck{250};
constexpr std::chrono::microseconds kRecheckSpan{128000};

// Changes whenever another connection (another process, or this backend's
// own calls, which use a different connection) has committed to the file
// since this connection last asked. In WAL mode it reads a counter from
// the shared-memory index: no write lock, no disk I/O.
constexpr char kDataVersionSql[] = "PRAGMA data_version";

constexpr char kClearWatchedSql[] = "DELETE FROM temp.simba_watched";
constexpr char kInsertWatchedSql[] =
    "INSERT OR IGNORE INTO temp.simba_watched (mutex) VALUES ({0})";
// A watched mutex without a row (never used) is free at version 0; the
// forced version is -1 unless it was forced; the backed version (with the
// lock that backs it) -1 unless a kernel lock was recorded.
constexpr char kSelectWatchedSql[] =
    "SELECT w.mutex, COALESCE(m.owner_id, ''), COALESCE(m.version, 0), COALESCE(f.version, -1),"
    " COALESCE(h.version, -1), COALESCE(h.lock_id, '')"
    " FROM temp.simba_watched AS w"
    " LEFT JOIN main.simba_mutex AS m ON m.mutex = w.mutex"
    " LEFT JOIN main.simba_mutex_forced AS f ON f.mutex = w.mutex"
    " LEFT JOIN main.simba_mutex_host AS h ON h.mutex = w.mutex";

// Time spent probing kernel locks per look, at most; a round that stops
// short goes on from there at the next look. A probe is one fcntl, which
// walks the kernel's list of the lock file's locks: ~1 µs with a few held,
// ~150 µs with 10,000 held on this host (measured). 2 ms per 15 ms tick
// bounds the watcher's share of a core when many are held.
constexpr std::chrono::microseconds kProbeBudgetPerLook{2000};

// A bound on one look (the connection never waits for a lock, so a look
// takes microseconds).
constexpr milliseconds kLookBound{1000};

// Writes to the database file and its write-ahead log, as the kernel
// reports them (inotify on their directory, whose events name the file:
// the WAL is deleted and made again as connections come and go, which a
// watch on the file itself would not survive). Not ok() where inotify
// cannot be had; the tick alone then tells of changes.
class FileWrites {
 public:
  explicit FileWrites(const std::string& path) {
    std::error_code error;
    const std::filesystem::path file = std::filesystem::absolute(path, error);
    if (error || !file.has_filename()) {
      why_not_ = "no file name in the path";
      return;
    }
    name_ = file.filename().string();
    wal_ = name_ + "-wal";
    fd_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd_ < 0) {
      why_not_ = "inotify_init1: " + std::system_category().message(errno);
      return;
    }
    if (inotify_add_watch(fd_, file.parent_path().c_str(), IN_MODIFY | IN_CREATE | IN_MOVED_TO) <
        0) {
      why_not_ = "inotify_add_watch " + in_quotes(file.parent_path().string()) + ": " +
                 std::system_category().message(errno);
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~FileWrites() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileWrites(const FileWrites&) = delete;
  FileWrites& operator=(const FileWrites&) = delete;

  bool ok() const { return fd_ >= 0; }
  // Why not ok().
  const std::string& why_not() const { return why_not_; }

  enum class Woken {
    kWritten,   // the file or its WAL was written
    kOther,     // only other files of the directory were
    kPosted,    // the wake fd (drained)
    kTimedOut,  // neither, within the timeout
  };

  // Waits up to `timeout` for a write or for `wake_fd`.
  Woken wait(const WakeFd& wake_fd, std::chrono::microseconds timeout) {
    std::array<pollfd, 2> fds{pollfd{fd_, POLLIN, 0}, pollfd{wake_fd.fd(), POLLIN, 0}};
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout);
    const timespec limit{static_cast<time_t>(seconds.count()),
                         static_cast<long>((timeout - seconds).count() * 1000)};
    if (::ppoll(fds.data(), fds.size(), &limit, nullptr) <= 0) return Woken::kTimedOut;
    const bool posted = (fds[1].revents & POLLIN) != 0;
    if (posted) wake_fd.drain();
    if ((fds[0].revents & POLLIN) != 0 && written()) return Woken::kWritten;
    return posted ? Woken::kPosted : Woken::kOther;
  }

 private:
  // Reads every queued event; whether one names our files.
  bool written() {
    bool ours = false;
    alignas(inotify_event) std::array<char, 4096> buffer;
    while (true) {
      const ssize_t n = ::read(fd_, buffer.data(), buffer.size());
      if (n <= 0) return ours;
      for (ssize_t at = 0; at + static_cast<ssize_t>(sizeof(inotify_event)) <= n;) {
        inotify_event event;
        std::memcpy(&event, buffer.data() + at, sizeof(event));
        const char* name = buffer.data() + at + sizeof(inotify_event);
        // A lost event (the queue overflowed) may have been ours.
        if ((event.mask & IN_Q_OVERFLOW) != 0 ||
            (event.len > 0 && (name_ == name || wal_ == name))) {
          ours = true;
        }
        at += static_cast<ssize_t>(sizeof(inotify_event) + event.len);
      }
    }
  }

  int fd_ = -1;
  std::string name_;
  std::string wal_;
  std::string why_not_;
};

std::int64_t to_int(const std::string& text) {
  std::int64_t value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value);
  return value;
}

}  // namespace

void Watcher::start(OnEvent on_event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_ || worker_.running()) return;
  on_event_ = std::move(on_event);
  try {
    // The thread holds a reference, so the watcher outlives it even when
    // Shutdown is called on it (from on_event).
    worker_.start("sqlite-watch", [self = shared_from_this()] { self->run(); });
  } catch (const std::system_error& e) {
    SIMBA_LOG(kError, "sqlite " << in_quotes(path_) << ": cannot start the push watcher thread: "
                                << e.what() << " (waiters fall back to polling)");
  }
}

void Watcher::watch(const std::string& mutex, std::optional<RowState> seen) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, inserted] = watched_.try_emplace(mutex);
    if (inserted) ++membership_;
    std::optional<RowState>& known = it->second;
    // Adopt the caller's reading when nothing is known yet, or when it shows
    // a newer holder. Never a newer *free* row over an older one: that would
    // hide a release the other subscribers have not been told of yet. (A
    // newer holder hides nothing worth telling: the mutex is taken again.)
    if (seen.has_value() &&
        (!known.has_value() || (seen->version > known->version && !seen->owner.empty()))) {
      known = std::move(seen);
    }
  }
  wake_.notify_one();
  wake_fd_.post();
}

void Watcher::unwatch(const std::string& mutex) {
  std::lock_guard<std::mutex> lock(mu_);
  if (watched_.erase(mutex) > 0) ++membership_;
  suspected_gone_.erase(mutex);
  told_gone_.erase(mutex);
}

void Watcher::probe_with(std::shared_ptr<HostLocks> host_locks) {
  std::lock_guard<std::mutex> lock(mu_);
  host_locks_ = std::move(host_locks);
}

void Watcher::poke() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    poked_ = true;
  }
  wake_.notify_one();
  wake_fd_.post();
}

void Watcher::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    stopping_.store(true);
  }
  wake_.notify_all();
  wake_fd_.post();
  // From on_event (a listener dropped the backend) the thread sees
  // stopping_ once the call returns and ends on its own.
  worker_.join();
}

void Watcher::run() {
  std::unique_ptr<SqlSession> connection;
  // The data_version of the last successful look; when !have_seen, look at
  // the next tick whatever the version. (Not std::optional: GCC 12 warns
  // that it "may be used uninitialized".)
  bool have_seen = false;
  std::int64_t seen_version = 0;
  std::uint64_t synced_membership = 0;  // the membership_ temp.simba_watched holds
  bool failing = false;
  std::vector<std::pair<std::string, RowState>> rows;
  std::vector<MutexEvent> events;

  // Made with the first subscription: a backend nobody subscribes to
  // watches no file.
  std::unique_ptr<FileWrites> writes;
  // After a reported write: when to look again if the version has not
  // moved yet (zero: no write pending), and how much of the span is left.
  std::chrono::microseconds recheck{0};
  std::chrono::microseconds recheck_left{0};

  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (watched_.empty()) {
      // Nothing to watch: sleep until a subscription (no ticking, no I/O).
      wake_.wait(lock, [this] { return stopped_ || !watched_.empty(); });
    } else {
      if (writes == nullptr) {
        writes = std::make_unique<FileWrites>(path_);
        if (!writes->ok() || !wake_fd_.ok()) {
          // Once per watcher: pushes still come, at the tick.
          SIMBA_LOG(kInfo, "sqlite "
                               << in_quotes(path_) << ": writes to the file are not reported ("
                               << (wake_fd_.ok() ? writes->why_not() : "no eventfd")
                               << "): releases by other processes are seen at the " << tick_.count()
                               << " ms tick");
        }
      }
      if (!writes->ok() || !wake_fd_.ok()) {
        wake_.wait_for(lock, tick_, [this] { return stopped_ || poked_; });
      } else if (!stopped_ && !poked_) {
        const std::chrono::microseconds timeout = recheck.count() > 0 ? recheck : tick_;
        const auto until = std::chrono::steady_clock::now() + timeout;
        lock.unlock();
        FileWrites::Woken woken = FileWrites::Woken::kTimedOut;
        // Writes to other files of the directory (a busy directory, logs
        // beside the database) are not worth a look: wait on for ours.
        do {
          const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
              until - std::chrono::steady_clock::now());
          woken = left.count() > 0 ? writes->wait(wake_fd_, left) : FileWrites::Woken::kTimedOut;
        } while (woken == FileWrites::Woken::kOther);
        lock.lock();
        if (woken == FileWrites::Woken::kWritten) {
          recheck = kFirstRecheck;
          recheck_left = kRecheckSpan;
        } else if (woken == FileWrites::Woken::kTimedOut && recheck.count() > 0) {
          recheck_left -= recheck;
          recheck = recheck_left.count() > 0 ? std::min(recheck * 2, recheck_left)
                                             : std::chrono::microseconds(0);
        }
      }
    }
    if (stopped_) break;
    poked_ = false;
    const std::uint64_t membership = membership_;
    std::vector<Statement> replace;
    if (membership != synced_membership) {
      // Makes temp.simba_watched hold exactly the watched names, in one
      // transaction on the temp database (the file is not touched).
      replace.push_back({kClearWatchedSql, {}});
      for (const auto& entry : watched_) replace.push_back({kInsertWatchedSql, {entry.first}});
    }
    lock.unlock();

    // Outside mu_: SQLite may take a moment, and subscribers must not wait.
    const Deadline deadline = std::chrono::steady_clock::now() + kLookBound;
    Status status;
    if (!connection) {
      Result<std::unique_ptr<SqlSession>> opened = open_();
      status = opened.status();
      if (opened.ok()) connection = std::move(*opened);
    }
    if (status.ok() && membership != synced_membership) {
      status = connection->run(replace, false, deadline).status();
      if (status.ok()) {
        synced_membership = membership;
        have_seen = false;  // new names: look at their rows now
      }
    }
    std::int64_t version = 0;
    bool looked = false;
    if (status.ok()) {
      auto read = connection->run({{kDataVersionSql, {}}}, false, deadline);
      status = read.status();
      if (read.ok()) version = to_int(read->at(0).rows.at(0).at(0));
    }
    if (status.ok() && (!have_seen || seen_version != version)) {
      // data_version was read first: a commit landing between the two reads
      // is in what we read now and changes the version again, so at worst
      // we look once more next tick; we never miss one. One statement, so
      // one consistent snapshot of the file.
      auto read = connection->run({{kSelectWatchedSql, {}}}, false, deadline);
      status = read.status();
      if (read.ok()) {
        rows.clear();
        for (const SqlRow& row : read->at(0).rows) {
          // Backed by the lock this watcher would probe, or by none it can.
          const bool ours = host_locks_ && row.at(5) == host_locks_->lock_id(row.at(0));
          rows.emplace_back(row.at(0), RowState{row.at(1), to_int(row.at(2)), to_int(row.at(3)),
                                                ours ? to_int(row.at(4)) : -1});
        }
        // A write that woke us is published once the version moves: back
        // to waiting for the next.
        if (have_seen) recheck = std::chrono::microseconds(0);
        have_seen = true;
        seen_version = version;
        looked = true;
      }
    }
    if (!status.ok()) {
      // Once per run of failures: the watcher retries every tick, and the
      // log must not get a line each time.
      if (!failing) {
        SIMBA_LOG(kWarn, status.with_context("sqlite " + in_quotes(path_) + ": push watcher")
                             << " (retrying every tick; waiters fall back to polling meanwhile)");
      }
      failing = true;
      have_seen = false;
      // Start afresh next tick with a new connection, whose temp table is
      // empty (the file may have moved, or hit an I/O error).
      connection.reset();
      synced_membership = 0;
    } else if (failing) {
      failing = false;
      SIMBA_LOG(kInfo, "sqlite " << in_quotes(path_) << ": push watcher recovered");
    }

    lock.lock();
    if (looked) observe_locked(rows, &events);
    if (host_locks_ && status.ok() && probe_locked(&events)) {
      have_seen = false;  // look again now, whatever data_version says
      poked_ = true;
    }
    if (!events.empty()) {
      lock.unlock();
      for (const MutexEvent& event : events) {
        // The backend was destroyed (possibly from the previous call).
        if (stopping_.load()) break;
        on_event_(event);
      }
      events.clear();
      lock.lock();
    }
  }
  lock.unlock();
  connection.reset();
}

void Watcher::observe_locked(const std::vector<std::pair<std::string, RowState>>& rows,
                             std::vector<MutexEvent>* events) {
  for (const auto& [mutex, row] : rows) {
    auto it = watched_.find(mutex);
    if (it == watched_.end()) continue;  // unwatched meanwhile
    std::optional<RowState>& known = it->second;
    if (!known.has_value()) {
      // The first reading is the baseline, not news.
      known = row;
      continue;
    }
    // Versions only grow; an older reading (a Watch's was newer) says
    // nothing new.
    if (row.version < known->version) continue;
    // Free now and changed since last seen: released (or force-released)
    // since. A row held now, by anyone, is not news to a waiter: nobody can
    // take it until it is released, which a later look will catch.
    const RowState& seen = *known;
    // A free row at the version a force left was freed by that force.
    const bool forced =
        row.owner.empty() && row.version != seen.version && row.forced_version == row.version;
    // The holder last seen holds it no more, and not by its own release: it
    // was forced out, or its lease ran out and another took the mutex. Its
    // own release never reaches it here (a service ends its subscription
    // before it releases), so a subscriber with its id hears of a hold that
    // ended without it, at once rather than at its next renewal. (Everyone
    // else ignores a loss naming another id.)
    const bool holder_gone =
        !seen.owner.empty() && row.owner != seen.owner && (forced || !row.owner.empty());
    // Forced out of a hold this watcher never saw (taken and forced between
    // two looks: the version moved more than the force's one step): the row
    // is free, so whoever believes it owns the mutex is wrong; the loss
    // names nobody, which matches every owner. (One that acquired after
    // this look is told too, and simply contends again.) A force of a mutex
    // that was free all along tells nobody.
    const bool unseen_hold_forced = seen.owner.empty() && forced && row.version > seen.version + 1;
    if (holder_gone || unseen_hold_forced) {
      MutexEvent lost{MutexEvent::Kind::kLost, mutex, seen.owner};
      // A holder's token is the version its acquisition left (renewals
      // keep it).
      lost.fencing_token = static_cast<std::uint64_t>(seen.owner.empty() ? 0 : seen.version);
      lost.forced = forced;
      events->push_back(std::move(lost));
    }
    if (row.owner.empty() && row.version != seen.version) {
      // The holder the watcher last saw; '' if it never saw one (the whole
      // hold fell between two looks).
      events->push_back(MutexEvent{MutexEvent::Kind::kReleased, mutex, seen.owner});
    }
    known = row;
  }
}

bool Watcher::probe_locked(std::vector<MutexEvent>* events) {
  // A holder's death writes nothing to the file: no look would see it. So
  // every look also probes the kernel lock of each watched row whose tenure
  // is recorded as backed by one, a bounded number per look.
  bool look_again = false;
  const auto until = std::chrono::steady_clock::now() + kProbeBudgetPerLook;
  auto it = watched_.lower_bound(probe_from_);
  for (std::size_t visited = 0; visited < watched_.size(); ++visited, ++it) {
    if (it == watched_.end()) it = watched_.begin();
    const std::string& mutex = it->first;
    const std::optional<RowState>& known = it->second;
    if (!known.has_value() || known->owner.empty() || known->backed_version != known->version) {
      continue;
    }
    auto told = told_gone_.find(mutex);
    if (told != told_gone_.end() && told->second == known->version) continue;
    if (std::chrono::steady_clock::now() >= until) {
      probe_from_ = mutex;
      return look_again;
    }
    if (!host_locks_->unheld(mutex)) {
      suspected_gone_.erase(mutex);
      continue;
    }
    auto suspected = suspected_gone_.find(mutex);
    if (suspected == suspected_gone_.end() || suspected->second != known->version) {
      suspected_gone_[mutex] = known->version;
      look_again = true;
      continue;
    }
    // Free, and a look after it was found free still saw this tenure: its
    // holder is gone. Released, as far as a waiter is concerned: its next
    // attempt takes the kernel lock, which proves it, and takes the row.
    suspected_gone_.erase(suspected);
    told_gone_[mutex] = known->version;
    SIMBA_LOG(kDebug, "sqlite " << in_quotes(path_) << ": mutex " << in_quotes(mutex)
                                << ": the kernel lock of tenure " << known->version << " ("
                                << in_quotes(known->owner) << ") is free: its holder is gone");
    events->push_back(MutexEvent{MutexEvent::Kind::kReleased, mutex, known->owner});
  }
  probe_from_.clear();
  return look_again;
}

}  // namespace simba::internal::sql::sqlite
