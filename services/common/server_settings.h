// The settings every gradhub server shares, each with its flag, environment variable and
// default, declared once so that gradhub-api, gradhub-checkpoint and gradhub-metrics cannot
// drift in what they accept: the api's database, the admin token, TLS for what they serve, the
// shutdown grace, and what one client may take of them (edge_limits.h). Each server's config.h
// holds one of these and adds its own settings (listen addresses, limits, intervals).
#pragma once

#include <string>

#include "absl/time/time.h"
#include "services/common/db/settings.h"
#include "services/common/edge_limits.h"
#include "services/common/flags.h"

namespace gradhub {

// PEM files; both empty = plaintext (grpc_credentials.h, http_server.h).
struct TlsSettings {
  std::string cert_file;
  std::string key_file;
  // gRPC asks clients for a certificate, which must chain to this CA when presented; "" = none.
  std::string client_ca_file;
};

// Plain data after Register and parsing; read-only once the server runs.
struct ServerSettings {
  // What differs between the servers in how the shared flags read.
  struct Spec {
    // --database-connections' variable: the servers share one database, not one pool size.
    std::string connections_env;
    // Whether the server applies migrations (then it has --migration-lock-timeout).
    bool migrates = false;
    // What --tls-cert and --tls-key do, for --help.
    std::string tls_effect = "gRPC and REST serve TLS only";
  };

  // Each member has a default, so that a config.h sets only what differs:
  // ServerSettings{.database = {.connections = 8}, .shutdown_grace = absl::Seconds(30)}.
  db::DatabaseSettings database{};
  std::string admin_token{};
  TlsSettings tls{};
  // How long calls in flight (and open streams) may finish after SIGTERM.
  absl::Duration shutdown_grace = absl::Seconds(10);
  // What one client may take of the server (edge_limits.h): --http-* and --grpc-* limits.
  HttpLimits http{};
  GrpcLimits grpc{};

  // --database-*, --admin-token, --shutdown-grace, --tls-cert, --tls-key, the --http-* and
  // --grpc-* limits; the defaults are the values the members hold when this is called.
  void Register(Flags& flags, const Spec& spec) {
    database.Register(flags, spec.connections_env, spec.migrates);
    flags.String("admin-token", "GRADHUB_ADMIN_TOKEN", &admin_token,
                 "Bearer token with admin rights on every gradhub server (the same on each; it "
                 "bootstraps tenants and tokens at the api); empty = none");
    flags.Duration("shutdown-grace", "GRADHUB_SHUTDOWN_GRACE", &shutdown_grace,
                   "On SIGTERM, how long calls in flight and open streams may finish before "
                   "they are cancelled");
    flags.String("tls-cert", "GRADHUB_TLS_CERT", &tls.cert_file,
                 "PEM certificate chain; with --tls-key, " + spec.tls_effect);
    flags.String("tls-key", "GRADHUB_TLS_KEY", &tls.key_file, "PEM private key of --tls-cert");
    flags.String("tls-client-ca", "GRADHUB_TLS_CLIENT_CA", &tls.client_ca_file,
                 "PEM CA certificates: gRPC asks callers for a client certificate, and one that "
                 "is presented must chain to these (agents' node certificates: `gradhub cluster "
                 "certs`); empty = none asked for. Needs --tls-cert");
    http.Register(flags);
    grpc.Register(flags);
  }
};

}  // namespace gradhub
