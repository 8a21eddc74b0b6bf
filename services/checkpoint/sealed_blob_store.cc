#include "services/checkpoint/sealed_blob_store.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/hashing_read_ahead.h"
#include "services/common/direct_write.h"
#include "services/common/status_macros.h"

namespace gradhub::checkpoint {
namespace {

using sealed::kChunkBytes;
using sealed::kHeaderBytes;
using sealed::kRecordBytes;
using sealed::kTagBytes;

absl::Status OutOfRange(int64_t offset, int64_t held) {
  return absl::OutOfRangeError(
      absl::StrCat("offset ", offset, " is beyond the ", held, " bytes held"));
}

std::string Binding(const BlobScope& scope) {
  return sealed::BlobBinding(scope.keys.ToString(), scope.identity);
}

// Up to `bytes` from `reader` into *out, fewer only at its end. The first read goes into *out's
// own memory, which is usually all of it.
absl::Status ReadExactly(BlobReader& reader, size_t bytes, std::string* out) {
  GRADHUB_RETURN_IF_ERROR(reader.Read(bytes, out));
  std::string piece;
  while (out->size() < bytes) {
    GRADHUB_RETURN_IF_ERROR(reader.Read(bytes - out->size(), &piece));
    if (piece.empty()) break;
    out->append(piece);
  }
  return absl::OkStatus();
}

// The size of record `index` of a blob of `plain_size` bytes (`count` records).
size_t RecordSize(uint64_t index, uint64_t count, int64_t plain_size) {
  if (index + 1 < count) return static_cast<size_t>(kRecordBytes);
  return static_cast<size_t>(plain_size - static_cast<int64_t>(count - 1) * kChunkBytes) +
         kTagBytes;
}

// Reads a blob's records ahead on a thread of its own, so that the disk's next read runs while
// the reader authenticates and decrypts the one before: with O_DIRECT on this VM's disk a
// record's read takes about as long as its AES-GCM and copies together, one after the other.
//   1. The thread reads records `first` .. `count` - 1 whole (ReadExactly) into a
//      ReadAheadQueue of at most kDepth records; a record cut short goes in as it is (the
//      reader names it), and ends the reading.
//   2. Take hands out the next one in order; once the queue is closed and empty, an empty
//      record and the read's error (OK: the reader finds the record short).
//   3. The destructor stops the queue (the thread then drops what it read) and joins it.
class RecordPrefetch {
 public:
  RecordPrefetch(std::unique_ptr<BlobReader> records, uint64_t first, uint64_t count,
                 int64_t plain_size)
      : records_(std::move(records)),
        thread_([this, first, count, plain_size] { ReadAll(first, count, plain_size); }) {}
  ~RecordPrefetch() {
    queue_.Stop();
    thread_.join();
  }

  absl::Status Take(std::string* record) { return queue_.Pop(record); }

 private:
  static constexpr size_t kDepth = 2;

  void ReadAll(uint64_t first, uint64_t count, int64_t plain_size) {
    absl::Status failed;
    for (uint64_t index = first; index < count; ++index) {
      const size_t size = RecordSize(index, count, plain_size);
      std::string record;
      failed = ReadExactly(*records_, size, &record);
      if (!failed.ok()) break;
      const bool cut = record.size() < size;                      // the file ended: nothing follows
      if (!queue_.Push(std::move(record), std::nullopt)) return;  // stopped
      if (cut) break;
    }
    queue_.Close(failed);
  }

  const std::unique_ptr<BlobReader> records_;  // the thread's alone
  ReadAheadQueue queue_{kDepth * static_cast<size_t>(kRecordBytes)};
  std::thread thread_;  // declared last: started once the rest exists
};

// What a thread seals into before one inner Append: reused, and block-aligned, so that a store
// that writes around the page cache sends it to the device as it is. Up to the largest Append
// plus a record of each thread that appends (the upload streams' writer threads).
AlignedBuffer& SealingBuffer() {
  thread_local AlignedBuffer buffer;
  return buffer;
}

// Copies `chunk` to the end of `out` and seals it there as record `index`.
absl::Status SealInto(sealed::ChunkSealer& sealer, uint64_t index, bool final,
                      std::string_view chunk, AlignedBuffer& out) {
  static constexpr char kNoTagYet[kTagBytes] = {};
  const size_t at = out.Append(chunk);
  out.Append(std::string_view(kNoTagYet, kTagBytes));
  return sealer.Seal(index, final, out.data() + at, chunk.size());
}

// Reads a sealed blob's records in order from the one holding the starting offset, each
// authenticated whole before any of its bytes is handed out. The first failure is final.
class SealedBlobReader final : public BlobReader {
 public:
  SealedBlobReader(std::unique_ptr<BlobReader> records, sealed::ChunkSealer sealer,
                   int64_t plain_size, uint64_t first_chunk, size_t skip)
      : records_(std::move(records), first_chunk, sealed::ChunkCount(plain_size), plain_size),
        sealer_(std::move(sealer)),
        plain_size_(plain_size),
        chunks_(sealed::ChunkCount(plain_size)),
        next_(first_chunk),
        skip_(skip) {}

  // At most the rest of one chunk per call, so that a whole chunk is handed over without a
  // copy: *out and the chunk's buffer swap places (a download's read-ahead asks for chunks
  // larger than these, which copied every byte once more). A chunk that fails its check is a
  // call's whole answer, after the authentic chunks before it.
  absl::Status Read(size_t max_bytes, std::string* out) override {
    out->clear();
    if (!failed_.ok()) return failed_;
    while (position_ == chunk_.size()) {
      if (next_ >= chunks_ || max_bytes == 0) return absl::OkStatus();  // the end of the blob
      failed_ = LoadNext();
      if (!failed_.ok()) return failed_;
    }
    const size_t n = std::min(max_bytes, chunk_.size() - position_);
    if (position_ == 0 && n == chunk_.size()) {
      out->swap(chunk_);
      chunk_.clear();  // position_ == chunk_.size(): the next call loads the next chunk
    } else {
      out->assign(chunk_, position_, n);
      position_ += n;
    }
    return absl::OkStatus();
  }
  int64_t size() const override { return plain_size_; }

 private:
  absl::Status LoadNext() {
    const bool final = next_ + 1 == chunks_;
    const size_t record = RecordSize(next_, chunks_, plain_size_);
    GRADHUB_RETURN_IF_ERROR(records_.Take(&chunk_));
    if (chunk_.size() != record) {
      chunk_.clear();
      return absl::DataLossError(absl::StrCat("its chunk ", next_, " ended early"));
    }
    if (absl::Status opened = sealer_.Open(next_, final, chunk_.data(), record); !opened.ok()) {
      chunk_.clear();
      position_ = 0;
      return opened;
    }
    chunk_.resize(record - kTagBytes);
    position_ = std::min(skip_, chunk_.size());
    skip_ = 0;
    ++next_;
    return absl::OkStatus();
  }

  RecordPrefetch records_;
  sealed::ChunkSealer sealer_;
  const int64_t plain_size_;
  const uint64_t chunks_;
  uint64_t next_;        // the chunk LoadNext reads
  size_t skip_;          // bytes of the first chunk before the starting offset
  std::string chunk_;    // the plaintext of the chunk last loaded
  size_t position_ = 0;  // in chunk_
  absl::Status failed_;
};

}  // namespace

struct SealedBlobStore::OpenedBlob {
  std::unique_ptr<BlobReader> reader;  // just past the header
  sealed::ChunkSealer sealer;
  int64_t plain_size = 0;
};

std::string SealedBlobStore::InnerUploadKey(const std::string& upload,
                                            const sealed::Header& header) {
  return absl::StrCat(upload, ".", sealed::ToHex(header.Params()));
}

std::optional<SealedBlobStore::ParsedInnerKey> SealedBlobStore::ParseInnerUploadKey(
    std::string_view inner_key) {
  const size_t dot = inner_key.rfind('.');
  if (dot == std::string_view::npos || dot == 0) return std::nullopt;
  absl::StatusOr<std::string> params = sealed::FromHex(inner_key.substr(dot + 1));
  if (!params.ok()) return std::nullopt;
  absl::StatusOr<sealed::Header> header = sealed::Header::FromParams(*params);
  if (!header.ok()) return std::nullopt;
  return ParsedInnerKey{std::string(inner_key.substr(0, dot)), *std::move(header)};
}

std::shared_ptr<SealedBlobStore::Upload> SealedBlobStore::Remember(const std::string& upload,
                                                                   std::shared_ptr<Upload> state) {
  absl::MutexLock lock(&mu_);
  return uploads_.emplace(upload, std::move(state)).first->second;  // a concurrent finder's wins
}

void SealedBlobStore::Forget(const std::string& upload) {
  absl::MutexLock lock(&mu_);
  uploads_.erase(upload);
}

absl::StatusOr<std::shared_ptr<SealedBlobStore::Upload>> SealedBlobStore::Find(
    const std::string& upload) {
  {
    absl::MutexLock lock(&mu_);
    auto known = uploads_.find(upload);
    if (known != uploads_.end()) return known->second;
  }
  GRADHUB_ASSIGN_OR_RETURN(const std::vector<UploadInfo> listed, inner_->ListUploads());
  for (const UploadInfo& info : listed) {
    std::optional<ParsedInnerKey> parsed = ParseInnerUploadKey(info.key);
    if (!parsed.has_value() || parsed->upload != upload) continue;
    auto state = std::make_shared<Upload>();
    state->inner_key = info.key;
    state->header = std::move(parsed->header);
    state->header_written = info.bytes >= kHeaderBytes;
    // Whole records only: a record cut by a crash is appended again.
    if (state->header_written) state->sealed = (info.bytes - kHeaderBytes) / kRecordBytes;
    return Remember(upload, std::move(state));
  }
  return nullptr;
}

absl::StatusOr<std::shared_ptr<SealedBlobStore::Upload>> SealedBlobStore::Begin(
    const std::string& upload) {
  GRADHUB_ASSIGN_OR_RETURN(const BlobScope scope, scopes_->OfUpload(upload));
  GRADHUB_ASSIGN_OR_RETURN(const DataKey key, keys_->Current(scope.keys));
  auto state = std::make_shared<Upload>();
  state->header = sealed::Header::Fresh(key.id);
  state->inner_key = InnerUploadKey(upload, state->header);
  GRADHUB_RETURN_IF_ERROR(CheckBlobKey(state->inner_key, false));
  state->sealer.emplace(*key.key, state->header, Binding(scope));
  return Remember(upload, std::move(state));
}

absl::Status SealedBlobStore::LoadSealer(const std::string& upload, Upload& state) {
  if (state.sealer.has_value()) return absl::OkStatus();
  GRADHUB_ASSIGN_OR_RETURN(const BlobScope scope, scopes_->OfUpload(upload));
  absl::StatusOr<DataKey> key = keys_->Find(state.header.key_id);
  if (absl::IsNotFound(key.status())) {
    return absl::DataLossError(absl::StrCat("upload '", upload, "' was sealed under data key ",
                                            sealed::ToHex(state.header.key_id),
                                            ", which is gone; abort it"));
  }
  if (!key.ok()) return key.status();
  if (key->scope != scope.keys) {
    return absl::DataLossError(absl::StrCat("upload '", upload, "' was sealed under a key of ",
                                            key->scope.ToString(), ", not of ",
                                            scope.keys.ToString()));
  }
  state.sealer.emplace(*key->key, state.header, Binding(scope));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> SealedBlobStore::Append(const std::string& upload, int64_t offset,
                                                std::string_view data) {
  GRADHUB_RETURN_IF_ERROR(CheckBlobKey(upload, false));
  if (offset < 0) return absl::InvalidArgumentError("offset: must not be negative");
  GRADHUB_ASSIGN_OR_RETURN(std::shared_ptr<Upload> state, Find(upload));
  if (state == nullptr) {
    if (offset > 0) return OutOfRange(offset, 0);
    GRADHUB_ASSIGN_OR_RETURN(state, Begin(upload));
  }
  std::lock_guard<std::mutex> lock(state->mu);
  if (state->final_sealed) {
    return absl::FailedPreconditionError(
        absl::StrCat("upload '", upload, "' is being committed: no more bytes"));
  }
  const int64_t held = state->held();
  if (offset > held) return OutOfRange(offset, held);
  // Bytes held already are ignored: the first copy stays.
  const size_t skip = static_cast<size_t>(std::min<int64_t>(held - offset, data.size()));
  data.remove_prefix(skip);
  if (data.empty() && state->header_written) return held;
  GRADHUB_RETURN_IF_ERROR(LoadSealer(upload, *state));
  GRADHUB_RETURN_IF_ERROR(SealAndAppend(*state, data));
  return state->held();
}

absl::Status SealedBlobStore::SealAndAppend(Upload& state, std::string_view data) {
  AlignedBuffer& out = SealingBuffer();
  out.Truncate(0);
  if (!state.header_written) out.Append(state.header.Encode());
  const size_t tail_before = state.tail.size();
  uint64_t sealed = state.sealed;
  bool tail_sealed = false;
  // The tail completed into a chunk first; then whole chunks straight from `data`.
  if (!state.tail.empty() && state.tail.size() + data.size() >= static_cast<size_t>(kChunkBytes)) {
    const size_t take = static_cast<size_t>(kChunkBytes) - state.tail.size();
    state.tail.append(data.substr(0, take));
    data.remove_prefix(take);
    tail_sealed = true;
    GRADHUB_RETURN_IF_ERROR(SealInto(*state.sealer, sealed++, false, state.tail, out));
  }
  for (; data.size() >= static_cast<size_t>(kChunkBytes); data.remove_prefix(kChunkBytes)) {
    GRADHUB_RETURN_IF_ERROR(
        SealInto(*state.sealer, sealed++, false, data.substr(0, kChunkBytes), out));
  }
  if (out.size() > 0) {
    const absl::Status appended =
        inner_->Append(state.inner_key, state.inner_end(), out.view()).status();
    if (!appended.ok()) {
      state.tail.resize(tail_before);  // nothing changed: the same chunks are sealed again
      return appended;
    }
  }
  state.header_written = true;
  state.sealed = sealed;
  if (tail_sealed) state.tail.clear();
  state.tail.append(data);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> SealedBlobStore::UploadedBytes(const std::string& upload) {
  GRADHUB_RETURN_IF_ERROR(CheckBlobKey(upload, false));
  GRADHUB_ASSIGN_OR_RETURN(const std::shared_ptr<Upload> state, Find(upload));
  if (state == nullptr) return 0;
  std::lock_guard<std::mutex> lock(state->mu);
  return state->held();
}

absl::Status SealedBlobStore::SealFinal(const std::string& upload, const std::string& blob,
                                        Upload& state) {
  GRADHUB_ASSIGN_OR_RETURN(const BlobScope from, scopes_->OfUpload(upload));
  GRADHUB_ASSIGN_OR_RETURN(const BlobScope to, scopes_->OfBlob(blob));
  if (from.keys != to.keys || from.identity != to.identity) {
    return absl::FailedPreconditionError(
        absl::StrCat("upload '", upload, "' belongs to ", from.keys.ToString(), " as '",
                     from.identity, "', blob '", blob, "' to ", to.keys.ToString(), " as '",
                     to.identity, "': it cannot be committed there"));
  }
  GRADHUB_RETURN_IF_ERROR(LoadSealer(upload, state));
  AlignedBuffer& out = SealingBuffer();
  out.Truncate(0);
  if (!state.header_written) out.Append(state.header.Encode());
  GRADHUB_RETURN_IF_ERROR(SealInto(*state.sealer, state.sealed, true, state.tail, out));
  GRADHUB_RETURN_IF_ERROR(inner_->Append(state.inner_key, state.inner_end(), out.view()).status());
  state.header_written = true;
  state.final_sealed = true;
  return absl::OkStatus();
}

absl::Status SealedBlobStore::Commit(const std::string& upload, const std::string& blob) {
  GRADHUB_RETURN_IF_ERROR(CheckBlobKey(upload, false));
  GRADHUB_RETURN_IF_ERROR(CheckBlobKey(blob, true));
  GRADHUB_ASSIGN_OR_RETURN(const std::shared_ptr<Upload> state, Find(upload));
  if (state == nullptr) {
    const absl::StatusOr<int64_t> committed = inner_->BlobSize(blob);
    if (committed.ok()) return absl::OkStatus();  // committed before
    if (absl::IsNotFound(committed.status())) {
      return absl::NotFoundError(absl::StrCat("upload '", upload, "' not found"));
    }
    return committed.status();
  }
  std::lock_guard<std::mutex> lock(state->mu);
  if (!state->final_sealed) GRADHUB_RETURN_IF_ERROR(SealFinal(upload, blob, *state));
  GRADHUB_RETURN_IF_ERROR(inner_->Commit(state->inner_key, blob));
  Forget(upload);
  return absl::OkStatus();
}

absl::Status SealedBlobStore::Abort(const std::string& upload) {
  GRADHUB_RETURN_IF_ERROR(CheckBlobKey(upload, false));
  std::shared_ptr<Upload> state;
  {
    absl::MutexLock lock(&mu_);
    auto known = uploads_.find(upload);
    if (known != uploads_.end()) {
      state = std::move(known->second);
      uploads_.erase(known);
    }
  }
  if (state != nullptr) return inner_->Abort(state->inner_key);
  // Not in memory: whatever a previous life of the process left under that name, and an
  // upload of the plain name (written before encryption at rest).
  GRADHUB_ASSIGN_OR_RETURN(const std::vector<UploadInfo> listed, inner_->ListUploads());
  for (const UploadInfo& info : listed) {
    const std::optional<ParsedInnerKey> parsed = ParseInnerUploadKey(info.key);
    if (parsed.has_value() && parsed->upload == upload) {
      GRADHUB_RETURN_IF_ERROR(inner_->Abort(info.key));
    }
  }
  return inner_->Abort(upload);
}

absl::StatusOr<SealedBlobStore::OpenedBlob> SealedBlobStore::OpenSealed(const std::string& blob) {
  GRADHUB_ASSIGN_OR_RETURN(std::unique_ptr<BlobReader> reader, inner_->Open(blob, 0));
  const auto lost = [&](const absl::Status& why) {
    return absl::DataLossError(absl::StrCat("blob '", blob, "': ", why.message()));
  };
  const absl::StatusOr<int64_t> plain_size = sealed::PlainSize(reader->size());
  if (!plain_size.ok()) return lost(plain_size.status());
  std::string bytes;
  GRADHUB_RETURN_IF_ERROR(ReadExactly(*reader, kHeaderBytes, &bytes));
  const absl::StatusOr<sealed::Header> header = sealed::Header::Parse(bytes);
  if (!header.ok()) return lost(header.status());
  GRADHUB_ASSIGN_OR_RETURN(const BlobScope scope, scopes_->OfBlob(blob));
  const absl::StatusOr<DataKey> key = keys_->Find(header->key_id);
  if (absl::IsNotFound(key.status())) {
    return lost(absl::DataLossError(absl::StrCat(
        "it was sealed under data key ", sealed::ToHex(header->key_id), ", which is gone")));
  }
  if (!key.ok()) return key.status();
  if (key->scope != scope.keys) {
    return lost(
        absl::DataLossError(absl::StrCat("it was sealed under a key of ", key->scope.ToString(),
                                         ", not of ", scope.keys.ToString())));
  }
  return OpenedBlob{std::move(reader), sealed::ChunkSealer(*key->key, *header, Binding(scope)),
                    *plain_size};
}

absl::StatusOr<std::unique_ptr<BlobReader>> SealedBlobStore::Open(const std::string& blob,
                                                                  int64_t offset) {
  GRADHUB_RETURN_IF_ERROR(CheckBlobKey(blob, true));
  GRADHUB_ASSIGN_OR_RETURN(OpenedBlob opened, OpenSealed(blob));
  if (offset < 0 || offset > opened.plain_size) {
    return absl::OutOfRangeError(absl::StrCat("offset ", offset, " is outside blob '", blob, "'"));
  }
  // The record that holds the offset; the bytes of it before the offset are checked with it.
  const uint64_t first = static_cast<uint64_t>(offset / kChunkBytes);
  if (first > 0) {
    GRADHUB_ASSIGN_OR_RETURN(opened.reader, inner_->Open(blob, sealed::RecordOffset(first)));
  }
  return std::make_unique<SealedBlobReader>(
      std::move(opened.reader), std::move(opened.sealer), opened.plain_size, first,
      static_cast<size_t>(offset - static_cast<int64_t>(first) * kChunkBytes));
}

absl::StatusOr<int64_t> SealedBlobStore::BlobSize(const std::string& blob) {
  GRADHUB_ASSIGN_OR_RETURN(const int64_t stored, inner_->BlobSize(blob));
  const absl::StatusOr<int64_t> plain = sealed::PlainSize(stored);
  if (!plain.ok()) {
    return absl::DataLossError(absl::StrCat("blob '", blob, "': ", plain.status().message()));
  }
  return plain;
}

absl::Status SealedBlobStore::Delete(const std::string& blob) { return inner_->Delete(blob); }

absl::StatusOr<std::vector<UploadInfo>> SealedBlobStore::ListUploads() {
  GRADHUB_ASSIGN_OR_RETURN(std::vector<UploadInfo> listed, inner_->ListUploads());
  for (UploadInfo& info : listed) {
    std::optional<ParsedInnerKey> parsed = ParseInnerUploadKey(info.key);
    if (!parsed.has_value()) continue;  // not sealed (from before encryption): as it is
    std::shared_ptr<Upload> state;
    {
      absl::MutexLock lock(&mu_);
      auto known = uploads_.find(parsed->upload);
      if (known != uploads_.end() && known->second->inner_key == info.key) state = known->second;
    }
    info.key = std::move(parsed->upload);
    if (state != nullptr) {
      std::lock_guard<std::mutex> lock(state->mu);
      info.bytes = state->held();
    } else {
      info.bytes =
          info.bytes < kHeaderBytes ? 0 : (info.bytes - kHeaderBytes) / kRecordBytes * kChunkBytes;
    }
  }
  return listed;
}

absl::StatusOr<std::vector<BlobInfo>> SealedBlobStore::ListBlobs() {
  GRADHUB_ASSIGN_OR_RETURN(std::vector<BlobInfo> listed, inner_->ListBlobs());
  // A size no sealed blob has reads as 0: such a blob fails when opened.
  for (BlobInfo& info : listed) info.bytes = sealed::PlainSize(info.bytes).value_or(0);
  return listed;
}

}  // namespace gradhub::checkpoint
