#include "services/checkpoint/code_store.h"

#include <algorithm>
#include <random>
#include <unordered_set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "services/common/job_records.h"
#include "services/common/status_macros.h"

namespace gradhub::checkpoint {
namespace {

using Kind = api::Principal::Kind;

constexpr char kCodeColumns[] =
    "sha256, size_bytes, unpacked_bytes, entries,"
    " (extract(epoch FROM create_time) * 1e6)::bigint AS create_us";

bool IsHex64(absl::string_view text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return absl::ascii_isxdigit(static_cast<unsigned char>(c));
         });
}

// A fresh upload key, "code-<32 hex>": unique, not secret.
std::string NewUploadKey() {
  std::random_device random;
  return absl::StrFormat("%s%08x%08x%08x%08x", kCodeUploadPrefix, random(), random(), random(),
                         random());
}

v1::CodeArchive ArchiveFromRow(const db::Row& row) {
  const std::string sha256 = row.Get<std::string>("sha256");
  v1::CodeArchive archive;
  archive.set_name(CodeBlobKey(sha256));
  archive.set_digest("sha256:" + sha256);
  archive.set_size_bytes(row.Get<int64_t>("size_bytes"));
  archive.set_unpacked_bytes(row.Get<int64_t>("unpacked_bytes"));
  archive.set_entries(row.Get<int32_t>("entries"));
  *archive.mutable_create_time() = api::MicrosColumn(row, "create_us");
  return archive;
}

std::string ShaOf(const v1::CodeArchive& archive) {
  return archive.name().substr(sizeof(kCodeBlobPrefix) - 1);
}

absl::Status CheckHeader(const v1::UploadCodeHeader& header, const code::ArchiveLimits& limits) {
  if (header.size_bytes() < 0) {
    return absl::InvalidArgumentError("header.size_bytes: must not be negative");
  }
  if (header.size_bytes() > limits.max_archive_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.size_bytes: ", header.size_bytes(), " bytes of archive are over the ",
                     "limit of ", limits.max_archive_bytes, " bytes (--max-code-bytes)"));
  }
  if (!header.sha256().empty() && !IsHex64(header.sha256())) {
    return absl::InvalidArgumentError("header.sha256: must be 64 hex characters");
  }
  return absl::OkStatus();
}

// The tenant whose rows `caller` reads, or nullopt for every row (nodes, the admin).
absl::StatusOr<std::optional<int64_t>> ReaderTenant(const Caller& caller) {
  switch (caller.principal.kind) {
    case Kind::kTenant:
      return std::optional<int64_t>(caller.principal.tenant_id);
    case Kind::kAdmin:
    case Kind::kNode:
      return std::optional<int64_t>();
    case Kind::kJob:
      break;
  }
  return absl::PermissionDeniedError("script ranks have no access to code archives");
}

}  // namespace

std::string CodeBlobKey(const std::string& sha256) { return kCodeBlobPrefix + sha256; }

absl::StatusOr<std::string> ParseCodeName(const std::string& name) {
  absl::string_view hex = name;
  if (!absl::ConsumePrefix(&hex, kCodeBlobPrefix) && !absl::ConsumePrefix(&hex, "sha256:")) {
    hex = {};
  }
  if (!IsHex64(hex)) {
    return absl::InvalidArgumentError(
        absl::StrCat("name: '", name.substr(0, 100),
                     "' is neither code/<sha256> nor sha256:<sha256> (64 hex characters)"));
  }
  return absl::AsciiStrToLower(hex);
}

std::string CodeCleanupReport::ToString() const {
  return absl::StrCat("code uploads of a previous life removed: ", stale_uploads,
                      "; code blobs without a row removed: ", orphan_blobs);
}

std::string CodeScrubReport::ToString() const {
  std::string text = absl::StrCat("code archives checked: ", checked, " (", bytes,
                                  " bytes); corrupt: ", corrupt.size());
  for (const std::string& line : corrupt) absl::StrAppend(&text, "; ", line);
  return text;
}

// ---------------------------------------------------------------------------------------------
// KeysInUse.

KeysInUse::Hold::Hold(Hold&& other) noexcept
    : keys_(std::exchange(other.keys_, nullptr)), key_(std::move(other.key_)) {}

KeysInUse::Hold& KeysInUse::Hold::operator=(Hold&& other) noexcept {
  if (this != &other) {
    if (keys_ != nullptr) keys_->Release(key_);
    keys_ = std::exchange(other.keys_, nullptr);
    key_ = std::move(other.key_);
  }
  return *this;
}

KeysInUse::Hold::~Hold() {
  if (keys_ != nullptr) keys_->Release(key_);
}

KeysInUse::Hold KeysInUse::Take(const std::string& key) {
  absl::MutexLock lock(&mu_);
  ++held_[key];
  return Hold(this, key);
}

void KeysInUse::Release(const std::string& key) {
  absl::MutexLock lock(&mu_);
  if (--held_[key] == 0) held_.erase(key);
}

bool KeysInUse::RunUnlessHeld(const std::string& key, const std::function<void()>& remove) {
  absl::MutexLock lock(&mu_);
  if (held_.count(key) > 0) return false;
  remove();
  return true;
}

// ---------------------------------------------------------------------------------------------
// HashingBlobSink.

HashingBlobSink::~HashingBlobSink() = default;

absl::Status HashingBlobSink::status() {
  absl::MutexLock lock(&mu_);
  return status_;
}

absl::Status HashingBlobSink::Append(std::string data) {
  GRADHUB_RETURN_IF_ERROR(status());
  if (data.empty()) return absl::OkStatus();
  if (filling_ != nullptr && filling_->bytes.size() + data.size() > kBatchBytes) Flush();
  if (filling_ == nullptr) {
    {
      absl::MutexLock lock(&mu_);
      filling_ = std::move(spare_);
    }
    if (filling_ == nullptr) filling_ = std::make_shared<Batch>();
    filling_->offset = appended_;
    filling_->bytes.Truncate(0);
  }
  filling_->bytes.Append(data);
  appended_ += static_cast<int64_t>(data.size());
  sha256_.Update(std::move(data));
  if (filling_->bytes.size() >= kBatchBytes) Flush();
  return absl::OkStatus();
}

void HashingBlobSink::Flush() {
  std::shared_ptr<Batch> batch = std::move(filling_);
  filling_ = nullptr;
  if (batch == nullptr) return;
  writer_.Submit(batch->bytes.size(), [this, batch] {
    absl::Status written = status();
    if (written.ok())
      written = blobs_->Append(upload_key_, batch->offset, batch->bytes.view()).status();
    absl::MutexLock lock(&mu_);
    if (status_.ok()) status_ = written;
    spare_ = batch;
  });
}

absl::StatusOr<std::string> HashingBlobSink::Finish() {
  Flush();
  writer_.Drain();
  GRADHUB_RETURN_IF_ERROR(status());
  // An empty upload exists too, for the commit to find.
  if (appended_ == 0) GRADHUB_RETURN_IF_ERROR(blobs_->Append(upload_key_, 0, "").status());
  return sha256_.Hex();
}

// ---------------------------------------------------------------------------------------------
// CodeUpload.

CodeUpload::CodeUpload(CodeStore* store, int64_t tenant_id, v1::UploadCodeHeader header,
                       TransferSlots::Slot slot, std::string upload_key)
    : store_(store),
      tenant_id_(tenant_id),
      header_(std::move(header)),
      slot_(std::move(slot)),
      hold_(store->in_use_.Take(upload_key)),
      checker_(store->options_.limits),
      sink_(std::make_unique<HashingBlobSink>(store->blobs_, std::move(upload_key))) {}

CodeUpload::~CodeUpload() {
  const std::string key = sink_->upload_key();
  sink_.reset();  // its writes end first
  // After a commit the upload is gone and this does nothing.
  store_->blobs_->Abort(key).IgnoreError();
}

absl::Status CodeUpload::Fail(absl::Status status) {
  if (failed_.ok()) failed_ = std::move(status);
  return failed_;
}

absl::Status CodeUpload::Write(std::string data) {
  GRADHUB_RETURN_IF_ERROR(failed_);
  const int64_t size = static_cast<int64_t>(data.size());
  if (received_ + size > header_.size_bytes()) {
    store_->Failure("code_size_mismatch");
    return Fail(absl::DataLossError(absl::StrCat("data: more bytes than the header's size_bytes (",
                                                 header_.size_bytes(), ")")));
  }
  received_ += size;
  if (absl::Status checked = checker_.Feed(data); !checked.ok()) {
    store_->Failure("code_refused");
    return Fail(std::move(checked));
  }
  GRADHUB_RETURN_IF_ERROR(Fail(sink_->Append(std::move(data))));
  if (store_->metrics_ != nullptr) store_->metrics_->RecordReceived(size);
  return absl::OkStatus();
}

absl::StatusOr<CodeUpload::Verified> CodeUpload::Verify() {
  GRADHUB_RETURN_IF_ERROR(failed_);
  if (received_ != header_.size_bytes()) {
    store_->Failure("code_size_mismatch");
    return Fail(absl::DataLossError(absl::StrCat("the archive has ", received_, " bytes, not the ",
                                                 header_.size_bytes(), " of header.size_bytes")));
  }
  absl::StatusOr<code::ArchiveSummary> summary = checker_.Finish();
  if (!summary.ok()) {
    store_->Failure("code_refused");
    return Fail(summary.status());
  }
  absl::StatusOr<std::string> sha256 = sink_->Finish();
  if (!sha256.ok()) return Fail(sha256.status());
  if (!header_.sha256().empty() && absl::AsciiStrToLower(header_.sha256()) != *sha256) {
    store_->Failure("sha256_mismatch");
    return Fail(absl::DataLossError(absl::StrCat("the archive's sha256 is ", *sha256,
                                                 ", not the header's ", header_.sha256())));
  }
  return Verified{*summary, *std::move(sha256)};
}

absl::StatusOr<v1::CodeArchive> CodeUpload::Finish() {
  GRADHUB_ASSIGN_OR_RETURN(const Verified verified, Verify());
  return store_->Keep(sink_->upload_key(), tenant_id_, verified.sha256, verified.summary);
}

// ---------------------------------------------------------------------------------------------
// CodeDownload.

absl::Status CodeDownload::Take(std::string* data) {
  const absl::Status read = ahead_->Next(data);
  if (absl::IsDataLoss(read)) {
    return store_->RemoveCorrupt(ShaOf(archive_), std::string(read.message()));
  }
  if (read.ok() && data->empty()) return store_->RemoveCorrupt(ShaOf(archive_), "it ended early");
  return read;
}

absl::Status CodeDownload::Next(std::string* data) {
  data->clear();
  const int64_t size = archive_.size_bytes();
  // Every byte is read and hashed; those before the starting offset are not handed out.
  while (data->empty() && taken_ < size) {
    GRADHUB_RETURN_IF_ERROR(Take(data));
    const int64_t start = taken_;
    taken_ += static_cast<int64_t>(data->size());
    if (taken_ <= start_) {
      data->clear();
    } else if (start < start_) {
      data->erase(0, static_cast<size_t>(start_ - start));
    }
  }
  if (taken_ < size || verified_) return absl::OkStatus();
  // The whole archive was read: its last chunk goes out only if it matched.
  verified_ = true;
  const std::optional<BlobDigests> digests = ahead_->Digests();
  if (!digests.has_value() || digests->sha256 != ShaOf(archive_)) {
    data->clear();
    return store_->RemoveCorrupt(ShaOf(archive_), "it no longer matches its sha256");
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// CodeStore.

CodeStore::CodeStore(db::Pool* pool, BlobStore* blobs, TransferSlots* transfers,
                     CheckpointMetrics* metrics, CodeStoreOptions options)
    : pool_(pool),
      blobs_(blobs),
      transfers_(transfers),
      metrics_(metrics),
      options_(std::move(options)) {}

void CodeStore::Failure(std::string_view reason) {
  if (metrics_ != nullptr) metrics_->RecordFailure(reason);
}

absl::StatusOr<TransferSlots::Slot> CodeStore::AcquireTransfer(const Caller& caller) {
  absl::StatusOr<TransferSlots::Slot> slot = transfers_->Acquire(CallerKey(caller));
  if (!slot.ok()) Failure("too_many_transfers");
  return slot;
}

absl::StatusOr<std::unique_ptr<CodeUpload>> CodeStore::StartUpload(
    const Caller& caller, const v1::UploadCodeHeader& header) {
  if (caller.principal.kind != Kind::kTenant) {
    return absl::PermissionDeniedError("code belongs to tenants: use a tenant token");
  }
  GRADHUB_RETURN_IF_ERROR(CheckHeader(header, options_.limits));
  GRADHUB_ASSIGN_OR_RETURN(TransferSlots::Slot slot, AcquireTransfer(caller));
  return std::unique_ptr<CodeUpload>(
      new CodeUpload(this, caller.principal.tenant_id, header, std::move(slot), NewUploadKey()));
}

absl::StatusOr<v1::CodeArchive> CodeStore::Keep(const std::string& upload_key, int64_t tenant_id,
                                                const std::string& sha256,
                                                const code::ArchiveSummary& summary) {
  const std::string blob = CodeBlobKey(sha256);
  // Held until the row is written: a removal of the blob waits, or is done before the check.
  const KeysInUse::Hold hold = in_use_.Take(blob);
  const absl::StatusOr<int64_t> kept = blobs_->BlobSize(blob);
  if (!kept.ok() && !absl::IsNotFound(kept.status())) return kept.status();
  if (kept.ok() && *kept == summary.archive_bytes) {
    GRADHUB_RETURN_IF_ERROR(blobs_->Abort(upload_key));  // the same bytes are there already
  } else {
    GRADHUB_RETURN_IF_ERROR(blobs_->Commit(upload_key, blob));  // replaces one of another size
  }
  GRADHUB_RETURN_IF_ERROR(
      pool_
          ->Exec(
              "INSERT INTO code_archives (tenant_id, sha256, size_bytes, unpacked_bytes,"
              " entries) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
              {tenant_id, sha256, summary.archive_bytes, summary.unpacked_bytes, summary.entries})
          .status());
  return ReadRow(sha256, tenant_id);
}

absl::StatusOr<v1::CodeArchive> CodeStore::ReadRow(const std::string& sha256,
                                                   std::optional<int64_t> tenant_id) {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      pool_->Exec(absl::StrCat("SELECT ", kCodeColumns, " FROM code_archives WHERE sha256 = $1",
                               " AND ($2::bigint IS NULL OR tenant_id = $2::bigint)",
                               " ORDER BY create_time LIMIT 1"),
                  {sha256, tenant_id}));
  if (rows.empty()) {
    return absl::NotFoundError(absl::StrCat("code archive '", CodeBlobKey(sha256), "' not found"));
  }
  return ArchiveFromRow(rows.row(0));
}

absl::StatusOr<v1::CodeArchive> CodeStore::Get(const Caller& caller, const std::string& name) {
  GRADHUB_ASSIGN_OR_RETURN(const std::optional<int64_t> tenant, ReaderTenant(caller));
  GRADHUB_ASSIGN_OR_RETURN(const std::string sha256, ParseCodeName(name));
  return ReadRow(sha256, tenant);
}

absl::StatusOr<std::unique_ptr<CodeDownload>> CodeStore::OpenDownload(const Caller& caller,
                                                                      const std::string& name,
                                                                      int64_t offset) {
  if (offset < 0) return absl::InvalidArgumentError("offset: must not be negative");
  GRADHUB_ASSIGN_OR_RETURN(v1::CodeArchive archive, Get(caller, name));
  if (offset > archive.size_bytes()) {
    return absl::OutOfRangeError(absl::StrCat("offset ", offset, " is beyond the archive's ",
                                              archive.size_bytes(), " bytes"));
  }
  GRADHUB_ASSIGN_OR_RETURN(TransferSlots::Slot slot, AcquireTransfer(caller));
  return OpenArchive(std::move(archive), offset, std::move(slot));
}

absl::StatusOr<std::unique_ptr<CodeDownload>> CodeStore::OpenArchive(v1::CodeArchive archive,
                                                                     int64_t offset,
                                                                     TransferSlots::Slot slot) {
  const std::string sha256 = ShaOf(archive);
  absl::StatusOr<std::unique_ptr<BlobReader>> reader = blobs_->Open(CodeBlobKey(sha256), 0);
  if (absl::IsNotFound(reader.status())) return RemoveCorrupt(sha256, "its blob is missing");
  // DATA_LOSS: a store that encrypts found a file that is not the archive's blob.
  if (absl::IsDataLoss(reader.status())) return RemoveCorrupt(sha256, reader.status().ToString());
  if (!reader.ok()) return reader.status();
  const int64_t size = archive.size_bytes();
  if ((*reader)->size() != size) {
    return RemoveCorrupt(sha256,
                         absl::StrCat("its blob has ", (*reader)->size(), " bytes, not ", size));
  }
  auto ahead =
      std::make_unique<HashingReadAhead>(*std::move(reader), size, kCodeDownloadChunkBytes);
  return std::unique_ptr<CodeDownload>(
      new CodeDownload(this, std::move(archive), offset, std::move(slot), std::move(ahead)));
}

absl::Status CodeStore::RemoveCorrupt(const std::string& sha256, const std::string& reason) {
  Failure("corrupt_blob");
  const std::string blob = CodeBlobKey(sha256);
  absl::Status removed;
  const bool ran = in_use_.RunUnlessHeld(blob, [&] {
    // Rows first: from now on GetCode says NOT_FOUND, and clients upload it again.
    removed = pool_->Exec("DELETE FROM code_archives WHERE sha256 = $1", {sha256}).status();
    if (removed.ok()) removed = blobs_->Delete(blob);
  });
  const bool gone = ran && removed.ok();
  if (gone) {
    if (metrics_ != nullptr) metrics_->RecordBad("code");
    if (options_.log) options_.log(absl::StrCat(blob, " removed with its rows: ", reason));
  }
  return absl::DataLossError(absl::StrCat("code archive '", blob, "': ", reason,
                                          gone ? "; it was removed: upload it again" : ""));
}

// ---------------------------------------------------------------------------------------------
// Cleanup and scrub.

absl::StatusOr<CodeCleanupReport> CodeStore::Cleanup() {
  CodeCleanupReport report;
  GRADHUB_RETURN_IF_ERROR(CleanupUploads(&report));
  GRADHUB_RETURN_IF_ERROR(CleanupBlobs(&report));
  return report;
}

// Uploads no stream of this process writes, idle past the TTL: a previous life's.
absl::Status CodeStore::CleanupUploads(CodeCleanupReport* report) {
  GRADHUB_ASSIGN_OR_RETURN(const std::vector<UploadInfo> uploads, blobs_->ListUploads());
  const absl::Time cutoff = absl::Now() - options_.upload_ttl;
  for (const UploadInfo& upload : uploads) {
    if (!absl::StartsWith(upload.key, kCodeUploadPrefix) || upload.last_write > cutoff) continue;
    bool removed = false;
    in_use_.RunUnlessHeld(upload.key, [&] { removed = blobs_->Abort(upload.key).ok(); });
    if (removed) ++report->stale_uploads;
  }
  return absl::OkStatus();
}

// Blobs without a row. The rows are asked again, under the lock of the blob's key, before a
// blob goes: an upload that placed it after the first read has written its row by then.
absl::Status CodeStore::CleanupBlobs(CodeCleanupReport* report) {
  GRADHUB_ASSIGN_OR_RETURN(const std::vector<BlobInfo> blobs, blobs_->ListBlobs());
  GRADHUB_ASSIGN_OR_RETURN(const db::Result rows,
                           pool_->Exec("SELECT DISTINCT sha256 FROM code_archives"));
  std::unordered_set<std::string> wanted;
  for (const db::Row& row : rows) wanted.insert(CodeBlobKey(row.Get<std::string>("sha256")));
  for (const BlobInfo& blob : blobs) {
    if (!absl::StartsWith(blob.key, kCodeBlobPrefix) || wanted.count(blob.key) > 0) continue;
    const std::string sha256 = blob.key.substr(sizeof(kCodeBlobPrefix) - 1);
    bool removed = false;
    in_use_.RunUnlessHeld(blob.key, [&] {
      const absl::StatusOr<db::Result> row =
          pool_->Exec("SELECT 1 FROM code_archives WHERE sha256 = $1 LIMIT 1", {sha256});
      removed = row.ok() && row->empty() && blobs_->Delete(blob.key).ok();
    });
    if (removed) ++report->orphan_blobs;
  }
  return absl::OkStatus();
}

absl::StatusOr<CodeScrubReport> CodeStore::Scrub(const std::function<bool()>& stop) {
  // In pages by digest, so that a large store is never read into memory at once.
  constexpr int64_t kPage = 100;
  CodeScrubReport report;
  std::string after;
  while (true) {
    GRADHUB_ASSIGN_OR_RETURN(const db::Result page,
                             pool_->Exec(absl::StrCat("SELECT DISTINCT ON (sha256) ", kCodeColumns,
                                                      " FROM code_archives WHERE sha256 > $1",
                                                      " ORDER BY sha256, create_time LIMIT $2"),
                                         {after, kPage}));
    for (const db::Row& row : page) {
      if (stop()) return report;
      v1::CodeArchive archive = ArchiveFromRow(row);
      after = ShaOf(archive);
      GRADHUB_RETURN_IF_ERROR(ScrubOne(std::move(archive), &report));
    }
    if (page.rows() < kPage) return report;
  }
}

// Reads the archive whole, as a download does: one that does not match is removed there.
absl::Status CodeStore::ScrubOne(v1::CodeArchive archive, CodeScrubReport* report) {
  ++report->checked;
  absl::StatusOr<std::unique_ptr<CodeDownload>> reading =
      OpenArchive(std::move(archive), 0, TransferSlots::Slot());
  absl::Status read = reading.status();
  std::string chunk;
  while (read.ok()) {
    read = (*reading)->Next(&chunk);
    if (chunk.empty()) break;
    report->bytes += static_cast<int64_t>(chunk.size());
  }
  if (absl::IsDataLoss(read)) {
    report->corrupt.push_back(std::string(read.message()));
    return absl::OkStatus();
  }
  return read;
}

}  // namespace gradhub::checkpoint
