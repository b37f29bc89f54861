#include "simba/tls.h"

#include <fstream>
#include <optional>

namespace simba {
namespace {

Status readable(std::string_view store, std::string_view option, const std::string& path) {
  std::ifstream in(path);
  if (in.good()) return ok_status();
  return invalid_argument_error(std::string(store) + ": " + std::string(option) + " '" + path +
                                "' cannot be read");
}

}  // namespace

const char* tls_mode_name(TlsMode mode) {
  switch (mode) {
    case TlsMode::kOff:
      return "off";
    case TlsMode::kOn:
      return "on";
    case TlsMode::kVerify:
      return "verify";
  }
  return "off";
}

Status TlsOptions::validate(std::string_view store) const {
  const std::string prefix = std::string(store) + ": ";
  if (!enabled()) {
    if (!ca.empty() || !cert.empty() || !key.empty() || !server_name.empty()) {
      return invalid_argument_error(prefix + "tls_ca, tls_cert, tls_key and tls_server_name " +
                                    "need TLS, but tls is off");
    }
    return ok_status();
  }
  if (!key.empty() && cert.empty()) {
    return invalid_argument_error(prefix + "tls_key needs tls_cert (the client certificate)");
  }
  if (!cert.empty() && key.empty()) {
    return invalid_argument_error(prefix + "tls_cert needs tls_key (its private key)");
  }
  if (!ca.empty()) SIMBA_RETURN_IF_ERROR(readable(store, "tls_ca", ca));
  if (!cert.empty()) SIMBA_RETURN_IF_ERROR(readable(store, "tls_cert", cert));
  if (!key.empty()) SIMBA_RETURN_IF_ERROR(readable(store, "tls_key", key));
  return ok_status();
}

std::string TlsOptions::describe() const {
  if (!enabled()) return "plain text";
  std::string out = std::string("TLS (") + tls_mode_name(mode) + ")";
  if (!cert.empty()) out += ", client certificate";
  return out;
}

Result<TlsOptions> tls_options_from_uri(const Uri& uri, std::string_view store,
                                        bool on_by_default) {
  TlsOptions tls;
  tls.ca = uri.query_value("tls_ca").value_or("");
  tls.cert = uri.query_value("tls_cert").value_or("");
  tls.key = uri.query_value("tls_key").value_or("");
  tls.server_name = uri.query_value("tls_server_name").value_or("");
  const bool any_file =
      !tls.ca.empty() || !tls.cert.empty() || !tls.key.empty() || !tls.server_name.empty();
  tls.mode = on_by_default || any_file ? TlsMode::kVerify : TlsMode::kOff;
  if (const std::optional<std::string> mode = uri.query_value("tls")) {
    if (*mode == "off") {
      tls.mode = TlsMode::kOff;
    } else if (*mode == "on") {
      tls.mode = TlsMode::kOn;
    } else if (*mode == "verify") {
      tls.mode = TlsMode::kVerify;
    } else {
      return invalid_argument_error(std::string(store) + ": tls must be off, on or verify, not '" +
                                    *mode + "'");
    }
  }
  for (const std::string_view key : {"tls_ca", "tls_cert", "tls_key", "tls_server_name"}) {
    const std::optional<std::string> value = uri.query_value(key);
    if (value && value->empty()) {
      return invalid_argument_error(std::string(store) + ": " + std::string(key) +
                                    " must not be empty");
    }
  }
  SIMBA_RETURN_IF_ERROR(tls.validate(store));
  return tls;
}

Result<std::string> read_secret_file(std::string_view store, std::string_view option,
                                     const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) {
    return invalid_argument_error(std::string(store) + ": " + std::string(option) + " '" + path +
                                  "' cannot be read");
  }
  std::string line;
  std::getline(in, line);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.empty()) {
    return invalid_argument_error(std::string(store) + ": " + std::string(option) + " '" + path +
                                  "' is empty");
  }
  return line;
}

}  // namespace simba
