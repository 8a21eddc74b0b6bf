// gradhub.v1.CheckpointService over gRPC: the caller from the call's `authorization` metadata,
// one CheckpointManager call, its absl::Status mapped one to one onto the gRPC status. The
// synchronous API: a stream of chunks is a loop of blocking reads and writes on one of gRPC's
// threads, which is what that pool is for (and a sync server must not also carry callback
// services: see services/common/async_grpc_service.h).
#pragma once

#include "gradhub/v1/checkpoint.grpc.pb.h"
#include "services/checkpoint/checkpoint_manager.h"
#include "services/checkpoint/checkpoint_metrics.h"
#include "services/common/auth/authenticator.h"

namespace gradhub::checkpoint {

// The caller of a call, from its `authorization`: what CheckpointService and CodeService
// (code_service.h) both ask.
absl::StatusOr<Caller> CallerOfCall(const api::Authenticator& auth,
                                    const grpc::ServerContext& context);

class CheckpointService final : public v1::CheckpointService::Service {
 public:
  // Not owned; all must outlive the service. `metrics` may be null.
  CheckpointService(CheckpointManager* manager, const api::Authenticator* auth,
                    CheckpointMetrics* metrics)
      : manager_(manager), auth_(auth), metrics_(metrics) {}

  grpc::Status StartUpload(grpc::ServerContext* context, const v1::StartUploadRequest* request,
                           v1::StartUploadResponse* response) override;
  grpc::Status UploadChunks(grpc::ServerContext* context,
                            grpc::ServerReader<v1::UploadChunkRequest>* reader,
                            v1::UploadChunksResponse* response) override;
  grpc::Status CommitCheckpoint(grpc::ServerContext* context,
                                const v1::CommitCheckpointRequest* request,
                                v1::Checkpoint* response) override;
  grpc::Status DownloadCheckpoint(
      grpc::ServerContext* context, const v1::DownloadCheckpointRequest* request,
      grpc::ServerWriter<v1::DownloadCheckpointResponse>* writer) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* context,
                               const v1::ListCheckpointsRequest* request,
                               v1::ListCheckpointsResponse* response) override;
  grpc::Status GetLatestCheckpoint(grpc::ServerContext* context,
                                   const v1::GetLatestCheckpointRequest* request,
                                   v1::Checkpoint* response) override;
  grpc::Status DeleteCheckpoint(grpc::ServerContext* context,
                                const v1::DeleteCheckpointRequest* request,
                                google::protobuf::Empty* response) override;

 private:
  absl::StatusOr<Caller> CallerOf(const grpc::ServerContext& context) const;

  CheckpointManager* manager_;
  const api::Authenticator* auth_;
  CheckpointMetrics* metrics_;
};

}  // namespace gradhub::checkpoint
