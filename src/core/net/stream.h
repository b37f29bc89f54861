// Sockets for the backends that speak their store's protocol themselves
// (Redis, etcd) and the wake-ups of those that wait on a client library's
// socket (PostgreSQL, MySQL): every wait bounded by a deadline, and
// wakeable from another thread.
//
//   SIMBA_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream,
//                          connect_tcp(host, port, "redis at host:6379", deadline));
//   SIMBA_RETURN_IF_ERROR(stream->write_all(request, deadline));
//   SIMBA_ASSIGN_OR_RETURN(std::size_t n, stream->read_some(buffer, size, deadline));
//
// TLS (#22): connect_tcp() is the one place a connection to a store is made,
// and Stream the one type bytes go through. core/net/tls_stream.h wraps a
// connected Stream in TLS (start_tls: the handshake within the same
// deadline) and gives the protocol code the same write_all / read_some /
// shutdown, by overriding the two virtual calls. It is compiled into the
// backends that use it (OpenSSL is theirs, not simba_core's).
#ifndef SIMBA_CORE_NET_STREAM_H_
#define SIMBA_CORE_NET_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "simba/backend.h"
#include "simba/status.h"

namespace simba::internal {

enum class FdWait {
  kReady,     // the fd has one of the events (or an error to report)
  kWoken,     // the wake fd became readable first
  kTimedOut,  // the deadline passed first
  kFailed,    // poll() itself failed (errno says why)
};

// Waits until `fd` has one of `events`, `wake_fd` (ignored when < 0) is
// readable, or `deadline` passes. The wake fd is not drained.
FdWait wait_fd(int fd, short events, Deadline deadline, int wake_fd = -1);

// An eventfd another thread posts to, to wake a poll() of ours: how a
// stop_callback (on the canceller's thread, which must not wait on the
// network) hands a cancel to the thread that waits on a socket.
class WakeFd {
 public:
  WakeFd();
  ~WakeFd();
  WakeFd(const WakeFd&) = delete;
  WakeFd& operator=(const WakeFd&) = delete;

  // False when the kernel gave us no eventfd (out of descriptors).
  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // Makes fd() readable until drain(). Safe from any thread. (The names
  // are PostgreSQL's since before #21; the naming sweep renames them.)
  void post() const;
  void drain() const;

 private:
  int fd_;
};

// A connected non-blocking stream socket. Messages start with `context`
// ("redis at host:port"). A subclass may carry the bytes differently (TLS)
// by overriding write_all and read_some.
class Stream {
 public:
  Stream(int fd, std::string context);
  virtual ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Writes all of `bytes`. kDeadlineExceeded ("<context>: write timed
  // out"), kUnavailable ("<context>: write: <error>").
  virtual Status write_all(std::string_view bytes, Deadline deadline);
  // Waits for bytes and reads up to `size` of them: their count, 0 when the
  // peer closed. kDeadlineExceeded ("<context>: <what> timed out"),
  // kUnavailable (a failed read, or shutdown()).
  virtual Result<std::size_t> read_some(char* buffer, std::size_t size, Deadline deadline,
                                        std::string_view what = "reply");
  // Makes a read blocked in another thread return, and every later call
  // fail (the socket is shut down, whatever layer is above it). Thread-safe.
  void shutdown();

  // Waits until the socket has one of `events` (POLLIN, POLLOUT).
  // kDeadlineExceeded ("<context>: <what> timed out").
  Status wait(short events, Deadline deadline, std::string_view what) const;
  // kUnavailable "<context>: <what>: <strerror(error_number)>".
  Status fail(std::string_view what, int error_number) const;

  const std::string& context() const { return context_; }
  int fd() const { return fd_; }

  // Hands the socket over to a wrapper of this connection (a TlsStream):
  // this Stream no longer closes it, and must not be used any more.
  int release_fd();

 private:
  int fd_;
  const std::string context_;
};

// Connects to `host`:`port` by `deadline`: resolves it (core/host_lookup.h),
// then tries its addresses in order until one accepts. Sets TCP_NODELAY
// (lock traffic is small request/reply pairs), and with `tcp_keepalive`
// keep-alive probes after 15 s of silence, every 5 s, 3 unanswered ending
// the connection (a peer host gone without a reset is noticed in ~30 s).
// Errors, after "<context>: ": kUnavailable (cannot resolve, no address
// accepted: the last one's error), kDeadlineExceeded ("connect timed out").
Result<std::unique_ptr<Stream>> connect_tcp(const std::string& host, std::uint16_t port,
                                            const std::string& context, Deadline deadline,
                                            bool tcp_keepalive = false);

}  // namespace simba::internal

#endif  // SIMBA_CORE_NET_STREAM_H_
