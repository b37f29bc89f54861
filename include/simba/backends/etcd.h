// File: simba/backends/etcd.h
//
// `etcd://host[:port][,host[:port]...]`: mutexes in an etcd v3 cluster
// (tested with Debian's etcd 3.4), spoken to through the JSON gateway that
// every etcd server serves under /v3/ (Debian ships no etcd C++ client, and
// gRPC stubs would need etcd's .proto files and their gogoproto and
// google.api imports, which Debian does not package).
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
// Calls (requests in one call are pipelined on one connection):
//   acquire_or_renew  grants the lease (its ID is chosen here, so the grant
//                     travels with the transaction that uses it) or keeps it
//                     alive, and in ONE transaction creates the key if it is
//                     missing and reads the lowest key and the key just below
//                     ours. Acquiring a free mutex: one round trip, two
//                     writes (grant, put). A waiter's poll: one round trip,
//                     no write. An owner's renewal: one keep-alive request,
//                     when the backend's watch has run without a break since
//                     the owner's last full check (its key is the lowest as
//                     long as it exists, and the watch reports any delete of
//                     it); otherwise keep-alive + transaction.
//   release           reads the lowest key and revokes the lease (which
//                     deletes the key): one round trip, one write.
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
// Connections: one request connection per backend (calls take turns; a call
// that misses its deadline closes it, so a late reply is never read as
// another call's; reconnects back off from 100 ms to 2 s and fail fast in
// between), and one watch connection read by one thread. 10,000 mutexes cost
// the same two connections and one thread. With several endpoints, a
// connection that cannot be made moves on to the next one, and so does one
// whose server answers "unavailable" (no leader, ...). Host names are
// resolved with getaddrinfo, which the deadline does not bound.
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
// User info (user:password@) is rejected: etcd authentication is not
// supported yet. TLS (https) is not supported either.
//
// Example:
//   auto backend = simba::open_backend("etcd://10.0.0.5:2379,10.0.0.6:2379");

#ifndef SIMBA_BACKENDS_ETCD_H_
#define SIMBA_BACKENDS_ETCD_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "simba/backend.h"
#include "simba/status.h"
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
};

// Creates the backend. It connects lazily, so a server that is down now
// makes calls fail with kUnavailable until it is back, rather than this.
// Errors (kInvalidArgument): no endpoints, an empty host, port 0, a
// non-positive connect_timeout or a bad key_prefix.
Result<std::shared_ptr<Backend>> new_etcd_backend(EtcdOptions options);

// etcd://host[:port][,host[:port]...][/][?query]; ports default to 2379.
// Errors (kInvalidArgument): another scheme, no host, user info, a path, an
// unknown query key or a bad value.
Result<EtcdOptions> etcd_options_from_uri(const Uri& uri);

}  // namespace simba

#endif  // SIMBA_BACKENDS_ETCD_H_
