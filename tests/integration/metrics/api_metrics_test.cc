// What gradhub-api adds to its /metrics for operators, against a real PostgreSQL: nodes by
// state, slots by use and restarts by budget read from the database, and the scheduling latency
// the scheduler reports when a job's ranks all run.
#include "services/api/api_metrics.h"

#include <gtest/gtest.h>

#include <google/protobuf/util/time_util.h>

#include "services/api/job_manager.h"
#include "services/api/node_manager.h"
#include "services/api/scheduler.h"
#include "tests/integration/metrics/metrics_test_util.h"
#include "tests/support/job_specs.h"

namespace gradhub::api {
namespace {

using metrics::SampleOf;

class ApiMetricsTest : public metrics::MetricsDatabaseTest {
 protected:
  int64_t InsertNode(const std::string& name, const std::string& state, int slots) {
    auto row = pool_->Exec(
        "INSERT INTO nodes (name, state, slots, last_heartbeat_time) VALUES ($1, $2, $3, now())"
        " RETURNING id",
        {name, state, slots});
    EXPECT_TRUE(row.ok()) << row.status();
    return row.ok() ? row->row(0).Get<int64_t>("id") : 0;
  }

  // Rank `rank` of `job`'s attempt 1 on `node`'s slot `slot`, in `state`.
  void InsertRank(const std::string& job, int rank, int64_t node, int slot,
                  const std::string& state) {
    const std::string id = job.substr(5);
    ASSERT_TRUE(pool_
                    ->Exec("INSERT INTO job_attempts (job_id, attempt, state, rendezvous_prefix)"
                           " VALUES ($1::uuid, 1, 'RUNNING', $2) ON CONFLICT DO NOTHING",
                           {id, job + "/attempts/1/"})
                    .ok());
    auto inserted = pool_->Exec(
        "INSERT INTO rank_assignments (job_id, attempt, rank, node_id, local_rank, slot, state)"
        " VALUES ($1::uuid, 1, $2, $3, $2, $4, $5)",
        {id, rank, node, slot, state});
    ASSERT_TRUE(inserted.ok()) << inserted.status();
  }
};

TEST_F(ApiMetricsTest, NodesSlotsAndRestartsComeFromTheDatabase) {
  ApiMetrics metrics(pool_.get());
  const int64_t ready = InsertNode("a", "READY", 4);
  const int64_t cordoned = InsertNode("b", "CORDONED", 2);
  const int64_t lost = InsertNode("c", "LOST", 3);
  const std::string job = InsertJob(4);
  InsertRank(job, 0, ready, 0, "RUNNING");
  InsertRank(job, 1, ready, 1, "STARTING");
  InsertRank(job, 2, cordoned, 0, "RUNNING");
  InsertRank(job, 3, lost, 0, "STOPPED");  // gone: holds nothing
  InsertJob(1);
  // The world-4 job restarted twice for the infrastructure and once for itself, the other once.
  ASSERT_TRUE(
      pool_->Exec("UPDATE jobs SET infra_restarts = 2, job_restarts = 1 WHERE world_size = 4")
          .ok());
  ASSERT_TRUE(pool_->Exec("UPDATE jobs SET infra_restarts = 1 WHERE world_size = 1").ok());

  const std::string text = metrics.Scrape();
  EXPECT_EQ(SampleOf(text, "gradhub_nodes{state=\"READY\"}"), 1);
  EXPECT_EQ(SampleOf(text, "gradhub_nodes{state=\"CORDONED\"}"), 1);
  EXPECT_EQ(SampleOf(text, "gradhub_nodes{state=\"LOST\"}"), 1);
  EXPECT_EQ(SampleOf(text, "gradhub_nodes{state=\"DRAINING\"}"), 0);
  EXPECT_EQ(SampleOf(text, "gradhub_slots{state=\"used\"}"), 3);
  EXPECT_EQ(SampleOf(text, "gradhub_slots{state=\"free\"}"), 2);
  EXPECT_EQ(SampleOf(text, "gradhub_slots{state=\"unavailable\"}"), 1);
  EXPECT_EQ(SampleOf(text, "gradhub_job_restarts_total{reason=\"infrastructure\"}"), 3);
  EXPECT_EQ(SampleOf(text, "gradhub_job_restarts_total{reason=\"job\"}"), 1);
  EXPECT_EQ(SampleOf(text, "gradhub_jobs{state=\"RUNNING\"}"), 2);
  EXPECT_EQ(SampleOf(text, "gradhub_api_database_up"), 1);
}

TEST_F(ApiMetricsTest, AnEmptyClusterStillShowsEveryState) {
  ApiMetrics metrics(pool_.get());
  const std::string text = metrics.Scrape();
  for (const char* state : {"READY", "CORDONED", "DRAINING", "LOST"}) {
    EXPECT_EQ(SampleOf(text, std::string("gradhub_nodes{state=\"") + state + "\"}"), 0) << state;
  }
  for (const char* state : {"used", "free", "unavailable"}) {
    EXPECT_EQ(SampleOf(text, std::string("gradhub_slots{state=\"") + state + "\"}"), 0) << state;
  }
  EXPECT_EQ(SampleOf(text, "gradhub_job_restarts_total{reason=\"job\"}"), 0);
  EXPECT_EQ(SampleOf(text, "gradhub_scheduling_latency_seconds_count"), 0);
}

// The agent protocol played by hand, as scheduler_test does: the latency is observed once,
// when the pass that saw every rank start has committed.
TEST_F(ApiMetricsTest, SchedulingLatencyIsObservedWhenEveryRankRuns) {
  ApiMetrics metrics(pool_.get());
  JobManager jobs(pool_.get(), SpecLimits{.max_world_size = 8});
  NodeManager nodes(pool_.get(), NodeManagerOptions{});
  nodes.set_store_address("127.0.0.1:7070");
  int observed = 0;
  SchedulerOptions options;
  options.on_running = [&](absl::Duration latency) {
    ++observed;
    metrics.ObserveSchedulingLatency(latency);
  };
  Scheduler scheduler(pool_.get(), options);

  v1::RegisterNodeRequest node;
  node.mutable_node()->set_name("nodes/a");
  node.mutable_node()->set_slots(2);
  node.mutable_node()->add_data_roots("/data");  // MinimalJobSpec's dataset is there
  auto registered = nodes.RegisterNode(node);
  ASSERT_TRUE(registered.ok()) << registered.status();
  v1::JobSpec spec = testing::MinimalJobSpec();
  spec.mutable_distributed()->set_world_size(2);
  spec.mutable_distributed()->set_ranks_per_node(0);
  ASSERT_TRUE(jobs.CreateJob(tenant_, spec, "").ok());
  ASSERT_TRUE(scheduler.RunOnce().ok());  // placed: SCHEDULED

  // One heartbeat learns the ranks, the next says they run.
  v1::HeartbeatRequest beat;
  beat.set_node("nodes/a");
  beat.set_session_id(registered->session_id());
  beat.set_seq(1);
  auto desired = nodes.Heartbeat(beat);
  ASSERT_TRUE(desired.ok()) << desired.status();
  ASSERT_EQ(desired->desired_ranks_size(), 2);
  beat.set_seq(2);
  for (const auto& rank : desired->desired_ranks()) {
    v1::RankStatus* status = beat.add_ranks();
    status->set_job(rank.job());
    status->set_attempt(rank.attempt());
    status->set_rank(rank.rank());
    status->set_pid(1000 + rank.rank());
    status->set_state(v1::RankStatus::RUNNING);
  }
  ASSERT_TRUE(nodes.Heartbeat(beat).ok());
  EXPECT_EQ(observed, 0);
  ASSERT_TRUE(scheduler.RunOnce().ok());  // RUNNING
  ASSERT_TRUE(scheduler.RunOnce().ok());  // nothing new
  EXPECT_EQ(observed, 1);
  const std::string text = metrics.Scrape();
  EXPECT_EQ(SampleOf(text, "gradhub_scheduling_latency_seconds_count"), 1);
  EXPECT_GT(SampleOf(text, "gradhub_scheduling_latency_seconds_sum"), 0);
  EXPECT_LT(SampleOf(text, "gradhub_scheduling_latency_seconds_sum"), 60);
}

}  // namespace
}  // namespace gradhub::api
