// TLS of the local cluster (`gradhub cluster up`, local_cluster.h): the cluster's own CA and
// certificates under the state directory (services/common/tls/cluster_ca.h), and what each
// process is given of them. On by default; `gradhub cluster up --insecure` runs plaintext.
//
//   <state>/tls-ca/   ca.pem, ca-key.pem (0700): the CA, kept across `up`s
//   <state>/tls/      ca.pem (what the CLI, agents and ranks trust), server.pem/server-key.pem
//                     (every server: localhost, 127.0.0.1), node-<name>.pem/-key.pem (each
//                     agent's client certificate); keys 0600, certificates 0644
//
// Plain data; thread-compatible.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gradhub::cli {

class ClusterTls {
 public:
  // Plaintext.
  ClusterTls() = default;
  // TLS from the files MakeClusterCerts wrote into `dir`.
  explicit ClusterTls(std::string dir) : dir_(std::move(dir)) {}

  bool enabled() const { return !dir_.empty(); }
  // "" when plaintext.
  const std::string& dir() const { return dir_; }
  // What every client trusts; "" when plaintext.
  std::string ca_file() const;
  // "https://" or "http://", for the REST endpoints.
  std::string url_scheme() const { return enabled() ? "https://" : "http://"; }

  // The servers' flags: their certificate, and the CA their agents' certificates chain to.
  std::vector<std::string> ServerArgs() const;
  // gradhub-api's besides: the agent calls must come with their node's certificate.
  std::vector<std::string> ApiArgs() const;
  // An agent's flags: the CA it (and its ranks) trust, and node `node`'s client certificate.
  std::vector<std::string> AgentArgs(const std::string& node) const;
  // Prometheus' scrape options for the servers' HTTPS ports (YAML lines of a scrape job,
  // indented for one); "" when plaintext.
  std::string PrometheusScrapeOptions() const;

 private:
  std::string dir_;
};

// The certificates of a cluster in `state_dir` whose agents are `nodes`: the CA kept (or made
// the first time), the server's and the nodes' certificates issued again. Plaintext when
// `enabled` is false (nothing is written).
absl::StatusOr<ClusterTls> PrepareClusterTls(const std::string& state_dir, bool enabled,
                                             const std::vector<std::string>& nodes);

}  // namespace gradhub::cli
