// Which node an agent's call may speak for, from its TLS client certificate: the rule
// (CheckNodeIdentity, pure) and what gRPC says of the caller (PeerCertificateOf).
//
// The node token is shared by every agent, so alone it lets any agent (or whoever took the
// token from one node) register, heartbeat, take assignments and rank credentials as any node.
// A client certificate per node (`gradhub cluster certs --nodes`, whose CN and DNS name are the
// node's name) binds an agent to its own node:
//   1. gradhub-api asks for client certificates when it has --tls-client-ca; one that is
//      presented must chain to that CA, else the TLS handshake fails (grpc_credentials.h);
//   2. a call that names a node and came with a verified certificate may name only a node the
//      certificate is for: a certificate of node a cannot register or heartbeat as node b;
//   3. with --tls-require-client-cert, the agent calls must come with one (mTLS); without it, a
//      call without a certificate is judged by its node token alone, as before.
// The node token is still required in every case.
#pragma once

#include <grpcpp/server_context.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace gradhub::api {

// The caller's client certificate, as the TLS handshake verified it.
struct PeerCertificate {
  bool verified = false;  // a certificate was presented and chains to --tls-client-ca
  // The names it is for: its DNS subjectAltNames, else its common name.
  std::vector<std::string> names;
};

// Steps 2 and 3 for a call naming node `node` (its id, "a" of "nodes/a"), or naming no node
// (nullopt: ReportLogs; then only step 3 applies). OK, or UNAUTHENTICATED (no certificate where
// one is required) or PERMISSION_DENIED (the certificate is another node's), saying which.
absl::Status CheckNodeIdentity(const PeerCertificate& peer, bool require_certificate,
                               const std::optional<std::string>& node);

// What the call's TLS handshake verified; not verified on a plaintext call or one without a
// client certificate.
PeerCertificate PeerCertificateOf(const grpc::ServerContext& context);

}  // namespace gradhub::api
