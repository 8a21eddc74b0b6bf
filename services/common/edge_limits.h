// What one client may take of a gradhub server (gradhub-api, gradhub-checkpoint,
// gradhub-metrics), over HTTP and over gRPC, so that slow or greedy clients cannot take the
// threads that answer everyone else, the probes (/healthz, /readyz, /metrics) included. Every
// limit is a flag of every server (ServerSettings registers them) with a default sized for a
// cluster's own clients; a deployment behind a proxy (every client then has the proxy's address)
// raises --http-max-connections-per-client.
//
// How the HTTP server applies them: services/common/http_server.h. Plain data, read-only once
// the server runs.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "services/common/flags.h"

namespace gradhub {

struct HttpLimits {
  // Connections open at once, in all and from one client address. Beyond the total, the
  // connection that has waited longest for its request is closed to make room; beyond the
  // client's own limit, the new connection is refused (429). Each open connection has a
  // thread of its own while it lives.
  int64_t max_connections = 512;
  int64_t max_connections_per_client = 64;
  // A request's line and headers must arrive within this from when the server starts to wait
  // for them (the connection's start, or the end of the previous response); else 408.
  absl::Duration header_timeout = absl::Seconds(10);
  // A request body must arrive within body_timeout plus one second for every body_min_rate
  // bytes received (so a large body at a steady rate is never cut); else 408.
  absl::Duration body_timeout = absl::Seconds(10);
  int64_t body_min_rate = 8 << 10;  // bytes per second

  void Register(Flags& flags) {
    flags.Int("http-max-connections", "GRADHUB_HTTP_MAX_CONNECTIONS", &max_connections,
              "HTTP connections open at once; beyond, the one idle longest is closed, or the new "
              "one refused when none is idle");
    flags.Int("http-max-connections-per-client", "GRADHUB_HTTP_MAX_CONNECTIONS_PER_CLIENT",
              &max_connections_per_client,
              "HTTP connections open at once from one client address; beyond, refused (429). "
              "Raise it behind a proxy");
    flags.Duration("http-header-timeout", "GRADHUB_HTTP_HEADER_TIMEOUT", &header_timeout,
                   "Time a client has to send a request's line and headers (408 after)");
    flags.Duration("http-body-timeout", "GRADHUB_HTTP_BODY_TIMEOUT", &body_timeout,
                   "Time a client has to send a request body, plus 1s per "
                   "--http-body-min-rate bytes received (408 after)");
    flags.Int("http-body-min-rate", "GRADHUB_HTTP_BODY_MIN_RATE", &body_min_rate,
              "Bytes per second a request body must average after --http-body-timeout");
  }

  // INVALID_ARGUMENT naming the flag that is out of range.
  absl::Status Validate() const {
    if (max_connections < 2 || max_connections > kMostConnections) {
      return OutOfRange("--http-max-connections", 2, kMostConnections);
    }
    if (max_connections_per_client < 1 || max_connections_per_client > max_connections) {
      return OutOfRange("--http-max-connections-per-client", 1, max_connections);
    }
    if (body_min_rate < 1) return OutOfRange("--http-body-min-rate", 1, INT64_MAX);
    for (const auto& [flag, value] : {std::pair{"--http-header-timeout", header_timeout},
                                      {"--http-body-timeout", body_timeout}}) {
      if (value < absl::Milliseconds(1) || value > absl::Hours(1)) {
        return absl::InvalidArgumentError(absl::StrCat(flag, ": must be between 1ms and 1h"));
      }
    }
    return absl::OkStatus();
  }

 private:
  // A thread per connection: far above what one process should run.
  static constexpr int64_t kMostConnections = 65536;
  static absl::Status OutOfRange(const char* flag, int64_t least, int64_t most) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": must be between ", least, " and ", most));
  }
};

// The api's REST watch and followed-log streams open at once, in all and per tenant (the admin
// token counts as one): each holds a connection and its thread for its whole life. Beyond, 429
// RESOURCE_EXHAUSTED naming the flag. Only gradhub-api has these flags.
struct StreamLimits {
  int64_t max_streams = 256;
  int64_t max_streams_per_tenant = 32;

  void Register(Flags& flags) {
    flags.Int("http-max-streams", "GRADHUB_HTTP_MAX_STREAMS", &max_streams,
              "REST watch and log streams open at once (each holds a connection); beyond, 429. "
              "Keep it under --http-max-connections, so that probes always find room");
    flags.Int("http-max-streams-per-tenant", "GRADHUB_HTTP_MAX_STREAMS_PER_TENANT",
              &max_streams_per_tenant, "REST watch and log streams one tenant may have open");
  }
  // INVALID_ARGUMENT naming the flag that is out of range.
  absl::Status Validate() const {
    if (max_streams < 1 || max_streams > INT32_MAX) {
      return absl::InvalidArgumentError("--http-max-streams: must be between 1 and 2147483647");
    }
    if (max_streams_per_tenant < 1 || max_streams_per_tenant > max_streams) {
      return absl::InvalidArgumentError(
          "--http-max-streams-per-tenant: must be between 1 and --http-max-streams");
    }
    return absl::OkStatus();
  }
};

struct GrpcLimits {
  // Calls one connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; the
  // client queues the rest). gRPC's own default has no limit.
  int64_t max_streams_per_connection = 100;
  // Threads the server's synchronous calls may hold in all (a stream holds one for its whole
  // life); a call beyond is answered RESOURCE_EXHAUSTED at once. 0 = no limit.
  int64_t max_threads = 2048;
  // A client must finish its TLS and HTTP/2 handshake within this (gRPC's default is 120s).
  absl::Duration handshake_timeout = absl::Seconds(10);

  void Register(Flags& flags) {
    flags.Int("grpc-max-streams-per-connection", "GRADHUB_GRPC_MAX_STREAMS_PER_CONNECTION",
              &max_streams_per_connection,
              "gRPC calls one connection may have open at once; the client queues the rest");
    flags.Int("grpc-max-threads", "GRADHUB_GRPC_MAX_THREADS", &max_threads,
              "Threads gRPC calls may hold in all (a stream holds one); beyond, "
              "RESOURCE_EXHAUSTED. 0 = no limit");
    flags.Duration("grpc-handshake-timeout", "GRADHUB_GRPC_HANDSHAKE_TIMEOUT", &handshake_timeout,
                   "Time a gRPC client has to finish its TLS and HTTP/2 handshake");
  }

  absl::Status Validate() const {
    if (max_streams_per_connection < 1 || max_streams_per_connection > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("--grpc-max-streams-per-connection: must be between 1 and ", INT32_MAX));
    }
    if (max_threads < 0 || max_threads > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("--grpc-max-threads: must be between 0 and ", INT32_MAX));
    }
    if (handshake_timeout < absl::Milliseconds(1) || handshake_timeout > absl::Hours(1)) {
      return absl::InvalidArgumentError("--grpc-handshake-timeout: must be between 1ms and 1h");
    }
    return absl::OkStatus();
  }
};

}  // namespace gradhub
