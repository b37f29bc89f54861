#include "backends/sqlite/sqlite_watcher.h"

#include <chrono>
#include <exception>
#include <system_error>
#include <utility>

#include "backends/sql/sql_backend.h"
#include "backends/sqlite/sqlite_errors.h"
#include "core/log.h"

namespace simba::internal::sql::sqlite {
namespace {

using std::chrono::milliseconds;

// How often the watcher asks PRAGMA data_version. A tick costs a few
// microseconds when nothing changed, so waiters learn of a release within
// ~15 ms (at once for releases made through this backend, which wake the
// watcher) instead of at their next poll, seconds later.
constexpr milliseconds kWatchTick{15};

// Changes whenever another connection (another process, or this backend's
// own calls, which use a different connection) has committed to the file
// since this connection last asked. In WAL mode it reads a counter from
// the shared-memory index: no write lock, no disk I/O.
constexpr char kDataVersionSql[] = "PRAGMA data_version";

// The watched names live in a table private to the watcher's connection
// (TEMP: never written to the file, never locked against other processes),
// so one join reads exactly the watched rows however many there are.
constexpr char kCreateWatchedSql[] =
    "CREATE TEMP TABLE IF NOT EXISTS simba_watched (mutex TEXT PRIMARY KEY)";
constexpr char kClearWatchedSql[] = "DELETE FROM temp.simba_watched";
constexpr char kInsertWatchedSql[] =
    "INSERT OR IGNORE INTO temp.simba_watched (mutex) VALUES (?1)";
// owner_id and version are NULL for a watched mutex without a row (never
// used): free, version 0; the forced version is NULL unless it was forced.
constexpr char kSelectWatchedSql[] =
    "SELECT w.mutex, m.owner_id, m.version, f.version FROM temp.simba_watched AS w"
    " LEFT JOIN main.simba_mutex AS m ON m.mutex = w.mutex"
    " LEFT JOIN main.simba_mutex_forced AS f ON f.mutex = w.mutex";

// The watcher's own connection: opened, used and closed on the watcher
// thread only. Every method returns an SQLite result code; none waits for a
// lock (no busy handler), because a busy file only means "ask again next
// tick".
class WatchConnection {
 public:
  explicit WatchConnection(std::string sqlite_path) : sqlite_path_(std::move(sqlite_path)) {}

  bool is_open() const { return db_ != nullptr; }

  int Open() {
    sqlite3* raw = nullptr;
    // READWRITE without CREATE: the backend created the file; if it has
    // gone, watching a new empty one would be wrong. (A read-only handle
    // would do for the reads, but WAL readers may need to write -shm.)
    const int rc = sqlite3_open_v2(sqlite_path_.c_str(), &raw,
                                   SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr);
    db_.reset(raw);  // owns the handle even when the open failed
    if (rc != SQLITE_OK) return FailAndClose(rc);
    sqlite3_extended_result_codes(db_.get(), 1);
    int step = sqlite3_exec(db_.get(), kCreateWatchedSql, nullptr, nullptr, nullptr);
    for (const auto& [sql, stmt] :
         {std::pair{kDataVersionSql, &data_version_}, std::pair{kClearWatchedSql, &clear_},
          std::pair{kInsertWatchedSql, &insert_}, std::pair{kSelectWatchedSql, &select_}}) {
      if (step != SQLITE_OK) break;
      sqlite3_stmt* prepared = nullptr;
      step = sqlite3_prepare_v3(db_.get(), sql, -1, SQLITE_PREPARE_PERSISTENT, &prepared,
                                nullptr);
      stmt->reset(prepared);
    }
    if (step != SQLITE_OK) return FailAndClose(step);
    return SQLITE_OK;
  }

  // Statements before the connection: a connection closes for good only
  // once they are finalized.
  void Close() {
    data_version_.reset();
    clear_.reset();
    insert_.reset();
    select_.reset();
    db_.reset();
  }

  // Makes temp.simba_watched hold exactly `names`, in one transaction on
  // the temp database (the file is not touched).
  int ReplaceWatched(const std::vector<std::string>& names) {
    int rc = sqlite3_exec(db_.get(), "BEGIN", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) {
      StmtUse use(clear_);
      rc = sqlite3_step(use.get());
      if (rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    for (const std::string& name : names) {
      if (rc != SQLITE_OK) break;
      StmtUse use(insert_);
      rc = use.BindText(1, name);
      if (rc == SQLITE_OK) rc = sqlite3_step(use.get());
      if (rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    if (rc == SQLITE_OK) rc = sqlite3_exec(db_.get(), "COMMIT", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) return SQLITE_OK;
    rc = Fail(rc);
    if (sqlite3_get_autocommit(db_.get()) == 0) {
      sqlite3_exec(db_.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    }
    return rc;
  }

  int DataVersion(std::int64_t* version) {
    StmtUse use(data_version_);
    const int rc = sqlite3_step(use.get());
    if (rc != SQLITE_ROW) return Fail(rc);
    *version = sqlite3_column_int64(use.get(), 0);
    return SQLITE_OK;
  }

  // The row state of every watched mutex. One statement, so one consistent
  // snapshot of the file.
  int ReadRows(std::vector<std::pair<std::string, Watcher::RowState>>* rows) {
    rows->clear();
    StmtUse use(select_);
    int rc = SQLITE_ROW;
    while ((rc = sqlite3_step(use.get())) == SQLITE_ROW) {
      const bool forced = sqlite3_column_type(use.get(), 3) != SQLITE_NULL;
      rows->emplace_back(use.ColumnText(0),
                         Watcher::RowState{use.ColumnText(1), sqlite3_column_int64(use.get(), 2),
                                           forced ? sqlite3_column_int64(use.get(), 3) : -1});
    }
    if (rc != SQLITE_DONE) return Fail(rc);
    return SQLITE_OK;
  }

  // What the last failing call reported, for the log.
  const SqliteFailure& failure() const { return failure_; }

 private:
  // Records the failure (before anything else replaces SQLite's message).
  int Fail(int rc) {
    message_ = db_ != nullptr ? sqlite3_errmsg(db_.get()) : sqlite3_errstr(rc);
    failure_ = SqliteFailure{rc, db_ != nullptr ? sqlite3_system_errno(db_.get()) : 0, message_};
    return rc;
  }
  // For a failed Open: is_open() must not report a half-made connection.
  int FailAndClose(int rc) {
    Fail(rc);
    Close();
    return rc;
  }

  const std::string sqlite_path_;
  std::string message_;  // failure_.sqlite_message points into it
  SqliteFailure failure_;
  // Declared before the statements so it is destroyed after them.
  DbPtr db_;
  StmtPtr data_version_, clear_, insert_, select_;
};

}  // namespace

std::string StmtUse::ColumnText(int column) const {
  const unsigned char* text = sqlite3_column_text(stmt_, column);
  if (text == nullptr) return std::string();
  return std::string(reinterpret_cast<const char*>(text),
                     static_cast<std::size_t>(sqlite3_column_bytes(stmt_, column)));
}

void Watcher::Start(OnEvent on_event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_ || worker_.running()) return;
  on_event_ = std::move(on_event);
  try {
    // The thread holds a reference, so the watcher outlives it even when
    // Shutdown is called on it (from on_event).
    worker_.start([self = shared_from_this()] { self->Run(); });
  } catch (const std::system_error& e) {
    SIMBA_LOG(kError, "sqlite " << Quoted(path_) << ": cannot start the push watcher thread: "
                                << e.what() << " (waiters fall back to polling)");
  }
}

void Watcher::Watch(const std::string& mutex, std::optional<RowState> seen) {
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
}

void Watcher::Unwatch(const std::string& mutex) {
  std::lock_guard<std::mutex> lock(mu_);
  if (watched_.erase(mutex) > 0) ++membership_;
}

void Watcher::Poke() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    poked_ = true;
  }
  wake_.notify_one();
}

void Watcher::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    stopping_.store(true);
  }
  wake_.notify_all();
  // From on_event (a listener dropped the backend) the thread sees
  // stopping_ once the call returns and ends on its own.
  worker_.join();
}

void Watcher::Run() {
  WatchConnection connection(sqlite_path_);
  // The data_version of the last successful look; when !have_seen, look at
  // the next tick whatever the version. (Not std::optional: GCC 12 warns
  // that it "may be used uninitialized".)
  bool have_seen = false;
  std::int64_t seen_version = 0;
  std::uint64_t synced_membership = 0;  // the membership_ temp.simba_watched holds
  bool failing = false;
  std::vector<std::pair<std::string, RowState>> rows;
  std::vector<MutexEvent> events;

  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (watched_.empty()) {
      // Nothing to watch: sleep until a subscription (no ticking, no I/O).
      wake_.wait(lock, [this] { return stopped_ || !watched_.empty(); });
    } else {
      wake_.wait_for(lock, kWatchTick, [this] { return stopped_ || poked_; });
    }
    if (stopped_) break;
    poked_ = false;
    const std::uint64_t membership = membership_;
    std::vector<std::string> names;
    if (membership != synced_membership) {
      names.reserve(watched_.size());
      for (const auto& entry : watched_) names.push_back(entry.first);
    }
    lock.unlock();

    // Outside mu_: SQLite may take a moment, and subscribers must not wait.
    int rc = connection.is_open() ? SQLITE_OK : connection.Open();
    if (rc == SQLITE_OK && membership != synced_membership) {
      rc = connection.ReplaceWatched(names);
      if (rc == SQLITE_OK) {
        synced_membership = membership;
        have_seen = false;  // new names: look at their rows now
      }
    }
    std::int64_t version = 0;
    bool looked = false;
    if (rc == SQLITE_OK) rc = connection.DataVersion(&version);
    if (rc == SQLITE_OK && (!have_seen || seen_version != version)) {
      // data_version was read first: a commit landing between the two reads
      // is in what we read now and changes the version again, so at worst
      // we look once more next tick; we never miss one.
      rc = connection.ReadRows(&rows);
      if (rc == SQLITE_OK) {
        have_seen = true;
        seen_version = version;
        looked = true;
      }
    }
    if (rc != SQLITE_OK) {
      // Once per run of failures: the watcher retries every tick, and the
      // log must not get a line each time.
      if (!failing) {
        SIMBA_LOG(kWarn, SqliteFailureToStatus(connection.failure(), false,
                                               "sqlite " + Quoted(path_) + ": push watcher")
                             << " (retrying every tick; waiters fall back to polling meanwhile)");
      }
      failing = true;
      have_seen = false;
      if (!IsBusy(rc)) {
        // Not mere contention (file moved, I/O error, ...): start afresh
        // next tick with a new connection, whose temp table is empty.
        connection.Close();
        synced_membership = 0;
      }
    } else if (failing) {
      failing = false;
      SIMBA_LOG(kInfo, "sqlite " << Quoted(path_) << ": push watcher recovered");
    }

    lock.lock();
    if (looked) ObserveLocked(rows, &events);
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
  connection.Close();
}

void Watcher::ObserveLocked(const std::vector<std::pair<std::string, RowState>>& rows,
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

}  // namespace simba::internal::sql::sqlite
