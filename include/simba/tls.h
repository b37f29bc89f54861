// File: simba/tls.h
//
// One spelling of TLS for every server store (Redis, PostgreSQL,
// MySQL/MariaDB, etcd; ZooKeeper where its client can), in options and in
// URIs:
//
//   tls=off|on|verify   off: plain text. on: encrypted, and the server's
//                       certificate must chain to tls_ca (or the system's
//                       CAs); its name is not checked. verify: as on, and the
//                       certificate must name the host connected to (or
//                       tls_server_name). There is no mode that encrypts
//                       without checking whom it talks to.
//   tls_ca=FILE         PEM file of the CAs to trust; default the system's
//   tls_cert=FILE       a client certificate (PEM), for servers that ask
//   tls_key=FILE        its private key (PEM, unencrypted); with tls_cert
//   tls_server_name=N   the name sent (SNI) and verified, when the URI's host
//                       is an address or an alias
//
// TLS is on (as `verify`) when any tls_* key is given, or the scheme says so
// (rediss://), unless tls= says otherwise. Each store's page says how these
// map onto its client library (PostgreSQL: sslmode verify-ca/verify-full;
// MySQL: ssl_mode verify_ca/verify_identity).
//
// Key files are read by the client library when it connects; neither their
// paths' contents nor passwords appear in errors, logs or status.
//
// Thread safety: values.

#ifndef SIMBA_TLS_H_
#define SIMBA_TLS_H_

#include <string>
#include <string_view>

#include "simba/status.h"
#include "simba/uri.h"

namespace simba {

enum class TlsMode { kOff, kOn, kVerify };

// "off", "on", "verify".
const char* tls_mode_name(TlsMode mode);

struct TlsOptions {
  TlsMode mode = TlsMode::kOff;
  std::string ca;
  std::string cert;
  std::string key;
  std::string server_name;

  bool enabled() const { return mode != TlsMode::kOff; }

  // Errors (kInvalidArgument, naming `store` and the option): tls_key
  // without tls_cert or the reverse, tls_* files with tls=off, a file that
  // cannot be read (the path is named, never its contents).
  Status validate(std::string_view store) const;

  // For status and logs: "plain text", or "TLS (verify)" / "TLS (on)", with
  // ", client certificate" when one is given. No paths, no secrets.
  std::string describe() const;

  friend bool operator==(const TlsOptions&, const TlsOptions&) = default;
};

// tls, tls_ca, tls_cert, tls_key and tls_server_name from `uri`'s query (the
// store's own check_query_keys must list them: kTlsQueryKeys). `on_by_default`:
// the scheme asks for TLS (rediss://). Errors name the key and the store.
Result<TlsOptions> tls_options_from_uri(const Uri& uri, std::string_view store,
                                        bool on_by_default = false);

// The query keys tls_options_from_uri reads.
inline constexpr std::string_view kTlsQueryKeys[] = {"tls", "tls_ca", "tls_cert", "tls_key",
                                                     "tls_server_name"};

// A secret read from a file (password_file=): the file's first line, without
// its line end. Errors name the store, the option and the path, never the
// contents.
Result<std::string> read_secret_file(std::string_view store, std::string_view option,
                                     const std::string& path);

}  // namespace simba

#endif  // SIMBA_TLS_H_
