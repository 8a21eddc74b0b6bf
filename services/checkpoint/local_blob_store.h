// The local-filesystem BlobStore: everything under one data directory.
//
//   <data_dir>/uploads/<upload>.part   an upload in progress, written with pwrite
//   <data_dir>/blobs/<blob>            committed blobs (the service's keys nest them by job)
//
// Commit, in this order, so that a blob is durable before it is visible and visible before the
// service writes its row:
//   1. fsync the upload's file (its data and size);
//   2. create the blob's directory if need be, fsync its parent;
//   3. rename the file to the blob's path (atomic within one filesystem);
//   4. fsync the blob's directory, which makes the rename durable.
// Uploads are written with O_DIRECT (services/common/direct_write.h: whole blocks straight to
// the device, a sub-block tail through the page cache), so the fsync at commit finds nothing but
// metadata and the device's cache left to flush, and a checkpoint does not evict the page cache
// of the machine. On a filesystem without O_DIRECT (an old tmpfs) appends are buffered, and
// their written pages handed to the kernel's writeback every kWritebackBytes
// (sync_file_range, which does not wait). Blobs are read with O_DIRECT too (DirectFileReader):
// a download or a scrub reads each byte once.
#pragma once

#include <string>

#include "services/checkpoint/blob_store.h"

namespace gradhub::checkpoint {

class LocalBlobStore final : public BlobStore {
 public:
  struct Options {
    // O_DIRECT where the filesystem allows it; false writes and reads through the page cache
    // always (the path a filesystem without O_DIRECT takes; tests run the conformance suite on
    // both).
    bool direct_io = true;
  };
  // Creates the directories when missing. The data directory must be on one filesystem.
  static absl::StatusOr<std::unique_ptr<LocalBlobStore>> Open(const std::string& data_dir,
                                                              Options options);
  static absl::StatusOr<std::unique_ptr<LocalBlobStore>> Open(const std::string& data_dir) {
    return Open(data_dir, Options());
  }

  // Without O_DIRECT: how much of an upload may be dirty before its writeback is started.
  static constexpr int64_t kWritebackBytes = 8 << 20;

  absl::StatusOr<int64_t> Append(const std::string& upload, int64_t offset,
                                 std::string_view data) override;
  absl::StatusOr<int64_t> UploadedBytes(const std::string& upload) override;
  absl::Status Commit(const std::string& upload, const std::string& blob) override;
  absl::Status Abort(const std::string& upload) override;
  absl::StatusOr<std::unique_ptr<BlobReader>> Open(const std::string& blob,
                                                   int64_t offset) override;
  absl::StatusOr<int64_t> BlobSize(const std::string& blob) override;
  absl::Status Delete(const std::string& blob) override;
  absl::StatusOr<std::vector<UploadInfo>> ListUploads() override;
  absl::StatusOr<std::vector<BlobInfo>> ListBlobs() override;

  // Paths, for tests and operators.
  std::string UploadPath(const std::string& upload) const;
  std::string BlobPath(const std::string& blob) const;

 private:
  LocalBlobStore(std::string data_dir, Options options)
      : data_dir_(std::move(data_dir)), options_(options) {}

  const std::string data_dir_;
  const Options options_;
};

}  // namespace gradhub::checkpoint
