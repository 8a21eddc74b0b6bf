// `gradhub describe`'s layout of a pipelined job (services/cli/job_layout.h): the ranks by
// replica and stage, each on the node its attempt's placement event names. No server.
#include "services/cli/job_layout.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "services/common/contract/job_spec.h"

namespace gradhub::cli {
namespace {

// A job of 2 stages x 2 replicas (an MLP of 4 layers) on its attempt `attempt`.
v1::Job PipelinedJob(int32_t attempt = 1) {
  v1::Job job;
  job.set_name("jobs/p");
  job.set_attempt(attempt);
  *job.mutable_spec() = ParseJobSpec(R"(
model: {mlp: {layers: [4, 8, 8, 8, 2]}}
distributed: {worldSize: 4}
parallelism: {pipelineStages: 2, microBatches: 4}
)");
  return job;
}

v1::JobEvent Scheduled(int32_t attempt, const std::string& message) {
  v1::JobEvent event;
  event.set_type(v1::JobEvent::STATE_CHANGED);
  event.set_to_state(v1::Job::SCHEDULED);
  event.set_attempt(attempt);
  event.set_message(message);
  return event;
}

TEST(NodesOfRanks, ReadsEveryRunOfAPlacementMessage) {
  // As scheduling_rules.h PlacementMessage writes them, with and without a pipeline.
  EXPECT_EQ(NodesOfRanks("attempt 3 placed on nodes/a (ranks 0-1), nodes/b-2 (rank 2), CUDA"),
            (std::map<int32_t, std::string>{{0, "nodes/a"}, {1, "nodes/a"}, {2, "nodes/b-2"}}));
  EXPECT_EQ(NodesOfRanks("attempt 1 placed 2 stages x 2 replicas: replica 0 on nodes/a (ranks "
                         "0-1), replica 1 on nodes/a (rank 2) and nodes/b (rank 3)"),
            (std::map<int32_t, std::string>{
                {0, "nodes/a"}, {1, "nodes/a"}, {2, "nodes/a"}, {3, "nodes/b"}}));
  EXPECT_TRUE(NodesOfRanks("needs 4 slots, 2 free on the largest node").empty());
}

TEST(CurrentPlacement, IsTheLastSchedulingOfTheCurrentAttempt) {
  const v1::JobEvent first = Scheduled(1, "attempt 1 placed on nodes/a (ranks 0-3)");
  const v1::JobEvent second = Scheduled(2, "attempt 2 placed on nodes/b (ranks 0-3)");
  v1::JobEvent running = Scheduled(2, "all 4 ranks started");
  running.set_to_state(v1::Job::RUNNING);
  EXPECT_EQ(CurrentPlacement(PipelinedJob(2), {&first, &second, &running}), &second);
  EXPECT_EQ(CurrentPlacement(PipelinedJob(3), {&first, &second, &running}), nullptr);
}

TEST(PipelineLayout, ShowsEachReplicasStagesWithRankAndNode) {
  const v1::JobEvent placed =
      Scheduled(1,
                "attempt 1 placed 2 stages x 2 replicas: replica 0 on nodes/a (ranks 0-1), "
                "replica 1 on nodes/b (ranks 2-3)");
  EXPECT_EQ(PipelineLayout(PipelinedJob(), {&placed}),
            "layout: 2 stages x 2 replicas, schedule ONE_F_ONE_B, 4 micro-batches, 4 layers "
            "(split by parameter count)\n"
            "  REPLICA  STAGE  RANK  NODE\n"
            "  0        0      0     nodes/a\n"
            "  0        1      1     nodes/a\n"
            "  1        0      2     nodes/b\n"
            "  1        1      3     nodes/b\n");
}

TEST(PipelineLayout, BeforeItsAttemptIsPlacedTheNodesAreDashes) {
  const v1::JobEvent earlier = Scheduled(1, "attempt 1 placed on nodes/a (ranks 0-3)");
  const std::string layout = PipelineLayout(PipelinedJob(2), {&earlier});
  EXPECT_NE(layout.find("  1        1      3     -\n"), std::string::npos) << layout;
  EXPECT_EQ(layout.find("nodes/a"), std::string::npos) << layout;
}

TEST(PipelineLayout, NamesTheInterleavedChunksAndTheMeasuredBalance) {
  v1::Job job = PipelinedJob();
  auto* parallelism = job.mutable_spec()->mutable_parallelism();
  parallelism->set_schedule(v1::ParallelismSpec::INTERLEAVED_ONE_F_ONE_B);
  parallelism->set_balance(v1::ParallelismSpec::MEASURED_TIME);
  parallelism->set_micro_batches(0);
  EXPECT_EQ(PipelineLayout(job, {}).substr(0, PipelineLayout(job, {}).find('\n')),
            "layout: 2 stages x 2 replicas, schedule INTERLEAVED_ONE_F_ONE_B (2 chunks per stage), "
            "2 micro-batches, 4 layers (split by measured time)");
}

TEST(PipelineLayout, IsEmptyWithoutAPipeline) {
  v1::Job job = PipelinedJob();
  job.mutable_spec()->mutable_parallelism()->set_pipeline_stages(1);
  EXPECT_EQ(PipelineLayout(job, {}), "");
  job.mutable_spec()->clear_parallelism();
  EXPECT_EQ(PipelineLayout(job, {}), "");
}

}  // namespace
}  // namespace gradhub::cli
