// The REST face of CodeService (cpp-httplib), on the checkpoint store's listener
// (CheckpointRest::http_server()), at the paths code.proto gives next to each rpc. It calls
// CodeStore as the gRPC adapter does and adds only transport: the caller from the
// `Authorization` header, status codes, error bodies shaped as every gradhub REST server's.
//
//   PUT /v1/code                    the archive as the body, streamed into the store as it
//       arrives (never held whole). `Content-Length` required (411 without); optional
//       `X-Code-Sha256: <64 hex>` (500 DATA_LOSS when the bytes differ). 200 with the
//       CodeArchive; 400 naming the entry for an archive the store refuses, or naming
//       --max-code-bytes for a Content-Length over it. A refused upload's body is still read to
//       its end and dropped, so that the answer reaches a client that sends the whole body
//       before it reads.
//   GET /v1/code/{sha256}           the CodeArchive
//   GET /v1/code/{sha256}:download  application/octet-stream; the sha256 in X-Code-Sha256;
//       `Range: bytes=N-` answers 206 from offset N (other ranges, and N at or past the end,
//       416). An archive found corrupt mid-way ends the connection before the last byte, and
//       the archive is removed.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/checkpoint/checkpoint_metrics.h"
#include "services/checkpoint/code_store.h"
#include "services/common/auth/authenticator.h"

namespace httplib {
class ContentReader;
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace gradhub::checkpoint {

class CodeRest {
 public:
  // Adds the routes to `server`, which must not be serving yet (CheckpointRest::Start adds its
  // last PUT route after them). Not owned; all must outlive the server's loop. `metrics` may be
  // null. The handlers may run on any of the server's threads at once.
  CodeRest(httplib::Server& server, CodeStore* store, const api::Authenticator* auth,
           CheckpointMetrics* metrics);

 private:
  void RouteUpload(httplib::Server& server);
  void RouteRead(httplib::Server& server);
  absl::StatusOr<Caller> CallerOf(const httplib::Request& request) const;
  // The upload's steps, the body read to its end whatever happens.
  absl::StatusOr<v1::CodeArchive> Upload(const httplib::Request& request,
                                         const httplib::ContentReader& body);
  absl::StatusOr<std::unique_ptr<CodeUpload>> StartUpload(const httplib::Request& request);
  void Download(const httplib::Request& request, httplib::Response& response);
  // Who asks, which archive, and from which offset (`Range`).
  absl::StatusOr<std::unique_ptr<CodeDownload>> OpenDownload(const httplib::Request& request);

  CodeStore* store_;
  const api::Authenticator* auth_;
  CheckpointMetrics* metrics_;
};

}  // namespace gradhub::checkpoint
