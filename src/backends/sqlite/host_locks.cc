#include "backends/sqlite/host_locks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <system_error>

#include "core/log.h"
#include "core/name_hash.h"
#include "core/store_options.h"

namespace simba::internal::sql::sqlite {
namespace {

// Where the kernel says which boot this is: the same on every process (and
// container) of one running kernel, new at every boot.
constexpr char kBootIdPath[] = "/proc/sys/kernel/random/boot_id";

// One byte at `offset`, to lock (F_WRLCK), unlock (F_UNLCK) or probe.
struct flock byte_at(std::int64_t offset, short type) {
  struct flock lock {};
  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  lock.l_start = static_cast<off_t>(offset);
  lock.l_len = 1;
  lock.l_pid = 0;  // must be 0 for the OFD commands
  return lock;
}

bool is_hex_id(const std::string& text) {
  if (text.empty()) return false;
  for (const char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == '-')) return false;
  }
  return true;
}

}  // namespace

std::int64_t HostLocks::offset_of(std::string_view mutex) {
  return static_cast<std::int64_t>(internal::fnv1a64(mutex) >> 2);
}

std::shared_ptr<HostLocks> HostLocks::open(const std::string& db_path) {
  const std::string path = db_path + kFileSuffix;
  const auto unavailable = [&](const std::string& why) {
    SIMBA_LOG(kInfo, "sqlite " << in_quotes(db_path) << ": no kernel locks beside the rows (" << why
                               << "): a holder that dies is taken over when its lease ends");
    return std::shared_ptr<HostLocks>();
  };
  std::string boot_id;
  {
    std::ifstream in(kBootIdPath);
    std::getline(in, boot_id);
  }
  if (!is_hex_id(boot_id)) return unavailable(std::string("no boot id in ") + kBootIdPath);
  // Readable and writable by whoever may write the database.
  mode_t mode = 0644;
  struct stat db {};
  if (::stat(db_path.c_str(), &db) == 0) mode = db.st_mode & 0666;
  // Not close-on-exec, on purpose: a program this process starts (the job
  // of `simba run`) shares the descriptor, so the locks stay held until it
  // has ended too. A holder's job that outlives the holder for a moment
  // (until simba's reaper has killed it) must not overlap the next one.
  // Inherited by a program that lives on, it only makes that holder's
  // mutexes wait for their leases, as before the kernel locks.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, mode);
  if (fd < 0) {
    return unavailable("opening " + in_quotes(path) + ": " +
                       std::error_code(errno, std::generic_category()).message());
  }
  struct stat file {};
  struct flock probe = byte_at(0, F_WRLCK);
  if (::fstat(fd, &file) != 0 || ::fcntl(fd, F_OFD_GETLK, &probe) != 0) {
    const int error = errno;
    ::close(fd);
    return unavailable(in_quotes(path) + " takes no open-file-description locks: " +
                       std::error_code(error, std::generic_category()).message());
  }
  return std::shared_ptr<HostLocks>(new HostLocks(
      fd, boot_id + "/" + std::to_string(file.st_dev) + ":" + std::to_string(file.st_ino)));
}

HostLocks::~HostLocks() { ::close(fd_); }

std::string HostLocks::lock_id(std::string_view mutex) const {
  return file_id_ + "/" + std::to_string(offset_of(mutex));
}

HostLocks::Taken HostLocks::take(const std::string& mutex, const std::string& contender) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = held_.find(mutex); it != held_.end()) {
    const bool claimed_now = it->second.claims.insert(contender).second;
    return {it->second.proving ? Take::kBusy : Take::kAlready, claimed_now};
  }
  const std::int64_t offset = offset_of(mutex);
  int& holders = holders_of_offset_[offset];
  if (holders == 0) {
    struct flock byte = byte_at(offset, F_WRLCK);
    if (::fcntl(fd_, F_OFD_SETLK, &byte) != 0) {
      holders_of_offset_.erase(offset);
      return {Take::kBusy, false};
    }
  }
  ++holders;
  // (Debug lines, with SIMBA_LOG=debug: the CI's sanitized runs of the
  // embedded stores keep them, so that a failure there shows which kernel
  // lock moved when.)
  if (holders == 1) {
    SIMBA_LOG(kDebug, "host lock " << file_id_ << "/" << offset << " taken for mutex "
                                   << in_quotes(mutex) << ", contender " << in_quotes(contender));
  }
  Held& held = held_[mutex];
  held.claims.insert(contender);
  held.proving = holders == 1;
  return {held.proving ? Take::kNew : Take::kJoined, true};
}

void HostLocks::end_acquire(const std::string& mutex, const std::string& contender,
                            const Taken& taken, const std::optional<std::string>& owner) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find(mutex);
  if (it == held_.end()) return;
  if (taken.take == Take::kNew) it->second.proving = false;
  if (owner.has_value() ? *owner != contender : taken.claimed_now) {
    give_up_locked(mutex, contender);
  }
}

void HostLocks::give_up(const std::string& mutex, const std::string& contender) {
  std::lock_guard<std::mutex> lock(mu_);
  give_up_locked(mutex, contender);
}

void HostLocks::give_up_locked(const std::string& mutex, const std::string& contender) {
  auto it = held_.find(mutex);
  if (it == held_.end() || it->second.claims.erase(contender) == 0 || !it->second.claims.empty()) {
    return;
  }
  held_.erase(it);
  const std::int64_t offset = offset_of(mutex);
  auto holders = holders_of_offset_.find(offset);
  if (holders == holders_of_offset_.end() || --holders->second > 0) return;
  holders_of_offset_.erase(holders);
  SIMBA_LOG(kDebug, "host lock " << file_id_ << "/" << offset << " freed for mutex "
                                 << in_quotes(mutex) << ", contender " << in_quotes(contender));
  struct flock byte = byte_at(offset, F_UNLCK);
  ::fcntl(fd_, F_OFD_SETLK, &byte);
}

bool HostLocks::unheld(const std::string& mutex) {
  const std::int64_t offset = offset_of(mutex);
  std::lock_guard<std::mutex> lock(mu_);
  // (F_OFD_GETLK does not report this descriptor's own lock.)
  if (holders_of_offset_.count(offset) > 0) return false;
  struct flock byte = byte_at(offset, F_WRLCK);
  if (::fcntl(fd_, F_OFD_GETLK, &byte) != 0) return false;
  return byte.l_type == F_UNLCK;
}

}  // namespace simba::internal::sql::sqlite
