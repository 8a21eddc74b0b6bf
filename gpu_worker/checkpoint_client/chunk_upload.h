// Streams a blob's bytes to gradhub-checkpoint's UploadChunks without copying them.
//
// Through the generated stub every chunk is copied twice before the kernel copies it once more
// into the socket: into the request's `data` field, then into the serialized message. Here the
// message is framed by hand around the caller's bytes instead: protobuf's wire format is a
// message's fields in any order, so
//   1. the request's other fields (upload_id on the first chunk, offset, the data's crc32c)
//      serialized by protobuf,
//   2. then `data`'s tag (field 3, length-delimited) and length as varints,
//   3. then the bytes themselves, as a gRPC slice that points into the caller's memory
// is exactly the UploadChunkRequest the server parses. The stream goes through gRPC's generic
// stub (the typed one accepts only messages), on a completion queue of its own.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace gradhub::checkpoint_client {

// The serialized UploadChunkRequest{upload_id, offset, crc32c, data} without the data's bytes:
// what goes before them on the wire. Exposed for its test.
std::string ChunkHeader(const std::string& upload_id, int64_t offset, std::string_view data);

struct ChunkUploadResult {
  grpc::Status status;
  int64_t received_bytes = 0;  // UploadChunksResponse.received_bytes when status is OK
};

// Sends bytes[offset, size) in chunks of `chunk_bytes` on one UploadChunks stream, the first
// chunk naming `upload_id`, each with its crc32c, and waits for the server's answer. `bytes`
// must outlive the call and must not change during it: they are the bytes the caller hashed
// for CommitCheckpoint, and the server checks each chunk against its crc32c only.
// `context` carries the caller's metadata and deadline.
ChunkUploadResult UploadChunks(const std::shared_ptr<grpc::Channel>& channel,
                               grpc::ClientContext* context, const std::string& upload_id,
                               std::string_view bytes, int64_t offset, int64_t chunk_bytes);

// How many contiguous bytes the server holds of `upload_id`: a stream of one chunk without
// data, as a client resuming a broken upload asks.
ChunkUploadResult ProbeUpload(const std::shared_ptr<grpc::Channel>& channel,
                              grpc::ClientContext* context, const std::string& upload_id);

}  // namespace gradhub::checkpoint_client
