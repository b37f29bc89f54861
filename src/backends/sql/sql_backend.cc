#include "backends/sql/sql_backend.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "backends/sql/wait_line.h"
#include "core/listener_hub.h"
#include "core/log.h"
#include "simba/uri.h"

namespace simba::internal::sql {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// How long subscribe() may wait for a connection to read the row a
// row-watching listener starts from (see SqlBackend::do_subscribe).
constexpr milliseconds kSubscribeReadBound{1000};

constexpr char kColumns[] = "acquired_at, ttl_at, transition_at, owner_id, version";

long long to_int(const std::string& text) {
  long long value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value);
  return value;
}

}  // namespace

std::string AcquireParts::insert_acquired(std::string_view alias) const {
  std::string sql = "INSERT INTO simba_mutex";
  if (!alias.empty()) sql += " AS " + std::string(alias);
  return sql + " (mutex, " + kColumns + ") VALUES ({0}, " + now + ", " + now + " + {#2}, " + now +
         " + {#2} + {#3}, {1}, 1)";
}

std::string AcquireParts::insert_acquired_if_free(std::string_view alias) const {
  std::string sql = "INSERT INTO simba_mutex";
  if (!alias.empty()) sql += " AS " + std::string(alias);
  // In the subquery the bare column names are its own row's. The casts: a
  // parameter in a select list has no type of its own to match the one it
  // gets in the subquery's comparison.
  return sql + " (mutex, " + kColumns + ") SELECT CAST({0} AS varchar), " + now + ", " + now +
         " + {#2}, " + now +
         " + {#2} + {#3}, CAST({1} AS varchar), 1 WHERE NOT EXISTS (SELECT 1 FROM simba_mutex "
         "WHERE mutex = {0} "
         "AND NOT " +
         may_acquire + ")";
}

Statement AcquireParts::read_back(const std::string& mutex) const {
  return {"SELECT " + returning + " FROM simba_mutex WHERE mutex = {0}", {mutex}};
}

std::string SqlDriver::insert_free_row_sql() const {
  return std::string(kInsertFreeRow) + " ON CONFLICT (mutex) DO NOTHING";
}

std::vector<Statement> SqlDriver::acquire_statements(const AcquireParts& parts,
                                                     const std::vector<std::string>& params) const {
  const std::string alias = existing_row_alias();
  // `expression` with each column (a whole word, not already qualified)
  // prefixed by "<alias>.".
  auto existing = [&](const std::string& expression) {
    if (alias.empty()) return expression;
    auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
    std::string out = expression;
    for (const std::string name :
         {"version", "acquired_at", "ttl_at", "transition_at", "owner_id"}) {
      for (std::size_t at = out.find(name); at != std::string::npos; at = out.find(name, at)) {
        const std::size_t end = at + name.size();
        if ((at == 0 || !(word(out[at - 1]) || out[at - 1] == '.')) &&
            (end >= out.size() || !word(out[end]))) {
          out.insert(at, alias + ".");
          at += alias.size() + 1;
        }
        at += name.size();
      }
    }
    return out;
  };
  std::optional<Statement> gate =
      parts.lined ? std::optional<Statement>() : acquire_gate(params[0]);
  std::string upsert =
      (gate || parts.lined ? parts.insert_acquired_if_free(alias) : parts.insert_acquired(alias)) +
      " ON CONFLICT (mutex) DO UPDATE SET ";
  for (std::size_t i = 0; i < parts.assignments.size(); ++i) {
    if (i > 0) upsert += ", ";
    upsert += parts.assignments[i].first + " = " + existing(parts.assignments[i].second);
  }
  upsert += " WHERE " + existing(parts.may_acquire);
  if (gate) return {std::move(*gate), {upsert, params}, parts.read_back(params[0])};
  return {{upsert, params}, parts.read_back(params[0])};
}

namespace {

// A row of acquired_at, ttl_at, transition_at, owner_id, version, now as an
// owner record. A released or expired lease (transition_at < now) is free:
// exactly what the next acquisition may take.
Result<OwnerRecord> to_record(const SqlRow& row, std::size_t first = 0) {
  if (row.size() < first + 6) return internal_error("unexpected row shape");
  OwnerRecord record;
  record.store_now = StoreTime(to_int(row[first + 5]));
  const StoreTime transition_at(to_int(row[first + 2]));
  if (row[first + 3].empty() || transition_at < record.store_now) return record;
  record.owner.owner_id = row[first + 3];
  record.owner.acquired_at = StoreTime(to_int(row[first + 0]));
  record.owner.ttl_at = StoreTime(to_int(row[first + 1]));
  record.owner.transition_at = transition_at;
  record.owner.fencing_token = static_cast<std::uint64_t>(to_int(row[first + 4]));
  return record;
}

class SqlBackend final : public Backend, public std::enable_shared_from_this<SqlBackend> {
 public:
  SqlBackend(std::unique_ptr<SqlDriver> driver, SqlBackendOptions options)
      : driver_(std::move(driver)),
        options_(options),
        // Sessions shared by all calls, connected lazily, replaced when
        // broken; a failed connect paces the next ones.
        pool_(std::make_shared<SessionPool<SqlSession>>(
            [driver = driver_.get()](Deadline deadline, int) { return driver->connect(deadline); },
            driver_->description(), options.connections, /*backoff=*/true)) {
    capabilities_.cross_process = true;
    capabilities_.fencing_source = "simba_mutex.version at acquisition";
    capabilities_.max_mutex_length = options.max_mutex_length;
    capabilities_.max_contender_id_length = options.max_contender_id_length;
    capabilities_.push_release = driver_->pushes();
    capabilities_.transport = driver_->transport();
    capabilities_.failover = options.failover;
    capabilities_.ends_with_session = options.ends_with_session;
    capabilities_.batch_renewals = driver_->batches_renewals();
    if (options.line_sessions > 0 && driver_->line_lock("")) {
      line_ = make_line(options.line_sessions);
      // Where releases are not announced, the line is the push: the next
      // in line is woken by the release of a holder that keeps the line lock.
      capabilities_.push_release = true;
      // A holder's death is seen through its line session (WaitLine::Hooks::
      // grace): for the mutexes it holds with a place in line.
      if (line_->backs_tenures()) capabilities_.ends_with_session = true;
    }
  }

  ~SqlBackend() override {
    // Its threads first: they call back into this backend (which reads
    // line_, so the pointer stays until the listener is gone too).
    if (line_) line_->stop();
    std::unique_ptr<SqlDriver::Listener> listener;
    {
      std::lock_guard<std::mutex> lock(mu_);
      listener = std::move(listener_);
    }
    listener.reset();
  }

  std::string_view scheme() const override { return driver_->scheme(); }
  const Capabilities& capabilities() const override { return capabilities_; }

  Result<OwnerRecord> do_acquire_or_renew(const AcquireRequest& request,
                                          Deadline deadline) override {
    const std::string now = driver_->now_ms();
    AcquireParts parts;
    parts.now = now;
    // Take the row when its hard lease is over; renew it when we own it and
    // it is not (>=: JVM Simba's `>` left a 1 ms gap where nobody could).
    const std::string mutex(request.mutex);
    if (line_) {
      if (std::optional<OwnerRecord> taken = take_prefetched(mutex, request.contender_id)) {
        forget_handed_on(mutex);
        return *taken;
      }
    }
    const std::optional<SqlDriver::LineLock> line =
        line_ ? driver_->line_lock(mutex, line_->ended_session(mutex))
              : std::optional<SqlDriver::LineLock>();
    parts.may_acquire =
        "(transition_at < " + now + " OR (owner_id = {1} AND transition_at >= " + now + "))";
    if (line) {
      // A free row still reserved for the first in line (acquired_at: the
      // reserve's end) is taken only with the line lock.
      parts.lined = true;
      parts.may_acquire = "((transition_at < " + now + " AND (owner_id <> '' OR acquired_at < " +
                          now + " OR " + line->try_sql +
                          ")) OR (owner_id = {1} AND transition_at >= " + now + "))";
    }
    parts.assignments = {
        // First, while owner_id and transition_at still hold the old values:
        // a renewal keeps the version (the fencing token).
        {"version", "CASE WHEN owner_id = {1} AND transition_at >= " + now +
                        " THEN version ELSE version + 1 END"},
        // {#i}: a number, which a driver that renders literals leaves unquoted.
        // Never earlier than the lease already written: `now` is when the
        // statement began, and one that waited on the row lock (behind a
        // commit held for a synchronous standby, say) may run after a later
        // renewal of the same owner. Writing its older `now + ttl` moved that
        // owner's lease back into the past, where a contender took it while
        // the owner still counted on the later renewal: two owners, which
        // the postgres-standby fault runs caught (docs/reliability.md). A
        // new acquisition finds the old lease over, so it gets now + ttl.
        {"ttl_at", "CASE WHEN ttl_at > " + now + " + {#2} THEN ttl_at ELSE " + now + " + {#2} END"},
        // Where assignments run left to right (MySQL), each later IF reads
        // the columns assigned before it: owner_id, then acquired_at, then
        // transition_at keep a true `may_acquire` true (the owner is not
        // empty once assigned, so a lined row's reserve no longer matters;
        // then it is ours and in its lease). acquired_at before owner_id
        // made a lined attempt read its own `now` as a reserve, refuse the
        // rest whenever another session held the line lock, and leave the
        // row free with a new version: a free mutex refused.
        {"owner_id", "{1}"},
        {"acquired_at", now},
        {"transition_at", "CASE WHEN transition_at > " + now +
                              " + {#2} + {#3} THEN transition_at ELSE " + now +
                              " + {#2} + {#3} END"},
    };
    parts.returning = std::string(kColumns) + ", " + now;
    std::vector<std::string> params = {mutex, std::string(request.contender_id),
                                       std::to_string(request.ttl.count()),
                                       std::to_string(request.transition.count())};
    if (line) params.insert(params.end(), line->key.begin(), line->key.end());
    const std::optional<SqlDriver::HostHold> hold =
        driver_->begin_acquire(mutex, params[1], params.size());
    if (hold) {
      params.push_back(hold->param);
      if (!hold->takeover.empty()) {
        parts.may_acquire = "(" + parts.may_acquire + " OR " + hold->takeover + ")";
      }
    }
    const std::string what = "acquiring mutex " + in_quotes(request.mutex);
    // First in line, this process asks on the session that holds the line
    // lock, for which a reserved row is free.
    std::optional<WaitLine::Loan> first =
        line ? line_->first_session(mutex, deadline) : std::optional<WaitLine::Loan>();
    // The same attempt goes with this process's wait in line, where the
    // driver lets it (built again: only a waiter needs it).
    const auto attempt_in_line = [&] {
      std::vector<Statement> attempt;
      if (line->attempt_with_wait) {
        attempt = driver_->acquire_statements(parts, params);
        for (Statement& statement : attempt) statement.sql = on_table(statement.sql);
      }
      return attempt;
    };
    if (line && !first && !hold) {
      if (std::optional<OwnerRecord> reserved = take_handed_on(mutex)) {
        // A release of ours has just handed the row to the process queued
        // in line, for which it is reserved: a try would only find it
        // taken, and lock the row beside that process's attempt. Into the
        // line at once (a try that will not wait: nowhere).
        if (!request.once) {
          line_->waiting(mutex, std::string(request.contender_id), attempt_in_line());
        }
        return *reserved;
      }
    }
    // The side table not found yet (its creation raced another process's,
    // or a DBA has created it since): looked for again now and then.
    if (first && line_->backs_tenures() && !marks_ready_.load()) {
      bool look = false;
      {
        const auto at = steady_clock::now();
        std::lock_guard<std::mutex> lock(prefetch_mu_);
        look = at >= next_marks_look_;
        if (look) next_marks_look_ = at + kMarksLookEvery;
      }
      if (look) prepare_marks(first->session(), deadline);
    }
    // Session-backed tenures: first in line, read which tenure of the mutex
    // a session backs; first long enough (WaitLine::takeover_after), take
    // over a backed tenure whose session has ended: this process was
    // granted the line lock that session held. (Not while this process's
    // own session backs a tenure: that session lives.)
    const bool backed =
        first && line_->backs_tenures() && marks_ready_.load() && first->backed_token() == 0;
    const steady_clock::time_point first_since =
        first ? first->first_since() : steady_clock::time_point{};
    std::vector<Statement> statements = driver_->acquire_statements(parts, params);
    if (backed && steady_clock::now() >= first_since + line_->takeover_after()) {
      // Ends the backed tenure's lease first, in the same transaction, so
      // the upsert takes the row as after any lease (one statement for
      // every dialect: MySQL's left-to-right assignments would see the
      // version they had just bumped). Never in the attempt sent with a
      // later wait, which runs at a grant.
      statements.insert(statements.begin(),
                        {"UPDATE simba_mutex SET ttl_at = 0, transition_at = 0 WHERE mutex = {0} "
                         "AND owner_id <> '' AND owner_id <> {1} AND version = (SELECT s.version "
                         "FROM simba_mutex_session AS s WHERE s.mutex = {0})",
                         {mutex, params[1]}});
    }
    if (hold) {
      for (const Statement& statement : hold->record) {
        statements.insert(statements.end() - 1, {statement.sql, params});
      }
    }
    // Its result comes right before the read-back's.
    if (backed) {
      statements.insert(statements.end() - 1,
                        {"SELECT version FROM simba_mutex_session WHERE mutex = {0}", {mutex}});
    }
    Result<std::vector<SqlResult>> ran =
        first ? run_on_table(first->session(), std::move(statements), true, deadline, what)
              : run_on_table(std::move(statements), true, deadline, what);
    const bool first_asked = first.has_value();
    first.reset();
    Result<OwnerRecord> decided =
        internal_error(driver_->description() + ": " + what + ": the row was not returned");
    if (!ran.ok()) {
      decided = ran.status();
    } else if (!ran->empty() && ran->back().rows.size() == 1) {
      decided = to_record(ran->back().rows.front());
    }
    if (hold && hold->end) {
      hold->end(decided.ok() ? std::optional<std::string>(decided->owner.owner_id) : std::nullopt);
    }
    if (!decided.ok()) return decided.status();
    const SqlRow& row = ran->back().rows.front();
    OwnerRecord record = *decided;
    if (line) {
      const std::string contender(request.contender_id);
      if (record.owner.is_owner(contender)) {
        line_->holding(mutex, contender, first_asked);
        record.bound = line_->bound_for(mutex, contender, record.owner.fencing_token);
        // Held: a renewal must never be answered by a hand-off of before.
        forget_handed_on(mutex);
        // A hold the line's attempt kept for this contender is this tenure
        // (our renewal kept its version) or an older one: the contender
        // knows what it holds, and a later leave of the same contender id
        // (a service stopped before this one started, its request late)
        // must not give that back, which ended this live hold in CI. Dropped
        // after holding(): an attempt whose reply comes later is superseded.
        drop_prefetched(mutex, contender);
      } else {
        // Into the line, unless the contender will not wait: a place for a
        // try would be given up as soon as taken (on MySQL, by closing its
        // session), the server's queue stirred for nothing.
        if (!request.once) line_->waiting(mutex, contender, attempt_in_line());
        // Another process's tenure that its session backs: from
        // takeover_after past this process's grant it may be taken over
        // (the session that backed it ended before that grant).
        if (backed && ran->size() >= 2 && record.owner.has_owner_id()) {
          const SqlResult& marked = (*ran)[ran->size() - 2];
          if (marked.rows.size() == 1 && !marked.rows[0].empty() &&
              static_cast<std::uint64_t>(to_int(marked.rows[0][0])) == record.owner.fencing_token) {
            line_->look_at(mutex, first_since + line_->takeover_after());
          } else if (!record.owner_times_unknown()) {
            // Not backed (yet): its holder's place may wait behind ours.
            line_->unbacked(mutex, record.owner.fencing_token);
          }
        }
        // Free but reserved: ask again when the reserve ends, unless the
        // line or a release says so first.
        const StoreTime reserved_until(to_int(row[0]));
        if (!record.owner.has_owner_id() && row[3].empty() && reserved_until >= record.store_now) {
          record.ask_again_at = reserved_until;
        }
      }
    }
    return record;
  }

  Result<bool> do_release(std::string_view mutex, std::string_view contender_id,
                          std::uint64_t fencing_token, Deadline deadline) override {
    const std::string what = "releasing mutex " + in_quotes(mutex);
    // The token is the version the acquisition left (our renewals keep it),
    // so a late release of an older ownership matches no row.
    const std::string m(mutex);
    // A holder that took the mutex first in line releases on that session
    // and frees the line lock in the same round trip: the server wakes the
    // next process in line. (Freed before the commit, the next one's
    // upsert waits for the row's lock, then finds it free and reserved.)
    std::optional<WaitLine::Loan> first =
        line_ ? line_->first_session(m, deadline) : std::optional<WaitLine::Loan>();
    // With a wait line the free row is reserved for the first in line for a
    // moment (acquired_at: the reserve's end; see SqlDriver::line_lock):
    // the one this release wakes, or the one a release announcement wakes.
    // Where releases are not announced, a release that did not free the
    // line lock wakes nobody, and reserves nothing: the line lock may still
    // be this process's own for a moment (its place was joining).
    const bool reserve = line_ && (first || !driver_->release_notice_sql().empty());
    const std::string free_at =
        reserve ? driver_->now_ms() + " + " + std::to_string(kQueueReserve.count()) : "0";
    std::string update = "UPDATE simba_mutex SET version = version + 1, acquired_at = " + free_at +
                         ", ttl_at = 0, transition_at = 0, owner_id = '' WHERE mutex = {0} AND "
                         "owner_id = {1}";
    std::vector<std::string> params = {m, std::string(contender_id)};
    if (fencing_token != 0) {
      update += " AND version = {#2}";
      params.push_back(std::to_string(fencing_token));
    }
    // A release need not wait for its commit to be durable (see
    // SqlDriver::lazy_release_suffix): the next holder's commit waits for it.
    update += driver_->lazy_release_suffix();
    std::vector<Statement> statements = {{update, std::move(params)}};
    // Unless another contender of this process waits: it is next, and
    // keeps the line lock (the waiters behind it are behind it anyway).
    const std::string contender(contender_id);
    const bool keep = first && line_->others_waiting(m, contender);
    const std::optional<SqlDriver::LineLock> line =
        first && !keep ? driver_->line_lock(m) : std::optional<SqlDriver::LineLock>();
    // Push stores announce it in the same transaction (delivered when it
    // commits): one round trip. Not when the line lock this frees has a
    // session waiting for it (LineLock::queued_sql): the server wakes that
    // one, whose attempt takes the row.
    const std::string notice = driver_->release_notice_sql();
    if (!notice.empty()) {
      Statement announce{notice, {m, contender}};
      if (line && !line->queued_sql.empty()) {
        announce.sql += " AND NOT " + line->queued_sql;
        announce.params.insert(announce.params.end(), line->key.begin(), line->key.end());
      }
      statements.push_back(std::move(announce));
    }
    // Whether the line lock goes to a session queued for it (the release
    // is then not announced): the row, read back, says until when it is
    // reserved for that one (remember_handed_on).
    const bool may_hand_on = line && !notice.empty() && !line->queued_sql.empty();
    const std::size_t announced_at = statements.size() - 1;
    if (may_hand_on) {
      statements.push_back({"SELECT " + std::string(kColumns) + ", " + driver_->now_ms() +
                                " FROM simba_mutex WHERE mutex = {0}",
                            {m}});
    }
    if (line) {
      statements.push_back(line->unlock);
      statements.back().after_commit = !line->unlock_in_transaction;
    }
    const steady_clock::time_point sent = steady_clock::now();
    Result<std::vector<SqlResult>> results =
        first ? run_on_table(first->session(), std::move(statements), true, deadline, what)
              : run_on_table(std::move(statements), true, deadline, what);
    if (first && !keep && results.ok()) first->unlocked();
    const bool first_asked = first.has_value();
    first.reset();
    forget_handed_on(m);
    if (may_hand_on && results.ok() && results->size() > announced_at + 1 &&
        results->front().affected_rows > 0 && (*results)[announced_at].rows.empty()) {
      remember_handed_on(m, (*results)[announced_at + 1], sent);
    }
    driver_->end_release(m, contender);
    if (line_) {
      line_->gone(m, contender);
      if (!first_asked) line_->await_leaving(m, deadline);
      // Nothing announces it: this process's own waiters hear it here.
      if (results.ok() && notice.empty()) {
        on_event(MutexEvent{MutexEvent::Kind::kReleased, m, contender});
      }
    }
    if (!results.ok()) return results.status();
    return !results->empty() && results->front().affected_rows > 0;
  }

  // One UPDATE per lease length (a factory's services share theirs, as a
  // rule) over the (mutex, owner) pairs that still hold, then one read of
  // the rows, in one transaction: the renewal of acquire_or_renew without
  // its taking. Each list is padded to a power of two (its last entry
  // again, which changes nothing): a driver that prepares each statement
  // text once per session (PostgreSQL) then keeps a few texts, not one
  // for every batch size.
  static std::size_t padded(std::size_t n) { return std::bit_ceil(std::max<std::size_t>(n, 1)); }

  Result<std::vector<OwnerRecord>> do_renew(const std::vector<AcquireRequest>& requests,
                                            Deadline deadline) override {
    const std::string now = driver_->now_ms();
    std::map<std::pair<milliseconds, milliseconds>, std::vector<std::size_t>> by_lease;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      by_lease[{requests[i].ttl, requests[i].transition}].push_back(i);
    }
    std::vector<Statement> statements;
    for (const auto& [lease, which] : by_lease) {
      std::vector<std::string> params = {std::to_string(lease.first.count()),
                                         std::to_string(lease.second.count())};
      std::string pairs;
      for (std::size_t k = 0; k < padded(which.size()); ++k) {
        const std::size_t i = which[std::min(k, which.size() - 1)];
        if (!pairs.empty()) pairs += ", ";
        pairs += "({" + std::to_string(params.size()) + "}, {" + std::to_string(params.size() + 1) +
                 "})";
        params.emplace_back(requests[i].mutex);
        params.emplace_back(requests[i].contender_id);
      }
      // (Each column's new value reads only its own old one: the same
      // under MySQL's left-to-right assignment.)
      statements.push_back({"UPDATE simba_mutex SET acquired_at = " + now +
                                ", ttl_at = CASE WHEN ttl_at > " + now +
                                " + {#0} THEN ttl_at ELSE " + now +
                                " + {#0} END, transition_at = CASE WHEN transition_at > " + now +
                                " + {#0} + {#1} THEN transition_at ELSE " + now +
                                " + {#0} + {#1} END WHERE transition_at >= " + now +
                                " AND (mutex, owner_id) IN (" + pairs + ")",
                            std::move(params)});
    }
    std::vector<std::string> mutexes;
    std::string in;
    for (std::size_t k = 0; k < padded(requests.size()); ++k) {
      if (!in.empty()) in += ", ";
      in += "{" + std::to_string(mutexes.size()) + "}";
      mutexes.emplace_back(requests[std::min(k, requests.size() - 1)].mutex);
    }
    statements.push_back({"SELECT mutex, " + std::string(kColumns) + ", " + now +
                              " FROM simba_mutex WHERE mutex IN (" + in + ")",
                          std::move(mutexes)});
    // The store's time, for a mutex without a row (its table was emptied).
    statements.push_back({"SELECT " + now, {}});
    SIMBA_ASSIGN_OR_RETURN(std::vector<SqlResult> ran,
                           run_on_table(std::move(statements), true, deadline,
                                        "renewing " + std::to_string(requests.size()) + " leases"));
    if (ran.size() < 2 || ran.back().rows.size() != 1 || ran.back().rows[0].empty()) {
      return internal_error(driver_->description() + ": renewing leases: no store time returned");
    }
    const StoreTime store_now(to_int(ran.back().rows[0][0]));
    std::map<std::string, OwnerRecord, std::less<>> rows;
    for (const SqlRow& row : ran[ran.size() - 2].rows) {
      SIMBA_ASSIGN_OR_RETURN(OwnerRecord record, to_record(row, 1));
      rows.emplace(row[0], std::move(record));
    }
    std::vector<OwnerRecord> records;
    records.reserve(requests.size());
    for (const AcquireRequest& request : requests) {
      auto it = rows.find(request.mutex);
      if (it != rows.end()) {
        records.push_back(it->second);
      } else {
        OwnerRecord none;
        none.store_now = store_now;
        records.push_back(std::move(none));
      }
    }
    return records;
  }

  Status do_leave(std::string_view mutex, std::string_view contender_id,
                  Deadline deadline) override {
    if (!line_) return ok_status();
    const std::string m(mutex);
    const std::string contender(contender_id);
    line_->gone(m, contender);
    // An attempt that went with the wait in line may have acquired it
    // for this contender, which never heard: give it back.
    return give_back_prefetched(m, contender, deadline);
  }

  Result<ForcedRelease> do_force_release(std::string_view mutex, Deadline deadline) override {
    const std::string what = "force-releasing mutex " + in_quotes(mutex);
    const std::string m(mutex);
    const std::string notice = driver_->release_notice_sql();
    const std::string forced_notice = driver_->forced_notice_sql();
    // (For push stores; a no-op statement otherwise.)
    auto push = [&](const std::string& sql, std::vector<std::string> params) -> Statement {
      if (sql.empty()) return {"SELECT 1", {}};
      return {sql, std::move(params)};
    };
    // Create the row if missing, so the floor is recorded; then read the
    // holder, tell it (push stores), free the row and announce that, in one
    // transaction.
    SIMBA_ASSIGN_OR_RETURN(
        std::vector<SqlResult> results,
        run_on_table({{driver_->insert_free_row_sql(), {m}},
                      {"SELECT " + std::string(kColumns) + ", " + driver_->now_ms() +
                           " FROM simba_mutex WHERE mutex = {0}" + driver_->for_update_sql(),
                       {m}},
                      push(forced_notice, {m}),
                      {"UPDATE simba_mutex SET version = version + 1, acquired_at = 0, ttl_at = 0, "
                       "transition_at = 0, owner_id = '' WHERE mutex = {0}",
                       {m}},
                      {"SELECT version FROM simba_mutex WHERE mutex = {0}", {m}},
                      push(notice, {m, ""})},
                     true, deadline, what));
    if (results.size() != 6 || results[1].rows.size() != 1 || results[4].rows.size() != 1 ||
        results[4].rows[0].empty()) {
      return internal_error(driver_->description() + ": " + what + ": unexpected result");
    }
    SIMBA_ASSIGN_OR_RETURN(OwnerRecord previous, to_record(results[1].rows[0]));
    ForcedRelease forced{previous.owner, static_cast<std::uint64_t>(to_int(results[4].rows[0][0])),
                         previous.store_now};
    return forced;
  }

  Result<OwnerRecord> do_read(std::string_view mutex, Deadline deadline) override {
    const std::string what = "reading mutex " + in_quotes(mutex);
    // The clock even when there is no row.
    SIMBA_ASSIGN_OR_RETURN(
        std::vector<SqlResult> results,
        run_on_table({{"SELECT " + std::string(kColumns) + ", " + driver_->now_ms() +
                           " FROM simba_mutex WHERE mutex = {0}",
                       {std::string(mutex)}},
                      {"SELECT 0, 0, 0, '', 0, " + driver_->now_ms(), {}}},
                     false, deadline, what));
    if (results.size() != 2 || results[1].rows.size() != 1) {
      return internal_error(driver_->description() + ": " + what + ": unexpected result");
    }
    return to_record(results[0].rows.empty() ? results[1].rows[0] : results[0].rows[0]);
  }

  Result<std::vector<ListedMutex>> do_list(Deadline deadline) override {
    SIMBA_ASSIGN_OR_RETURN(
        std::vector<SqlResult> results,
        run_on_table({{"SELECT " + std::string(kColumns) + ", " + driver_->now_ms() +
                           ", mutex FROM simba_mutex ORDER BY mutex",
                       {}}},
                     false, deadline, "listing mutexes"));
    std::vector<ListedMutex> listed;
    for (const SqlRow& row : results.front().rows) {
      SIMBA_ASSIGN_OR_RETURN(OwnerRecord record, to_record(row));
      listed.push_back(ListedMutex{row.at(6), std::move(record)});
    }
    return listed;
  }

  Result<std::unique_ptr<Subscription>> do_subscribe(
      std::string_view mutex, std::string_view /*contender_id*/,
      std::function<void(const MutexEvent&)> listener) override;

  Status do_inspect(StoreReport& report, Deadline deadline) override {
    SIMBA_ASSIGN_OR_RETURN(std::optional<SessionPool<SqlSession>::Loan> loan,
                           pool_->borrow(deadline));
    if (!loan) {
      return deadline_exceeded_error(driver_->description() +
                                     ": deadline passed while waiting for a connection");
    }
    Status inspected = driver_->inspect(**loan, report, deadline);
    if (!inspected.ok()) {
      return Status(inspected.code(),
                    driver_->description() + ": inspecting the server: " + inspected.message());
    }
    return ok_status();
  }

 private:
  // Runs statements that use the table; creates the table once if it is
  // missing (or says what to run when we may not).
  Result<std::vector<SqlResult>> run_on_table(std::vector<Statement> statements, bool transaction,
                                              Deadline deadline, const std::string& what) {
    SIMBA_ASSIGN_OR_RETURN(std::optional<SessionPool<SqlSession>::Loan> loan,
                           pool_->borrow(deadline));
    if (!loan) {
      return deadline_exceeded_error(driver_->description() +
                                     ": deadline passed while waiting for a connection");
    }
    return run_on_table(**loan, std::move(statements), transaction, deadline, what);
  }
  // The same on `session`.
  Result<std::vector<SqlResult>> run_on_table(SqlSession& session,
                                              std::vector<Statement> statements, bool transaction,
                                              Deadline deadline, const std::string& what) {
    for (Statement& statement : statements) statement.sql = on_table(statement.sql);
    SqlFailure failure = SqlFailure::kOther;
    auto results = session.run(statements, transaction, deadline, &failure);
    if (!results.ok() && failure == SqlFailure::kNoTable) {
      SIMBA_RETURN_IF_ERROR(create_table(session, deadline));
      results = session.run(statements, transaction, deadline, &failure);
    }
    if (!results.ok()) {
      return Status(results.status().code(),
                    driver_->description() + ": " + what + ": " + results.status().message());
    }
    return results;
  }

  // `sql` with our table's name for "simba_mutex".
  std::string on_table(const std::string& sql) const {
    if (options_.table == "simba_mutex") return sql;
    std::string out;
    std::size_t at = 0;
    for (std::size_t found; (found = sql.find("simba_mutex", at)) != std::string::npos;) {
      out += sql.substr(at, found - at) + options_.table;
      at = found + std::string_view("simba_mutex").size();
    }
    return out + sql.substr(at);
  }

  Status create_table(SqlSession& session, Deadline deadline) {
    const std::string ddl = on_table(driver_->create_table_sql());
    if (!options_.create_table) {
      return failed_precondition_error(driver_->description() + ": the table " + options_.table +
                                       " does not exist; create it with: " + ddl);
    }
    SqlFailure failure = SqlFailure::kOther;
    auto created = session.run({{ddl, {}}}, false, deadline, &failure);
    // Two processes creating it at once: the other one won. Even with IF NOT
    // EXISTS, PostgreSQL reports the loser's clash on the catalog (the row
    // type or pg_type's unique index) instead of waiting for the winner.
    if (!created.ok() &&
        (failure == SqlFailure::kDuplicateKey || failure == SqlFailure::kAlreadyExists)) {
      return ok_status();
    }
    if (!created.ok()) {
      if (failure == SqlFailure::kNoPrivilege) {
        return permission_denied_error(driver_->description() + ": the table " + options_.table +
                                       " does not exist and this user may not create it; ask a "
                                       "DBA to run (`simba schema --store URI` prints it): " +
                                       ddl);
      }
      return created.status().with_context(driver_->description() + ": creating " + options_.table);
    }
    SIMBA_LOG(kInfo, driver_->description() << ": created the table " << options_.table);
    return ok_status();
  }

  // The side table of session-backed tenures (SqlDriver::LineLock::
  // create_marks_sql), created if missing and allowed, or found; until it
  // is, tenures are not backed (said once).
  void prepare_marks(SqlSession& session, Deadline deadline) {
    const std::string marks = options_.table + std::string(kSessionTableSuffix);
    const Statement statement =
        options_.create_table
            ? Statement{on_table(driver_->line_lock("")->create_marks_sql), {}}
            : Statement{on_table("SELECT version FROM simba_mutex_session WHERE mutex = ''"), {}};
    Result<std::vector<SqlResult>> ran = session.run({statement}, false, deadline);
    // A CREATE TABLE IF NOT EXISTS that raced another process's can fail
    // (PostgreSQL: a duplicate pg_type row); once more finds the table. Not
    // ready, this process would never back a tenure nor take one over.
    if (!ran.ok() && options_.create_table && session.healthy()) {
      ran = session.run({statement}, false, deadline);
    }
    if (ran.ok()) {
      marks_ready_.store(true);
      return;
    }
    if (!marks_warned_.exchange(true)) {
      SIMBA_LOG(kWarn, driver_->description()
                           << ": the table " << marks << " (which tenures a session backs) "
                           << (options_.create_table ? "could not be created" : "is missing")
                           << ": " << ran.status()
                           << "; a dead holder's mutexes are taken over only when their leases "
                              "end. To create it: "
                           << on_table(driver_->line_lock("")->create_marks_sql));
    }
  }

  // One event from the driver's listener, for every subscriber of its
  // mutex (a release of "" after a reconnect: for every subscriber).
  void on_event(const MutexEvent& pushed) {
    // News of the mutex (or of all, after a reconnect): its next try asks
    // the store.
    if (line_) {
      if (pushed.mutex.empty()) {
        std::lock_guard<std::mutex> lock(prefetch_mu_);
        handed_on_.clear();
      } else {
        forget_handed_on(pushed.mutex);
      }
    }
    if (line_ && pushed.kind == MutexEvent::Kind::kLost) {
      // A hold taken with the line's grant and not yet handed to its
      // contender was forced away: the contender must ask the store.
      drop_prefetched(pushed.mutex, pushed.owner_id);
    }
    ListenerHub::Work work;
    // "" after a reconnect: anything may have been missed.
    if (pushed.mutex.empty()) {
      hub_->collect_all(pushed, &work);
    } else if (line_ && pushed.kind == MutexEvent::Kind::kReleased && !pushed.owner_id.empty() &&
               line_->hold_back(pushed.mutex)) {
      // Another process is ahead of this one in line: the release is for it.
      return;
    } else {
      hub_->collect(pushed, &work);
    }
    hub_->deliver(work);
  }

  // Creates the driver's listener on first use. REQUIRES: mu_.
  void start_listener_locked();

  std::unique_ptr<WaitLine> make_line(int sessions) {
    WaitLine::Hooks hooks;
    SqlDriver* driver = driver_.get();
    hooks.connect = [driver](Deadline deadline,
                             int wake_fd) -> Result<std::unique_ptr<SqlSession>> {
      SIMBA_ASSIGN_OR_RETURN(std::unique_ptr<SqlSession> session,
                             driver->connect_wakeable(deadline, wake_fd));
      const std::vector<Statement> setup = driver->line_lock("")->session_setup;
      if (!setup.empty()) SIMBA_RETURN_IF_ERROR(session->run(setup, false, deadline).status());
      return session;
    };
    const bool marks_fit = session_table_fits(options_.table);
    if (options_.session_grace.count() > 0 && !driver->line_lock("")->mark_sql.empty() &&
        !marks_fit) {
      SIMBA_LOG(kWarn, driver->description()
                           << ": the table name " << options_.table << " leaves no room for "
                           << options_.table << kSessionTableSuffix
                           << " (which tenures a session backs): a dead holder's mutexes are "
                              "taken over only when their leases end");
    }
    if (options_.session_grace.count() > 0 && !driver->line_lock("")->mark_sql.empty() &&
        marks_fit) {
      hooks.connect = [this, connect = std::move(hooks.connect)](
                          Deadline deadline, int wake_fd) -> Result<std::unique_ptr<SqlSession>> {
        SIMBA_ASSIGN_OR_RETURN(std::unique_ptr<SqlSession> session, connect(deadline, wake_fd));
        if (!marks_ready_.load()) prepare_marks(*session, deadline);
        return session;
      };
      hooks.grace = options_.session_grace;
      hooks.mark = [this](const std::string& mutex, const std::string& contender,
                          std::uint64_t token) {
        std::vector<Statement> statements;
        if (!marks_ready_.load()) return statements;
        const std::optional<SqlDriver::LineLock> line = driver_->line_lock(mutex);
        for (const std::string& sql : line->mark_sql) {
          // (A statement without placeholders gets no parameters: libpq
          // refuses parameters a statement does not use.)
          std::vector<std::string> params;
          if (sql.find('{') != std::string::npos)
            params = {mutex, contender, std::to_string(token)};
          statements.push_back({on_table(sql), std::move(params)});
        }
        return statements;
      };
      hooks.lost = [this](const std::string& mutex, const std::string& contender,
                          std::uint64_t token) {
        MutexEvent event{MutexEvent::Kind::kLost, mutex, contender};
        event.fencing_token = token;
        on_event(event);
      };
    }
    hooks.wait = [driver](const std::string& mutex, milliseconds wait) {
      return driver->line_lock(mutex)->wait(wait);
    };
    hooks.unlock = [driver](const std::string& mutex) { return driver->line_lock(mutex)->unlock; };
    hooks.granted = driver->line_lock("")->granted;
    hooks.releases_announced = !driver->release_notice_sql().empty();
    hooks.attempted = [this](const std::string& mutex, const std::string& contender,
                             const std::vector<SqlResult>& results, steady_clock::time_point sent) {
      if (results.empty() || results.back().rows.size() != 1) return false;
      Result<OwnerRecord> record = to_record(results.back().rows.front());
      if (!record.ok() || !record->owner.is_owner(contender)) return false;
      record->bound = line_->bound_for(mutex, contender, record->owner.fencing_token);
      std::lock_guard<std::mutex> lock(prefetch_mu_);
      prefetched_[{mutex, contender}] = Prefetched{*record, sent};
      return true;
    };
    hooks.abandoned = [this](const std::string& mutex, const std::string& contender) {
      Status given_back =
          give_back_prefetched(mutex, contender, steady_clock::now() + kGiveBackBound);
      if (!given_back.ok()) {
        SIMBA_LOG(kWarn, given_back << " (the lease will expire at the store)");
      }
    };
    hooks.superseded = [this](const std::string& mutex, const std::string& contender) {
      drop_prefetched(mutex, contender);
    };
    // The waiters of this process look now (a named release: an owner
    // ignores it); the contender whose attempt took the mutex in line asks
    // on this thread (answered_for): its answer is the prefetched hold.
    hooks.first = [this](const std::string& mutex) {
      MutexEvent event{MutexEvent::Kind::kReleased, mutex, kFirstInLine};
      event.answered_for = prefetched_contender(mutex);
      on_event(event);
    };
    return std::make_unique<WaitLine>(std::move(hooks), driver_->description(), sessions);
  }
  // Whom the wake of the first in line names as the releaser. Any name does:
  // an owner ignores a named release, a waiter looks.
  static constexpr char kFirstInLine[] = "(first in line)";

  const std::unique_ptr<SqlDriver> driver_;
  const SqlBackendOptions options_;
  Capabilities capabilities_;
  const std::shared_ptr<SessionPool<SqlSession>> pool_;

  const std::shared_ptr<ListenerHub> hub_ = std::make_shared<ListenerHub>();
  // Orders watch() and unwatch() with the hub's membership.
  std::mutex mu_;
  std::unique_ptr<SqlDriver::Listener> listener_;  // started by the first subscribe
  // The wait line (SqlDriver::line_lock), or null. Destroyed first.
  std::unique_ptr<WaitLine> line_;
  // The side table of session-backed tenures exists (prepare_marks).
  std::atomic<bool> marks_ready_{false};
  std::atomic<bool> marks_warned_{false};
  // When do_acquire_or_renew looks for it next; prefetch_mu_.
  steady_clock::time_point next_marks_look_{};
  static constexpr milliseconds kMarksLookEvery{10000};

  // Holds that an attempt sent with the wait in line took as the line lock
  // was granted (WaitLine::Hooks::attempted), until their contender's next
  // attempt takes them (take_prefetched), it leaves, or a loss is pushed.
  struct Prefetched {
    OwnerRecord record;
    // When the attempt was sent with the wait: it ran at the grant, no
    // earlier. Not when the reply came: a reply held up (a stalled
    // connection around a server failover) would make the lease look
    // longer than the store's, and the fault run postgres-standby-run
    // caught a waiter acting on such a hold after another had taken the
    // mutex (token 49 learned 2.5 ms after token 50 was granted).
    steady_clock::time_point at;
  };
  std::mutex prefetch_mu_;
  std::map<std::pair<std::string, std::string>, Prefetched> prefetched_;  // prefetch_mu_
  // mutex -> the answer its next try would get after a release of ours
  // handed the row on (remember_handed_on); prefetch_mu_.
  std::map<std::string, Prefetched> handed_on_;
  // A handed-on row counts as reserved only while this much of its reserve
  // is left: a try near its end may find it free.
  static constexpr milliseconds kHandedOnMargin{200};

  // The hold prefetched for `contender`, as if read now: the lease left is
  // what was left when the attempt ran, less the time since it was sent
  // (never more than the store granted). nullopt when there is none, or when it is older
  // than kPrefetchFresh (the contender's call then asks the store, which
  // renews it).
  std::optional<OwnerRecord> take_prefetched(const std::string& mutex, std::string_view contender) {
    std::lock_guard<std::mutex> lock(prefetch_mu_);
    auto it = prefetched_.find({mutex, std::string(contender)});
    if (it == prefetched_.end()) return std::nullopt;
    Prefetched prefetched = std::move(it->second);
    prefetched_.erase(it);
    // Only while the line's grant is still this contender's latest news
    // (WaitLine::claim); otherwise the hold is an older one, released or
    // held by the contender's own call since, and the store is asked.
    if (!line_->claim(mutex, std::string(contender))) return std::nullopt;
    const auto age = steady_clock::now() - prefetched.at;
    if (age > kPrefetchFresh) return std::nullopt;
    prefetched.record.store_now =
        prefetched.record.store_now + std::chrono::ceil<milliseconds>(age);
    return prefetched.record;
  }

  // A release of ours that freed `mutex`'s line lock for a session queued
  // on it (another process's: ours would have kept it): until the reserve
  // read back in `row` ends, less kHandedOnMargin, the next try of ours
  // would find the row reserved, and is answered here instead.
  void remember_handed_on(const std::string& mutex, const SqlResult& row,
                          steady_clock::time_point sent) {
    if (row.rows.size() != 1) return;
    Result<OwnerRecord> record = to_record(row.rows.front());
    if (!record.ok() || record->owner.has_owner_id()) return;
    const StoreTime reserved_until(to_int(row.rows.front()[0]));
    if (reserved_until < record->store_now + kHandedOnMargin) return;
    record->ask_again_at = reserved_until;
    std::lock_guard<std::mutex> lock(prefetch_mu_);
    handed_on_[mutex] = Prefetched{*record, sent};
  }

  void forget_handed_on(const std::string& mutex) {
    std::lock_guard<std::mutex> lock(prefetch_mu_);
    handed_on_.erase(mutex);
  }

  // The answer remember_handed_on kept for `mutex`, as if read now (once),
  // or nullopt when there is none or its reserve is about to end.
  std::optional<OwnerRecord> take_handed_on(const std::string& mutex) {
    std::lock_guard<std::mutex> lock(prefetch_mu_);
    auto it = handed_on_.find(mutex);
    if (it == handed_on_.end()) return std::nullopt;
    Prefetched kept = std::move(it->second);
    handed_on_.erase(it);
    // Measured from when the release was sent: the store's clock read
    // later than that, so this "now" is never behind the store's.
    kept.record.store_now =
        kept.record.store_now + std::chrono::ceil<milliseconds>(steady_clock::now() - kept.at);
    if (*kept.record.ask_again_at < kept.record.store_now + kHandedOnMargin) return std::nullopt;
    return kept.record;
  }

  // The contender of ours a hold of `mutex` was prefetched for; "" if none.
  std::string prefetched_contender(const std::string& mutex) {
    std::lock_guard<std::mutex> lock(prefetch_mu_);
    auto it = prefetched_.lower_bound({mutex, std::string()});
    return it != prefetched_.end() && it->first.first == mutex ? it->first.second : std::string();
  }

  void drop_prefetched(const std::string& mutex, const std::string& contender) {
    std::lock_guard<std::mutex> lock(prefetch_mu_);
    prefetched_.erase({mutex, contender});
  }

  // Releases a prefetched hold nobody took (its contender left).
  Status give_back_prefetched(const std::string& mutex, const std::string& contender,
                              Deadline deadline) {
    std::optional<Prefetched> prefetched;
    {
      std::lock_guard<std::mutex> lock(prefetch_mu_);
      auto it = prefetched_.find({mutex, contender});
      if (it == prefetched_.end()) return ok_status();
      prefetched = std::move(it->second);
      prefetched_.erase(it);
    }
    return do_release(mutex, contender, prefetched->record.owner.fencing_token, deadline)
        .status()
        .with_context("giving back mutex " + in_quotes(mutex) + ", taken in line for " + contender +
                      " after it left");
  }
  static constexpr milliseconds kPrefetchFresh{1000};
  static constexpr milliseconds kGiveBackBound{5000};
};

Result<std::unique_ptr<Subscription>> SqlBackend::do_subscribe(
    std::string_view mutex, std::string_view /*contender_id*/,
    std::function<void(const MutexEvent&)> listener) {
  if (!capabilities_.push_release) {
    return unimplemented_error(std::string(scheme()) + " backend cannot push owner changes");
  }
  const std::string name(mutex);
  bool watches_rows = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    start_listener_locked();
    watches_rows = listener_ && listener_->watches_rows();
  }
  // A row-watching listener starts from the row as of now, so a release
  // committed after this call returns is delivered even if it comes before
  // the listener first looks. Reading only waits for a connection; failing
  // costs only that guarantee (the first look becomes the baseline), so it
  // does not fail the subscription.
  std::optional<SqlDriver::Listener::Row> seen;
  if (watches_rows) {
    auto row =
        run_on_table({{"SELECT owner_id, version FROM simba_mutex WHERE mutex = {0}", {name}}},
                     false, steady_clock::now() + kSubscribeReadBound,
                     "subscribing to mutex " + in_quotes(mutex) + ": reading the row");
    if (!row.ok()) {
      SIMBA_LOG(kDebug, row.status() << " (subscribing anyway)");
    } else if (row->empty() || row->front().rows.empty()) {
      seen.emplace();  // no row: free, version 0
    } else if (row->front().rows.front().size() == 2) {
      const SqlRow& values = row->front().rows.front();
      seen = SqlDriver::Listener::Row{values[0], to_int(values[1])};
    }
  }
  // Listeners must not throw; one that does must not end the push for
  // everyone else.
  auto guarded = [listener = std::move(listener),
                  description = driver_->description()](const MutexEvent& event) {
    try {
      listener(event);
    } catch (...) {
      SIMBA_LOG(kError,
                description << ": a listener for mutex " << in_quotes(event.mutex) << " threw");
    }
  };
  // The last subscription to a mutex gone, a row-watching listener stops
  // watching it.
  auto on_close = [weak = weak_from_this()](const ListenerHub::Slot& slot) {
    auto self = weak.lock();
    if (!self) return;
    std::lock_guard<std::mutex> lock(self->mu_);
    if (self->hub_->any(slot.mutex)) return;
    if (self->listener_) self->listener_->unwatch(slot.mutex);
    if (self->line_) self->line_->forget(slot.mutex);
  };
  std::lock_guard<std::mutex> lock(mu_);
  start_listener_locked();
  auto subscription = hub_->subscribe(name, std::string(), std::move(guarded), std::move(on_close));
  if (listener_) listener_->watch(name, std::move(seen));
  return subscription;
}

void SqlBackend::start_listener_locked() {
  if (listener_) return;
  std::weak_ptr<SqlBackend> weak = weak_from_this();
  listener_ = driver_->make_listener([weak](const MutexEvent& event) {
    if (auto self = weak.lock()) self->on_event(event);
  });
}

}  // namespace

std::optional<MutexEvent> notice_event(const std::string& mutex, const std::string& by) {
  MutexEvent event{MutexEvent::Kind::kReleased, mutex, by};
  const std::size_t first = by.find('\n');
  if (first == std::string::npos) return event;
  // forced_notice_sql()'s "<owner>\n<token>\nforced": that hold was taken
  // away, which its owner must hear at once (the release notice that
  // follows wakes the waiters).
  const std::size_t second = by.find('\n', first + 1);
  if (second == std::string::npos || by.substr(second + 1) != "forced" || first == 0 ||
      mutex.empty()) {
    return std::nullopt;
  }
  event.kind = MutexEvent::Kind::kLost;
  event.owner_id = by.substr(0, first);
  event.fencing_token = static_cast<std::uint64_t>(
      std::strtoull(by.substr(first + 1, second - first - 1).c_str(), nullptr, 10));
  event.forced = true;
  return event;
}

Result<std::string> render_params(
    const std::string& sql,
    const std::function<Result<std::string>(std::size_t index, bool number)>& render) {
  std::string out;
  out.reserve(sql.size() + 32);
  for (std::size_t i = 0; i < sql.size(); ++i) {
    const std::size_t close = sql[i] == '{' ? sql.find('}', i) : std::string::npos;
    const bool number = close != std::string::npos && sql[i + 1] == '#';
    const std::size_t first = i + (number ? 2 : 1);
    std::size_t index = 0;
    if (close != std::string::npos && close > first &&
        std::from_chars(sql.data() + first, sql.data() + close, index).ptr == sql.data() + close) {
      SIMBA_ASSIGN_OR_RETURN(std::string value, render(index, number));
      out += value;
      i = close;
    } else {
      out += sql[i];
    }
  }
  return out;
}

namespace {

// A URI key's whole value as a count in [lo, hi]; kInvalidArgument naming
// the store and the key otherwise.
Result<int> read_count(std::string_view store, const std::string& key, const std::string& value,
                       int lo, int hi) {
  int n = 0;
  auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (error != std::errc() || end != value.data() + value.size() || n < lo || n > hi) {
    return invalid_argument_error(std::string(store) + ": " + key + " must be " +
                                  std::to_string(lo) + ".." + std::to_string(hi) + ", not " +
                                  in_quotes(value));
  }
  return n;
}

}  // namespace

Result<bool> read_table_key(std::string_view store, const std::string& key,
                            const std::string& value, int& connections, std::string& table,
                            bool& create_table) {
  if (key == "connections") {
    SIMBA_ASSIGN_OR_RETURN(connections, read_count(store, key, value, 1, 64));
  } else if (key == "table") {
    table = value;
  } else if (key == "create_table") {
    if (value != "on" && value != "off") {
      return invalid_argument_error(std::string(store) + ": create_table must be on or off, not " +
                                    in_quotes(value));
    }
    create_table = value == "on";
  } else {
    return false;
  }
  return true;
}

Result<bool> read_queue_key(std::string_view store, const std::string& key,
                            const std::string& value, int& sessions) {
  if (key != "queue_connections") return false;
  SIMBA_ASSIGN_OR_RETURN(sessions, read_count(store, key, value, 0, kMaxLineSessions));
  return true;
}

Result<bool> read_grace_key(std::string_view store, const std::string& key,
                            const std::string& value, std::chrono::milliseconds& grace) {
  if (key != "session_grace") return false;
  SIMBA_ASSIGN_OR_RETURN(grace, parse_duration(std::string(store) + ": session_grace", value));
  SIMBA_RETURN_IF_ERROR(check_session_grace(store, grace));
  return true;
}

Status check_session_grace(std::string_view store, std::chrono::milliseconds grace) {
  if (grace.count() != 0 && (grace < kMinSessionGrace || grace > kMaxSessionGrace)) {
    return invalid_argument_error(std::string(store) + ": session_grace is " +
                                  format_duration(grace) + "; expected 0ms (off) or " +
                                  format_duration(kMinSessionGrace) + " to " +
                                  format_duration(kMaxSessionGrace));
  }
  return ok_status();
}

Status check_line_sessions(std::string_view store, int sessions) {
  if (sessions >= 0 && sessions <= kMaxLineSessions) return ok_status();
  return invalid_argument_error(std::string(store) + ": queue_connections must be 0.." +
                                std::to_string(kMaxLineSessions) + ", not " +
                                std::to_string(sessions));
}

Status validate_table_name(const std::string& table) {
  const std::string& t = table;
  const bool identifier = !t.empty() && t.size() <= kMaxIdentifier &&
                          !(t[0] >= '0' && t[0] <= '9') &&
                          std::all_of(t.begin(), t.end(), [](char c) {
                            return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                                   (c >= '0' && c <= '9') || c == '_';
                          });
  if (!identifier) {
    return invalid_argument_error(
        "table " + in_quotes(t) + " must be a plain identifier of at most " +
        std::to_string(kMaxIdentifier) + " characters (A-Z a-z 0-9 _, not starting with a digit)");
  }
  return ok_status();
}

Result<std::shared_ptr<Backend>> new_sql_backend(std::unique_ptr<SqlDriver> driver,
                                                 SqlBackendOptions options) {
  if (!driver) return invalid_argument_error("no SQL driver");
  if (options.connections < 1) return invalid_argument_error("connections must be at least 1");
  SIMBA_RETURN_IF_ERROR(validate_table_name(options.table));
  return std::shared_ptr<Backend>(std::make_shared<SqlBackend>(std::move(driver), options));
}

}  // namespace simba::internal::sql
