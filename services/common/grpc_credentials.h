// TLS for gradhub's gRPC, from PEM files: the server's certificate and key (and the CA its
// clients' certificates must chain to), and what a client trusts (and its own certificate).
// Every gRPC server and client of gradhub builds its credentials here, so "no files =
// plaintext" means the same everywhere.
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace gradhub {

// TLS with `cert_file` (a PEM chain) and `key_file`, or plaintext when both are empty.
// With `client_ca_file`, a client certificate is asked for: one that is presented must chain to
// it or the handshake fails; one that is not is no error here (the services decide, e.g.
// NodeService under --tls-require-client-cert). INVALID_ARGUMENT when only one of cert and key
// is given, a client CA without them, or a file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const std::string& cert_file, const std::string& key_file,
    const std::string& client_ca_file = "");

// TLS that trusts the PEM certificates in `ca_file` (the server's own self-signed certificate or
// the CA that signed it), or plaintext when it is empty. With `cert_file` and `key_file`, the
// client presents that certificate (an agent's node identity); INVALID_ARGUMENT for one without
// the other, either without `ca_file`, or a file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentials(
    const std::string& ca_file, const std::string& cert_file = "",
    const std::string& key_file = "");

}  // namespace gradhub
