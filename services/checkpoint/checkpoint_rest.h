// The REST face of CheckpointService (cpp-httplib), at the paths checkpoint.proto gives next to
// each rpc: list, latest, download (raw bytes), delete, and one-request uploads for clients
// without gRPC (script ranks, through the `gradhub` Python module). It calls CheckpointManager
// as the gRPC adapter does and adds only transport: the caller from the `Authorization` header,
// status codes, error bodies shaped as gradhub-api's REST gateway shapes them. Also serves
// /healthz, /readyz and /metrics.
//
//   GET    /v1/jobs/{job}/checkpoints?pageSize=&pageToken=&filter=
//   GET    /v1/jobs/{job}/checkpoints:latest
//   GET    /v1/jobs/{job}/checkpoints/{step}:download   application/octet-stream; the sha256 in
//          X-Checkpoint-Sha256; `Range: bytes=N-` answers 206 from offset N (other ranges 416);
//          `?verifySha256=true` as DownloadCheckpointRequest.verify_sha256.
//          A blob found corrupt mid-way ends the connection before the last byte (the status
//          line is long gone), and the checkpoint is marked BAD.
//   PUT    /v1/jobs/{job}/checkpoints/{step}?attempt=N   the checkpoint's bytes as the body;
//          `Content-Length` required (411 without; 413 over max_upload_bytes), the body's
//          end-to-end check required (400 naming both when neither):
//          `X-Checkpoint-Sha256: <64 lowercase hex>`, `X-Checkpoint-Crc32c: <8 lowercase hex>`
//          or both (the CRC-32C costs the client a tenth of the CPU: what the `gradhub` module
//          sends where gradhub's engine is loaded); optional
//          `X-Checkpoint-Metadata: key=value,key=value` (no commas or '=' in either). Steps 1-3
//          of checkpoint.proto in one request, streamed to the blob store as the body arrives
//          (never held whole): StartUpload, the body as chunks, CommitCheckpoint. The server
//          hashes the body as it writes it (its sha256, the content key, and its CRC-32C): a
//          client's digest that does not match is DATA_LOSS (500) and nothing is kept. 200
//          with the Checkpoint; 409 ALREADY_EXISTS when the step has a committed checkpoint,
//          with that one's digests in X-Checkpoint-Sha256 and X-Checkpoint-Crc32c (a client
//          that retried an upload whose answer it lost finds its own bytes there).
//   DELETE /v1/jobs/{job}/checkpoints/{step}
//
// Request bodies: the PUT routes stream theirs and check their own limits; every other route
// takes at most max_body_bytes (a larger or chunked body is read, dropped and answered 413).
// An upload refused before its body is read (bad headers, no access, the step exists) is still
// read to its end and dropped, so that the answer reaches a client that sends the whole body
// before it reads (Python's http.client does).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "services/checkpoint/checkpoint_manager.h"
#include "services/checkpoint/checkpoint_metrics.h"
#include "services/common/auth/authenticator.h"
#include "services/common/http_server.h"

namespace httplib {
class ContentReader;
struct Request;
struct Response;
class Server;
}  // namespace httplib

namespace gradhub::checkpoint {

// A download or an upload holds its connection's thread for its whole transfer (the store's
// --max-transfers bound how many run). max_body_bytes (64 KiB) bounds the body of every route
// but the PUT uploads.
struct CheckpointRestOptions : HttpServerOptions {
  CheckpointRestOptions() { max_body_bytes = 64 << 10; }
  // The largest checkpoint one PUT may carry. gRPC uploads have no limit of their own (the
  // disk is one); this bounds what a Content-Length may declare.
  int64_t max_upload_bytes = int64_t{1} << 40;
};

class CheckpointRest {
 public:
  // Not owned; all must outlive this.
  CheckpointRest(CheckpointManager* manager, const api::Authenticator* auth,
                 CheckpointMetrics* metrics, CheckpointRestOptions options = {});
  ~CheckpointRest();  // Stop()

  // Binds host:port (0 = a free port) and serves on a background thread. Returns the port.
  // Call once, after every route is added: it adds the last PUT route, which reads and drops
  // the body of a PUT no other route took and answers 404.
  absl::StatusOr<int> Start(const std::string& host, int port);
  // Stops accepting, lets in-flight requests finish, joins the thread. Idempotent.
  void Stop();

  // The listener, for the other REST faces this process serves on the same port (code_rest.h).
  // Add routes before Start. A PUT route must take an httplib::ContentReader and check the size
  // of what it reads: the listener's own body limit is off, for the uploads.
  httplib::Server& http_server() { return *server_; }

 private:
  void Route();
  void RouteDownload();
  void RouteUpload();
  // Bodies over max_body_bytes on the routes that are not PUT: refused, see the top.
  void LimitBodies();
  absl::StatusOr<Caller> CallerOf(const httplib::Request& request) const;
  // The PUT upload's steps; see the top.
  absl::StatusOr<v1::Checkpoint> Upload(const httplib::Request& request,
                                        const httplib::ContentReader& body);
  absl::StatusOr<std::unique_ptr<UploadWriter>> OpenUpload(const Caller& caller,
                                                           const v1::StartUploadRequest& start);
  // The committed checkpoint `name`'s digests in `response`'s headers (none when it cannot be
  // read), for a client that retried an upload whose answer it lost.
  void SetCommittedDigests(const Caller& caller, const std::string& name,
                           httplib::Response& response);

  CheckpointManager* manager_;
  const api::Authenticator* auth_;
  CheckpointMetrics* metrics_;
  CheckpointRestOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace gradhub::checkpoint
