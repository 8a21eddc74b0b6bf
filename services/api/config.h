#pragma once

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "services/common/contract/defaults.h"
#include "services/common/flags.h"
#include "services/common/server_settings.h"

namespace gradhub::api {

// Every setting of gradhub-api, with its flag, environment variable and default: those every
// server shares (server_settings.h), then the api's own.
struct ApiConfig {
  ServerSettings server{.database = {.connections = 16}, .shutdown_grace = absl::Seconds(10)};
  std::string grpc_address = "0.0.0.0:7070";
  std::string http_host = "0.0.0.0";
  int64_t http_port = 8080;
  int64_t max_world_size = 1024;
  int64_t max_request_bytes = 4 << 20;
  std::string store_address;
  absl::Duration heartbeat_interval = absl::FromChrono(defaults::kHeartbeatInterval);
  absl::Duration node_outage_grace = absl::FromChrono(defaults::kApiOutageGrace);
  absl::Duration backfill_window = absl::Seconds(60);
  absl::Duration scheduler_interval = absl::Milliseconds(200);
  // The leader's term without a renewal (leader_lease.h): the longest wait for a new leader
  // after the leader dies, and the shortest pause that deposes one.
  absl::Duration leader_lease = absl::Milliseconds(1500);
  StreamLimits rest_streams{};
  // NodeService's agent calls must come with a node's client certificate (node_identity.h).
  bool require_node_certificates = false;

  void Register(Flags& flags) {
    server.Register(flags, {.connections_env = "GRADHUB_DATABASE_CONNECTIONS",
                            .migrates = true,
                            .tls_effect = "gRPC and REST serve TLS only"});
    flags.String(
        "grpc-address", "GRADHUB_GRPC_ADDRESS", &grpc_address,
        "host:port for gRPC (JobService, NodeService, StoreService); port 0 picks a free one");
    flags.String("http-host", "GRADHUB_HTTP_HOST", &http_host, "Address REST listens on");
    flags.Int("http-port", "GRADHUB_HTTP_PORT", &http_port, "Port for REST; 0 picks a free one");
    flags.Int("max-world-size", "GRADHUB_MAX_WORLD_SIZE", &max_world_size,
              "Largest distributed.worldSize a job may ask for");
    flags.Int("max-request-bytes", "GRADHUB_MAX_REQUEST_BYTES", &max_request_bytes,
              "Largest request accepted; larger ones are RESOURCE_EXHAUSTED");
    flags.String("store-address", "GRADHUB_STORE_ADDRESS", &store_address,
                 "host:port at which trainers reach this server's StoreService; empty = "
                 "127.0.0.1 and the gRPC port");
    flags.Duration(
        "heartbeat-interval", "GRADHUB_HEARTBEAT_INTERVAL", &heartbeat_interval,
        absl::StrCat("How often agents heartbeat; a node silent for ", defaults::kLeaseHeartbeats,
                     " intervals is lost, once the api has been up for 10 (agents "
                     "reconnect after an api restart)"));
    flags.Duration("node-outage-grace", "GRADHUB_NODE_OUTAGE_GRACE", &node_outage_grace,
                   "How long a silent node stays in its jobs while their ranks on other nodes "
                   "still run (a partition from the api, not a death); match the agents' "
                   "--api-outage-grace");
    flags.Duration("backfill-window", "GRADHUB_BACKFILL_WINDOW", &backfill_window,
                   "How long a job that does not fit may be passed over by smaller ones");
    flags.Duration("scheduler-interval", "GRADHUB_SCHEDULER_INTERVAL", &scheduler_interval,
                   "Time between scheduler passes (one also follows every rank exit)");
    flags.Duration("leader-lease", "GRADHUB_LEADER_LEASE", &leader_lease,
                   "How long the leading replica's term lasts without a renewal: replicas take "
                   "over this long after the leader dies (renewed every quarter of it)");
    rest_streams.Register(flags);
    flags.Bool("tls-require-client-cert", "GRADHUB_TLS_REQUIRE_CLIENT_CERT",
               &require_node_certificates,
               "The agent calls of NodeService must come with a client certificate chaining to "
               "--tls-client-ca, for the node they name (mTLS); without, a certificate is still "
               "checked when presented. Needs --tls-client-ca");
  }
};

}  // namespace gradhub::api
