#include "services/api/node_identity.h"

#include <grpcpp/security/auth_context.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradhub::api {

absl::Status CheckNodeIdentity(const PeerCertificate& peer, bool require_certificate,
                               const std::optional<std::string>& node) {
  if (!peer.verified) {
    if (!require_certificate) return absl::OkStatus();
    return absl::UnauthenticatedError(
        "the agent protocol takes a client certificate of the node here "
        "(gradhub-api --tls-require-client-cert; gradhub-agent --tls-cert/--tls-key)");
  }
  if (!node.has_value()) return absl::OkStatus();
  if (std::find(peer.names.begin(), peer.names.end(), *node) != peer.names.end()) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat("the client certificate is for ",
                                                  absl::StrJoin(peer.names, ", "),
                                                  ", not for node '", *node, "'"));
}

PeerCertificate PeerCertificateOf(const grpc::ServerContext& context) {
  PeerCertificate peer;
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  // Peer identity: the DNS subjectAltNames of a verified certificate, else its CN (gRPC's
  // x509_subject_alternative_name / x509_common_name); none without a certificate.
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return peer;
  peer.verified = true;
  for (const grpc::string_ref& name : auth->GetPeerIdentity()) {
    peer.names.emplace_back(name.data(), name.size());
  }
  return peer;
}

}  // namespace gradhub::api
