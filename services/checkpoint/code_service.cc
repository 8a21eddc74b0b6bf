#include "services/checkpoint/code_service.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/checkpoint_service.h"
#include "services/common/grpc_status.h"
#include "services/common/status_macros.h"

namespace gradhub::checkpoint {

grpc::Status CodeService::UploadCode(grpc::ServerContext* context,
                                     grpc::ServerReader<v1::UploadCodeRequest>* reader,
                                     v1::CodeArchive* response) {
  const absl::StatusOr<Caller> caller = CallerOfCall(*auth_, *context);
  if (!caller.ok()) return ToGrpc(caller.status());
  v1::UploadCodeRequest first;
  if (!reader->Read(&first) || !first.has_header()) {
    return ToGrpc(absl::InvalidArgumentError("header: the stream's first message must be it"));
  }
  absl::StatusOr<std::unique_ptr<CodeUpload>> upload = store_->StartUpload(*caller, first.header());
  if (!upload.ok()) return ToGrpc(upload.status());
  // A broken stream ends the loop early: the size check refuses it, and the upload is
  // discarded with its CodeUpload.
  return Answer(Receive(*reader, **upload), response);
}

absl::StatusOr<v1::CodeArchive> CodeService::Receive(
    grpc::ServerReader<v1::UploadCodeRequest>& reader, CodeUpload& upload) {
  v1::UploadCodeRequest message;
  while (reader.Read(&message)) {
    if (message.has_header()) {
      return absl::InvalidArgumentError("header: only the stream's first message carries it");
    }
    if (message.data().size() > static_cast<size_t>(kMaxCodeMessageDataBytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("data: at most ", kMaxCodeMessageDataBytes, " bytes a message"));
    }
    GRADHUB_RETURN_IF_ERROR(upload.Write(std::move(*message.mutable_data())));
  }
  return upload.Finish();
}

grpc::Status CodeService::GetCode(grpc::ServerContext* context, const v1::GetCodeRequest* request,
                                  v1::CodeArchive* response) {
  return AnswerFor(CallerOfCall(*auth_, *context), response,
                   [&](const Caller& caller) { return store_->Get(caller, request->name()); });
}

grpc::Status CodeService::DownloadCode(grpc::ServerContext* context,
                                       const v1::DownloadCodeRequest* request,
                                       grpc::ServerWriter<v1::DownloadCodeResponse>* writer) {
  const absl::StatusOr<Caller> caller = CallerOfCall(*auth_, *context);
  if (!caller.ok()) return ToGrpc(caller.status());
  absl::StatusOr<std::unique_ptr<CodeDownload>> download =
      store_->OpenDownload(*caller, request->name(), request->offset());
  if (!download.ok()) return ToGrpc(download.status());
  v1::DownloadCodeResponse message;
  while (true) {
    const absl::Status read = (*download)->Next(message.mutable_data());
    if (!read.ok()) return ToGrpc(read);
    if (message.data().empty()) return grpc::Status::OK;
    if (!writer->Write(message)) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
    if (metrics_ != nullptr) {
      metrics_->RecordSent("grpc", static_cast<int64_t>(message.data().size()));
    }
  }
}

}  // namespace gradhub::checkpoint
