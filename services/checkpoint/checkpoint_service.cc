#include "services/checkpoint/checkpoint_service.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "services/common/auth/call_authorization.h"
#include "services/common/grpc_status.h"

namespace gradhub::checkpoint {

absl::StatusOr<Caller> CallerOfCall(const api::Authenticator& auth,
                                    const grpc::ServerContext& context) {
  return IdentifyCaller(auth, api::AuthorizationOf(context));
}

absl::StatusOr<Caller> CheckpointService::CallerOf(const grpc::ServerContext& context) const {
  return CallerOfCall(*auth_, context);
}

grpc::Status CheckpointService::StartUpload(grpc::ServerContext* context,
                                            const v1::StartUploadRequest* request,
                                            v1::StartUploadResponse* response) {
  return AnswerFor(CallerOf(*context), response,
                   [&](const Caller& caller) { return manager_->StartUpload(caller, *request); });
}

grpc::Status CheckpointService::UploadChunks(grpc::ServerContext* context,
                                             grpc::ServerReader<v1::UploadChunkRequest>* reader,
                                             v1::UploadChunksResponse* response) {
  const absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return ToGrpc(caller.status());
  const size_t max_chunk = static_cast<size_t>(manager_->options().chunk_size_bytes);
  std::unique_ptr<UploadWriter> writer;
  v1::UploadChunkRequest chunk;
  // One upload per stream: the first message names it, later ones may leave upload_id empty.
  while (reader->Read(&chunk)) {
    if (writer == nullptr) {
      absl::StatusOr<std::unique_ptr<UploadWriter>> opened =
          manager_->OpenUpload(*caller, chunk.upload_id());
      if (!opened.ok()) return ToGrpc(opened.status());
      writer = *std::move(opened);
    } else if (!chunk.upload_id().empty() && chunk.upload_id() != writer->upload_id()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "upload_id: one stream carries one upload");
    }
    if (chunk.data().size() > max_chunk) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("data: at most ", max_chunk, " bytes per chunk"));
    }
    // An error of an earlier chunk ends the stream; the chunks are written while the next
    // one arrives.
    const absl::Status queued =
        writer->Write(chunk.offset(), std::move(*chunk.mutable_data()),
                      chunk.has_crc32c() ? std::optional<uint32_t>(chunk.crc32c()) : std::nullopt);
    if (!queued.ok()) return ToGrpc(queued);
  }
  if (writer == nullptr) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "upload_id: the stream was empty");
  }
  const absl::StatusOr<int64_t> held = writer->Finish();
  if (!held.ok()) return ToGrpc(held.status());
  response->set_received_bytes(*held);
  return grpc::Status::OK;
}

grpc::Status CheckpointService::CommitCheckpoint(grpc::ServerContext* context,
                                                 const v1::CommitCheckpointRequest* request,
                                                 v1::Checkpoint* response) {
  return AnswerFor(CallerOf(*context), response,
                   [&](const Caller& caller) { return manager_->Commit(caller, *request); });
}

grpc::Status CheckpointService::DownloadCheckpoint(
    grpc::ServerContext* context, const v1::DownloadCheckpointRequest* request,
    grpc::ServerWriter<v1::DownloadCheckpointResponse>* writer) {
  const absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return ToGrpc(caller.status());
  absl::StatusOr<std::unique_ptr<CheckpointDownload>> download =
      manager_->OpenDownload(*caller, request->name(), request->offset(), request->verify_sha256());
  if (!download.ok()) return ToGrpc(download.status());
  v1::DownloadCheckpointResponse message;
  message.set_sha256((*download)->checkpoint().sha256());
  if ((*download)->checkpoint().has_crc32c())
    message.set_crc32c((*download)->checkpoint().crc32c());
  bool sent = false;
  while (true) {
    message.set_offset((*download)->offset());
    const absl::Status read = (*download)->Next(message.mutable_data());
    if (!read.ok()) return ToGrpc(read);
    // The first message carries the sha256 (and crc32c) even when there is no data (an empty blob,
    // or a download resumed at its end).
    if (message.data().empty() && sent) break;
    if (!writer->Write(message)) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
    if (metrics_ != nullptr)
      metrics_->RecordSent("grpc", static_cast<int64_t>(message.data().size()));
    if (message.data().empty()) break;
    sent = true;
    message.clear_sha256();
    message.clear_crc32c();
  }
  return grpc::Status::OK;
}

grpc::Status CheckpointService::ListCheckpoints(grpc::ServerContext* context,
                                                const v1::ListCheckpointsRequest* request,
                                                v1::ListCheckpointsResponse* response) {
  return AnswerFor(CallerOf(*context), response,
                   [&](const Caller& caller) { return manager_->List(caller, *request); });
}

grpc::Status CheckpointService::GetLatestCheckpoint(grpc::ServerContext* context,
                                                    const v1::GetLatestCheckpointRequest* request,
                                                    v1::Checkpoint* response) {
  return AnswerFor(CallerOf(*context), response, [&](const Caller& caller) {
    return manager_->GetLatest(caller, request->job());
  });
}

grpc::Status CheckpointService::DeleteCheckpoint(grpc::ServerContext* context,
                                                 const v1::DeleteCheckpointRequest* request,
                                                 google::protobuf::Empty* response) {
  const absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return ToGrpc(caller.status());
  return ToGrpc(manager_->Delete(*caller, request->name()));
}

}  // namespace gradhub::checkpoint
