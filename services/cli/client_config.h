// Where the CLI keeps what lives between runs: the state directory of `gradhub cluster` and the
// client config it writes there. The config is the last source of the global flags, like
// kubectl's kubeconfig: a flag beats its variable, which beats the config, which beats the
// built-in default. So `gradhub submit -f job.yaml` talks to the local cluster right after
// `gradhub cluster up` with no flag and no variable.
//
// The config is `key=value` lines named as the flags (server, checkpoint-server, token,
// tls-ca); '#' starts a comment line. It holds a token, so it is written 0600.
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradhub::cli {

// $GRADHUB_STATE_DIR, else $XDG_STATE_HOME/gradhub, else ~/.gradhub. As root, with neither
// variable set, /var/lib/gradhub/local: PostgreSQL and the ranks run as unprivileged users
// there, and they cannot enter root's home directory.
std::string StateDir();

// $GRADHUB_CONFIG, else <StateDir()>/config.
std::string ClientConfigPath();

// The keys of the config at `path`; empty when there is no such file.
absl::StatusOr<std::map<std::string, std::string>> ReadClientConfig(const std::string& path);

// Replaces the config at `path` atomically (a reader never sees half of it), mode 0600.
absl::Status WriteClientConfig(const std::string& path,
                               const std::map<std::string, std::string>& values);

}  // namespace gradhub::cli
