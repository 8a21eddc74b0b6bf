// gradhub.v1.CodeService over gRPC: the caller from the call's metadata (as CheckpointService
// learns it), one CodeStore call, its absl::Status mapped one to one onto the gRPC status. The
// synchronous API, as CheckpointService: an upload's stream is a loop of blocking reads on one
// of gRPC's threads, registered on the same server.
#pragma once

#include "gradhub/v1/code.grpc.pb.h"
#include "services/checkpoint/code_store.h"
#include "services/common/auth/authenticator.h"

namespace gradhub::checkpoint {

// The most data one UploadCodeRequest may carry (code.proto); the server's message limit must
// leave room for it.
inline constexpr int kMaxCodeMessageDataBytes = 4 << 20;

class CodeService final : public v1::CodeService::Service {
 public:
  // Not owned; all must outlive the service. `metrics` may be null.
  CodeService(CodeStore* store, const api::Authenticator* auth, CheckpointMetrics* metrics)
      : store_(store), auth_(auth), metrics_(metrics) {}

  grpc::Status UploadCode(grpc::ServerContext* context,
                          grpc::ServerReader<v1::UploadCodeRequest>* reader,
                          v1::CodeArchive* response) override;
  grpc::Status GetCode(grpc::ServerContext* context, const v1::GetCodeRequest* request,
                       v1::CodeArchive* response) override;
  grpc::Status DownloadCode(grpc::ServerContext* context, const v1::DownloadCodeRequest* request,
                            grpc::ServerWriter<v1::DownloadCodeResponse>* writer) override;

 private:
  // The stream after its header: every data message into `upload`, then its end.
  absl::StatusOr<v1::CodeArchive> Receive(grpc::ServerReader<v1::UploadCodeRequest>& reader,
                                          CodeUpload& upload);

  CodeStore* store_;
  const api::Authenticator* auth_;
  CheckpointMetrics* metrics_;
};

}  // namespace gradhub::checkpoint
