// A GPU node end to end on a machine without a GPU: gradhub-agent --fake-gpus 2 registers a
// CUDA node whose two GPUs are not there, against the real gradhub-api and PostgreSQL. A
// world-2 job with backend AUTO is placed there; each rank is started with its own GPU and
// NCCL. The real gradhub-trainer then logs the environment it was started with and fails
// (no CUDA device here, an infrastructure failure): its log lines and the job's events are
// what the ranks saw, which is what this test checks. The training itself on a GPU is
// tests/gpu/run.sh's.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include "gradhub/v1/jobs.grpc.pb.h"
#include "gradhub/v1/nodes.grpc.pb.h"
#include "services/common/contract/job_spec.h"
#include "services/common/contract/trainer_exit_codes.h"
#include "tests/support/local_cluster.h"

namespace gradhub {
namespace {

using testing::Ended;

class GpuNodeE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::LocalClusterOptions options;
    options.agents = {"gpu"};
    options.fake_gpus = 2;
    cluster_ = std::make_unique<testing::LocalCluster>(options);
    ASSERT_TRUE(cluster_->Start());
  }

  std::unique_ptr<testing::LocalCluster> cluster_;
};

TEST_F(GpuNodeE2eTest, AgentWithTwoFakeGpusRegistersACudaNodeWithTwoSlotsAndItsDevices) {
  const v1::Node node = cluster_->GetNode("gpu");
  EXPECT_EQ(node.kind(), v1::Node::CUDA);
  EXPECT_EQ(node.slots(), 2);
  ASSERT_EQ(node.devices_size(), 2) << node.DebugString();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(node.devices(i).index(), i);
    EXPECT_NE(node.devices(i).name().find("Fake GPU"), std::string::npos);
    EXPECT_GT(node.devices(i).total_memory_bytes(), 0);
    EXPECT_EQ(node.devices(i).uuid(), "GPU-fake-" + std::to_string(i));
    EXPECT_EQ(node.devices(i).driver_version(), "fake");
    EXPECT_EQ(node.devices(i).cuda_version(), "fake");
  }
}

TEST_F(GpuNodeE2eTest, AutoJobRanksOnTheGpuNodeStartWithDistinctDevicesAndNccl) {
  const v1::Job job = cluster_->Submit(
      ParseJobSpec("model: {mlp: {layers: [8, 4]}}\n"
                   "dataset: {synthetic: {numSamples: 256, numFeatures: 8, numClasses: 4}}\n"
                   "optimizer: {sgd: {lr: 0.1}}\n"
                   "batchSizePerRank: 8\n"
                   "maxSteps: 5\n"
                   "distributed: {worldSize: 2, ranksPerNode: 2, backend: AUTO}\n"
                   "maxRestarts: {infrastructure: 0, job: 0}\n"));
  const v1::Job ended = cluster_->AwaitJob(job.name(), Ended);
  ASSERT_EQ(ended.state(), v1::Job::FAILED) << cluster_->Describe(job.name());

  // 1. The ranks' own report of their environment (gradhub-trainer's first log line).
  const std::regex started(
      "GRADHUB_DEVICE=cuda GRADHUB_BACKEND=NCCL CUDA_VISIBLE_DEVICES=([0-9]+)$");
  std::set<std::string> devices;
  for (int rank = 0; rank < 2; ++rank) {
    std::string device;
    // Logs reach the api after the job's end may (under load, CI found it did); wait for them.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (device.empty() && std::chrono::steady_clock::now() < deadline) {
      for (const std::string& line : cluster_->Logs(job.name(), 0, rank)) {
        std::smatch match;
        if (std::regex_search(line, match, started)) device = match[1].str();
      }
      if (device.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_FALSE(device.empty()) << "rank " << rank << " logged no environment line; "
                                 << cluster_->Describe(job.name());
    devices.insert(device);
  }
  EXPECT_EQ(devices, (std::set<std::string>{"0", "1"}));

  // 2. The job's events: it was placed on the GPU node, and the rank that failed first (which
  //    fails the attempt; the other is then stopped) failed there for want of the GPU it was
  //    given, an infrastructure failure naming that GPU.
  bool placed = false;
  int failed = 0;
  for (const v1::JobEvent& event : cluster_->Events(job.name())) {
    if (event.type() == v1::JobEvent::STATE_CHANGED && event.to_state() == v1::Job::SCHEDULED) {
      placed = event.message().find("nodes/gpu") != std::string::npos;
    }
    if (event.type() != v1::JobEvent::RANK_FAILED) continue;
    ++failed;
    EXPECT_EQ(event.node(), "nodes/gpu");
    EXPECT_EQ(event.failure_kind(), v1::JobEvent::INFRASTRUCTURE);
    EXPECT_EQ(event.exit_code(), trainer::kExitInfrastructure) << event.message();
    EXPECT_TRUE(std::regex_search(event.message(),
                                  std::regex("GRADHUB_DEVICE=cuda, CUDA_VISIBLE_DEVICES=[01]\\)")))
        << event.message();
  }
  EXPECT_TRUE(placed) << cluster_->Describe(job.name());
  EXPECT_GE(failed, 1) << cluster_->Describe(job.name());
}

}  // namespace
}  // namespace gradhub
