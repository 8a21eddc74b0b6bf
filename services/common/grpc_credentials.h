// TLS for gradhub's gRPC, from PEM files: the server's certificate and key, and the
// certificates a client trusts. Every gRPC server and client of gradhub builds its credentials
// here, so "no files = plaintext" means the same everywhere.
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace gradhub {

// TLS with `cert_file` (a PEM chain) and `key_file`, or plaintext when both are empty.
// INVALID_ARGUMENT when only one is given or a file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const std::string& cert_file, const std::string& key_file);

// TLS that trusts the PEM certificates in `ca_file` (the server's own self-signed certificate or
// the CA that signed it), or plaintext when it is empty.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentials(
    const std::string& ca_file);

}  // namespace gradhub
