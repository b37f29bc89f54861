#include "backends/etcd/etcd_client.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <cctype>
#include <chrono>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "core/log.h"

namespace simba::internal::etcd {
namespace {

// gRPC's target for an endpoint: an IP literal as it is (no resolver at
// all), a name through DNS.
std::string target_of(const Endpoint& endpoint) {
  const std::string port = std::to_string(endpoint.port);
  if (endpoint.host.find(':') != std::string::npos) {
    return "ipv6:[" + endpoint.host + "]:" + port;
  }
  const bool ipv4 = endpoint.host.find_first_not_of("0123456789.") == std::string::npos;
  return (ipv4 ? "ipv4:" : "dns:///") + endpoint.host + ":" + port;
}

// The contents of PEM file `path` (option `option`): errors name the
// option and the path, never the contents.
Result<std::string> read_pem(std::string_view option, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  if (in.good()) contents << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return invalid_argument_error("etcd: " + std::string(option) + " '" + path +
                                  "' cannot be read");
  }
  std::string text = contents.str();
  if (text.empty()) {
    return invalid_argument_error("etcd: " + std::string(option) + " '" + path + "' is empty");
  }
  return text;
}

Result<std::shared_ptr<grpc::ChannelCredentials>> credentials_for(const TlsOptions& tls,
                                                                  grpc::ChannelArguments* args) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  std::string ca;
  std::string cert;
  std::string key;
  if (!tls.ca.empty()) {
    SIMBA_ASSIGN_OR_RETURN(ca, read_pem("tls_ca", tls.ca));
  }
  if (!tls.cert.empty()) {
    SIMBA_ASSIGN_OR_RETURN(cert, read_pem("tls_cert", tls.cert));
  }
  if (!tls.key.empty()) {
    SIMBA_ASSIGN_OR_RETURN(key, read_pem("tls_key", tls.key));
  }
  // The name sent (SNI) and, for verify, checked.
  if (!tls.server_name.empty()) args->SetSslTargetNameOverride(tls.server_name);
  if (tls.mode == TlsMode::kVerify) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ca;  // empty: gRPC's default roots (the system's)
    ssl.pem_cert_chain = cert;
    ssl.pem_private_key = key;
    return grpc::SslCredentials(ssl);
  }
  // on: the chain is verified (verify_server_certs), the name is not.
  namespace gx = grpc::experimental;
  gx::TlsChannelCredentialsOptions options;
  std::vector<gx::IdentityKeyCertPair> identity;
  if (!cert.empty()) identity.push_back(gx::IdentityKeyCertPair{key, cert});
  if (!ca.empty() || !identity.empty()) {
    options.set_certificate_provider(
        std::make_shared<gx::StaticDataCertificateProvider>(ca, identity));
  }
  if (!ca.empty()) options.watch_root_certs();
  if (!identity.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  options.set_certificate_verifier(std::make_shared<gx::NoOpCertificateVerifier>());
  options.set_check_call_host(false);
  std::shared_ptr<grpc::ChannelCredentials> credentials = gx::TlsCredentials(options);
  if (!credentials) {
    return internal_error("etcd: gRPC could not make TLS credentials for tls=on");
  }
  return credentials;
}

}  // namespace

std::string Endpoint::describe() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<std::shared_ptr<grpc::Channel>> open_channel(const Endpoint& endpoint, bool keepalive,
                                                    const TlsOptions& tls) {
  grpc::ChannelArguments args;
  // A connection of this channel's own: not shared with the backend's other
  // channel to the same endpoint (see the header).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Reconnecting is ours to do (the backend moves on to the next endpoint).
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  args.SetMaxReceiveMessageSize(-1);
  if (keepalive) {
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
    // Ping as long as the watch lasts, however quiet it is (etcd allows a
    // ping every 5 s by default).
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                         credentials_for(tls, &args));
  return grpc::CreateCustomChannel(target_of(endpoint), credentials, args);
}

Status wait_connected(grpc::Channel& channel, const Endpoint& endpoint, Deadline deadline) {
  const std::string context = "etcd at " + endpoint.describe();
  bool tried = false;
  for (;;) {
    const grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
    if (state == GRPC_CHANNEL_READY) return ok_status();
    if (state == GRPC_CHANNEL_SHUTDOWN) return unavailable_error(context + ": channel shut down");
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE && tried) {
      // The cause: a call on a failed channel fails at once with it.
      auto stub = etcdserverpb::KV::NewStub(
          std::shared_ptr<grpc::Channel>(&channel, [](grpc::Channel*) {}));
      grpc::ClientContext probe;
      probe.set_deadline(grpc_deadline(
          std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(100))));
      etcdserverpb::RangeResponse ignored;
      const grpc::Status status = stub->Range(&probe, etcdserverpb::RangeRequest(), &ignored);
      std::string message = context + ": cannot connect" +
                            (status.ok() ? std::string() : ": " + status.error_message());
      if (!status.ok() && is_tls_verification_failure(status.error_message())) {
        return permission_denied_error(std::move(message));
      }
      return unavailable_error(std::move(message));
    }
    tried = tried || state != GRPC_CHANNEL_IDLE;
    if (!channel.WaitForStateChange(state, grpc_deadline(deadline))) {
      return deadline_exceeded_error(context + ": no connection before the deadline");
    }
    tried = true;
  }
}

std::string transport_hint(std::string_view message, const TlsOptions& tls) {
  const auto has = [&](std::string_view part) { return message.find(part) != std::string::npos; };
  const bool hung_up =
      has("Socket closed") || has("Endpoint read failed") || has("Connection reset") || has("EOF");
  if (!tls.enabled()) {
    if (hung_up) {
      return " (the connection was plain text; if the server serves TLS only, set tls_ca=FILE "
             "or tls=verify)";
    }
    return "";
  }
  if (has("certificate verify failed")) {
    return " (TLS: the server's certificate does not verify against " +
           std::string(tls.ca.empty() ? "the system's CAs" : "tls_ca") +
           ": signed by another CA, expired or not yet valid)";
  }
  if (has("not in peer certificate")) {
    return " (TLS: the server's certificate does not name the host; tls_server_name=NAME "
           "sets the name checked)";
  }
  if (hung_up) {
    return std::string(
               " (TLS: the server hung up during the handshake: it may not serve TLS "
               "on this port") +
           (tls.cert.empty() ? ", or may require a client certificate (tls_cert, tls_key))"
                             : ", or refused the client certificate)");
  }
  if (is_tls_verification_failure(message)) {
    return " (TLS: the server refused the client certificate" +
           std::string(tls.cert.empty() ? ": it wants one (tls_cert, tls_key))" : ")");
  }
  if (has("andshake")) return " (TLS handshake failed)";
  return "";
}

bool is_tls_verification_failure(std::string_view message) {
  // One spelling for OpenSSL's "certificate verify failed" and BoringSSL's
  // CERTIFICATE_VERIFY_FAILED.
  std::string text(message);
  for (char& c : text) {
    c = c == '_' ? ' ' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  static constexpr std::string_view kVerdicts[] = {
      // Ours, on the server's certificate: its chain, its name.
      "certificate verify failed",
      "is not in peer certificate",
      // The server's alerts about ours, during the handshake.
      "alert bad certificate",
      "alert unsupported certificate",
      "alert certificate revoked",
      "alert certificate expired",
      "alert certificate unknown",
      "alert unknown ca",
      "alert access denied",
      "alert decrypt error",
      "alert certificate required",
  };
  for (std::string_view verdict : kVerdicts) {
    if (text.find(verdict) != std::string::npos) return true;
  }
  return false;
}

Result<std::string> Auth::authorize(grpc::ClientContext& context, grpc::Channel& channel,
                                    const Endpoint& endpoint, Deadline deadline) {
  if (!enabled()) return std::string();
  std::string token;
  bool have = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    have = have_token_;
    token = token_;
  }
  if (!have) {
    // Not under mu_: another channel's call may authenticate meanwhile
    // (both tokens are valid; the last one is kept).
    auto stub = etcdserverpb::Auth::NewStub(
        std::shared_ptr<grpc::Channel>(&channel, [](grpc::Channel*) {}));
    grpc::ClientContext call;
    call.set_deadline(grpc_deadline(deadline));
    etcdserverpb::AuthenticateRequest request;
    request.set_name(user_);
    request.set_password(password_);
    etcdserverpb::AuthenticateResponse response;
    const grpc::Status status = stub->Authenticate(&call, request, &response);
    const std::string context_text = "etcd at " + endpoint.describe();
    if (status.ok()) {
      token = response.token();
    } else if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
               status.error_message().find("authentication is not enabled") != std::string::npos) {
      token.clear();  // no auth on this server: calls go without a token
    } else if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
               status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
               status.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
               status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      // "authentication failed, invalid user ID or password", ...
      return permission_denied_error(context_text + ": authentication failed (user '" + user_ +
                                     "'): " + status.error_message());
    } else {
      return error_status(status, endpoint, context_text + ": authenticating");
    }
    std::lock_guard<std::mutex> lock(mu_);
    have_token_ = true;
    token_ = token;
  }
  if (!token.empty()) context.AddMetadata("token", token);
  return token;
}

bool Auth::refused_token(const std::string& token, const grpc::Status& status) {
  if (!enabled() || !is_invalid_token(status)) return false;
  SIMBA_LOG(kDebug, "etcd: the auth token of user '" << user_ << "' was refused ("
                                                     << status.error_message()
                                                     << "); authenticating again");
  forget(token);
  return true;
}

void Auth::forget(const std::string& token) {
  std::lock_guard<std::mutex> lock(mu_);
  if (have_token_ && token_ == token) {
    have_token_ = false;
    token_.clear();
  }
}

bool is_invalid_token(const grpc::Status& status) {
  const std::string& message = status.error_message();
  return (status.error_code() == grpc::StatusCode::UNAUTHENTICATED &&
          message.find("invalid auth token") != std::string::npos) ||
         message.find("revision of auth store is old") != std::string::npos;
}

std::chrono::system_clock::time_point grpc_deadline(Deadline deadline) {
  // A far deadline (hours, or Deadline::max()) stays far without overflowing.
  constexpr auto kFar = std::chrono::hours(24 * 365);
  const auto left = deadline - std::chrono::steady_clock::now();
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             left > kFar ? std::chrono::steady_clock::duration(kFar) : left);
}

std::string prefix_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  // Every key: etcd's "\0" range end.
  return std::string(1, '\0');
}

Status error_status(int grpc_code, std::string_view message, std::string_view context) {
  std::string text = std::string(context) + ": " + std::string(message);
  const auto says = [&](std::string_view part) {
    return message.find(part) != std::string_view::npos;
  };
  switch (grpc_code) {
    case 8:  // RESOURCE_EXHAUSTED
      if (says("database space exceeded")) {
        // etcd's NOSPACE alarm refuses every write until an operator frees
        // space and disarms it: waiting cannot help, and every member says
        // the same.
        return failed_precondition_error(
            std::move(text) +
            " (the etcd cluster is out of space: an operator must compact and defragment it, "
            "then run `etcdctl alarm disarm`)");
      }
      // "etcdserver: too many requests": a busy server, for a while.
      return unavailable_error(std::move(text));
    case 9:  // FAILED_PRECONDITION
      // "not leader": a member asked for what only the leader does, during
      // an election or just after one; the next member or attempt may be it.
      if (says("not leader") || says("no leader") || says("leader changed")) {
        return unavailable_error(std::move(text));
      }
      // "lease already exists", ...: the caller handles those it expects.
      return internal_error(std::move(text));
    case 14:  // UNAVAILABLE: "etcdserver: no leader", "leader changed", no connection
      if (is_tls_verification_failure(message)) return permission_denied_error(std::move(text));
      return unavailable_error(std::move(text));
    case 1:   // CANCELLED: the call was cut off
    case 2:   // UNKNOWN: e.g. "etcdserver: leader changed" from older servers
    case 4:   // DEADLINE_EXCEEDED: "etcdserver: request timed out", or ours
    case 10:  // ABORTED
    case 13:  // INTERNAL
      return unavailable_error(std::move(text));
    case 7:   // PERMISSION_DENIED
    case 16:  // UNAUTHENTICATED: "etcdserver: user name is empty", "invalid auth token"
      return permission_denied_error(std::move(text));
    case 3:   // INVALID_ARGUMENT: "etcdserver: request is too large", ...
    case 11:  // OUT_OF_RANGE: "etcdserver: mvcc: required revision is a future revision"
      return invalid_argument_error(std::move(text));
    default:  // NOT_FOUND, ...: the caller handles those it expects
      return internal_error(std::move(text));
  }
}

Status error_status(const grpc::Status& status, const Endpoint& endpoint,
                    std::string_view context) {
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    // The call's own deadline (etcd reports its timeouts as UNAVAILABLE).
    return deadline_exceeded_error(std::string(context) + ": " + endpoint.describe() + ": " +
                                   status.error_message());
  }
  return error_status(static_cast<int>(status.error_code()),
                      endpoint.describe() + ": " + status.error_message(), context);
}

}  // namespace simba::internal::etcd
