#include "services/cli/cluster_tls.h"

#include "absl/strings/str_cat.h"
#include "services/common/tls/cluster_ca.h"

namespace gradhub::cli {

std::string ClusterTls::ca_file() const { return enabled() ? dir_ + "/ca.pem" : ""; }

std::vector<std::string> ClusterTls::ServerArgs() const {
  if (!enabled()) return {};
  return {"--tls-cert",      dir_ + "/server.pem",
          "--tls-key",       dir_ + "/server-key.pem",
          "--tls-client-ca", ca_file()};
}

std::vector<std::string> ClusterTls::ApiArgs() const {
  std::vector<std::string> args = ServerArgs();
  if (enabled()) args.push_back("--tls-require-client-cert=true");
  return args;
}

std::vector<std::string> ClusterTls::AgentArgs(const std::string& node) const {
  if (!enabled()) return {};
  const tls::ClusterCertFiles::NodeFiles files = tls::NodeCertFiles(dir_, node);
  return {"--tls-ca", ca_file(), "--tls-cert", files.cert, "--tls-key", files.key};
}

std::string ClusterTls::PrometheusScrapeOptions() const {
  if (!enabled()) return "";
  return absl::StrCat("    scheme: https\n    tls_config:\n      ca_file: ", ca_file(), "\n");
}

absl::StatusOr<ClusterTls> PrepareClusterTls(const std::string& state_dir, bool enabled,
                                             const std::vector<std::string>& nodes) {
  if (!enabled) return ClusterTls();
  const tls::ClusterCertsOptions options{
      .out_dir = state_dir + "/tls", .ca_dir = state_dir + "/tls-ca", .hosts = {}, .nodes = nodes};
  absl::StatusOr<tls::ClusterCertFiles> files = tls::MakeClusterCerts(options);
  if (!files.ok()) return files.status();
  return ClusterTls(options.out_dir);
}

}  // namespace gradhub::cli
