// The connections of the PostgreSQL keyed-lock backend: a fixed budget,
// opened on demand and kept for reuse. A hold pins its connection (its
// session holds the advisory lock), so unlike a pool of short calls, a
// borrower may keep a connection for as long as it holds a key.
#ifndef SIMBA_BACKENDS_POSTGRES_KEYED_CONNECTION_POOL_H_
#define SIMBA_BACKENDS_POSTGRES_KEYED_CONNECTION_POOL_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "backends/postgres/pg_connection.h"
#include "simba/backend.h"
#include "simba/status.h"

namespace simba::internal::pg {

// Thread-safe. Create it with std::make_shared (loans keep it alive).
class KeyedConnectionPool : public std::enable_shared_from_this<KeyedConnectionPool> {
 public:
  // One connection on loan. Destroying it (or Return()) gives the connection
  // back for reuse; after Discard() it is closed instead, freeing its place
  // in the budget. Move-only.
  class Loan {
   public:
    Loan() = default;
    Loan(Loan&& other) noexcept = default;
    Loan& operator=(Loan&& other) noexcept;
    Loan(const Loan&) = delete;
    Loan& operator=(const Loan&) = delete;
    ~Loan() { Return(); }

    PGconn* get() const { return conn_.get(); }
    // Back to the pool for the next borrower.
    void Return();
    // Closes the connection: its session ends, and with it every advisory
    // lock it held (at once when the server is reachable, else when it
    // notices).
    void Discard();

   private:
    friend class KeyedConnectionPool;
    Loan(std::shared_ptr<KeyedConnectionPool> pool, PgConn conn)
        : pool_(std::move(pool)), conn_(std::move(conn)) {}

    std::shared_ptr<KeyedConnectionPool> pool_;
    PgConn conn_;
  };

  // `params` are libpq keywords; `budget` >= 1 is the most connections that
  // exist at once (idle, lent and being opened).
  KeyedConnectionPool(std::map<std::string, std::string> params, std::string description,
                      int budget, std::chrono::milliseconds connect_timeout);

  // A connection: an idle one that is still connected, or a new one when
  // fewer than the budget exist. Borrowers wait in arrival order. An empty
  // optional when none came free by `wait_deadline` (a deadline already past
  // gets one look); kCancelled when `cancel` is stopped first (`wake_fd`,
  // readable once it is, also ends a connection attempt); otherwise the
  // error of connecting (bounded by the connect timeout).
  Result<std::optional<Loan>> Borrow(Deadline wait_deadline, const std::stop_token& cancel,
                                     int wake_fd);

  // Connections that exist now (idle, lent, being opened).
  int open_connections() const;

 private:
  void TakeBack(PgConn conn);
  void Forget(PgConn conn);

  const std::map<std::string, std::string> params_;
  const std::string description_;
  const int budget_;
  const std::chrono::milliseconds connect_timeout_;

  mutable std::mutex mu_;
  std::condition_variable_any changed_;
  std::vector<PgConn> idle_;       // guarded by mu_
  int open_ = 0;                   // guarded by mu_
  std::list<std::uint64_t> line_;  // borrowers waiting, in arrival order; guarded by mu_
  std::uint64_t next_ticket_ = 0;  // guarded by mu_
};

}  // namespace simba::internal::pg

#endif  // SIMBA_BACKENDS_POSTGRES_KEYED_CONNECTION_POOL_H_
