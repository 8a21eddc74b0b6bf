// The REST face of CheckpointService (cpp-httplib), at the paths checkpoint.proto gives next to
// each rpc: list, latest, download (raw bytes) and delete; uploads are gRPC only. It calls
// CheckpointManager as the gRPC adapter does and adds only transport: the caller from the
// `Authorization` (and, for trainers, `gradhub-node` / `gradhub-node-session`) headers, status
// codes, error bodies shaped as gradhub-api's REST gateway shapes them. Also serves /healthz,
// /readyz and /metrics.
//
//   GET    /v1/jobs/{job}/checkpoints?pageSize=&pageToken=&filter=
//   GET    /v1/jobs/{job}/checkpoints:latest
//   GET    /v1/jobs/{job}/checkpoints/{step}:download   application/octet-stream; the sha256 in
//          X-Checkpoint-Sha256; `Range: bytes=N-` answers 206 from offset N (other ranges 416).
//          A blob found corrupt mid-way ends the connection before the last byte (the status
//          line is long gone), and the checkpoint is marked BAD.
//   DELETE /v1/jobs/{job}/checkpoints/{step}
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "services/checkpoint/checkpoint_manager.h"
#include "services/checkpoint/checkpoint_metrics.h"
#include "services/common/auth/authenticator.h"
#include "services/common/http_server.h"

namespace httplib {
class Server;
}

namespace gradhub::checkpoint {

// A download holds one of max_concurrent_requests for its whole transfer. No route takes a
// body larger than 64 KiB.
struct CheckpointRestOptions : HttpServerOptions {
  CheckpointRestOptions() {
    max_concurrent_requests = 32;
    max_body_bytes = 64 << 10;
  }
};

class CheckpointRest {
 public:
  // Not owned; all must outlive this.
  CheckpointRest(CheckpointManager* manager, const api::Authenticator* auth,
                 CheckpointMetrics* metrics, CheckpointRestOptions options = {});
  ~CheckpointRest();  // Stop()

  // Binds host:port (0 = a free port) and serves on a background thread. Returns the port.
  absl::StatusOr<int> Start(const std::string& host, int port);
  // Stops accepting, lets in-flight requests finish, joins the thread. Idempotent.
  void Stop();

  // The listener, for the other REST faces this process serves on the same port (code_rest.h).
  // Add routes before Start.
  httplib::Server& http_server() { return *server_; }

 private:
  void Route();
  void RouteDownload();

  CheckpointManager* manager_;
  const api::Authenticator* auth_;
  CheckpointMetrics* metrics_;
  CheckpointRestOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace gradhub::checkpoint
