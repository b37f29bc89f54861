// Internal to the SQLite driver: a kernel lock per held mutex, so that a
// holder's death on this host is seen at once instead of when its lease
// ends.
//
// Every process that opens the database holds, while it holds a mutex, a
// write lock on one byte of a file beside the database (`<db>-simba-locks`,
// the byte picked by a hash of the mutex name). The kernel frees it when
// the process exits, however it exits. In the acquiring transaction the
// holder records, in `simba_mutex_host`, that the tenure (the row's version)
// is backed by a kernel lock, and which one (this boot of this kernel, this
// lock file's inode). A contender that can lock that byte, finding the row
// still at the recorded version, knows that no process holds the tenure any
// more: the holder died, or gave the mutex up, and nobody believes it holds
// it. It takes the row over at once.
//
// Why the lease is not weakened: the kernel lock is on the same host as
// every process that uses it, so there is no partition between a holder
// and it; a holder that is alive but paused keeps it, and loses only by its
// lease, as before. A lock that cannot be had (another host's process, a
// file system without OFD locks, two mutexes whose bytes collide) records
// nothing, and the lease decides.
//
// Why a file of its own: closing any descriptor of a file drops every POSIX
// lock the process holds on it, and SQLite's own locks on the database file
// are POSIX locks. Open-file-description locks (F_OFD_*) belong to the
// descriptor, are not shared with SQLite's, and end with the process.

#ifndef SIMBA_BACKENDS_SQLITE_HOST_LOCKS_H_
#define SIMBA_BACKENDS_SQLITE_HOST_LOCKS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>

namespace simba::internal::sql::sqlite {

class HostLocks {
 public:
  // The lock file is the database's path with this appended.
  static constexpr char kFileSuffix[] = "-simba-locks";

  // The lock file beside `db_path`, opened (made if missing); nullptr when
  // it cannot be had (the reason logged once: the lease then decides alone).
  static std::shared_ptr<HostLocks> open(const std::string& db_path);
  ~HostLocks();
  HostLocks(const HostLocks&) = delete;
  HostLocks& operator=(const HostLocks&) = delete;

  // Which lock backs a tenure of `mutex`: "<boot id>/<device>:<inode>/<byte>"
  // of this kernel, this lock file and the mutex's byte. A contender trusts
  // a record only when it names the lock it would probe itself. Only
  // [0-9a-f:/-]: safe inside an SQL literal.
  std::string lock_id(std::string_view mutex) const;

  // What take() found. Only kNew proves that whoever a record names is gone.
  enum class Take {
    kNew,      // locked by this call: nobody held it
    kJoined,   // this backend already holds the byte for a mutex whose byte
               // is the same: held, but proves nothing
    kAlready,  // this backend holds it for the mutex
    kBusy,     // another process (or backend) holds it, or another call of
               // this backend has just locked it (its proof must not be
               // spoiled): no record may name it
  };
  struct Taken {
    Take take;
    // The call added `contender`'s claim (end_acquire() settles it).
    bool claimed_now = false;
  };
  // Locks `mutex`'s byte for this backend, never waiting, and claims it for
  // `contender`: this backend keeps the byte while any contender of its
  // claims it. The claim must be settled by end_acquire().
  Taken take(const std::string& mutex, const std::string& contender);
  // After the acquire call that took(): `owner` is the row's owner now
  // (nullopt: the call failed). A contender that does not own the mutex
  // gives its claim up (after a failure, only one the call added).
  void end_acquire(const std::string& mutex, const std::string& contender, const Taken& taken,
                   const std::optional<std::string>& owner);
  // Gives `contender`'s claim up (it released the mutex).
  void give_up(const std::string& mutex, const std::string& contender);
  // Whether nobody holds `mutex`'s byte now, this backend included: the
  // holder of a tenure recorded as backed by it is gone. (False when a
  // probe fails: gone is never a guess.)
  bool unheld(const std::string& mutex);

  // The byte of `mutex` in the lock file: FNV-1a (64-bit) of the name,
  // below 2^62. Part of the file format: every version must agree, and the
  // byte is in lock_id() so that one that did not would trust nothing.
  static std::int64_t offset_of(std::string_view mutex);

 private:
  HostLocks(int fd, std::string file_id) : fd_(fd), file_id_(std::move(file_id)) {}

  const int fd_;
  const std::string file_id_;  // "<boot id>/<device>:<inode>"
  std::mutex mu_;
  struct Held {
    std::set<std::string, std::less<>> claims;  // contenders of this backend
    bool proving = false;                       // a kNew take whose call has not ended
  };
  void give_up_locked(const std::string& mutex, const std::string& contender);

  // Guarded by mu_: the held mutexes, and how many of them hold each byte
  // (names may collide).
  std::map<std::string, Held, std::less<>> held_;
  std::map<std::int64_t, int> holders_of_offset_;
};

}  // namespace simba::internal::sql::sqlite

#endif  // SIMBA_BACKENDS_SQLITE_HOST_LOCKS_H_
