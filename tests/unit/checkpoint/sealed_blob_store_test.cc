// SealedBlobStore (encryption at rest): the BlobStore conformance suite over both ways of the
// local backend, then what only encryption promises, checked on the files themselves: no
// plaintext on disk; a flipped byte anywhere (header, a chunk, a tag, the last chunk), a cut, an
// extension, chunks reordered, a blob copied over another job's or another tenant's: each
// DATA_LOSS, with nothing of the failing chunk handed out; offsets and resumed uploads (also
// after a restart, and after a crash that cut a record) still work; a rotated key seals new
// blobs while the old ones still read.
#include "services/checkpoint/sealed_blob_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/str_format.h"
#include "services/checkpoint/local_blob_store.h"
#include "tests/unit/checkpoint/blob_store_conformance.h"

namespace gradhub::checkpoint {
namespace {

namespace fs = std::filesystem;
using sealed::kChunkBytes;
using sealed::kHeaderBytes;
using sealed::kRecordBytes;
using sealed::kTagBytes;

std::string MakeTempDir() {
  std::string pattern = (fs::temp_directory_path() / "gradhub-sealed-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) return "";
  return pattern;
}

// Every key belongs to tenant 1 with one identity: what the conformance suite's keys need.
class OneScope final : public BlobScopes {
 public:
  absl::StatusOr<BlobScope> OfUpload(const std::string&) override { return Scope(); }
  absl::StatusOr<BlobScope> OfBlob(const std::string&) override { return Scope(); }

 private:
  static BlobScope Scope() { return {KeyScope::Tenant(1), "any"}; }
};

// Uploads "t<tenant>_<job>_<name>" become blobs "t<tenant>/<job>/<name>": the tenant from the
// key, the blob key as the identity (as blob_scopes.h does with the rows).
class KeyedScopes final : public BlobScopes {
 public:
  absl::StatusOr<BlobScope> OfUpload(const std::string& upload) override {
    std::string blob = upload;
    std::replace(blob.begin(), blob.end(), '_', '/');
    return OfBlob(blob);
  }
  absl::StatusOr<BlobScope> OfBlob(const std::string& blob) override {
    if (blob.size() < 2 || blob[0] != 't') return absl::NotFoundError("not a test key");
    return BlobScope{KeyScope::Tenant(blob[1] - '0'), blob};
  }
};

// A store as the server builds it: sealed, over a local one in a temp dir; what a test needs
// torn down in the deleter.
struct SealedParts {
  std::string dir;
  std::unique_ptr<LocalBlobStore> local;
  InMemoryDataKeys keys;
  OneScope scopes;
  std::unique_ptr<SealedBlobStore> sealed;
};

std::shared_ptr<BlobStore> MakeSealed(LocalBlobStore::Options options) {
  auto parts = std::make_shared<SealedParts>();
  parts->dir = MakeTempDir();
  auto local = LocalBlobStore::Open(parts->dir + "/data", options);
  if (!local.ok()) return nullptr;
  parts->local = *std::move(local);
  parts->sealed =
      std::make_unique<SealedBlobStore>(parts->local.get(), &parts->keys, &parts->scopes);
  return std::shared_ptr<BlobStore>(parts->sealed.get(), [parts](BlobStore*) {
    parts->sealed.reset();
    fs::remove_all(parts->dir);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Backends, BlobStoreConformanceTest,
    ::testing::Values(BlobStoreFactory{"Sealed", [] { return MakeSealed({.direct_io = true}); }},
                      BlobStoreFactory{"SealedBuffered",
                                       [] { return MakeSealed({.direct_io = false}); }}),
    BlobStoreFactoryName);

class SealedBlobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    auto local = LocalBlobStore::Open(dir_ + "/data");
    ASSERT_TRUE(local.ok()) << local.status();
    local_ = *std::move(local);
    Restart();
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(dir_);
  }

  // A new store over the same files and keys: nothing in memory, as after a restart.
  void Restart() { store_ = std::make_unique<SealedBlobStore>(local_.get(), &keys_, &scopes_); }

  // Recognizable text, so that a copy of it on disk is found by a plain search.
  static std::string Plaintext(size_t size, int seed = 0) {
    std::string text;
    for (int line = 0; text.size() < size; ++line) {
      absl::StrAppendFormat(&text, "GRADHUB-PLAINTEXT-%d-%08d;", seed, line);
    }
    text.resize(size);
    return text;
  }

  // Uploads `data` as "t<tenant>_<job>_<name>" in appends of `piece` bytes and commits it as
  // "t<tenant>/<job>/<name>"; returns the blob key.
  std::string Save(int tenant, const std::string& job, const std::string& name,
                   const std::string& data, size_t piece = 300000) {
    const std::string upload = absl::StrFormat("t%d_%s_%s", tenant, job, name);
    for (size_t at = 0; at < data.size() || at == 0; at += piece) {
      auto held = store_->Append(upload, static_cast<int64_t>(at), data.substr(at, piece));
      EXPECT_TRUE(held.ok()) << held.status();
      if (data.empty()) break;
    }
    const std::string blob = absl::StrFormat("t%d/%s/%s", tenant, job, name);
    const absl::Status committed = store_->Commit(upload, blob);
    EXPECT_TRUE(committed.ok()) << committed;
    return blob;
  }

  // Reads `blob` from `offset` in reads of `piece` bytes: what was handed out before the first
  // error, and that error (OK at the end).
  absl::Status Read(const std::string& blob, std::string* out, int64_t offset = 0,
                    size_t piece = 100000) {
    out->clear();
    auto reader = store_->Open(blob, offset);
    if (!reader.ok()) return reader.status();
    std::string part;
    while (true) {
      const absl::Status read = (*reader)->Read(piece, &part);
      if (!read.ok()) return read;
      if (part.empty()) return absl::OkStatus();
      *out += part;
    }
  }

  std::string FileOf(const std::string& blob) { return local_->BlobPath(blob); }
  static std::string Contents(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static void Overwrite(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }
  static void FlipByte(const std::string& path, int64_t offset) {
    std::string bytes = Contents(path);
    bytes[static_cast<size_t>(offset)] ^= 0x5a;
    Overwrite(path, bytes);
  }

  std::string dir_;
  std::unique_ptr<LocalBlobStore> local_;
  InMemoryDataKeys keys_;
  KeyedScopes scopes_;
  std::unique_ptr<SealedBlobStore> store_;
};

TEST_F(SealedBlobStoreTest, NeitherTheUploadNorTheBlobOnDiskHoldsThePlaintext) {
  const std::string data = Plaintext(3 * kChunkBytes + 12345);
  const std::string upload = "t1_job_a";
  ASSERT_TRUE(store_->Append(upload, 0, data.substr(0, 2 * kChunkBytes + 7)).ok());
  const auto uploads = local_->ListUploads();
  ASSERT_TRUE(uploads.ok());
  ASSERT_EQ(uploads->size(), 1u);
  const std::string part = Contents(local_->UploadPath((*uploads)[0].key));
  EXPECT_EQ(part.find("GRADHUB-PLAINTEXT"), std::string::npos);
  EXPECT_EQ(part.size(), static_cast<size_t>(sealed::RecordOffset(2)));  // whole chunks only

  ASSERT_TRUE(store_->Append(upload, 2 * kChunkBytes + 7, data.substr(2 * kChunkBytes + 7)).ok());
  ASSERT_TRUE(store_->Commit(upload, "t1/job/a").ok());
  const std::string file = Contents(FileOf("t1/job/a"));
  EXPECT_EQ(file.find("GRADHUB-PLAINTEXT"), std::string::npos);
  EXPECT_EQ(file.substr(0, 8), "GHSEALED");
  EXPECT_EQ(static_cast<int64_t>(file.size()), sealed::SealedSize(data.size()));
  EXPECT_EQ(*store_->BlobSize("t1/job/a"), static_cast<int64_t>(data.size()));
  std::string read;
  ASSERT_TRUE(Read("t1/job/a", &read).ok());
  EXPECT_TRUE(read == data);
}

TEST_F(SealedBlobStoreTest, AFlippedByteAnywhereIsDataLossAndNothingOfItsChunkIsServed) {
  const std::string data = Plaintext(3 * kChunkBytes + 5000, 1);
  const int64_t last_record = sealed::RecordOffset(3);
  // Where the byte is, and how many whole chunks before it read as they were.
  const std::vector<std::pair<int64_t, int>> flips = {
      {3, 0},                                          // the magic
      {20, 0},                                         // the key id
      {36, 0},                                         // the salt
      {1000, 0},                                       // the header's padding
      {kHeaderBytes + 10, 0},                          // the first chunk
      {sealed::RecordOffset(1) + kChunkBytes / 2, 1},  // a middle chunk
      {sealed::RecordOffset(2) - 3, 1},                // the second chunk's tag
      {last_record + 100, 3},                          // the last chunk
      {last_record + 5000 + 15, 3},                    // its tag, the file's last byte
  };
  for (const auto& [offset, good_chunks] : flips) {
    SCOPED_TRACE(offset);
    const std::string blob = Save(1, "job", "flip" + std::to_string(offset), data);
    FlipByte(FileOf(blob), offset);
    std::string read;
    const absl::Status status = Read(blob, &read, 0, 70000);
    EXPECT_TRUE(absl::IsDataLoss(status)) << status;
    // The whole chunks before the flipped one, each authentic; nothing of that one.
    EXPECT_EQ(read.size(), static_cast<size_t>(good_chunks * kChunkBytes));
    EXPECT_TRUE(read == data.substr(0, read.size()));
  }
}

TEST_F(SealedBlobStoreTest, ACutOrExtendedBlobIsDataLoss) {
  const std::string data = Plaintext(2 * kChunkBytes + 777, 2);
  const int64_t sealed_size = sealed::SealedSize(data.size());
  for (const int64_t size : {sealed_size - 1, sealed::RecordOffset(2), sealed::RecordOffset(2) + 10,
                             sealed::RecordOffset(1) + 100, kHeaderBytes, int64_t{10},
                             sealed_size + 1, sealed_size + kRecordBytes}) {
    SCOPED_TRACE(size);
    const std::string blob = Save(1, "job", "cut" + std::to_string(size), data);
    std::string bytes = Contents(FileOf(blob));
    bytes.resize(static_cast<size_t>(size), 'x');
    Overwrite(FileOf(blob), bytes);
    std::string read;
    const absl::Status status = Read(blob, &read);
    EXPECT_TRUE(absl::IsDataLoss(status)) << status;
    EXPECT_TRUE(read == data.substr(0, read.size()));
    EXPECT_LT(read.size(), data.size());
  }
}

TEST_F(SealedBlobStoreTest, ChunksInAnotherOrderAreDataLossAtTheFirstOneMoved) {
  const std::string data = Plaintext(3 * kChunkBytes, 3);
  const std::string blob = Save(1, "job", "order", data);
  std::string bytes = Contents(FileOf(blob));
  const size_t one = static_cast<size_t>(sealed::RecordOffset(1));
  const size_t two = static_cast<size_t>(sealed::RecordOffset(2));
  std::swap_ranges(bytes.begin() + one, bytes.begin() + two, bytes.begin() + two);
  Overwrite(FileOf(blob), bytes);
  std::string read;
  EXPECT_TRUE(absl::IsDataLoss(Read(blob, &read)));
  EXPECT_TRUE(read == data.substr(0, kChunkBytes));
}

TEST_F(SealedBlobStoreTest, ABlobCopiedOverAnotherJobsOrTenantsIsRefusedBeforeAnyByte) {
  const std::string a = Plaintext(kChunkBytes + 10, 4), b = Plaintext(kChunkBytes + 10, 5);
  const std::string mine = Save(1, "job", "x", a);
  const std::string other_job = Save(1, "other", "x", b);
  const std::string other_tenant = Save(2, "job", "x", b);
  // The same tenant's key, another identity: the first chunk fails.
  fs::copy_file(FileOf(other_job), FileOf(mine), fs::copy_options::overwrite_existing);
  std::string read;
  absl::Status status = Read(mine, &read);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_TRUE(read.empty());
  // Another tenant's key: refused when opened.
  fs::copy_file(FileOf(other_tenant), FileOf(mine), fs::copy_options::overwrite_existing);
  status = store_->Open(mine, 0).status();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_NE(status.message().find("tenant:2"), std::string_view::npos) << status;
  // The originals still read.
  ASSERT_TRUE(Read(other_job, &read).ok());
  EXPECT_TRUE(read == b);
}

TEST_F(SealedBlobStoreTest, AnUploadIsCommittedOnlyAsTheBlobItWasSealedFor) {
  ASSERT_TRUE(store_->Append("t1_job_a", 0, "bytes").ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->Commit("t1_job_a", "t1/job/b")));
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->Commit("t1_job_a", "t2/job/a")));
  ASSERT_TRUE(store_->Commit("t1_job_a", "t1/job/a").ok());
}

TEST_F(SealedBlobStoreTest, ReadsStartAtAnyOffset) {
  const std::string data = Plaintext(3 * kChunkBytes + 99, 6);
  const std::string blob = Save(1, "job", "offsets", data);
  const int64_t size = static_cast<int64_t>(data.size());
  for (const int64_t offset : {int64_t{0}, int64_t{1}, kChunkBytes - 1, kChunkBytes,
                               kChunkBytes + 1, 3 * kChunkBytes, size - 1, size}) {
    SCOPED_TRACE(offset);
    std::string read;
    ASSERT_TRUE(Read(blob, &read, offset, 1 << 20).ok());
    EXPECT_TRUE(read == data.substr(static_cast<size_t>(offset)));
  }
  EXPECT_TRUE(absl::IsOutOfRange(store_->Open(blob, size + 1).status()));
  // A read hands out at most the rest of one chunk (a whole one without a copy): fewer bytes
  // than asked for are not the end; an empty read is.
  auto reader = store_->Open(blob, 10);
  ASSERT_TRUE(reader.ok());
  std::string part;
  ASSERT_TRUE((*reader)->Read(1 << 20, &part).ok());
  EXPECT_EQ(part.size(), static_cast<size_t>(kChunkBytes - 10));
  ASSERT_TRUE((*reader)->Read(1 << 20, &part).ok());
  EXPECT_EQ(part.size(), static_cast<size_t>(kChunkBytes));
  EXPECT_TRUE(part == data.substr(static_cast<size_t>(kChunkBytes), part.size()));
  ASSERT_TRUE((*reader)->Read(100, &part).ok());
  EXPECT_TRUE(part == data.substr(static_cast<size_t>(2 * kChunkBytes), 100));
  EXPECT_EQ((*reader)->size(), size);
}

TEST_F(SealedBlobStoreTest, AReaderDroppedPartWayStopsTheRecordsItReadAhead) {
  // Records are read ahead on a thread of the reader's own: dropping the reader at any point
  // (a download cancelled) must stop and join it, whether it waits for room or reads.
  const std::string data = Plaintext(6 * kChunkBytes + 3, 8);
  const std::string blob = Save(1, "job", "dropped", data);
  for (int chunks_read = 0; chunks_read < 4; ++chunks_read) {
    SCOPED_TRACE(chunks_read);
    auto reader = store_->Open(blob, 0);
    ASSERT_TRUE(reader.ok());
    std::string part;
    for (int i = 0; i < chunks_read; ++i) {
      ASSERT_TRUE((*reader)->Read(static_cast<size_t>(kChunkBytes), &part).ok());
      EXPECT_TRUE(part == data.substr(static_cast<size_t>(i * kChunkBytes), part.size()));
    }
    if (chunks_read == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // full
  }
  std::string whole;
  ASSERT_TRUE(Read(blob, &whole).ok());
  EXPECT_TRUE(whole == data);
}

TEST_F(SealedBlobStoreTest, AnUploadResumesAfterARestartFromItsWholeChunks) {
  const std::string data = Plaintext(3 * kChunkBytes + 500, 7);
  const std::string upload = "t1_job_resumed";
  ASSERT_EQ(*store_->Append(upload, 0, data.substr(0, 2 * kChunkBytes + 300)),
            2 * kChunkBytes + 300);
  Restart();  // the tail of 300 bytes was in memory only
  EXPECT_EQ(*store_->UploadedBytes(upload), 2 * kChunkBytes);
  auto listed = store_->ListUploads();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].key, upload);
  EXPECT_EQ((*listed)[0].bytes, 2 * kChunkBytes);
  EXPECT_TRUE(absl::IsOutOfRange(store_->Append(upload, 2 * kChunkBytes + 300, "x").status()));
  ASSERT_EQ(*store_->Append(upload, 2 * kChunkBytes, data.substr(2 * kChunkBytes)),
            static_cast<int64_t>(data.size()));
  ASSERT_TRUE(store_->Commit(upload, "t1/job/resumed").ok());
  std::string read;
  ASSERT_TRUE(Read("t1/job/resumed", &read).ok());
  EXPECT_TRUE(read == data);
}

TEST_F(SealedBlobStoreTest, ARecordCutByACrashIsWrittenAgainAndTheBlobReads) {
  const std::string data = Plaintext(2 * kChunkBytes + 40, 8);
  const std::string upload = "t1_job_crashed";
  ASSERT_TRUE(store_->Append(upload, 0, data.substr(0, 2 * kChunkBytes)).ok());
  // The crash came in the middle of the second record's write.
  const std::string path = local_->UploadPath((*local_->ListUploads())[0].key);
  fs::resize_file(path, static_cast<uintmax_t>(sealed::RecordOffset(1) + 1000));
  Restart();
  EXPECT_EQ(*store_->UploadedBytes(upload), kChunkBytes);
  ASSERT_TRUE(store_->Append(upload, kChunkBytes, data.substr(kChunkBytes)).ok());
  ASSERT_TRUE(store_->Commit(upload, "t1/job/crashed").ok());
  std::string read;
  ASSERT_TRUE(Read("t1/job/crashed", &read).ok());
  EXPECT_TRUE(read == data);
}

TEST_F(SealedBlobStoreTest, ARetriedCommitAfterTheFinalChunkWasWrittenCommitsOnce) {
  const std::string data = Plaintext(kChunkBytes + 5, 9);
  ASSERT_TRUE(store_->Append("t1_job_c", 0, data).ok());
  ASSERT_TRUE(store_->Commit("t1_job_c", "t1/job/c").ok());
  EXPECT_TRUE(store_->Commit("t1_job_c", "t1/job/c").ok());
  std::string read;
  ASSERT_TRUE(Read("t1/job/c", &read).ok());
  EXPECT_TRUE(read == data);
}

TEST_F(SealedBlobStoreTest, ARotatedKeySealsNewBlobsAndTheOldOnesStillRead) {
  const std::string before = Save(1, "job", "before", Plaintext(1000, 10));
  const DataKey rotated = keys_.Rotate(KeyScope::Tenant(1));
  const std::string after = Save(1, "job", "after", Plaintext(1000, 11));
  const auto header_of = [&](const std::string& blob) {
    return *sealed::Header::Parse(Contents(FileOf(blob)).substr(0, kHeaderBytes));
  };
  EXPECT_NE(header_of(before).key_id, rotated.id);
  EXPECT_EQ(header_of(after).key_id, rotated.id);
  std::string read;
  ASSERT_TRUE(Read(before, &read).ok());
  EXPECT_EQ(read, Plaintext(1000, 10));
  ASSERT_TRUE(Read(after, &read).ok());
  EXPECT_EQ(read, Plaintext(1000, 11));
}

TEST_F(SealedBlobStoreTest, ABlobWhoseKeyIsGoneIsDataLoss) {
  const std::string blob = Save(1, "job", "orphan", Plaintext(1000, 12));
  InMemoryDataKeys empty;
  SealedBlobStore without_keys(local_.get(), &empty, &scopes_);
  EXPECT_TRUE(absl::IsDataLoss(without_keys.Open(blob, 0).status()));
}

TEST_F(SealedBlobStoreTest, AFileThatIsNotSealedIsDataLoss) {
  ASSERT_TRUE(local_->Append("plain", 0, Plaintext(kHeaderBytes + 100)).ok());
  ASSERT_TRUE(local_->Commit("plain", "t1/job/plain").ok());
  EXPECT_TRUE(absl::IsDataLoss(store_->Open("t1/job/plain", 0).status()));
}

}  // namespace
}  // namespace gradhub::checkpoint
