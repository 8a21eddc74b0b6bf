// LocalBlobStore: the conformance suite, and what only the filesystem backend promises (its
// layout, and that a new instance on the same directory, as after a restart, sees everything).
#include "services/checkpoint/local_blob_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/unit/checkpoint/blob_store_conformance.h"

namespace gradhub::checkpoint {
namespace {

namespace fs = std::filesystem;

std::string MakeTempDir() {
  std::string pattern = (fs::temp_directory_path() / "gradhub-blobs-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) return "";
  return pattern;
}

std::shared_ptr<BlobStore> MakeLocal(LocalBlobStore::Options options) {
  const std::string dir = MakeTempDir();
  auto store = LocalBlobStore::Open(dir + "/data", options);
  if (!store.ok()) return nullptr;
  return std::shared_ptr<BlobStore>(store->release(), [dir](BlobStore* s) {
    delete s;
    fs::remove_all(dir);
  });
}

// Both ways of writing: O_DIRECT (what ext4 and xfs get) and the page cache (a filesystem
// without O_DIRECT).
INSTANTIATE_TEST_SUITE_P(
    Backends, BlobStoreConformanceTest,
    ::testing::Values(BlobStoreFactory{"Local", [] { return MakeLocal({.direct_io = true}); }},
                      BlobStoreFactory{"LocalBuffered",
                                       [] { return MakeLocal({.direct_io = false}); }}),
    BlobStoreFactoryName);

class LocalBlobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    auto store = LocalBlobStore::Open(dir_ + "/data");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string dir_;
  std::unique_ptr<LocalBlobStore> store_;
};

TEST_F(LocalBlobStoreTest, UploadsAreTemporaryFilesAndBlobsTheirRenamedSelves) {
  ASSERT_TRUE(store_->Append("u1", 0, "hello").ok());
  EXPECT_EQ(store_->UploadPath("u1"), dir_ + "/data/uploads/u1.part");
  EXPECT_TRUE(fs::exists(store_->UploadPath("u1")));
  ASSERT_TRUE(store_->Commit("u1", "job-a/7-u1").ok());
  EXPECT_FALSE(fs::exists(store_->UploadPath("u1")));
  EXPECT_EQ(store_->BlobPath("job-a/7-u1"), dir_ + "/data/blobs/job-a/7-u1");
  std::ifstream in(store_->BlobPath("job-a/7-u1"));
  std::string text;
  in >> text;
  EXPECT_EQ(text, "hello");
  // The job's directory goes with its last blob.
  ASSERT_TRUE(store_->Delete("job-a/7-u1").ok());
  EXPECT_FALSE(fs::exists(dir_ + "/data/blobs/job-a"));
}

TEST_F(LocalBlobStoreTest, ANewInstanceOnTheSameDirectorySeesEverything) {
  ASSERT_TRUE(store_->Append("u1", 0, "partial").ok());
  ASSERT_TRUE(store_->Append("u2", 0, "whole").ok());
  ASSERT_TRUE(store_->Commit("u2", "j/b2").ok());
  store_.reset();
  auto again = LocalBlobStore::Open(dir_ + "/data");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*(*again)->UploadedBytes("u1"), 7);
  EXPECT_EQ(*(*again)->Append("u1", 7, "+more"), 12);
  EXPECT_EQ(*(*again)->BlobSize("j/b2"), 5);
}

TEST_F(LocalBlobStoreTest, FilesInTheUploadsDirectoryThatAreNotUploadsAreIgnored) {
  std::ofstream(dir_ + "/data/uploads/notes.txt") << "x";
  auto uploads = store_->ListUploads();
  ASSERT_TRUE(uploads.ok());
  EXPECT_TRUE(uploads->empty());
}

TEST_F(LocalBlobStoreTest, AnUnusableDataDirectoryIsAnError) {
  std::ofstream(dir_ + "/file") << "x";
  EXPECT_FALSE(LocalBlobStore::Open(dir_ + "/file/data").ok());
  EXPECT_FALSE(LocalBlobStore::Open("").ok());
}

}  // namespace
}  // namespace gradhub::checkpoint
