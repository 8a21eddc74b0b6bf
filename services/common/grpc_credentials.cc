#include "services/common/grpc_credentials.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace gradhub {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in || text.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read '", path, "'"));
  }
  return text.str();
}

// The certificate and key of one side, both or neither.
absl::StatusOr<grpc::SslServerCredentialsOptions::PemKeyCertPair> ReadKeyCertPair(
    const std::string& cert_file, const std::string& key_file) {
  absl::StatusOr<std::string> cert = ReadPem(cert_file, "tls certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(key_file, "tls key");
  if (!key.ok()) return key.status();
  return grpc::SslServerCredentialsOptions::PemKeyCertPair{*std::move(key), *std::move(cert)};
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const std::string& cert_file, const std::string& key_file, const std::string& client_ca_file) {
  if (cert_file.empty() && key_file.empty()) {
    if (!client_ca_file.empty()) {
      return absl::InvalidArgumentError("tls: a client CA needs the server's certificate and key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (cert_file.empty() || key_file.empty()) {
    return absl::InvalidArgumentError("tls: a certificate and its key go together");
  }
  auto pair = ReadKeyCertPair(cert_file, key_file);
  if (!pair.ok()) return pair.status();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back(*std::move(pair));
  if (!client_ca_file.empty()) {
    absl::StatusOr<std::string> roots = ReadPem(client_ca_file, "tls client ca");
    if (!roots.ok()) return roots.status();
    options.pem_root_certs = *std::move(roots);
    options.client_certificate_request = GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentials(
    const std::string& ca_file, const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError("tls: a client certificate and its key go together");
  }
  if (ca_file.empty()) {
    if (!cert_file.empty()) {
      return absl::InvalidArgumentError("tls: a client certificate needs a tls ca (TLS)");
    }
    return grpc::InsecureChannelCredentials();
  }
  absl::StatusOr<std::string> roots = ReadPem(ca_file, "tls ca");
  if (!roots.ok()) return roots.status();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = *std::move(roots);
  if (!cert_file.empty()) {
    auto pair = ReadKeyCertPair(cert_file, key_file);
    if (!pair.ok()) return pair.status();
    options.pem_private_key = std::move(pair->private_key);
    options.pem_cert_chain = std::move(pair->cert_chain);
  }
  return grpc::SslCredentials(options);
}

}  // namespace gradhub
