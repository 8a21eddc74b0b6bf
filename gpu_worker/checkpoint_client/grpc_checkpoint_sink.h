// The trainer's CheckpointSink over gradhub-checkpoint (proto/gradhub/v1/checkpoint.proto), so
// that a restarted attempt resumes on any node, not only where the last one ran. gRPC only, no
// torch: the trainer hands it to the training loop as a plain CheckpointSink.
//
// Save (synchronous; AsyncCheckpointWriter runs it off the training loop):
//   1. Take the bytes' CRC-32C (no sha256: the store hashes the bytes as they arrive and
//      records its own, checkpoint.proto's CommitCheckpoint, so the save costs the training
//      node a CRC pass instead of a SHA-256 one, which took as long as the snapshot itself);
//      StartUpload with a request id made of attempt, step and CRC, so a retried start finds
//      the same upload.
//   2. Ask how many bytes the server holds (an UploadChunks stream with one empty chunk) and
//      stream the rest in the chunk size the server announced, each chunk with its CRC-32C. A
//      broken stream, or a chunk the server found changed on the way (DATA_LOSS from
//      UploadChunks), goes back to step 1 after a backoff: the same request id finds the same
//      upload, so only the missing tail is sent again (logged: "resuming the upload at byte
//      N"), after a restart of the store too.
//   3. CommitCheckpoint with the CRC-32C; the answer names the sha256, under which the bytes
//      are cached (cache_dir/<sha256>.ckpt). DATA_LOSS (the server's bytes differ, or the bytes
//      sent are not the bytes whose CRC was taken) starts over at step 1 under a new request
//      id; NOT_FOUND (the upload expired) likewise.
//   Retryable failures (IsRetryable in services/common/grpc_retry.h: the server unreachable,
//   busy or restarting, the token refused) back off (100 ms doubling to 1 s, with jitter; the
//   channel's reconnect backoff likewise: see kStoreBackoff in the .cc) until `deadline`. Anything
//   else (FAILED_PRECONDITION: this attempt is no longer the job's current one; PERMISSION_DENIED)
//   throws at once.
//
// LoadLatest:
//   1. GetLatestCheckpoint; NOT_FOUND means start from step 0.
//   2. A cached copy (cache_dir/<sha256>.ckpt) whose bytes still check right is used as is.
//      The check (services/common/blob_check.h) is the checkpoint's crc32c where it has one
//      (Checkpoint.crc32c: of the bytes its sha256 names), else its sha256.
//   3. Otherwise download, resuming at the received offset after a broken stream, and check
//      it likewise. DATA_LOSS from the server means it found the blob corrupt and marked it BAD:
//      back to step 1, which now names the previous good checkpoint. A check that fails is
//      retried from step 1 with verify_sha256: the server, which otherwise checks only the
//      crc32c it recorded, then hashes the blob too, and marks it BAD if its bytes differ.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>

#include "gpu_worker/trainer/sinks.h"

namespace gradhub::checkpoint_client {

struct GrpcCheckpointSinkOptions {
  std::string address;  // host:port of gradhub-checkpoint
  // Sent as a bearer token: the rank's job token (the server lets it read its job's
  // checkpoints and save its attempt's, while that attempt is current), or by hand the admin's.
  std::string token;
  std::string tls_ca_file;  // PEM certificates to trust; empty = plaintext
  std::string job;          // "jobs/<id>"
  int32_t attempt = 1;
  // Blobs this node uploaded or downloaded, by hash: a restart on the same node skips the
  // download. Empty = no cache.
  std::string cache_dir;
  // One Save or LoadLatest retries for at most this long, then throws.
  std::chrono::milliseconds deadline = std::chrono::minutes(10);
  std::chrono::milliseconds rpc_timeout = std::chrono::seconds(60);
  std::ostream* log = nullptr;  // retries and fallbacks; null = std::cerr
};

// Thread-compatible: one caller at a time (AsyncCheckpointWriter's thread for Save, the
// training thread for LoadLatest before training starts). Throws std::runtime_error.
std::shared_ptr<trainer::CheckpointSink> MakeGrpcCheckpointSink(GrpcCheckpointSinkOptions options);

}  // namespace gradhub::checkpoint_client
