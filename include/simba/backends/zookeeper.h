// File: simba/backends/zookeeper.h
//
// `zookeeper://host:port[,host:port...][/chroot]`: mutexes as elections in a
// ZooKeeper ensemble (3.5 or newer; tested with Debian's 3.8), shaped like
// Curator's LeaderLatch so C++ contenders and JVM Simba contenders can share
// an election.
//
// Layout for mutex M (under `root`, default /simba, JVM Simba's):
//   /simba/M                      a container node (created when missing;
//                                 the server removes it once it is empty)
//   /simba/M/_c_<uuid>-latch-<n>  one ephemeral sequential node per
//                                 contender, data = the contender id. This
//                                 is Curator's protected name: the uuid lets
//                                 a contender find its node again when the
//                                 connection broke while it was created.
// The contender with the lowest <n> owns the mutex; each waiter watches
// only the node just before its own (no herd when the owner leaves), and
// everybody knows who owns it (the data of the lowest node).
//
// Fencing: a token is the owner node's creation zxid (czxid). Owners are
// served in node order, which is zxid order, so tokens grow with every new
// owner; a renewal keeps the token; a restart of the ensemble raises the
// zxid epoch.
//
// Leases on top of sessions. A session ends when its process dies, so a
// crashed owner's node disappears when its session times out. But a process
// whose client library still heartbeats while the code that should renew is
// stuck would hold a session lock forever; Simba's leases end it anyway.
// Each session keeps a heartbeat node, <root>-sessions/<session id>, that
// Simba's calls rewrite at most once per half ttl (one write per process,
// however many mutexes it holds); a C++ node's uuid is a version-8 UUID
// carrying its ttl and transition (ms). A waiter evicts the lowest node
// once its session's heartbeat is older than that node's ttl + transition
// by the server's clock (estimated conservatively from the times of our
// own writes), in one transaction that also checks the heartbeat's version,
// so a heartbeat written meanwhile wins. The owner's lease runs from when
// it sent the heartbeat, so it ends before anyone may evict it. JVM
// (Curator) nodes carry random version-4 UUIDs and are never evicted: their
// session is their lease, as in JVM Simba. A C++ node without a heartbeat is
// judged by its own writes (a lowest node never written gets a whole lease
// from when a waiter first saw it in front).
//
// Loss signals: when the connection drops (Curator's SUSPENDED) the client
// moves the session to another member of the ensemble; owners keep their
// hold meanwhile, but no longer than 2/3 of the session timeout after the
// servers last heard from the session (a keepalive read every third of the
// timeout keeps that recent) nor past their lease: then every owner on this
// backend is told (MutexEvent::kLost) and stops believing it owns its
// mutex until a renewal succeeds again. A call that loses its connection
// tries again once reconnected, within its deadline. When the session
// expires, every node of this backend is gone, owners are told, and the
// next call opens a new session and enters the elections again. A create
// whose reply is lost is found again by its protected name (after a sync,
// so a member that has not caught up yet cannot hide it). An owner also
// watches its own node, so a forced release or an eviction reaches it at
// once.
//
// Calls: the client's asynchronous API, so every call has a deadline even
// though the library itself would wait for a session timeout; requests of
// one call are pipelined (an acquisition of a free mutex is the creation of
// the node and a read of the children, sent together: one round trip).
// Watchers and completions run on the client's completion thread, which
// only records results and hands events to listeners (which must not
// block). One session (one connection, the client's two threads) per
// backend, shared by every mutex.
//
// Forced release: deletes every node of the mutex (the owner's and the
// queue's) in one transaction, so every later owner has a node created
// after it; the fencing floor is that transaction's zxid. Waiters enter the
// queue again at once.
//
// Names: a mutex must not contain '/' and must not be "." or ".."; at most
// 512 bytes. The contender id is the node's data (at most 512 bytes).
//
// Authentication and ACLs: with a user (zookeeper://user:password@hosts, or
// the password from password_file=PATH) the session authenticates with
// ZooKeeper's digest scheme (zoo_add_auth "digest" "user:password", sent
// again by the client on every reconnection) before any call uses it, and
// every node Simba creates (the root's components it makes, the mutex nodes,
// the participants, the heartbeats) gets the ACL "all permissions for the
// creating user" (the `auth` scheme) plus, with read_acl=anyone, read
// permission for everyone. Two backends with the same user share elections
// as before; another user (or none) can neither join, nor delete, nor write
// them, nor (read_acl=creator, the default) read them. Nodes that exist
// already keep their ACL. Without a user every node is open
// (ZOO_OPEN_ACL_UNSAFE), as before. ZooKeeper's digest scheme accepts any
// password when the session authenticates: a wrong one shows when the nodes
// refuse it (ZNOAUTH), and is reported as an authentication failure.
//
// TLS: not available. Debian's C client (libzookeeper-mt 3.8) is built
// without OpenSSL (no zookeeper_init_ssl), so tls=on|verify and the tls_*
// keys are refused; tls=off is accepted. Capabilities::transport is
// "plain text".
//
// URI query keys:
//   password_file    the password, from the file's first line (with a user)
//   read_acl         creator (default) or anyone: who may read our nodes
//                    (with a user only)
//   tls              off only (see above)
//   root             the parent of every mutex node (default /simba)
//   session_timeout  asked of the server (default 10s; the server clamps it
//                    to [2, 20] x its tickTime)
//   connect_timeout  how long a call waits for a session before failing
//                    with kUnavailable (default 3s, and never past the call's
//                    deadline)
//
// Example:
//   auto backend = simba::open_backend("zookeeper://zk1:2181,zk2:2181/apps");

#ifndef SIMBA_BACKENDS_ZOOKEEPER_H_
#define SIMBA_BACKENDS_ZOOKEEPER_H_

#include <chrono>
#include <memory>
#include <string>

#include "simba/backend.h"
#include "simba/status.h"
#include "simba/tls.h"
#include "simba/uri.h"

namespace simba {

struct ZookeeperOptions {
  // "host:port,host:port[/chroot]", as the ZooKeeper C client takes it.
  std::string connect_string = "127.0.0.1:2181";
  // Absolute path, no trailing '/'.
  std::string root = "/simba";
  std::chrono::milliseconds session_timeout{10000};
  std::chrono::milliseconds connect_timeout{3000};
  // Digest authentication: empty user, none (and every node open). With a
  // user the password must not be empty; the user must not contain ':'.
  std::string user;
  std::string password;
  // Who may read the nodes Simba creates when a user is given: only that
  // user (kCreator), or everyone (kAnyone; still nobody else may change or
  // delete them).
  enum class ReadAcl { kCreator, kAnyone };
  ReadAcl read_acl = ReadAcl::kCreator;
  // Must stay off: the C client has no TLS (see above).
  TlsOptions tls;
};

// Creates the backend. It connects lazily, so an ensemble that is down now
// makes calls fail with kUnavailable until it is back, rather than this.
// Errors (kInvalidArgument): an empty connect string, a bad root, a
// non-positive timeout, a user without a password (or with ':'), TLS.
Result<std::shared_ptr<Backend>> new_zookeeper_backend(ZookeeperOptions options);

// zookeeper://[user[:password]@]host[:port][,host[:port]...][/chroot][?query];
// ports default to 2181. Errors (kInvalidArgument): another scheme, no host,
// a user without a password (in the URI or password_file), an unknown query
// key or a bad value, TLS. Errors never show the password.
Result<ZookeeperOptions> zookeeper_options_from_uri(const Uri& uri);

}  // namespace simba

#endif  // SIMBA_BACKENDS_ZOOKEEPER_H_
