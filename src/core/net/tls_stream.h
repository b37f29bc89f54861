// TLS over a connected Stream (core/net/stream.h), written over OpenSSL for
// the backends that speak their store's protocol themselves: hiredis 0.14
// (Debian 12) has no TLS, so the Redis backend's socket is ours and so is its
// TLS. Generic: a store's protocol code sees the same Stream either way.
//
//   SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<const TlsContext> tls,
//                          TlsContext::create(options.tls, "redis"));  // once
//   ...
//   SIMBA_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream,
//                          connect_tcp(host, port, "redis at host:6379", deadline));
//   SIMBA_ASSIGN_OR_RETURN(stream, start_tls(std::move(stream), *tls, host, deadline));
//
// Verification follows simba::TlsOptions (simba/tls.h): `on` checks the
// server's chain against tls_ca (or the system's CAs); `verify` also its
// name, the host connected to (an address is matched against the
// certificate's IP names) or tls_server_name. SNI is tls_server_name, or the
// host when it is a name. A client certificate (tls_cert, tls_key) is sent
// when the server asks. TLS 1.2 or newer.
//
// Compiled into the backends that use it (OpenSSL is theirs, not
// simba_core's): CMake's simba_add_library(... SOURCES core/net/tls_stream.cc
// PRIVATE_LIBS OpenSSL::SSL).
#ifndef SIMBA_CORE_NET_TLS_STREAM_H_
#define SIMBA_CORE_NET_TLS_STREAM_H_

#include <memory>
#include <string>
#include <string_view>

#include "core/net/stream.h"
#include "simba/backend.h"
#include "simba/status.h"
#include "simba/tls.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace simba::internal {

// The CAs to trust and the client certificate, loaded once for every
// connection of a store. Thread-safe (immutable once made).
class TlsContext {
 public:
  // Loads tls_ca (or the system's default CA paths), tls_cert and tls_key.
  // Errors (kInvalidArgument), after "<store>: ": a file OpenSSL cannot read
  // as PEM, a key that does not match the certificate. The path is named,
  // never the file's contents.
  static Result<std::shared_ptr<const TlsContext>> create(const TlsOptions& options,
                                                          std::string_view store);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  const TlsOptions& options() const { return options_; }
  ssl_ctx_st* native() const { return ctx_; }

 private:
  TlsContext(TlsOptions options, ssl_ctx_st* ctx);

  const TlsOptions options_;
  ssl_ctx_st* const ctx_;
};

// Runs the TLS handshake with the server at `host` over `stream` by
// `deadline` and returns the encrypted stream (the same context in its
// messages). Errors, after "<context>: TLS handshake: ": kPermissionDenied
// when verification failed (is_verification_failure: "certificate verify
// failed: certificate has expired", a host-name mismatch, the server's
// alert refusing our certificate), which no retry can fix; kUnavailable
// for the rest ("wrong version number (is the server serving TLS on this
// port?)", the server closed the connection, ...); kDeadlineExceeded
// ("<context>: TLS handshake timed out").
//
// The stream's write_all and read_some may be called from two threads at
// once (one reading, one writing): calls into OpenSSL take turns on a mutex,
// never held while waiting for the socket. A server that refuses our client
// certificate (or its absence) after the handshake is reported by the first
// read, or by a write that finds the connection reset (the alert is read
// then): kPermissionDenied "<context>: read: TLS: tlsv13 alert certificate
// required ...". Other read and write failures are kUnavailable.
Result<std::unique_ptr<Stream>> start_tls(std::unique_ptr<Stream> stream, const TlsContext& tls,
                                          const std::string& host, Deadline deadline);

// Whether a TLS failure is a verification failure, permanent until someone
// changes a certificate or an option: our check of the server's certificate
// failed (`verify_result`, SSL_get_verify_result, is not X509_V_OK: the
// chain, its dates, a host-name mismatch), or the server refused ours by a
// fatal alert (`openssl_error`, ERR_peek_error's code: bad_certificate,
// unknown_ca, certificate_required, certificate_unknown,
// unsupported_certificate, certificate_expired, certificate_revoked,
// access_denied, decrypt_error). OpenSSL reports an alert it received as
// reason SSL_AD_REASON_OFFSET + the alert's number, never used for a
// failure of its own, so these are the server's words. Anything else (a
// reset, a plain-text server, an unknown error) is not.
bool is_verification_failure(unsigned long openssl_error,  // NOLINT(google-runtime-int)
                             long verify_result);          // NOLINT(google-runtime-int)

}  // namespace simba::internal

#endif  // SIMBA_CORE_NET_TLS_STREAM_H_
