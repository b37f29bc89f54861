// File: simba/backends/redis.h
//
// `redis://[user:password@]host:port[/db]` (`rediss://` for TLS): mutexes
// in a Redis server (5 or newer; tested with Debian's 7.0), wire-compatible
// with JVM Simba's Redis backend so C++ and JVM contenders can share a
// mutex.
//
// Keys for mutex M (the braces are a Redis Cluster hash tag: all of a mutex's
// keys live in one slot):
//   simba:{M}             the lock: a string holding the owner's id, with
//                         PX = ttl + transition (JVM Simba's layout)
//   simba:{M}:contender   the wait queue: a sorted set of contender ids
//                         scored by the server time (seconds) they joined
//   simba:{M}:fence       a hash: the fencing counter and the owner it was
//                         issued to (C++ only; JVM Simba never reads it)
// Channels: `simba:{M}` carries `acquired@@<id>` to everyone;
// `simba:{M}:<id>` carries `released@@<by>` to the one waiter woken by a
// release; `simba:{M}:@@released` carries every release to retrievers.
//
// Every store call is one Lua script that declares the keys it touches and
// decides by the server's clock. Acquiring takes one round trip.
//
// Hand-off: a release wakes the oldest waiter that is still listening
// (PUBLISH reports how many received it); waiters that died, and the
// releaser itself, are dropped from the queue on the way, and each failed
// acquisition also drops the queue's oldest entries if nobody listens on their
// channel any more, so the queue does not grow across crashes. When the
// server publishes key expiry events (notify-keyspace-events contains E and
// x, or A), a crashed owner's expiry wakes the waiters at once; otherwise they
// find it at their next poll.
//
// Fencing: a token is max(previous token + 1, server time in microseconds).
// It grows with every acquisition and also across a server restart that lost
// all data (as long as the server's clock does not step back).
//
// Restart guard: a server without durable writes (anything but
// `appendonly yes` with `appendfsync always`) forgets leases when it
// restarts, and a new owner could then overlap one that still holds its
// lease. So for ttl + transition after such a server starts (by its uptime),
// nobody acquires a free mutex: acquire_or_renew fails with kUnavailable and
// the caller retries. `restart_guard=off` in the URI turns this off.
//
// Connections: one command connection and one subscriber connection per
// backend (so per factory), shared by every mutex, plus one thread that reads
// the subscriber connection. Both reconnect with backoff (from 100 ms to
// 2 s); subscriptions are renewed after a reconnect and every subscriber is
// then woken once, since events may have been missed. subscribe() does not
// wait for the server; a subscription is woken once when the server
// confirms it, for the same reason. Calls take turns on
// the command connection; a call that misses its deadline closes it (a late
// reply must never be read as another call's), and the next call reconnects.
//
// Names: the mutex must not contain '{', '}' or "@@" and the contender id
// must not contain "@@" (JVM Simba's delimiters); both at most 512 bytes.
//
// TLS and authentication: `rediss://` is TLS with the server's certificate
// and name verified (tls=verify); `redis://...?tls=on|verify` too. The keys
// tls, tls_ca, tls_cert, tls_key and tls_server_name are simba/tls.h's.
// TLS is Simba's own (core/net/tls_stream.h, over OpenSSL): hiredis 0.14 has
// none. `user:password@` sends `AUTH user password` (a Redis 6 ACL user);
// `:password@` sends `AUTH password` (the default user, or requirepass).
// Both connections (commands and pub/sub) use the same TLS and AUTH.
//
// Redis Sentinel: `redis-sentinel://[user:password@]h1:p1,h2:p2,.../master[/db]`
// finds the primary of `master` by asking the sentinels in turn
// (SENTINEL get-master-addr-by-name, then ROLE on the node it names), follows
// `+switch-master` on a sentinel, and looks again after a lost connection or
// a READONLY reply. A failover is treated like a restart of a non-durable
// server: no new lease until every lease the old primary may have granted
// has ended (ttl + transition after the first call that meets the new
// primary; the term is the primary's master_replid, kept in
// `<prefix>:@@term`). `min_replicas=N` waits for N replicas to acknowledge
// every acquisition and renewal (WAIT). Extra query keys:
// sentinel_password, min_replicas, min_replicas_timeout.
//
// URI query keys:
//   tls, tls_ca, tls_cert, tls_key, tls_server_name   see above
//   password_file     a file whose first line is the password (instead of
//                     one in the URI)
//   connect_timeout   bound on connecting, per attempt (default 3s)
//   restart_guard     on|off (default on), see above
//   keyspace_events   auto|off (default auto: use expiry events when the
//                     server publishes them)
//   key_prefix        replaces "simba" in every key and channel name
//                     (default simba, JVM Simba's; A-Z a-z 0-9 _ - . :)
//
// Examples:
//   auto backend = simba::open_backend("redis://:secret@10.0.0.5:6379/2");
//   auto tls = simba::open_backend(
//       "rediss://app:secret@redis.internal:6380?tls_ca=/etc/ssl/redis-ca.pem");

#ifndef SIMBA_BACKENDS_REDIS_H_
#define SIMBA_BACKENDS_REDIS_H_

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

struct RedisOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 6379;
  // ACL user (Redis 6+); empty means the default user.
  std::string user;
  // Empty means no AUTH.
  std::string password;
  // Logical database (SELECT), >= 0.
  int database = 0;
  // TLS (simba/tls.h); off by default, verify for rediss://.
  TlsOptions tls;
  std::chrono::milliseconds connect_timeout{3000};
  bool restart_guard = true;
  bool keyspace_events = true;
  // The first part of every key and channel name. JVM Simba uses "simba";
  // another prefix keeps separate applications (or test runs) on one server
  // apart, at the price of JVM compatibility.
  std::string key_prefix = "simba";

  // Redis Sentinel (redis-sentinel://h1:p1,h2:p2/master-name): when
  // `sentinels` is not empty, `host` and `port` are ignored and the data
  // node is the primary the sentinels name for `master_name` (checked with
  // ROLE, found again after a failover). user, password, database and tls
  // apply to the data nodes; tls also to the sentinels.
  struct SentinelAddress {
    std::string host;
    std::uint16_t port = 26379;
  };
  std::vector<SentinelAddress> sentinels;
  std::string master_name;
  // AUTH for the sentinels (`requirepass` in sentinel.conf); empty: none.
  std::string sentinel_password;
  // Redis Cluster (redis-cluster://h1:p1,h2:p2,...): when `cluster_nodes`
  // is not empty, `host`, `port` and `sentinels` are ignored; these nodes
  // are asked for the slot map (CLUSTER SLOTS), and every call goes to the
  // primary serving the mutex's slot (all of a mutex's keys are in one
  // slot: simba:{M}...), following MOVED and ASK. Messages go by sharded
  // pub/sub (SPUBLISH/SSUBSCRIBE, Redis 7), one subscriber connection per
  // shard; keyspace events are not used. A node promoted from a replica
  // grants no new lease on a mutex for ttl + transition from its first use
  // there (the failover guard, per mutex in its fence hash). database must
  // be 0. user, password and tls apply to every node.
  struct NodeAddress {
    std::string host;
    std::uint16_t port = 6379;
  };
  std::vector<NodeAddress> cluster_nodes;
  // After each acquisition or renewal, `WAIT min_replicas` for at most
  // min_replicas_timeout: a write fewer replicas acknowledged is not counted
  // (an acquisition is released again and reported kUnavailable). 0: off.
  int min_replicas = 0;
  std::chrono::milliseconds min_replicas_timeout{500};
};

// Creates the backend. It connects lazily, so a server that is down now
// makes calls fail with kUnavailable until it is back, rather than this.
// Errors (kInvalidArgument): an empty host, port 0, a negative database, a
// non-positive connect_timeout, a bad key_prefix, TLS options that do not
// validate or files OpenSSL cannot load (named by path, never shown).
Result<std::shared_ptr<Backend>> new_redis_backend(RedisOptions options);

// redis://[user:password@]host[:port][/db][?query], or rediss:// (TLS); the
// port defaults to 6379 and the database to 0. redis-sentinel:// and
// rediss-sentinel:// name sentinels and a master; redis-cluster:// and
// rediss-cluster:// name cluster nodes (host:port,...; no database). Errors (kInvalidArgument):
// another scheme, several hosts, a path that is not a database number, an
// unknown query key, a bad value, a password both in the URI and in
// password_file, or a password_file that cannot be read.
Result<RedisOptions> redis_options_from_uri(const Uri& uri);

}  // namespace simba

#endif  // SIMBA_BACKENDS_REDIS_H_
