#include "gpu_worker/checkpoint_client/chunk_upload.h"

#include <grpcpp/generic/generic_stub.h>

#include <algorithm>
#include <vector>

#include "gradhub/v1/checkpoint.pb.h"
#include "services/common/crc32c.h"

namespace gradhub::checkpoint_client {
namespace {

constexpr char kMethod[] = "/gradhub.v1.CheckpointService/UploadChunks";
constexpr uint32_t kDataField = 3;  // UploadChunkRequest.data
constexpr uint32_t kLengthDelimited = 2;

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// One operation on the stream's completion queue at a time: start it, wait for it.
class Completions {
 public:
  bool Wait() {
    void* tag = nullptr;
    bool ok = false;
    if (!queue_.Next(&tag, &ok)) return false;
    return ok;
  }
  grpc::CompletionQueue* queue() { return &queue_; }
  ~Completions() {
    queue_.Shutdown();
    void* tag;
    bool ok;
    while (queue_.Next(&tag, &ok)) {
    }
  }

 private:
  grpc::CompletionQueue queue_;
};

}  // namespace

std::string ChunkHeader(const std::string& upload_id, int64_t offset, std::string_view data) {
  v1::UploadChunkRequest fields;
  fields.set_upload_id(upload_id);
  fields.set_offset(offset);
  if (!data.empty()) fields.set_crc32c(Crc32c(data));
  std::string header = fields.SerializeAsString();
  AppendVarint((kDataField << 3) | kLengthDelimited, &header);
  AppendVarint(data.size(), &header);
  return header;
}

ChunkUploadResult UploadChunks(const std::shared_ptr<grpc::Channel>& channel,
                               grpc::ClientContext* context, const std::string& upload_id,
                               std::string_view bytes, int64_t offset, int64_t chunk_bytes) {
  grpc::GenericStub stub(channel);
  Completions completions;
  void* const tag = &completions;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(context, kMethod, completions.queue());
  call->StartCall(tag);
  bool open = completions.Wait();
  const int64_t size = static_cast<int64_t>(bytes.size());
  bool first = true;
  // Never an empty stream: a lone chunk without data asks how many bytes the server holds.
  while (open && (offset < size || first)) {
    const int64_t n = std::min(chunk_bytes, size - offset);
    const std::string_view data = bytes.substr(static_cast<size_t>(offset), static_cast<size_t>(n));
    const std::string header = ChunkHeader(first ? upload_id : "", offset, data);
    std::vector<grpc::Slice> slices;
    slices.emplace_back(header);
    if (n > 0) slices.emplace_back(data.data(), data.size(), grpc::Slice::STATIC_SLICE);
    grpc::ByteBuffer message(slices.data(), slices.size());
    call->Write(message, tag);
    open = completions.Wait();  // false: the stream broke; Finish says why
    offset += n;
    first = false;
  }
  if (open) {
    call->WritesDone(tag);
    open = completions.Wait();
  }
  grpc::ByteBuffer answer;
  bool answered = false;
  if (open) {
    call->Read(&answer, tag);
    answered = completions.Wait();
  }
  ChunkUploadResult result;
  call->Finish(&result.status, tag);
  completions.Wait();
  if (!result.status.ok()) return result;
  v1::UploadChunksResponse response;
  std::vector<grpc::Slice> answer_slices;
  std::string serialized;
  if (answered && answer.Dump(&answer_slices).ok()) {
    for (const grpc::Slice& slice : answer_slices) {
      serialized.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  if (!answered || !response.ParseFromString(serialized)) {
    result.status = grpc::Status(grpc::StatusCode::INTERNAL, "UploadChunks: no valid answer");
    return result;
  }
  result.received_bytes = response.received_bytes();
  return result;
}

ChunkUploadResult ProbeUpload(const std::shared_ptr<grpc::Channel>& channel,
                              grpc::ClientContext* context, const std::string& upload_id) {
  return UploadChunks(channel, context, upload_id, {}, 0, 1);
}

}  // namespace gradhub::checkpoint_client
