// A BlobStore that encrypts at rest: every upload and blob of the store it wraps (the local
// filesystem, or any other backend) is in the sealed format (sealed_format.h), under the data
// key of the tenant it belongs to (data_keys.h). Callers see plaintext offsets and sizes and
// the same contract as any BlobStore (blob_store.h; tests/unit/checkpoint runs the one
// conformance suite on it).
//
// Uploads, as Append and Commit drive them:
//   1. the first Append (offset 0) asks BlobScopes for the upload's scope and identity, and
//      DataKeys for the scope's current key; it writes the header, a fresh salt and nonce
//      prefix, to an inner upload named "<upload>.<hex of key id, salt, nonce prefix>", so
//      that a restarted process finds everything it needs to go on from the inner store's
//      listing alone (an S3-like backend cannot read an upload back);
//   2. each Append seals the whole chunks it completes and appends their records in one inner
//      Append; the bytes of a chunk not yet complete (the tail, < 1 MiB) stay in this
//      process's memory, so they are lost with it: after a restart UploadedBytes says where the
//      sealed chunks end, and the client sends the rest again (as after any broken stream);
//   3. Commit checks that the upload and the blob have the same scope and identity, seals the
//      tail as the final chunk, and commits the inner upload as the blob.
// A chunk is sealed once: bytes sent again are ignored (the first copy stays), so a nonce is
// never used for two different plaintexts. After a crash that left half a record, the next
// record is appended over it, and the inner store keeps the half it holds: a mismatch is then a
// failed tag (DATA_LOSS), never a reused nonce with a second tag on disk.
//
// Reads (Open): the header is read and parsed, its key found (DataKeys::Find) and checked to
// belong to the blob's scope (BlobScopes::OfBlob), then the records from the one holding the
// offset on, each authenticated before any of its bytes is handed out; a record that fails is
// DATA_LOSS from Read, and the bytes before it were all authentic. A Read hands out at most the
// rest of one chunk (a whole one without a copy), and the records are read ahead, two at most,
// on a thread of the reader's own (the disk's next read overlaps the AES-GCM of the one
// before). Open itself answers
// DATA_LOSS for a file that is not a sealed blob of that scope (no header, a size that no
// sealed blob has, another tenant's key, a key that is gone).
//
// Thread-safety: every method may be called from any thread (as BlobStore). The in-memory state
// of an upload is guarded by a lock of its own; calls on one upload are serialized by the
// caller, as the contract says. Readers are one per caller.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "services/checkpoint/blob_store.h"
#include "services/checkpoint/data_keys.h"
#include "services/checkpoint/sealed_format.h"

namespace gradhub::checkpoint {

class SealedBlobStore final : public BlobStore {
 public:
  // Not owned; all must outlive the store.
  SealedBlobStore(BlobStore* inner, DataKeys* keys, BlobScopes* scopes)
      : inner_(inner), keys_(keys), scopes_(scopes) {}

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

  // The inner store's key of an upload sealed with `header` ("<upload>.<hex>"), and back:
  // nullopt for an inner key of another form.
  static std::string InnerUploadKey(const std::string& upload, const sealed::Header& header);
  struct ParsedInnerKey {
    std::string upload;
    sealed::Header header;
  };
  static std::optional<ParsedInnerKey> ParseInnerUploadKey(std::string_view inner_key);

 private:
  // What this process knows of one upload (step 1-3 above).
  struct Upload {
    std::mutex mu;
    std::string inner_key;  // empty: no inner upload yet
    sealed::Header header;
    std::optional<sealed::ChunkSealer> sealer;  // made when first needed
    bool header_written = false;
    uint64_t sealed = 0;  // whole chunks sealed and appended
    std::string tail;     // plaintext after them, in memory only
    bool final_sealed = false;

    int64_t held() const {
      return static_cast<int64_t>(sealed) * sealed::kChunkBytes + static_cast<int64_t>(tail.size());
    }
    int64_t inner_end() const { return header_written ? sealed::RecordOffset(sealed) : 0; }
  };

  // The state of `upload`, from memory or from the inner store's listing (a restart); null when
  // neither has it.
  absl::StatusOr<std::shared_ptr<Upload>> Find(const std::string& upload);
  std::shared_ptr<Upload> Remember(const std::string& upload, std::shared_ptr<Upload> state);
  void Forget(const std::string& upload);
  // Step 1: a new upload's scope, key and header.
  absl::StatusOr<std::shared_ptr<Upload>> Begin(const std::string& upload);
  // The sealer of an upload found in the listing: its key, checked against the upload's scope.
  absl::Status LoadSealer(const std::string& upload, Upload& state);
  // Step 2: seals the chunks `data` completes and appends them (and the header, if not written
  // yet); the rest joins the tail.
  absl::Status SealAndAppend(Upload& state, std::string_view data);
  // Step 3: the final chunk.
  absl::Status SealFinal(const std::string& upload, const std::string& blob, Upload& state);
  // The sealer of a committed blob: its header read, its key found and checked.
  struct OpenedBlob;
  absl::StatusOr<OpenedBlob> OpenSealed(const std::string& blob);

  BlobStore* const inner_;
  DataKeys* const keys_;
  BlobScopes* const scopes_;
  absl::Mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Upload>> uploads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradhub::checkpoint
