// A peer process killed mid-collective: the survivor's collective must fail within the group
// timeout, naming the operation, the group and its rank, and never hang.
//
// The peer is this test binary itself, re-executed to run only the disabled PeerRank test, so
// it is a real process with its own sockets and its own mapping of the shared-memory segment,
// killed with SIGKILL as a crashed trainer would be. Both allreduce paths: over TCP the survivor
// sees the connection close, in shared memory it sees the peer's process gone; and a Recv
// (point to point) from the peer.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "gpu_worker/ddp/comm/gloo/gloo_process_group.h"
#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/ddp/store/file_store.h"

namespace gradhub::ddp {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr auto kGroupTimeout = std::chrono::seconds(5);
constexpr char kStoreEnv[] = "GRADHUB_DEATH_TEST_STORE";
constexpr char kSharedMemoryEnv[] = "GRADHUB_DEATH_TEST_SHARED_MEMORY";

std::shared_ptr<ProcessGroup> JoinGroup(int rank, const std::string& store_dir,
                                        bool shared_memory) {
  ProcessGroupOptions options;
  options.backend = Backend::kGloo;
  options.rank = rank;
  options.size = 2;
  options.store = std::make_shared<FileStore>(store_dir);
  options.name = "death";
  options.timeout = kGroupTimeout;
  options.gloo.emplace().shared_memory = shared_memory;
  auto pg = CreateProcessGroup(options);
  EXPECT_EQ(dynamic_cast<GlooProcessGroup&>(*pg).uses_shared_memory(), shared_memory);
  return pg;
}

// Runs only inside the re-executed child: joins as rank 1, takes part in one allreduce and then
// waits to be killed, so the parent's second allreduce is left without its peer.
TEST(GlooDeadPeerTest, DISABLED_PeerRank) {
  const char* store_dir = std::getenv(kStoreEnv);
  const char* shared_memory = std::getenv(kSharedMemoryEnv);
  ASSERT_NE(store_dir, nullptr);
  ASSERT_NE(shared_memory, nullptr);
  auto pg = JoinGroup(1, store_dir, std::string(shared_memory) == "1");
  at::Tensor tensor = at::ones({1 << 20});
  pg->AllReduce(tensor, ReduceOp::kSum)->Wait();
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

pid_t SpawnPeer(const std::string& store_dir, bool shared_memory) {
  const pid_t pid = fork();
  if (pid == 0) {
    setenv(kStoreEnv, store_dir.c_str(), 1);
    setenv(kSharedMemoryEnv, shared_memory ? "1" : "0", 1);
    execl("/proc/self/exe", "process_group_death_test",
          "--gtest_filter=GlooDeadPeerTest.DISABLED_PeerRank", "--gtest_also_run_disabled_tests",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

class GlooDeadPeerPathTest : public ::testing::TestWithParam<bool /*shared_memory*/> {};

TEST_P(GlooDeadPeerPathTest, SurvivorFailsWithinTimeoutNamingOpGroupAndRank) {
  const bool shared_memory = GetParam();
  const std::string store_dir =
      (std::filesystem::temp_directory_path() /
       ("gradhub-death-" + std::to_string(getpid()) + (shared_memory ? "-shm" : "-tcp")))
          .string();
  std::filesystem::remove_all(store_dir);
  const pid_t peer = SpawnPeer(store_dir, shared_memory);
  ASSERT_GT(peer, 0);

  auto pg = JoinGroup(0, store_dir, shared_memory);
  at::Tensor tensor = at::ones({1 << 20});
  pg->AllReduce(tensor, ReduceOp::kSum)->Wait();
  EXPECT_EQ(tensor[0].item<float>(), 2.0f) << "the peer took part in the first allreduce";

  const auto start = Clock::now();
  auto work = pg->AllReduce(tensor, ReduceOp::kSum);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(kill(peer, SIGKILL), 0);
  int status = 0;
  waitpid(peer, &status, 0);
  try {
    work->Wait();
    ADD_FAILURE() << "allreduce without its peer completed";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("allreduce"));
    EXPECT_THAT(e.what(), HasSubstr("death"));
    EXPECT_THAT(e.what(), HasSubstr("rank 0"));
    if (shared_memory) {
      EXPECT_THAT(e.what(), HasSubstr("rank 1 (pid " + std::to_string(peer) + ") exited"));
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(seconds, std::chrono::duration<double>(kGroupTimeout).count() + 2.0);
  std::filesystem::remove_all(store_dir);
}

// Point to point: a Recv from a peer that dies fails as soon as the connection closes, well
// within the timeout, naming the op, its peer and tag, the group and this rank.
TEST(GlooDeadPeerTest, RecvFromAPeerThatDiesFailsWithinTheTimeout) {
  const std::string store_dir = (std::filesystem::temp_directory_path() /
                                 ("gradhub-death-" + std::to_string(getpid()) + "-p2p"))
                                    .string();
  std::filesystem::remove_all(store_dir);
  const pid_t peer = SpawnPeer(store_dir, /*shared_memory=*/false);
  ASSERT_GT(peer, 0);
  auto pg = JoinGroup(0, store_dir, /*shared_memory=*/false);
  at::Tensor tensor = at::ones({1 << 20});
  pg->AllReduce(tensor, ReduceOp::kSum)->Wait();  // the peer is up; it never sends

  const auto start = Clock::now();
  auto recv = pg->Recv(at::zeros({1000}), 1, 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(kill(peer, SIGKILL), 0);
  int status = 0;
  waitpid(peer, &status, 0);
  try {
    recv->Wait();
    ADD_FAILURE() << "a Recv from a dead peer completed";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr("recv #0 (float32, 1000 elements, from rank 1, tag 3) in "
                                    "group 'death' rank 0/2: peer closed the connection"));
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(seconds, std::chrono::duration<double>(kGroupTimeout).count() + 2.0);
  std::filesystem::remove_all(store_dir);
}

INSTANTIATE_TEST_SUITE_P(BothPaths, GlooDeadPeerPathTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "shm" : "tcp"; });

}  // namespace
}  // namespace gradhub::ddp
