// `gradhub cluster up | status | down | logs`: a local cluster for one user (local_cluster.h).
#pragma once

#include "services/cli/invocation.h"

namespace gradhub::cli {

int ClusterUpCommand(Invocation& inv);
int ClusterStatusCommand(Invocation& inv);
int ClusterDownCommand(Invocation& inv);
int ClusterLogsCommand(Invocation& inv);

}  // namespace gradhub::cli
