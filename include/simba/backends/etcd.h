// File: simba/backends/etcd.h
//
// `etcd://[user:password@]host[:port][,host[:port]...][?query]`: mutexes in an etcd v3 cluster
// (tested with Debian's etcd 3.4), spoken to over etcd's v3 gRPC API (Debian's
// gRPC++ and protobuf, with a .proto of Simba's own that declares the calls
// it makes with etcd's package, method names and field numbers).
//
// A queue per mutex, like etcd's own election recipe: each contender that
// contends for mutex M has a lease L of its own (TTL: ttl + transition,
// rounded up to whole seconds; etcd may grant more, never less) and one key
//
//   <key_prefix>/<M>/<L as 16 hex digits>    value: the contender id
//
// attached to L. The owner of M is the key under `<key_prefix>/<M>/` with the
// lowest create revision, and that create revision is the fencing token: a
// renewal keeps it, and every later owner's key was created later, so its
// token is greater. `<key_prefix>/<M>` itself (no lease, empty value) records
// that M was used, so list() shows free mutexes too. In keys, '/' in M is
// written %2F and '%' is written %25, so one mutex's keys are never inside
// another's range (M = "a" and M = "a/b" stay apart; etcdctl shows
// `simba/a%2Fb/...`).
//
// Calls (each RPC with the call's deadline):
//   acquire_or_renew  grants the lease (its ID is chosen here, so the key can
//                     name it) or keeps it alive, and in ONE transaction
//                     creates the key if it is missing and reads the lowest
//                     key and the key just below ours. Acquiring a free
//                     mutex: two round trips (the grant, then the
//                     transaction), two writes. A waiter's poll: one round
//                     trip (the keep-alive travels with a read-only
//                     transaction when its key is known), no write. An
//                     owner's renewal: one keep-alive request, when the
//                     backend's watch has run without a break since the
//                     owner's last full check (its key is the lowest as
//                     long as it exists, and the watch reports any delete of
//                     it); otherwise keep-alive + transaction.
//   release           reads the lowest key, then revokes the lease (which
//                     deletes the key): two round trips, one write.
//   force_release     deletes the lowest key, whoever owns it; the floor is
//                     the revision of that delete.
//   read / list       the lowest key per mutex, with the remaining time of
//                     its lease (so `simba status` counts down truly; etcd
//                     keeps only the lease's length, so ttl_at is reported
//                     equal to transition_at).
//
// The lease is kept alive only by the calls of the contend service (the
// owner renews at ttl; a waiter polls a little before its own lease would
// end: its reply leaves the owner's times unknown and asks again by then,
// OwnerRecord::ask_again_at), never by a timer of its own: a process that stops calling loses its
// place when its lease ends, ttl + transition after its last call was sent
// (plus up to ~0.5 s until etcd's lessor notices).
//
// Hand-off: one watch per backend on the whole `<key_prefix>/` range tells
// each waiting contender when the key it queues behind is deleted (its
// predecessor: released, expired, revoked, forced). A release therefore
// wakes exactly one waiter, in FIFO order across processes, and no herd.
// An owner whose key is deleted under it (its lease revoked or expired, a
// forced release) is told at once (MutexEvent::kLost) instead of at its next
// renewal. After a watch reconnect every subscriber is woken once. The
// watch starts with the first subscribe; a contender's first call waits for
// it (at most connect_timeout, once per backend) so that it covers the
// call's decision from the start.
//
// Connections: one gRPC channel (one connection, to one endpoint) for
// requests per backend (calls take turns; a call that fails on an endpoint
// for a transient reason -- refused, reset, "no leader", "leader changed",
// "request timed out", no answer within its attempt -- drops the channel
// and is made again on the next endpoint in URI order within its deadline:
// with several endpoints each attempt gets half the time left, 0.25-1 s,
// and a pause of 50-500 ms follows every round of failures; when no
// endpoint accepts a connection the call fails at once; reconnects back off
// from 100 ms to 2 s), and one for the watch stream, read by one thread.
// Calls and the watch carry etcd's require-leader metadata, so a member
// without a leader refuses them at once (docs/backends/etcd.md, "Replicated
// deployment"). 10,000 mutexes cost the same two
// connections and one thread of the backend's own; gRPC's library adds
// threads of its own (7-8 per process with Debian's gRPC 1.51, shared by
// every backend; docs/backends/etcd.md). With several endpoints, a
// connection that cannot be made moves on to the next one, and so does one
// whose server answers "unavailable" (no leader, ...). Host names are
// resolved by gRPC's resolver, within the connect deadline.
//
// Names: both at most 512 bytes of UTF-8 without control characters (the
// default rules); '/' in a mutex name is escaped as above. Contender ids must
// be unique (the default ids are): a key of this contender id that holds the
// mutex but is not this backend's own is taken for a stale one and deleted.
//
// URI query keys:
//   key_prefix        first part of every key (default simba;
//                     A-Z a-z 0-9 _ - . : only, 1 to 128 characters)
//   connect_timeout   bound on connecting, per attempt (default 3s)
//   password_file     the password, from the first line of this file
//                     (instead of user:password@)
//   tls, tls_ca, tls_cert, tls_key, tls_server_name
//                     TLS as simba/tls.h spells it (on when any tls_* key
//                     is given). verify: grpc::SslCredentials (chain and
//                     host name). on: the chain only (gRPC's experimental
//                     TLS credentials with a no-op name verifier).
//
// Authentication: with user:password@ (or password_file=), the backend
// calls etcd's Auth.Authenticate and sends the token it gets as the "token"
// metadata of every call and stream; a token etcd calls invalid (expired:
// --auth-token-ttl) is replaced by a new one within the same call. A wrong
// user or password is kPermissionDenied "etcd at HOST:PORT: authentication
// failed (user 'U'): ...". A server without auth enabled is used without a
// token. The password and the token never appear in errors, logs or
// Capabilities; Capabilities::transport says "plain text" or "TLS (verify)"
// etc. (TlsOptions::describe). Without TLS the password travels in the
// clear, as etcd allows.
//
// Example:
//   auto backend = simba::open_backend("etcd://10.0.0.5:2379,10.0.0.6:2379");
//   auto secured = simba::open_backend(
//       "etcd://simba@etcd.example:2379?password_file=/run/secrets/etcd&"
//       "tls_ca=/etc/ssl/etcd-ca.pem");

#ifndef SIMBA_BACKENDS_ETCD_H_
#define SIMBA_BACKENDS_ETCD_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "simba/backend.h"
#include "simba/status.h"
#include "simba/tls.h"
#include "simba/uri.h"

namespace simba {

struct EtcdEndpoint {
  // Host name or address. Must not be empty.
  std::string host = "127.0.0.1";
  // Client port. Default: 2379.
  std::uint16_t port = 2379;
};

struct EtcdOptions {
  // The cluster's client endpoints, tried in order. Default: 127.0.0.1:2379.
  std::vector<EtcdEndpoint> endpoints = {EtcdEndpoint{}};
  // Bound on connecting to one endpoint, per attempt. Default: 3 s.
  std::chrono::milliseconds connect_timeout{3000};
  // The first part of every key; another prefix keeps separate applications
  // (or test runs) on one cluster apart. Default: "simba".
  std::string key_prefix = "simba";
  // TLS (simba/tls.h). Default: off (plain text).
  TlsOptions tls;
  // etcd authentication: a user and its password (both or neither).
  // Default: none.
  std::string user;
  std::string password;
};

// Creates the backend. It connects lazily, so a server that is down now
// makes calls fail with kUnavailable until it is back, rather than this.
// Errors (kInvalidArgument): no endpoints, an empty host, port 0, a
// non-positive connect_timeout, a bad key_prefix, bad TLS options
// (TlsOptions::validate) or a user without a password (or the reverse).
Result<std::shared_ptr<Backend>> new_etcd_backend(EtcdOptions options);

// etcd://[user:password@]host[:port][,host[:port]...][/][?query]; ports
// default to 2379. Errors (kInvalidArgument): another scheme, no host, a
// path, an unknown query key, a bad value, a password both in the URI and
// in password_file, an unreadable password_file.
Result<EtcdOptions> etcd_options_from_uri(const Uri& uri);

}  // namespace simba

#endif  // SIMBA_BACKENDS_ETCD_H_
