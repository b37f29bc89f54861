#include "core/net/tls_stream.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <utility>

namespace simba::internal {
namespace {

// ---- a BIO over our non-blocking socket --------------------------------------------
// OpenSSL's own socket BIO writes with write(), which raises SIGPIPE when
// the server has gone; a library must not change the process's signals, so
// ours sends with MSG_NOSIGNAL, as Stream does.

int socket_of(BIO* bio) {
  return static_cast<int>(reinterpret_cast<std::intptr_t>(BIO_get_data(bio)));
}

int bio_write(BIO* bio, const char* data, int length) {
  BIO_clear_retry_flags(bio);
  ssize_t n;
  do {
    n = ::send(socket_of(bio), data, static_cast<std::size_t>(length), MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) BIO_set_retry_write(bio);
  return static_cast<int>(n);
}

int bio_read(BIO* bio, char* data, int length) {
  BIO_clear_retry_flags(bio);
  ssize_t n;
  do {
    n = ::recv(socket_of(bio), data, static_cast<std::size_t>(length), 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) BIO_set_retry_read(bio);
  return static_cast<int>(n);
}

long bio_ctrl(BIO*, int command, long, void*) {  // NOLINT(google-runtime-int): OpenSSL's type
  return command == BIO_CTRL_FLUSH ? 1 : 0;
}

BIO_METHOD* socket_method() {
  static BIO_METHOD* const kMethod = [] {
    BIO_METHOD* method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "simba socket");
    if (method == nullptr) return method;
    BIO_meth_set_write(method, bio_write);
    BIO_meth_set_read(method, bio_read);
    BIO_meth_set_ctrl(method, bio_ctrl);
    return method;
  }();
  return kMethod;
}

// ---- errors ------------------------------------------------------------------------

// The oldest error OpenSSL queued on this thread ("wrong version number"),
// and a hint for the reasons a user can act on. Clears the queue.
std::string take_openssl_error() {
  const unsigned long error = ERR_get_error();  // NOLINT(google-runtime-int): OpenSSL's type
  ERR_clear_error();
  if (error == 0) return "unknown TLS error";
  std::string text;
  if (const char* reason = ERR_reason_error_string(error); reason != nullptr) {
    text = reason;
  } else {
    char buffer[256];
    ERR_error_string_n(error, buffer, sizeof buffer);
    text = buffer;
  }
  if (ERR_GET_LIB(error) == ERR_LIB_SSL) {
    switch (ERR_GET_REASON(error)) {
      case SSL_R_WRONG_VERSION_NUMBER:
      case SSL_R_PACKET_LENGTH_TOO_LONG:
        text += " (is the server serving TLS on this port?)";
        break;
      case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
        text += " (the server wants a client certificate: tls_cert and tls_key)";
        break;
      case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
      case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
        text += " (the server refused our client certificate)";
        break;
      default:
        break;
    }
  }
  return text;
}

// kPermissionDenied for a verification failure, which trying again cannot
// fix; kUnavailable for the rest.
Status tls_failure(bool verification, std::string message) {
  return verification ? permission_denied_error(std::move(message))
                      : unavailable_error(std::move(message));
}

bool is_ip_literal(const std::string& host) {
  in6_addr address{};
  return ::inet_pton(AF_INET, host.c_str(), &address) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), &address) == 1;
}

// ---- the stream ----------------------------------------------------------------------

class TlsStream final : public Stream {
 public:
  TlsStream(std::unique_ptr<Stream> plain, SSL* ssl)
      : Stream(plain->release_fd(), plain->context()), ssl_(ssl) {}

  ~TlsStream() override {
    // A close_notify, if the connection is still sound; never waits.
    if (!failed_) (void)SSL_shutdown(ssl_);
    SSL_free(ssl_);
  }

  // The handshake, by `deadline`.
  Status handshake(const std::string& expected_name, Deadline deadline) {
    for (;;) {
      ERR_clear_error();
      errno = 0;
      const int result = SSL_connect(ssl_);
      if (result == 1) return ok_status();
      const int error = SSL_get_error(ssl_, result);
      if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
        const short events = error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
        const Status waited = wait(events, deadline, "TLS handshake");
        if (waited.code() == StatusCode::kDeadlineExceeded &&
            BIO_number_read(SSL_get_rbio(ssl_)) == 0) {
          // A plain-text server takes our hello for the start of a command
          // and waits for the rest of it.
          return deadline_exceeded_error(waited.message() +
                                         ": the server sent nothing back (is it serving TLS on "
                                         "this port? a plain-text server waits silently)");
        }
        SIMBA_RETURN_IF_ERROR(waited);
        continue;
      }
      failed_ = true;
      // Judged before handshake_failure takes the error off the queue.
      const bool verification = is_verification_failure(
          error == SSL_ERROR_SSL ? ERR_peek_error() : 0, SSL_get_verify_result(ssl_));
      return tls_failure(verification,
                         context() + ": TLS handshake: " + handshake_failure(error, expected_name));
    }
  }

  Status write_all(std::string_view bytes, Deadline deadline) override {
    std::size_t sent = 0;
    while (sent < bytes.size()) {
      const int chunk = static_cast<int>(
          std::min<std::size_t>(bytes.size() - sent, std::numeric_limits<int>::max()));
      int result;
      int error;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ERR_clear_error();
        errno = 0;
        result = SSL_write(ssl_, bytes.data() + sent, chunk);
        error = result > 0 ? SSL_ERROR_NONE : SSL_get_error(ssl_, result);
        if (result <= 0 && error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) {
          return write_failure_locked(error);
        }
      }
      if (result > 0) {
        sent += static_cast<std::size_t>(result);
      } else {
        SIMBA_RETURN_IF_ERROR(
            wait(error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline, "write"));
      }
    }
    return ok_status();
  }

  Result<std::size_t> read_some(char* buffer, std::size_t size, Deadline deadline,
                                std::string_view what) override {
    const int chunk =
        static_cast<int>(std::min<std::size_t>(size, std::numeric_limits<int>::max()));
    for (;;) {
      int result;
      int error;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ERR_clear_error();
        errno = 0;
        result = SSL_read(ssl_, buffer, chunk);
        if (result > 0) return static_cast<std::size_t>(result);
        error = SSL_get_error(ssl_, result);
        // The server closed the connection (with or without close_notify:
        // SSL_OP_IGNORE_UNEXPECTED_EOF), as a plain Stream reads 0.
        if (error == SSL_ERROR_ZERO_RETURN) return std::size_t{0};
        if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) {
          return io_failure_locked("read", error);
        }
      }
      SIMBA_RETURN_IF_ERROR(wait(error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline, what));
    }
  }

 private:
  std::string handshake_failure(int error, const std::string& expected_name) {
    const long verify = SSL_get_verify_result(ssl_);  // NOLINT(google-runtime-int)
    if (verify != X509_V_OK) {
      ERR_clear_error();
      std::string text =
          std::string("certificate verify failed: ") + X509_verify_cert_error_string(verify);
      if (verify == X509_V_ERR_HOSTNAME_MISMATCH || verify == X509_V_ERR_IP_ADDRESS_MISMATCH) {
        text += " (the server's certificate does not name '" + expected_name + "')";
      } else if (verify == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY ||
                 verify == X509_V_ERR_CERT_SIGNATURE_FAILURE ||
                 verify == X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN ||
                 verify == X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT) {
        text += " (is tls_ca the CA that signed the server's certificate?)";
      }
      return text;
    }
    if (error == SSL_ERROR_SSL) return take_openssl_error();
    const int saved = errno;
    ERR_clear_error();
    if (error == SSL_ERROR_SYSCALL && saved != 0) return std::strerror(saved);
    return "the server closed the connection (is it serving TLS on this port?)";
  }

  // A write failed. A server that ends the connection after the handshake
  // (TLS 1.3 checks our certificate only then) says why in an alert before
  // it closes; if our write is what found the connection reset, the alert
  // still waits in the socket: read it, for the cause.
  Status write_failure_locked(int error) {
    Status failure = io_failure_locked("write", error);
    char byte;
    ERR_clear_error();
    const int result = SSL_read(ssl_, &byte, 1);
    if (result <= 0 && SSL_get_error(ssl_, result) == SSL_ERROR_SSL &&
        ERR_GET_LIB(ERR_peek_error()) == ERR_LIB_SSL) {
      const bool verification =
          is_verification_failure(ERR_peek_error(), SSL_get_verify_result(ssl_));
      return tls_failure(verification, context() + ": write: TLS: " + take_openssl_error());
    }
    ERR_clear_error();
    return failure;
  }

  // `what` ("read", "write") failed: kUnavailable "<context>: <what>: ...",
  // or kPermissionDenied for the server's alert refusing our certificate
  // (TLS 1.3 servers check it after the handshake).
  Status io_failure_locked(std::string_view what, int error) {
    failed_ = true;
    if (error == SSL_ERROR_SYSCALL) {
      const int saved = errno;
      ERR_clear_error();
      if (saved != 0) return fail(what, saved);
      return unavailable_error(context() + ": connection closed");
    }
    if (error == SSL_ERROR_SSL) {
      const bool verification =
          is_verification_failure(ERR_peek_error(), SSL_get_verify_result(ssl_));
      return tls_failure(verification,
                         context() + ": " + std::string(what) + ": TLS: " + take_openssl_error());
    }
    ERR_clear_error();
    return unavailable_error(context() + ": " + std::string(what) + ": TLS error " +
                             std::to_string(error));
  }

  SSL* const ssl_;
  // OpenSSL lets one thread at a time into an SSL: a reader and a writer
  // take turns here, never while they wait for the socket.
  std::mutex mu_;
  bool failed_ = false;  // guarded by mu_ after the handshake
};

}  // namespace

bool is_verification_failure(unsigned long openssl_error,  // NOLINT(google-runtime-int)
                             long verify_result) {         // NOLINT(google-runtime-int)
  if (verify_result != X509_V_OK) return true;
  if (openssl_error == 0 || ERR_GET_LIB(openssl_error) != ERR_LIB_SSL) return false;
  switch (ERR_GET_REASON(openssl_error)) {
    // Ours, in case the verify result was not kept.
    case SSL_R_CERTIFICATE_VERIFY_FAILED:
    // The server's alerts about our certificate (or its absence).
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
    case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
      return true;
    default:
      return false;
  }
}

TlsContext::TlsContext(TlsOptions options, ssl_ctx_st* ctx)
    : options_(std::move(options)), ctx_(ctx) {}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

Result<std::shared_ptr<const TlsContext>> TlsContext::create(const TlsOptions& options,
                                                             std::string_view store) {
  SIMBA_RETURN_IF_ERROR(options.validate(store));
  if (!options.enabled()) {
    return invalid_argument_error(std::string(store) + ": TLS is off; no TLS context to make");
  }
  const std::string prefix = std::string(store) + ": ";
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) {
    return internal_error(prefix + "cannot make a TLS context: " + take_openssl_error());
  }
  std::shared_ptr<const TlsContext> context(new TlsContext(options, ctx));
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  // Partial writes and a moved buffer between retries: write_all's loop.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
  // Both modes check the chain: there is no TLS without knowing whom we
  // talk to. `verify` adds the name, per connection (start_tls).
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  // An encrypted key is refused, never asked for on the terminal (OpenSSL's
  // default callback would prompt).
  SSL_CTX_set_default_passwd_cb(ctx, [](char*, int, int, void*) { return 0; });
  auto refused = [&](std::string_view what, const std::string& path) {
    std::string reason = take_openssl_error();
    if (what == "tls_key" && (reason.find("decrypt") != std::string::npos ||
                              reason.find("password") != std::string::npos)) {
      reason += " (an encrypted key? tls_key must be unencrypted)";
    }
    return invalid_argument_error(prefix + std::string(what) + " '" + path +
                                  "' cannot be used: " + reason);
  };
  if (!options.ca.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, options.ca.c_str(), nullptr) != 1) {
      return refused("tls_ca", options.ca);
    }
  } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
    return internal_error(prefix +
                          "cannot load the system's CA certificates: " + take_openssl_error());
  }
  if (!options.cert.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx, options.cert.c_str()) != 1) {
      return refused("tls_cert", options.cert);
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, options.key.c_str(), SSL_FILETYPE_PEM) != 1) {
      return refused("tls_key", options.key);
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
      ERR_clear_error();
      return invalid_argument_error(prefix + "tls_key '" + options.key +
                                    "' is not the key of tls_cert '" + options.cert + "'");
    }
  }
  return context;
}

Result<std::unique_ptr<Stream>> start_tls(std::unique_ptr<Stream> stream, const TlsContext& tls,
                                          const std::string& host, Deadline deadline) {
  const std::string context = stream->context();
  const TlsOptions& options = tls.options();
  ERR_clear_error();
  SSL* ssl = SSL_new(tls.native());
  BIO* bio = socket_method() == nullptr ? nullptr : BIO_new(socket_method());
  if (ssl == nullptr || bio == nullptr) {
    if (ssl != nullptr) SSL_free(ssl);
    if (bio != nullptr) BIO_free(bio);
    return internal_error(context + ": TLS: " + take_openssl_error());
  }
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<std::intptr_t>(stream->fd())));
  BIO_set_init(bio, 1);
  SSL_set_bio(ssl, bio, bio);
  // From here the TlsStream owns ssl (and the socket).
  auto tls_stream = std::make_unique<TlsStream>(std::move(stream), ssl);

  const bool ip = is_ip_literal(host);
  const std::string& name = options.server_name.empty() ? host : options.server_name;
  // SNI: a name, never an address (RFC 6066).
  if (!options.server_name.empty() || !ip) {
    if (SSL_ctrl(ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
                 const_cast<char*>(name.c_str())) != 1) {
      return invalid_argument_error(context + ": TLS: '" + name +
                                    "' cannot be sent as SNI: " + take_openssl_error());
    }
  }
  if (options.mode == TlsMode::kVerify) {
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    const int set = options.server_name.empty() && ip
                        ? X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str())
                        : X509_VERIFY_PARAM_set1_host(param, name.c_str(), 0);
    if (set != 1) {
      return invalid_argument_error(context + ": TLS: cannot verify the name '" + name +
                                    "': " + take_openssl_error());
    }
  }
  SIMBA_RETURN_IF_ERROR(tls_stream->handshake(name, deadline));
  return std::unique_ptr<Stream>(std::move(tls_stream));
}

}  // namespace simba::internal
