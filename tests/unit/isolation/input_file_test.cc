// OpenInputFile and CheckInputPath (services/common/contract/input_file.h) on a real
// filesystem: every refusal names the field, and no refusal ever carries a file's content.
#include "services/common/contract/input_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "services/common/contract/user_error.h"
#include "tests/support/subprocess.h"

namespace gradhub {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kMarker[] = "GRADHUB-SECRET-MARKER-7f3a";
constexpr char kField[] = "dataset.csv.path";

class InputFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.path() + "/root";
    outside_ = dir_.path() + "/outside";
    mkdir(root_.c_str(), 0755);
    mkdir(outside_.c_str(), 0755);
    std::ofstream(root_ + "/ok.csv") << "1,2\n3,4\n";
    std::ofstream(outside_ + "/secret.csv") << kMarker << "\n";
    policy_.enforce_roots = true;
    policy_.data_roots = {root_};
    policy_.max_bytes = 1 << 20;
  }

  // The message OpenInputFile refuses `path` with ("" if it opened it).
  std::string Refusal(const std::string& path, const InputPolicy& policy) {
    try {
      OpenInputFile(path, kField, policy);
      return "";
    } catch (const UserError& error) {
      return error.what();
    }
  }

  // Refused both when opened and when checked by name, naming the field, never the marker.
  void ExpectRefused(const std::string& path, const InputPolicy& policy, const std::string& why) {
    const std::string opened = Refusal(path, policy);
    const std::string checked = CheckInputPath(path, kField, policy);
    for (const std::string& message : {opened, checked}) {
      EXPECT_THAT(message, HasSubstr(kField)) << path;
      EXPECT_THAT(message, HasSubstr(why)) << path;
      EXPECT_THAT(message, Not(HasSubstr(kMarker))) << path;
    }
  }

  testing::TempDir dir_;
  std::string root_, outside_;
  InputPolicy policy_;
};

TEST_F(InputFileTest, ReadsARegularFileUnderARoot) {
  InputFile file = OpenInputFile(root_ + "/ok.csv", kField, policy_);
  EXPECT_EQ(ReadAllBounded(file, kField, policy_), "1,2\n3,4\n");
  EXPECT_EQ(CheckInputPath(root_ + "/ok.csv", kField, policy_), "");
}

TEST_F(InputFileTest, RefusesAPathOutsideTheRootsNamingThem) {
  ExpectRefused(outside_ + "/secret.csv", policy_, "allowed: " + root_);
  ExpectRefused("/etc/shadow", policy_, "not under a data root");
}

TEST_F(InputFileTest, RefusesDotDotEscapes) {
  ExpectRefused(root_ + "/../outside/secret.csv", policy_, "'..'");
}

TEST_F(InputFileTest, RefusesASymlinkThatLeadsOutOfTheRoots) {
  ASSERT_EQ(symlink((outside_ + "/secret.csv").c_str(), (root_ + "/link.csv").c_str()), 0);
  ExpectRefused(root_ + "/link.csv", policy_, "symbolic link");
  ASSERT_EQ(symlink(outside_.c_str(), (root_ + "/dir-link").c_str()), 0);
  ExpectRefused(root_ + "/dir-link/secret.csv", policy_, "symbolic link");
}

TEST_F(InputFileTest, FollowsASymlinkThatStaysInside) {
  ASSERT_EQ(symlink((root_ + "/ok.csv").c_str(), (root_ + "/alias.csv").c_str()), 0);
  InputFile file = OpenInputFile(root_ + "/alias.csv", kField, policy_);
  EXPECT_EQ(file.size(), 8);
}

TEST_F(InputFileTest, ARootThatIsASymlinkServesPathsSpelledThroughIt) {
  ASSERT_EQ(symlink(root_.c_str(), (dir_.path() + "/alias-root").c_str()), 0);
  InputPolicy policy = policy_;
  policy.data_roots = {dir_.path() + "/alias-root"};
  EXPECT_EQ(CheckInputPath(dir_.path() + "/alias-root/ok.csv", kField, policy), "");
}

TEST_F(InputFileTest, OnlyRegularFilesEvenWhereEveryPathIsAllowed) {
  InputPolicy anywhere = policy_;
  anywhere.enforce_roots = false;
  ExpectRefused("/dev/zero", anywhere, "a device");
  ExpectRefused("/proc/self/environ", anywhere, "pseudo filesystem");
  ExpectRefused(root_, anywhere, "a directory");
  ASSERT_EQ(mkfifo((root_ + "/fifo").c_str(), 0644), 0);
  ExpectRefused(root_ + "/fifo", anywhere, "a FIFO");  // and does not block on it
}

TEST_F(InputFileTest, TheSameKindsAreRefusedUnderRootsThatHoldThem) {
  InputPolicy roots = policy_;
  roots.data_roots = {"/dev", "/proc"};
  ExpectRefused("/dev/zero", roots, "a device");
  ExpectRefused("/proc/self/environ", roots, "pseudo filesystem");
}

TEST_F(InputFileTest, RefusesAFileOverTheCapBeforeReadingIt) {
  InputPolicy small = policy_;
  small.max_bytes = 4;
  ExpectRefused(root_ + "/ok.csv", small, "8 bytes, more than this node accepts (4 bytes");
}

TEST_F(InputFileTest, TheRankCannotOpenWhatItsUserMayNotRead) {
  if (geteuid() == 0) GTEST_SKIP() << "root reads everything; the e2e suite runs ranks as a user";
  InputPolicy anywhere = policy_;
  anywhere.enforce_roots = false;
  EXPECT_THAT(Refusal("/etc/shadow", anywhere), HasSubstr("Permission denied"));
}

}  // namespace
}  // namespace gradhub
