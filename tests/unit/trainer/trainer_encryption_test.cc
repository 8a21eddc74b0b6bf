// distributed.encryptTraffic in the trainer: two ranks (threads over one store) train a spec
// with it; the ranks' process group agreed on a traffic key through the store
// (gpu_worker/ddp/comm/gloo/sealed_channel.h), the ranks end with the same parameters (what
// DDP's broadcast and allreduces guarantee, here sealed), and a spec without it makes a plain
// group. Ranks as threads share torch's global generator, so the initial weights (rank 0's,
// broadcast) depend on the threads' interleaving: runs are compared within, not across. The
// sealed collectives themselves are tested in tests/unit/ddp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gpu_worker/ddp/store/in_memory_store.h"
#include "gpu_worker/trainer/trainer.h"
#include "services/common/contract/job_spec.h"

namespace gradhub::trainer {
namespace {

v1::JobSpec Spec(bool encrypt) {
  return ParseJobSpec(std::string("model: {mlp: {layers: [16, 32, 4]}}\n"
                                  "dataset: {synthetic: {numSamples: 512, numFeatures: 16, "
                                  "numClasses: 4, noise: 0.5}}\n"
                                  "optimizer: {sgd: {lr: 0.05, momentum: 0.9}}\n"
                                  "batchSizePerRank: 16\n"
                                  "maxSteps: 6\n"
                                  "seed: 3\n"
                                  "distributed: {backend: GLOO, encryptTraffic: ") +
                      (encrypt ? "true" : "false") + "}\n");
}

// Rank r of two on its own thread; rethrows the first rank's failure.
std::vector<TrainResult> TrainTwoRanks(const v1::JobSpec& spec,
                                       const std::shared_ptr<ddp::Store>& store) {
  std::vector<TrainResult> results(2);
  std::vector<std::ostringstream> progress(2), log(2);
  std::mutex mu;
  std::exception_ptr failure;
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      TrainerOptions options;
      options.rank = rank;
      options.world_size = 2;
      options.local_rank = rank;
      options.local_world_size = 2;
      options.store = store;
      options.threads = 1;
      options.collective_timeout = std::chrono::seconds(30);
      options.progress = &progress[rank];
      options.log = &log[rank];
      try {
        results[rank] = Train(spec, options);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failure) failure = std::current_exception();
      }
    });
  }
  for (auto& rank : ranks) rank.join();
  if (failure) std::rethrow_exception(failure);
  return results;
}

TEST(TrainerEncryptionTest, EncryptTrafficSealsTheRanksGroup) {
  auto store = std::make_shared<ddp::InMemoryStore>();
  const std::vector<TrainResult> sealed = TrainTwoRanks(Spec(true), store);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(sealed[rank].steps, 6) << "rank " << rank;
    EXPECT_TRUE(std::isfinite(sealed[rank].final_loss)) << "rank " << rank;
  }
  EXPECT_EQ(sealed[0].parameters_sha256, sealed[1].parameters_sha256);
  // The trainer's group (named "default") agreed on a key.
  const std::string verdict = store->Get("default/sealing/verdict", std::chrono::seconds(1));
  EXPECT_EQ(verdict.rfind("key:", 0), 0u) << "the group did not encrypt";
}

TEST(TrainerEncryptionTest, WithoutItTheGroupIsPlain) {
  auto store = std::make_shared<ddp::InMemoryStore>();
  const std::vector<TrainResult> plain = TrainTwoRanks(Spec(false), store);
  EXPECT_EQ(plain[0].parameters_sha256, plain[1].parameters_sha256);
  EXPECT_EQ(store->Get("default/sealing/verdict", std::chrono::seconds(1)), "plain");
}

}  // namespace
}  // namespace gradhub::trainer
