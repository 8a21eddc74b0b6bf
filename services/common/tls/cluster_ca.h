// A cluster's own certificate authority (`gradhub cluster certs`, `gradhub cluster up`): an EC
// P-256 CA, a server certificate for every gradhub server, and a client certificate for each
// agent, all as PEM files that the servers' --tls-cert/--tls-key/--tls-client-ca and the
// clients' --tls-ca (and agents' --tls-cert/--tls-key) read.
//
// What MakeClusterCerts does, in order:
//   1. The CA: kept when <ca_dir>/ca.pem and ca-key.pem exist (and still match and are valid for
//      kMinRemainingValidity), else made (kCaValidity). So re-running never invalidates what
//      clients already trust.
//   2. <out_dir>/ca.pem: a copy of the CA certificate, what every client trusts.
//   3. <out_dir>/server.pem + server-key.pem: issued again on every run (kLeafValidity), for
//      localhost, 127.0.0.1, ::1 and `hosts`; extended key usage serverAuth only.
//   4. <out_dir>/node-<name>.pem + node-<name>-key.pem for each of `nodes`: CN and DNS SAN the
//      node's name, extended key usage clientAuth only (so it cannot serve, and a server
//      certificate cannot pass as a node).
// Keys are written 0600, certificates 0644, each file atomically (a temporary file renamed), so
// a server starting meanwhile reads the old file or the new one, never half of one. Rotation:
// run it again and restart the servers and agents (the leaves are new, the CA is the same); a
// new CA: remove ca.pem and ca-key.pem first, then every client needs the new ca.pem.
//
// Thread-compatible: one MakeClusterCerts at a time per directory.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gradhub::tls {

inline constexpr absl::Duration kCaValidity = absl::Hours(24 * 3650);
inline constexpr absl::Duration kLeafValidity = absl::Hours(24 * 365);
// A kept CA must stay valid at least this long, else MakeClusterCerts refuses (its leaves
// would outlive it).
inline constexpr absl::Duration kMinRemainingValidity = absl::Hours(24 * 30);

struct ClusterCertsOptions {
  // Where the servers' and clients' files go (created 0755 if missing).
  std::string out_dir{};
  // Where the CA's certificate and key are kept; "" = out_dir. Keep it apart from what the
  // servers and agents mount: whoever reads ca-key.pem can issue any node's certificate.
  std::string ca_dir{};
  // Host names or IP addresses the servers are reached at, besides localhost, 127.0.0.1, ::1.
  std::vector<std::string> hosts{};
  // Agents' node names ([a-zA-Z0-9][a-zA-Z0-9._-]{0,62}, as the api's): a client certificate
  // each.
  std::vector<std::string> nodes{};
};

// The files written (absolute or as the options named the directories).
struct ClusterCertFiles {
  std::string ca_cert;      // <out_dir>/ca.pem
  std::string ca_key;       // <ca_dir>/ca-key.pem
  std::string server_cert;  // <out_dir>/server.pem
  std::string server_key;   // <out_dir>/server-key.pem
  struct NodeFiles {
    std::string cert, key;
  };
  std::map<std::string, NodeFiles> nodes;  // by node name
  bool made_ca = false;                    // false: an existing CA was kept
};

// Steps 1-4 above. INVALID_ARGUMENT naming the host or node that cannot be in a certificate;
// FAILED_PRECONDITION for a kept CA that is unreadable, mismatched or expiring; INTERNAL when a
// file cannot be written.
absl::StatusOr<ClusterCertFiles> MakeClusterCerts(const ClusterCertsOptions& options);

// Where MakeClusterCerts puts node `name`'s certificate and key under `out_dir`.
ClusterCertFiles::NodeFiles NodeCertFiles(const std::string& out_dir, const std::string& name);

}  // namespace gradhub::tls
