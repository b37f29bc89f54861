// The etcd backend's transport: etcd's own v3 gRPC API (etcd.proto, kv.proto
// in this folder, compiled at build time), over Debian's gRPC++.
//
// What is here: the channel to one endpoint (open_channel: plain text or
// TLS), waiting for it to connect within a deadline (wait_connected), etcd
// authentication (Auth: a user's token, sent as the "token" metadata of
// every call), and the Status for a failed call (error_status). The calls
// themselves, with a gRPC deadline each, are made by etcd_backend.cc.
//
// Each channel has its own connection (a local subchannel pool), so the
// backend's calls and its watch never share one, and leaving an endpoint
// (dropping its channel) closes exactly that connection.

#ifndef SIMBA_BACKENDS_ETCD_ETCD_CLIENT_H_
#define SIMBA_BACKENDS_ETCD_ETCD_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "backends/etcd/etcd.grpc.pb.h"
#include "simba/backend.h"
#include "simba/status.h"
#include "simba/tls.h"

namespace simba::internal::etcd {

struct Endpoint {
  std::string host;
  int port = 2379;
  // "host:port" (IPv6 in brackets), for messages.
  std::string describe() const;
};

// A channel to `endpoint` (not yet connected: see wait_connected).
// `keepalive` makes it ping the server while a call is open (30 s, with
// 10 s to answer), so a long-lived watch notices a peer that vanished
// without a reset.
//
// `tls` (simba/tls.h): off is plain text. verify is grpc::SslCredentials:
// the server's chain must lead to tls_ca (or the system's CAs) and its
// certificate must name the host (or tls_server_name, which is also sent as
// SNI: GRPC_SSL_TARGET_NAME_OVERRIDE_ARG). on is gRPC's TLS credentials
// (grpc::experimental, gRPC 1.51) with the chain verified against the same
// roots but no name check (NoOpCertificateVerifier, no per-call host
// check). tls_cert + tls_key are the client certificate. The PEM files are
// read here, at every (re)connect, so renewed files are picked up; an
// unreadable one is kInvalidArgument naming its option and path (never its
// contents).
Result<std::shared_ptr<grpc::Channel>> open_channel(const Endpoint& endpoint, bool keepalive,
                                                    const TlsOptions& tls);

// Connects `channel` (to `endpoint`) by `deadline`. Errors name the
// endpoint: kPermissionDenied when TLS verification failed
// (is_tls_verification_failure), kUnavailable when the connection failed
// otherwise (with gRPC's cause), kDeadlineExceeded when it was not up by
// then.
Status wait_connected(grpc::Channel& channel, const Endpoint& endpoint, Deadline deadline);

// etcd's authentication: user and password (for an empty user, none)
// exchanged for a token (Auth.Authenticate) that every call carries as its
// "token" metadata. One token per backend, shared by its channels (etcd
// keeps simple tokens cluster-wide; JWT tokens are valid on every member);
// a call answered "invalid auth token" (the token expired: etcd's
// --auth-token-ttl) forgets it, and the next call authenticates again.
// A server without auth enabled answers Authenticate with "authentication
// is not enabled": the calls then go without a token, as etcd's own Go
// client does. Thread-safe. The password and the token never appear in
// errors.
class Auth {
 public:
  Auth(std::string user, std::string password)
      : user_(std::move(user)), password_(std::move(password)) {}

  bool enabled() const { return !user_.empty(); }

  // Adds the token to `context` and returns it, authenticating on
  // `channel` (to `endpoint`) by `deadline` first if there is no token yet.
  // Errors name the endpoint: kPermissionDenied "etcd at HOST:PORT:
  // authentication failed: ..." for a wrong user or password; transport
  // failures as error_status says (so the caller may try another endpoint).
  Result<std::string> authorize(grpc::ClientContext& context, grpc::Channel& channel,
                                const Endpoint& endpoint, Deadline deadline);

  // A call that carried `token` was refused with `status`: true if that
  // was the token (expired or revoked), which is forgotten then, so that
  // the call can be made once more with a new one.
  bool refused_token(const std::string& token, const grpc::Status& status);

  // Forgets `token` if it is still the current one.
  void forget(const std::string& token);

 private:
  const std::string user_;
  const std::string password_;
  std::mutex mu_;
  bool have_token_ = false;  // token_ is valid ("" when the server has no auth)
  std::string token_;
};

// True if `status` is etcd's answer to a token that is no longer valid
// ("invalid auth token", or "revision of auth store is old").
bool is_invalid_token(const grpc::Status& status);

// What a failed connection's gRPC message `message` (made with `tls`)
// most likely means, as " (...)" to append, or "": gRPC says "certificate
// verify failed" for a wrong CA as for an expired certificate, and "Socket
// closed" for a server that hung up on the handshake for whatever reason.
std::string transport_hint(std::string_view message, const TlsOptions& tls);

// Whether gRPC's message for a failed connection (or for a call on a
// channel that could not connect) says TLS verification failed, which no
// retry fixes. gRPC keeps the handshake's error in the channel's status
// ("failed to connect to all addresses; last error: ...: Ssl handshake
// failed: SSL_ERROR_SSL: error:0A000086:SSL routines::certificate verify
// failed"), and says so itself for a name: OpenSSL's "certificate verify
// failed" (BoringSSL's CERTIFICATE_VERIFY_FAILED), gRPC's "Peer name NAME is
// not in peer certificate", or the alert by which the server refused our
// certificate in the handshake ("sslv3 alert bad certificate", "tlsv1
// alert unknown ca", "tlsv13 alert certificate required", ...). Not a
// client certificate refused after a TLS 1.3 handshake: gRPC then says only
// that the connection closed ("Socket closed", "Endpoint read failed"), as
// for any server that hangs up, so that stays transient.
bool is_tls_verification_failure(std::string_view message);

// A Deadline (steady clock) as gRPC takes it (the system clock: the only
// clock its C++ API accepts), for deadlines set just before they are used.
std::chrono::system_clock::time_point grpc_deadline(Deadline deadline);

// etcd's range end for every key that starts with `prefix` (the prefix with
// its last byte incremented, dropping trailing 0xff bytes).
std::string prefix_end(std::string_view prefix);

// The Status for a call that failed with gRPC status `grpc_code`:
// transient codes (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, ABORTED,
// RESOURCE_EXHAUSTED such as "too many requests", UNKNOWN/INTERNAL such as
// "leader changed", and FAILED_PRECONDITION "not leader") are kUnavailable,
// but UNAVAILABLE for a failed TLS verification (is_tls_verification_failure)
// is kPermissionDenied; RESOURCE_EXHAUSTED "mvcc: database space exceeded"
// (etcd's NOSPACE alarm, raised until an operator compacts, defragments
// and disarms it) is kFailedPrecondition, with that hint;
// UNAUTHENTICATED and PERMISSION_DENIED kPermissionDenied; INVALID_ARGUMENT
// and OUT_OF_RANGE kInvalidArgument; NOT_FOUND, other FAILED_PRECONDITION
// and others kInternal. The message is "<context>: <message>".
Status error_status(int grpc_code, std::string_view message, std::string_view context);
// The same for a gRPC status (not OK) of a call to `endpoint`, except that
// DEADLINE_EXCEEDED (the call's own deadline) is kDeadlineExceeded.
Status error_status(const grpc::Status& status, const Endpoint& endpoint, std::string_view context);

}  // namespace simba::internal::etcd

#endif  // SIMBA_BACKENDS_ETCD_ETCD_CLIENT_H_
