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

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() && key_file.empty()) return grpc::InsecureServerCredentials();
  if (cert_file.empty() || key_file.empty()) {
    return absl::InvalidArgumentError("tls: a certificate and its key go together");
  }
  absl::StatusOr<std::string> cert = ReadPem(cert_file, "tls certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(key_file, "tls key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentials(
    const std::string& ca_file) {
  if (ca_file.empty()) return grpc::InsecureChannelCredentials();
  absl::StatusOr<std::string> roots = ReadPem(ca_file, "tls ca");
  if (!roots.ok()) return roots.status();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = *std::move(roots);
  return grpc::SslCredentials(options);
}

}  // namespace gradhub
