// `gradhub cluster up | certs | status | down | logs`: a local cluster for one user
// (local_cluster.h).
#pragma once

#include "services/cli/invocation.h"

namespace gradhub::cli {

int ClusterUpCommand(Invocation& inv);
// `gradhub cluster certs --out DIR [--ca-dir DIR] [--hosts h,...] [--nodes n,...]`: a cluster
// CA and its certificates (services/common/tls/cluster_ca.h), for compose and Kubernetes.
int ClusterCertsCommand(Invocation& inv);
int ClusterStatusCommand(Invocation& inv);
int ClusterDownCommand(Invocation& inv);
int ClusterLogsCommand(Invocation& inv);

}  // namespace gradhub::cli
