// The contract of services/checkpoint/blob_store.h, as one test suite that every BlobStore
// backend runs (as tests/unit/ddp/store_conformance.h does for Stores). A backend's test file
// instantiates it with a factory:
//
//   INSTANTIATE_TEST_SUITE_P(Backends, BlobStoreConformanceTest,
//       ::testing::Values(BlobStoreFactory{"Local", [] { return ...; }}), BlobStoreFactoryName);
//
// The factory is called once per test and must return an empty store; whatever the store needs
// cleaned up afterwards (a temp dir, a bucket) belongs in the shared_ptr's deleter. This header
// defines the tests, so include it in exactly one .cc of a test binary.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "services/checkpoint/blob_store.h"

namespace gradhub::checkpoint {

struct BlobStoreFactory {
  std::string name;  // The test name suffix: letters, digits, '_'.
  std::function<std::shared_ptr<BlobStore>()> make;
};

inline void PrintTo(const BlobStoreFactory& factory, std::ostream* os) { *os << factory.name; }

inline std::string BlobStoreFactoryName(const ::testing::TestParamInfo<BlobStoreFactory>& info) {
  return info.param.name;
}

class BlobStoreConformanceTest : public ::testing::TestWithParam<BlobStoreFactory> {
 protected:
  void SetUp() override {
    store_ = GetParam().make();
    ASSERT_NE(store_, nullptr);
  }
  void TearDown() override { store_.reset(); }

  // Bytes that differ at every position, so an offset error shows.
  static std::string Pattern(size_t size, int seed = 0) {
    std::string bytes(size, '\0');
    for (size_t i = 0; i < size; ++i)
      bytes[i] = static_cast<char>((i * 131 + seed * 7 + i / 251) & 0xff);
    return bytes;
  }

  int64_t Append(const std::string& upload, int64_t offset, const std::string& data) {
    absl::StatusOr<int64_t> held = store_->Append(upload, offset, data);
    EXPECT_TRUE(held.ok()) << held.status();
    return held.ok() ? *held : -1;
  }

  std::string ReadAll(const std::string& blob, int64_t offset = 0, size_t chunk = 1000) {
    auto reader = store_->Open(blob, offset);
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) return "";
    std::string all, part;
    while (true) {
      const absl::Status read = (*reader)->Read(chunk, &part);
      EXPECT_TRUE(read.ok()) << read;
      if (!read.ok() || part.empty()) return all;
      all += part;
    }
  }

  std::shared_ptr<BlobStore> store_;
};

TEST_P(BlobStoreConformanceTest, AppendsInOrderAndCommitsTheWhole) {
  const std::string data = Pattern(10000);
  EXPECT_EQ(*store_->UploadedBytes("u1"), 0);
  EXPECT_EQ(Append("u1", 0, data.substr(0, 4000)), 4000);
  EXPECT_EQ(Append("u1", 4000, data.substr(4000, 4000)), 8000);
  EXPECT_EQ(Append("u1", 8000, data.substr(8000)), 10000);
  EXPECT_EQ(*store_->UploadedBytes("u1"), 10000);
  ASSERT_TRUE(store_->Commit("u1", "job/1-u1").ok());
  EXPECT_EQ(*store_->BlobSize("job/1-u1"), 10000);
  EXPECT_EQ(ReadAll("job/1-u1"), data);
  // The upload ended with its commit.
  EXPECT_EQ(*store_->UploadedBytes("u1"), 0);
}

TEST_P(BlobStoreConformanceTest, AGapIsOutOfRangeAndWritesNothing) {
  EXPECT_TRUE(absl::IsOutOfRange(store_->Append("u1", 5, "abc").status()));
  EXPECT_EQ(*store_->UploadedBytes("u1"), 0);
  EXPECT_EQ(Append("u1", 0, "abcd"), 4);
  EXPECT_TRUE(absl::IsOutOfRange(store_->Append("u1", 5, "xyz").status()));
  EXPECT_EQ(*store_->UploadedBytes("u1"), 4);
}

TEST_P(BlobStoreConformanceTest, BytesSentAgainAreIgnoredAndTheFirstCopyStays) {
  EXPECT_EQ(Append("u1", 0, "0123456789"), 10);
  EXPECT_EQ(Append("u1", 0, "0123456789"), 10);  // all of it again
  EXPECT_EQ(Append("u1", 2, "XXXX"), 10);        // inside what is held
  EXPECT_EQ(Append("u1", 6, "XXXXabcd"), 14);    // overlapping the end: only the new part
  ASSERT_TRUE(store_->Commit("u1", "b/1").ok());
  EXPECT_EQ(ReadAll("b/1"), "0123456789abcd");
}

TEST_P(BlobStoreConformanceTest, CommitIsIdempotentAndNeedsAnUpload) {
  Append("u1", 0, "data");
  ASSERT_TRUE(store_->Commit("u1", "b/1").ok());
  EXPECT_TRUE(store_->Commit("u1", "b/1").ok());  // a retry after the first one succeeded
  EXPECT_EQ(ReadAll("b/1"), "data");
  EXPECT_TRUE(absl::IsNotFound(store_->Commit("nothing", "b/2")));
}

TEST_P(BlobStoreConformanceTest, AnEmptyAppendAtZeroMakesAnEmptyBlobPossible) {
  EXPECT_EQ(Append("u1", 0, ""), 0);
  ASSERT_TRUE(store_->Commit("u1", "b/empty").ok());
  EXPECT_EQ(*store_->BlobSize("b/empty"), 0);
  EXPECT_EQ(ReadAll("b/empty"), "");
}

TEST_P(BlobStoreConformanceTest, UncommittedUploadsAreInvisible) {
  Append("u1", 0, "data");
  EXPECT_TRUE(absl::IsNotFound(store_->Open("b/1", 0).status()));
  EXPECT_TRUE(absl::IsNotFound(store_->BlobSize("b/1").status()));
  auto blobs = store_->ListBlobs();
  ASSERT_TRUE(blobs.ok());
  EXPECT_TRUE(blobs->empty());
}

TEST_P(BlobStoreConformanceTest, OpenReadsFromAnOffset) {
  const std::string data = Pattern(5000, 3);
  Append("u1", 0, data);
  ASSERT_TRUE(store_->Commit("u1", "b/1").ok());
  EXPECT_EQ(ReadAll("b/1", 1234, 777), data.substr(1234));
  EXPECT_EQ(ReadAll("b/1", 5000), "");
  EXPECT_TRUE(absl::IsOutOfRange(store_->Open("b/1", 5001).status()));
  auto reader = store_->Open("b/1", 100);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->size(), 5000);  // of the whole blob
  EXPECT_TRUE(absl::IsNotFound(store_->Open("b/none", 0).status()));
}

TEST_P(BlobStoreConformanceTest, AbortDiscardsAndIsIdempotent) {
  Append("u1", 0, "data");
  ASSERT_TRUE(store_->Abort("u1").ok());
  EXPECT_TRUE(store_->Abort("u1").ok());
  EXPECT_EQ(*store_->UploadedBytes("u1"), 0);
  EXPECT_TRUE(absl::IsOutOfRange(store_->Append("u1", 4, "more").status()));
  EXPECT_TRUE(absl::IsNotFound(store_->Commit("u1", "b/1")));
}

TEST_P(BlobStoreConformanceTest, DeleteRemovesAndIsIdempotent) {
  Append("u1", 0, "data");
  ASSERT_TRUE(store_->Commit("u1", "job/b1").ok());
  Append("u2", 0, "more");
  ASSERT_TRUE(store_->Commit("u2", "job/b2").ok());
  ASSERT_TRUE(store_->Delete("job/b1").ok());
  EXPECT_TRUE(store_->Delete("job/b1").ok());
  EXPECT_TRUE(absl::IsNotFound(store_->Open("job/b1", 0).status()));
  EXPECT_EQ(ReadAll("job/b2"), "more");  // its neighbour stays
  ASSERT_TRUE(store_->Delete("job/b2").ok());
  // A blob under the same prefix can be committed again after its neighbours went.
  Append("u3", 0, "again");
  ASSERT_TRUE(store_->Commit("u3", "job/b3").ok());
  EXPECT_EQ(ReadAll("job/b3"), "again");
}

TEST_P(BlobStoreConformanceTest, ListsUploadsAndBlobs) {
  Append("u1", 0, "12345");
  Append("u2", 0, "1");
  Append("u3", 0, "123");
  ASSERT_TRUE(store_->Commit("u3", "j1/b3").ok());
  auto uploads = store_->ListUploads();
  ASSERT_TRUE(uploads.ok()) << uploads.status();
  std::vector<std::pair<std::string, int64_t>> seen;
  for (const UploadInfo& upload : *uploads) {
    seen.emplace_back(upload.key, upload.bytes);
    EXPECT_GT(upload.last_write, absl::Now() - absl::Minutes(5));
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::pair<std::string, int64_t>>{{"u1", 5}, {"u2", 1}}));
  auto blobs = store_->ListBlobs();
  ASSERT_TRUE(blobs.ok()) << blobs.status();
  ASSERT_EQ(blobs->size(), 1u);
  EXPECT_EQ((*blobs)[0].key, "j1/b3");
  EXPECT_EQ((*blobs)[0].bytes, 3);
}

TEST_P(BlobStoreConformanceTest, RefusesKeysThatAreNotKeys) {
  for (const char* key : {"", "../x", "a/../b", "a//b", "/abs", "sp ace", "a/"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(store_->Open(key, 0).status())) << key;
    EXPECT_TRUE(absl::IsInvalidArgument(store_->Append(key, 0, "x").status())) << key;
  }
  // Upload keys are one segment.
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Append("a/b", 0, "x").status()));
}

TEST_P(BlobStoreConformanceTest, LargeBlobsRoundTripInChunks) {
  const std::string data = Pattern(9 << 20, 5);  // crosses several writeback windows
  constexpr size_t kChunk = 1 << 20;
  for (size_t offset = 0; offset < data.size(); offset += kChunk) {
    ASSERT_EQ(Append("big", static_cast<int64_t>(offset), data.substr(offset, kChunk)),
              static_cast<int64_t>(std::min(data.size(), offset + kChunk)));
  }
  ASSERT_TRUE(store_->Commit("big", "j/big").ok());
  EXPECT_TRUE(ReadAll("j/big", 0, 1 << 20) == data);
}

// Chunks of every awkward size: shorter than a disk block, ending mid-block, then whole blocks
// from a mid-block offset, overlapping resends. A backend that writes whole blocks (the local
// one with O_DIRECT) must read back and keep the partial block it ended in.
TEST_P(BlobStoreConformanceTest, RaggedAppendsKeepEveryByteInPlace) {
  const std::string data = Pattern(3 * 4096 + 1234 + (1 << 20), 9);
  const std::vector<size_t> sizes = {1, 4095, 5000, 100, 4096, 1 << 20, 8192, 1};
  size_t offset = 0;
  for (size_t i = 0; offset < data.size(); ++i) {
    const size_t size = std::min(sizes[i % sizes.size()], data.size() - offset);
    // Every other chunk starts a few bytes early, as a client that resumes at an older offset.
    const size_t back = i % 2 == 1 ? std::min<size_t>(offset, 17) : 0;
    ASSERT_EQ(Append("ragged", static_cast<int64_t>(offset - back),
                     data.substr(offset - back, size + back)),
              static_cast<int64_t>(offset + size));
    ASSERT_EQ(*store_->UploadedBytes("ragged"), static_cast<int64_t>(offset + size));
    offset += size;
  }
  // An overlapping resend that straddles the end changes nothing that was held.
  ASSERT_EQ(Append("ragged", static_cast<int64_t>(data.size() - 10), data.substr(data.size() - 10)),
            static_cast<int64_t>(data.size()));
  ASSERT_TRUE(store_->Commit("ragged", "j/ragged").ok());
  EXPECT_TRUE(ReadAll("j/ragged", 0, 1 << 20) == data);
}

}  // namespace gradhub::checkpoint
