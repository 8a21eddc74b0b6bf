// Every Store backend against the one contract (store_conformance.h), then what is particular
// to each: FileStore across processes and on disk, PrefixStore's scoping.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_worker/ddp/store/file_store.h"
#include "gpu_worker/ddp/store/in_memory_store.h"
#include "gpu_worker/ddp/store/prefix_store.h"
#include "tests/unit/ddp/store_conformance.h"

namespace gradhub::ddp {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

std::string MakeTempDir() {
  std::string path = (fs::temp_directory_path() / "gradhub_store_test_XXXXXX").string();
  if (::mkdtemp(path.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return path;
}

// A FileStore in a subdirectory (which it must create) of a fresh temp dir; the temp dir goes
// with the last reference to the store.
std::shared_ptr<Store> MakeTempFileStore() {
  std::string root = MakeTempDir();
  try {
    return std::shared_ptr<Store>(new FileStore(root + "/store"), [root](Store* store) {
      delete store;
      fs::remove_all(root);
    });
  } catch (...) {
    fs::remove_all(root);
    throw;
  }
}

std::shared_ptr<Store> MakeInMemoryStore() { return std::make_shared<InMemoryStore>(); }

INSTANTIATE_TEST_SUITE_P(
    Backends, StoreConformanceTest,
    ::testing::Values(
        StoreFactory{"InMemory", MakeInMemoryStore}, StoreFactory{"File", MakeTempFileStore},
        StoreFactory{"PrefixOverInMemory",
                     [] { return std::make_shared<PrefixStore>(MakeInMemoryStore(), "p/q"); }},
        StoreFactory{"PrefixOverFile",
                     [] { return std::make_shared<PrefixStore>(MakeTempFileStore(), "p/q"); }}),
    StoreFactoryName);

// ---- FileStore ----

class FileStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = MakeTempDir(); }
  void TearDown() override { fs::remove_all(root_); }

  static std::vector<std::string> List(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string root_;
};

TEST_F(FileStoreTest, AddIsAtomicAcrossProcesses) {
  constexpr int kAdds = 200;
  // The child uses the parent's store object: a lock held through a descriptor inherited
  // across fork() would exclude nothing, so this also checks that none is.
  FileStore store(root_ + "/store");
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only _exit from here: returning would run the rest of the test binary in the child.
    ::close(go[1]);
    char byte;
    if (::read(go[0], &byte, 1) != 1) ::_exit(2);
    try {
      for (int i = 0; i < kAdds; ++i) store.Add("counter", 1);
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  ::close(go[0]);
  // Start both loops together so that they overlap.
  ASSERT_EQ(::write(go[1], "x", 1), 1);
  ::close(go[1]);
  for (int i = 0; i < kAdds; ++i) store.Add("counter", 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_EQ(store.Get("counter", milliseconds(100)), std::to_string(2 * kAdds));
}

TEST_F(FileStoreTest, ProcessesSeeEachOthersKeys) {
  FileStore writer(root_ + "/store");
  FileStore reader(root_ + "/store");
  writer.Set("rank/0", "addr");
  EXPECT_EQ(reader.Get("rank/0", milliseconds(100)), "addr");
  EXPECT_EQ(reader.Add("n", 3), 3);
  EXPECT_EQ(writer.Add("n", 1), 4);
}

TEST_F(FileStoreTest, KeysStayInsideTheDirectoryAsPlainFiles) {
  FileStore store(root_ + "/store");
  for (const char* key : {"..", ".", "../escape", "/abs", "a/b", "a/../../b", "%2e%2e"}) {
    store.Set(key, "v");
  }
  EXPECT_EQ(List(root_), std::vector<std::string>{"store"});
  for (const auto& entry : fs::directory_iterator(root_ + "/store")) {
    EXPECT_TRUE(entry.is_regular_file()) << entry.path();
  }
}

TEST_F(FileStoreTest, DeletePrefixLeavesOtherFilesAlone) {
  FileStore store(root_ + "/store");
  store.Set("a", "v");
  std::ofstream(root_ + "/store/notes.txt") << "not a key";
  std::ofstream(root_ + "/store/k.bad%zz") << "not a valid key file name";
  EXPECT_EQ(store.DeletePrefix(""), 1);
  EXPECT_TRUE(fs::exists(root_ + "/store/notes.txt"));
  EXPECT_TRUE(fs::exists(root_ + "/store/k.bad%zz"));
}

TEST_F(FileStoreTest, CreatesMissingParentDirectories) {
  FileStore store(root_ + "/a/b/c");
  store.Set("k", "v");
  EXPECT_TRUE(fs::is_directory(root_ + "/a/b/c"));
}

TEST_F(FileStoreTest, ErrorsNameThePath) {
  std::string file = root_ + "/plain_file";
  std::ofstream(file) << "x";
  for (const std::string& dir : {file, file + "/sub"}) {
    try {
      FileStore store(dir);
      FAIL() << "FileStore over " << dir << " was created";
    } catch (const StoreError& e) {
      EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
    }
  }
}

// ---- PrefixStore, over each backend ----

class PrefixStoreTest : public ::testing::TestWithParam<StoreFactory> {
 protected:
  void SetUp() override { inner_ = GetParam().make(); }
  std::shared_ptr<Store> inner_;
};

INSTANTIATE_TEST_SUITE_P(Inner, PrefixStoreTest,
                         ::testing::Values(StoreFactory{"InMemory", MakeInMemoryStore},
                                           StoreFactory{"File", MakeTempFileStore}),
                         StoreFactoryName);

TEST_P(PrefixStoreTest, KeysLandUnderThePrefix) {
  PrefixStore scoped(inner_, "jobs/42/attempts/3");
  scoped.Set("rank/0", "addr");
  EXPECT_EQ(inner_->Get("jobs/42/attempts/3/rank/0", milliseconds(100)), "addr");
  EXPECT_FALSE(inner_->Check({"rank/0"}));
  EXPECT_EQ(scoped.Add("n", 2), 2);
  EXPECT_EQ(inner_->Get("jobs/42/attempts/3/n", milliseconds(100)), "2");
  inner_->Set("jobs/42/attempts/3/from_inner", "y");
  EXPECT_EQ(scoped.Get("from_inner", milliseconds(100)), "y");

  // Nesting composes the prefixes.
  PrefixStore attempt(std::make_shared<PrefixStore>(inner_, "jobs/42"), "attempts/3");
  EXPECT_EQ(attempt.Get("rank/0", milliseconds(100)), "addr");
}

TEST_P(PrefixStoreTest, PrefixesDoNotSeeEachOthersKeys) {
  PrefixStore a(inner_, "a"), ab(inner_, "ab"), b(inner_, "b");
  a.Set("k", "1");
  EXPECT_FALSE(ab.Check({"k"}));  // The "/" separator keeps "a" and "ab" apart.
  EXPECT_FALSE(b.Check({"k"}));
  b.Set("k", "2");
  ab.Set("k", "3");
  EXPECT_EQ(a.Get("k", milliseconds(100)), "1");
  EXPECT_EQ(b.Get("k", milliseconds(100)), "2");

  EXPECT_EQ(a.DeletePrefix(""), 1);
  EXPECT_FALSE(a.Check({"k"}));
  EXPECT_TRUE(ab.Check({"k"}));
  EXPECT_TRUE(b.Check({"k"}));
}

TEST_P(PrefixStoreTest, ErrorsNameTheFullKey) {
  PrefixStore scoped(inner_, "jobs/42/attempts/3");
  try {
    scoped.Get("missing", milliseconds(10));
    FAIL() << "Get of a missing key returned";
  } catch (const StoreTimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("jobs/42/attempts/3/missing"), std::string::npos)
        << e.what();
  }
  scoped.Set("value", "text");
  try {
    scoped.Add("value", 1);
    FAIL() << "Add on a value returned";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("jobs/42/attempts/3/value"), std::string::npos)
        << e.what();
  }
}

TEST(PrefixStore, RejectsANullStore) {
  EXPECT_THROW(PrefixStore(nullptr, "p"), std::invalid_argument);
}

}  // namespace
}  // namespace gradhub::ddp
