// The scheduler and the server side of the agent protocol against a real PostgreSQL: the test
// plays the agents, speaking the protocol through NodeManager as NodeService does, and runs
// scheduler passes by hand, so every step of gang placement, the job lifecycle and failure
// handling is observed in order.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <google/protobuf/util/message_differencer.h>
#include <google/protobuf/util/time_util.h>

#include <functional>
#include <map>
#include <set>

#include "absl/time/clock.h"
#include "services/api/attempts.h"
#include "services/api/job_manager.h"
#include "services/api/node_manager.h"
#include "services/api/scheduler.h"
#include "tests/integration/db/db_test_util.h"
#include "tests/support/job_specs.h"

namespace gradhub::api {
namespace {

using ::testing::HasSubstr;

class SchedulerTest : public db::DatabaseTest {
 protected:
  void SetUp() override {
    db::DatabaseTest::SetUp();
    Migrate();
    pool_ = MakePool(8);
    jobs_ = std::make_unique<JobManager>(pool_.get(), SpecLimits{.max_world_size = 64});
    nodes_ = std::make_unique<NodeManager>(pool_.get(), NodeManagerOptions{});
    nodes_->set_store_address("127.0.0.1:7070");
    SchedulerOptions options;
    options.backfill_window = absl::Seconds(600);
    options.peer_failure_grace = absl::Seconds(600);
    scheduler_ = std::make_unique<Scheduler>(pool_.get(), options);
    auto tenant = pool_->Exec("INSERT INTO tenants (name) VALUES ('team') RETURNING id");
    ASSERT_TRUE(tenant.ok()) << tenant.status();
    tenant_ = tenant->row(0).Get<int64_t>("id");
  }

  // A registered agent: its session and sequence number.
  struct Agent {
    std::string name, session;
    int64_t seq = 0;
  };

  Agent Register(const std::string& name, int slots,
                 const std::vector<std::string>& data_roots = {"/data"},
                 const std::map<std::string, std::string>& labels = {},
                 v1::Node::DeviceKind kind = v1::Node::CPU) {
    v1::RegisterNodeRequest request;
    request.mutable_node()->set_name("nodes/" + name);
    request.mutable_node()->set_slots(slots);
    request.mutable_node()->set_kind(kind);
    for (const auto& [key, value] : labels)
      (*request.mutable_node()->mutable_labels())[key] = value;
    // By default /data, where MinimalJobSpec's dataset is.
    for (const std::string& root : data_roots) request.mutable_node()->add_data_roots(root);
    auto response = nodes_->RegisterNode(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return {name, response.ok() ? response->session_id() : ""};
  }

  // One heartbeat reporting `ranks`; returns the desired set.
  std::vector<v1::RankAssignment> Beat(Agent& agent, const std::vector<v1::RankStatus>& ranks) {
    v1::HeartbeatRequest request;
    request.set_node("nodes/" + agent.name);
    request.set_session_id(agent.session);
    request.set_seq(++agent.seq);
    for (const auto& rank : ranks) *request.add_ranks() = rank;
    auto response = nodes_->Heartbeat(request);
    EXPECT_TRUE(response.ok()) << response.status();
    if (!response.ok()) return {};
    return {response->desired_ranks().begin(), response->desired_ranks().end()};
  }

  static v1::RankStatus Status(const v1::RankAssignment& rank, v1::RankStatus::State state,
                               int exit_code = 0, int signal = 0) {
    v1::RankStatus status;
    status.set_job(rank.job());
    status.set_attempt(rank.attempt());
    status.set_rank(rank.rank());
    status.set_pid(1000 + rank.rank());
    status.set_state(state);
    status.set_exit_code(exit_code);
    status.set_signal(signal);
    if (state == v1::RankStatus::RUNNING) {  // as an agent reports a rank that made progress
      status.set_last_step(10);
      *status.mutable_last_step_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
    }
    return status;
  }

  static std::vector<v1::RankStatus> All(const std::vector<v1::RankAssignment>& ranks,
                                         v1::RankStatus::State state) {
    std::vector<v1::RankStatus> out;
    for (const auto& rank : ranks) out.push_back(Status(rank, state));
    return out;
  }

  v1::Job Submit(int world_size, int job_restarts = 1) {
    v1::JobSpec spec = testing::MinimalJobSpec();
    spec.mutable_distributed()->set_world_size(world_size);
    spec.mutable_distributed()->set_ranks_per_node(0);
    spec.mutable_max_restarts()->set_job(job_restarts);
    auto job = jobs_->CreateJob(tenant_, spec, "");
    EXPECT_TRUE(job.ok()) << job.status();
    return *job;
  }

  v1::Job Get(const v1::Job& job) { return *jobs_->GetJob(tenant_, job.name()); }

  void Pass() { ASSERT_TRUE(scheduler_->RunOnce().ok()); }

  std::unique_ptr<db::Pool> pool_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<NodeManager> nodes_;
  std::unique_ptr<Scheduler> scheduler_;
  int64_t tenant_ = 0;
};

TEST_F(SchedulerTest, PlacesOnlyOnNodesWhoseDataRootsHoldEveryPathOfTheJob) {
  Agent a = Register("a", 2), b = Register("b", 2, {"/models"});
  v1::JobSpec both = testing::MinimalJobSpec();  // dataset under /data
  both.mutable_model()->mutable_torchscript()->set_path("/models/m.pt");
  auto nowhere = jobs_->CreateJob(tenant_, both, "");  // each path is served, not both at once
  ASSERT_TRUE(nowhere.ok()) << nowhere.status();
  v1::Job data = Submit(2);
  Pass();
  EXPECT_EQ(Get(*nowhere).state(), v1::Job::PENDING);
  EXPECT_THAT(Get(*nowhere).state_reason(), HasSubstr("data roots"));
  EXPECT_EQ(Get(data).state(), v1::Job::SCHEDULED);
  EXPECT_EQ(Beat(a, {}).size(), 2u);
  EXPECT_TRUE(Beat(b, {}).empty()) << "b's roots do not hold /data";
}

// FP16 trains on CUDA GPUs whatever the backend. With backend AUTO, a pass's view of the queue
// once left out the spec's precision: it judged the job placeable on a CPU node (the placement
// under the lock then refused it) and took that node's slot from every job behind it, so a
// job that fits waited for as long as the FP16 job did.
TEST_F(SchedulerTest, Fp16WithBackendAutoWaitsForACudaNodeAndTakesNoCpuSlot) {
  Register("cpu", 1);
  v1::JobSpec spec = testing::MinimalJobSpec();
  spec.set_precision(v1::JobSpec::FP16);
  spec.mutable_distributed()->set_backend(v1::DistributedSpec::AUTO);
  spec.mutable_distributed()->set_world_size(1);
  auto fp16 = jobs_->CreateJob(tenant_, spec, "");
  ASSERT_TRUE(fp16.ok()) << fp16.status();
  const v1::Job behind = Submit(1);  // FP32: fits the CPU node
  Pass();
  EXPECT_EQ(Get(*fp16).state(), v1::Job::PENDING);
  EXPECT_EQ(Get(*fp16).state_reason(),
            "backend AUTO with precision FP16 runs on CUDA nodes; no such node is registered");
  EXPECT_EQ(Get(behind).state(), v1::Job::SCHEDULED) << Get(behind).state_reason();
  Pass();  // and again, from the cached view of the queue
  EXPECT_EQ(Get(*fp16).state(), v1::Job::PENDING);

  Agent gpu = Register("gpu", 1, {"/data"}, {}, v1::Node::CUDA);
  Pass();
  EXPECT_EQ(Get(*fp16).state(), v1::Job::SCHEDULED) << Get(*fp16).state_reason();
  EXPECT_THAT(Get(*fp16).state_reason(), HasSubstr("nodes/gpu (rank 0), CUDA"));
  const std::vector<v1::RankAssignment> desired = Beat(gpu, {});
  ASSERT_EQ(desired.size(), 1u);
  EXPECT_EQ(desired[0].job(), fp16->name());
}

// What the trainer would refuse for the spec alone is refused before the job is queued
// (tests/unit/trainer/spec_rules_test.cc lists every such refusal).
TEST_F(SchedulerTest, CreateJobRefusesFp16CombinationsTheTrainerWouldNamingTheField) {
  Register("gpu", 1, {"/data"}, {}, v1::Node::CUDA);
  const auto refusal = [&](const std::function<void(v1::JobSpec&)>& change) {
    v1::JobSpec spec = testing::MinimalJobSpec();
    spec.set_precision(v1::JobSpec::FP16);
    change(spec);
    const absl::StatusOr<v1::Job> job = jobs_->CreateJob(tenant_, spec, "");
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << job.status();
    return std::string(job.status().message());
  };
  EXPECT_THAT(
      refusal([](v1::JobSpec& s) { s.mutable_distributed()->mutable_local_sgd()->set_period(2); }),
      HasSubstr("distributed.localSgd: cannot be combined with precision FP16"));
  EXPECT_THAT(refusal([](v1::JobSpec& s) {
                s.mutable_distributed()->set_comm_hook(v1::DistributedSpec::POWER_SGD);
              }),
              HasSubstr("distributed.commHook: POWER_SGD cannot be combined with precision FP16"));
  EXPECT_THAT(refusal([](v1::JobSpec& s) {
                s.mutable_distributed()->set_backend(v1::DistributedSpec::GLOO);
              }),
              HasSubstr("precision: FP16 (autocast to float16 with dynamic loss scaling) needs a "
                        "CUDA GPU; backend GLOO trains on the CPU"));
  auto listed = jobs_->ListJobs(tenant_, v1::ListJobsRequest());
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->jobs_size(), 0) << "nothing was queued";
}

TEST_F(SchedulerTest, CreateJobRefusesAPathNoRegisteredNodeServesNamingTheField) {
  Register("a", 1);
  v1::JobSpec spec = testing::MinimalJobSpec();
  spec.mutable_dataset()->mutable_csv()->set_path("/etc/shadow");
  auto refused = jobs_->CreateJob(tenant_, spec, "");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("dataset.csv.path"));
  EXPECT_THAT(refused.status().message(), HasSubstr("(/data)"));
  spec.mutable_dataset()->mutable_csv()->set_path("/data/../etc/shadow");
  EXPECT_THAT(jobs_->CreateJob(tenant_, spec, "").status().message(), HasSubstr("'..'"));
}

TEST_F(SchedulerTest, WithNoNodeRegisteredPathsAreCheckedOnlyForForm) {
  v1::JobSpec spec = testing::MinimalJobSpec();
  spec.mutable_dataset()->mutable_csv()->set_path("/anywhere/x.csv");
  EXPECT_TRUE(jobs_->CreateJob(tenant_, spec, "").ok());
  spec.mutable_dataset()->mutable_csv()->set_path("relative.csv");
  EXPECT_EQ(jobs_->CreateJob(tenant_, spec, "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, GangPlacesAcrossNodesRunsAndSucceeds) {
  Agent a = Register("a", 2), b = Register("b", 2);
  v1::Job job = Submit(4);
  Pass();
  EXPECT_EQ(Get(job).state(), v1::Job::SCHEDULED);
  EXPECT_EQ(Get(job).attempt(), 1);

  auto on_a = Beat(a, {}), on_b = Beat(b, {});
  ASSERT_EQ(on_a.size(), 2u);
  ASSERT_EQ(on_b.size(), 2u);
  std::set<int> ranks;
  for (const auto& r : on_a) ranks.insert(r.rank());
  for (const auto& r : on_b) ranks.insert(r.rank());
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(on_a[0].world_size(), 4);
  EXPECT_EQ(on_a[0].local_world_size(), 2);
  EXPECT_EQ(on_a[0].store_address(), "127.0.0.1:7070");
  EXPECT_EQ(on_a[0].rendezvous_prefix(), JobId(job.name()).insert(0, "jobs/") + "/attempts/1/");

  // One node's ranks started is not enough for RUNNING.
  Beat(a, All(on_a, v1::RankStatus::STARTING));
  Pass();
  EXPECT_EQ(Get(job).state(), v1::Job::SCHEDULED);
  Beat(b, All(on_b, v1::RankStatus::RUNNING));
  Pass();
  EXPECT_EQ(Get(job).state(), v1::Job::RUNNING);

  EXPECT_EQ(Beat(a, All(on_a, v1::RankStatus::SUCCEEDED)).size(), 0u);
  Pass();
  EXPECT_EQ(Get(job).state(), v1::Job::RUNNING);  // b's ranks still run
  Beat(b, All(on_b, v1::RankStatus::SUCCEEDED));
  Pass();
  EXPECT_EQ(Get(job).state(), v1::Job::SUCCEEDED);
  EXPECT_EQ(nodes_->GetNode("nodes/a")->slots_in_use(), 0);
}

TEST_F(SchedulerTest, KilledRankStopsTheOthersAndTheNextAttemptWaitsForThem) {
  Agent a = Register("a", 2), b = Register("b", 2);
  v1::Job job = Submit(4);
  Pass();
  auto on_a = Beat(a, {}), on_b = Beat(b, {});
  Beat(a, All(on_a, v1::RankStatus::RUNNING));
  Beat(b, All(on_b, v1::RankStatus::RUNNING));
  Pass();
  ASSERT_EQ(Get(job).state(), v1::Job::RUNNING);

  // A SIGKILLed rank on b.
  const v1::RankAssignment killed = on_b[1];
  auto desired_b = Beat(
      b, {Status(on_b[0], v1::RankStatus::RUNNING), Status(killed, v1::RankStatus::FAILED, 0, 9)});
  Pass();
  v1::Job restarting = Get(job);
  EXPECT_EQ(restarting.state(), v1::Job::RESTARTING);
  EXPECT_EQ(restarting.job_restarts(), 1);
  auto events = jobs_->ListJobEvents(tenant_, testing::EventsOf(job.name()));
  bool named = false;
  for (const auto& e : events->events()) {
    if (e.type() == v1::JobEvent::RANK_FAILED) {
      named = true;
      EXPECT_EQ(e.rank(), killed.rank());
      EXPECT_EQ(e.node(), "nodes/b");
      EXPECT_EQ(e.signal(), 9);
      EXPECT_EQ(e.failure_kind(), v1::JobEvent::JOB);
      EXPECT_THAT(e.message(), HasSubstr("killed by signal 9"));
    }
  }
  EXPECT_TRUE(named);

  // The survivors are no longer desired; until they are stopped, no new attempt.
  EXPECT_TRUE(Beat(a, All(on_a, v1::RankStatus::RUNNING)).empty());
  Pass();
  EXPECT_EQ(Get(job).state(), v1::Job::RESTARTING);
  EXPECT_THAT(Get(job).state_reason(), HasSubstr("to stop"));

  Beat(a, All(on_a, v1::RankStatus::STOPPED));
  Beat(b, {Status(on_b[0], v1::RankStatus::STOPPED)});
  Pass();
  v1::Job second = Get(job);
  EXPECT_EQ(second.state(), v1::Job::SCHEDULED);
  EXPECT_EQ(second.attempt(), 2);
  auto again = Beat(a, {});
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].attempt(), 2);
  EXPECT_THAT(again[0].rendezvous_prefix(), HasSubstr("/attempts/2/"));
}

TEST_F(SchedulerTest, UserErrorFailsAtOnceWithoutSpendingRestarts) {
  Agent a = Register("a", 2);
  v1::Job job = Submit(2, /*job_restarts=*/5);
  Pass();
  auto on_a = Beat(a, {});
  Beat(a, {Status(on_a[0], v1::RankStatus::FAILED, 10), Status(on_a[1], v1::RankStatus::RUNNING)});
  Pass();
  v1::Job failed = Get(job);
  EXPECT_EQ(failed.state(), v1::Job::FAILED);
  EXPECT_EQ(failed.job_restarts(), 0);
  EXPECT_THAT(failed.state_reason(), HasSubstr("USER"));
}

TEST_F(SchedulerTest, JobsThatDoNotFitWaitWithAReasonAndRunAfter) {
  Agent a = Register("a", 2), b = Register("b", 2);
  v1::Job first = Submit(3), second = Submit(3), huge = Submit(8);
  Pass();
  EXPECT_EQ(Get(first).state(), v1::Job::SCHEDULED);
  EXPECT_EQ(Get(second).state(), v1::Job::PENDING);
  EXPECT_THAT(Get(second).state_reason(), HasSubstr("needs 3 slots"));
  EXPECT_THAT(Get(huge).state_reason(), HasSubstr("needs 8 slots"));

  // The first finishes; its slots go to the second; the huge one waits for a third node.
  auto on_a = Beat(a, {}), on_b = Beat(b, {});
  Beat(a, All(on_a, v1::RankStatus::RUNNING));
  Beat(b, All(on_b, v1::RankStatus::RUNNING));
  Pass();
  Beat(a, All(on_a, v1::RankStatus::SUCCEEDED));
  Beat(b, All(on_b, v1::RankStatus::SUCCEEDED));
  Pass();
  EXPECT_EQ(Get(first).state(), v1::Job::SUCCEEDED);
  EXPECT_EQ(Get(second).state(), v1::Job::SCHEDULED);
  EXPECT_EQ(Get(huge).state(), v1::Job::PENDING);

  // The second finishes too and a third node joins: now all 8 ranks fit, across 3 nodes.
  on_a = Beat(a, {}), on_b = Beat(b, {});
  Beat(a, All(on_a, v1::RankStatus::RUNNING));
  Beat(b, All(on_b, v1::RankStatus::RUNNING));
  Pass();
  Beat(a, All(on_a, v1::RankStatus::SUCCEEDED));
  Beat(b, All(on_b, v1::RankStatus::SUCCEEDED));
  Pass();
  EXPECT_EQ(Get(second).state(), v1::Job::SUCCEEDED);
  EXPECT_EQ(Get(huge).state(), v1::Job::PENDING);
  EXPECT_THAT(Get(huge).state_reason(), HasSubstr("needs 8 slots"));
  Agent c = Register("c", 4);
  Pass();
  EXPECT_EQ(Get(huge).state(), v1::Job::SCHEDULED);
  EXPECT_EQ(Beat(c, {}).size(), 4u);
  EXPECT_EQ(Beat(a, {}).size() + Beat(b, {}).size(), 4u);
}

TEST_F(SchedulerTest, AnAgentRestartFailsItsRanksAsInfrastructure) {
  Agent a = Register("a", 2);
  v1::Job job = Submit(2);
  Pass();
  auto on_a = Beat(a, {});
  Beat(a, All(on_a, v1::RankStatus::RUNNING));
  Pass();
  ASSERT_EQ(Get(job).state(), v1::Job::RUNNING);
  Agent old = a;
  a = Register("a", 2);  // new session
  v1::HeartbeatRequest stale;
  stale.set_node("nodes/a");
  stale.set_session_id(old.session);
  stale.set_seq(old.seq + 1);
  EXPECT_EQ(nodes_->Heartbeat(stale).status().code(), absl::StatusCode::kFailedPrecondition);
  v1::Job after = Get(job);
  // No infrastructure budget in this spec: the job fails, and says why.
  EXPECT_EQ(after.state(), v1::Job::FAILED);
  EXPECT_THAT(after.state_reason(), HasSubstr("restarted"));
}

TEST_F(SchedulerTest, CancelledJobsRanksAreNotDesiredAndFreeTheirSlots) {
  Agent a = Register("a", 2);
  v1::Job job = Submit(2);
  Pass();
  auto on_a = Beat(a, {});
  ASSERT_EQ(on_a.size(), 2u);
  Beat(a, All(on_a, v1::RankStatus::RUNNING));
  ASSERT_TRUE(jobs_->CancelJob(tenant_, job.name()).ok());
  EXPECT_TRUE(Beat(a, All(on_a, v1::RankStatus::RUNNING)).empty());
  EXPECT_EQ(nodes_->GetNode("nodes/a")->slots_in_use(), 2);  // still running
  Beat(a, All(on_a, v1::RankStatus::STOPPED));
  EXPECT_EQ(nodes_->GetNode("nodes/a")->slots_in_use(), 0);
}

TEST_F(SchedulerTest, StaleHeartbeatIsAnsweredButNotRecorded) {
  Agent a = Register("a", 2);
  v1::Job job = Submit(2);
  Pass();
  auto on_a = Beat(a, {});
  Beat(a, All(on_a, v1::RankStatus::RUNNING));
  // A late duplicate of an older heartbeat claiming a failure changes nothing.
  v1::HeartbeatRequest late;
  late.set_node("nodes/a");
  late.set_session_id(a.session);
  late.set_seq(1);
  *late.add_ranks() = Status(on_a[0], v1::RankStatus::FAILED, 11);
  auto response = nodes_->Heartbeat(late);
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response->desired_ranks_size(), 2);
  Pass();
  EXPECT_EQ(Get(job).state(), v1::Job::RUNNING);
}

TEST_F(SchedulerTest, NodeSelectorWithoutMatchingNodeSaysSo) {
  Register("a", 4);
  v1::JobSpec spec = testing::MinimalJobSpec();
  (*spec.mutable_node_selector())["gpu"] = "h200";
  auto job = jobs_->CreateJob(tenant_, spec, "");
  ASSERT_TRUE(job.ok());
  Pass();
  EXPECT_EQ(Get(*job).state(), v1::Job::PENDING);
  EXPECT_EQ(Get(*job).state_reason(), "no node with label gpu=h200");
}

// The labels come from the nodes table's jsonb (a pass once read them from a destroyed
// temporary and crashed as soon as a node had any).
TEST_F(SchedulerTest, NodeSelectorPlacesOnTheLabelledNode) {
  Register("a", 4);
  Register("b", 1, {"/data"}, {{"gpu", "h200"}, {"zone", "eu-west-1a"}});
  v1::JobSpec spec = testing::MinimalJobSpec();
  (*spec.mutable_node_selector())["gpu"] = "h200";
  auto job = jobs_->CreateJob(tenant_, spec, "");
  ASSERT_TRUE(job.ok());
  Pass();
  EXPECT_EQ(Get(*job).state(), v1::Job::SCHEDULED) << Get(*job).state_reason();
  EXPECT_THAT(Get(*job).state_reason(), ::testing::HasSubstr("nodes/b"));
}

// --- Control plane under faults (issue 23) ---------------------------------------------------

TEST(ControlPlaneRules, CancelIsCancellingWhileRanksLive) {
  EXPECT_EQ(StateAfterCancel(v1::Job::PENDING, 0), v1::Job::CANCELLED);
  EXPECT_EQ(StateAfterCancel(v1::Job::RESTARTING, 0), v1::Job::CANCELLED);
  EXPECT_EQ(StateAfterCancel(v1::Job::RUNNING, 2), v1::Job::CANCELLING);
  EXPECT_EQ(StateAfterCancel(v1::Job::SCHEDULED, 1), v1::Job::CANCELLING);
  EXPECT_EQ(StateAfterCancel(v1::Job::CANCELLING, 1), v1::Job::CANCELLING);
  EXPECT_EQ(StateAfterCancel(v1::Job::SUCCEEDED, 0), v1::Job::SUCCEEDED);
  EXPECT_FALSE(IsTerminal(v1::Job::CANCELLING));
  EXPECT_TRUE(IsAllowedTransition(v1::Job::CANCELLING, v1::Job::CANCELLED));
  EXPECT_FALSE(IsAllowedTransition(v1::Job::CANCELLING, v1::Job::RUNNING));
}

// The hypothesis: Heartbeat read the desired set and then, in a second statement under
// READ COMMITTED, the node's live ranks; a placement committed between the two was seen live
// but not desired, and marked STOPPED, failing the new attempt ("stopped by its agent"). The
// seam commits a placement exactly there.
TEST_F(SchedulerTest, APlacementCommittedDuringAHeartbeatIsNotStopped) {
  Agent a = Register("a", 2);
  v1::Job job = Submit(2);
  bool placed = false;
  NodeManagerOptions options;
  options.after_desired_read_for_test = [&] {
    if (placed) return;
    placed = true;
    ASSERT_TRUE(scheduler_->RunOnce().ok());  // other connections; commits the placement
  };
  NodeManager racing(pool_.get(), options);
  racing.set_store_address("127.0.0.1:7070");
  v1::HeartbeatRequest request;
  request.set_node("nodes/a");
  request.set_session_id(a.session);
  request.set_seq(++a.seq);
  ASSERT_TRUE(racing.Heartbeat(request).ok());
  ASSERT_TRUE(placed);
  ASSERT_EQ(Get(job).state(), v1::Job::SCHEDULED);

  auto states = pool_->Exec("SELECT state FROM rank_assignments WHERE job_id = $1::uuid",
                            {JobId(job.name())});
  ASSERT_TRUE(states.ok()) << states.status();
  ASSERT_EQ(states->rows(), 2);
  for (const db::Row& row : *states) EXPECT_EQ(row.Get<std::string>("state"), "ASSIGNED");
  Pass();
  EXPECT_EQ(Get(job).state(), v1::Job::SCHEDULED) << Get(job).state_reason();
  EXPECT_EQ(Beat(a, {}).size(), 2u);  // the next heartbeat hands the ranks out
}

// Protocol steps 2-4 of scheduler.h: a node silent only because the api was away keeps its
// running job; one still silent after the grace is lost, and its job's reason says so.
TEST_F(SchedulerTest, AStartingApiGivesSilentNodesAGraceThenLosesThemWithTheReason) {
  Agent a = Register("a", 2);
  v1::Job job = Submit(2);
  Pass();
  auto on_a = Beat(a, {});
  Beat(a, All(on_a, v1::RankStatus::RUNNING));
  Pass();
  ASSERT_EQ(Get(job).state(), v1::Job::RUNNING);
  auto age = [&] {
    ASSERT_TRUE(
        pool_->Exec("UPDATE nodes SET last_heartbeat_time = now() - interval '1 minute'").ok());
  };

  age();  // the api was down for a minute and has just started again
  SchedulerOptions restarted;
  restarted.startup_grace = absl::Hours(1);
  ASSERT_TRUE(Scheduler(pool_.get(), restarted).RunOnce().ok());
  EXPECT_EQ(nodes_->GetNode("nodes/a")->state(), v1::Node::READY);
  EXPECT_EQ(Get(job).state(), v1::Job::RUNNING);
  // The agent gets through with the session it had: its ranks are adopted, not restarted.
  EXPECT_EQ(Beat(a, All(on_a, v1::RankStatus::RUNNING)).size(), 2u);
  Pass();
  EXPECT_EQ(Get(job).state(), v1::Job::RUNNING);
  EXPECT_EQ(Get(job).attempt(), 1);

  age();  // silent past the grace: lost
  SchedulerOptions up;
  up.startup_grace = absl::ZeroDuration();
  ASSERT_TRUE(Scheduler(pool_.get(), up).RunOnce().ok());
  EXPECT_EQ(nodes_->GetNode("nodes/a")->state(), v1::Node::LOST);
  EXPECT_NE(Get(job).state(), v1::Job::RUNNING);
  EXPECT_THAT(Get(job).state_reason(), HasSubstr("nodes/a lost: no heartbeat for 60 s"));
}

// The grace excuses only silence that began before the api started: a node that has
// heartbeated to this api and then goes silent is lost after the lease, grace or not.
TEST_F(SchedulerTest, ANodeSilentSinceItSpokeToThisApiGetsNoStartupGrace) {
  Agent a = Register("a", 2);
  SchedulerOptions options;
  options.node_lease = absl::Milliseconds(300);
  options.startup_grace = absl::Hours(1);
  Scheduler fresh(pool_.get(), options);
  ASSERT_TRUE(
      pool_->Exec("UPDATE nodes SET last_heartbeat_time = now() - interval '1 minute'").ok());
  ASSERT_TRUE(fresh.RunOnce().ok());
  EXPECT_EQ(nodes_->GetNode("nodes/a")->state(), v1::Node::READY);  // silent since before
  Beat(a, {});                                                      // heard by this api
  absl::SleepFor(absl::Milliseconds(500));
  ASSERT_TRUE(fresh.RunOnce().ok());
  EXPECT_EQ(nodes_->GetNode("nodes/a")->state(), v1::Node::LOST);
}

TEST_F(SchedulerTest, CancelIsCancellingUntilEveryRankIsReportedGone) {
  Agent a = Register("a", 2);
  v1::Job job = Submit(2);
  Pass();
  auto on_a = Beat(a, {});
  Beat(a, All(on_a, v1::RankStatus::RUNNING));
  Pass();
  ASSERT_EQ(Get(job).state(), v1::Job::RUNNING);

  auto cancelled = jobs_->CancelJob(tenant_, job.name(), "enough");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::Job::CANCELLING);
  EXPECT_THAT(cancelled->state_reason(), HasSubstr("stopping 2 ranks"));
  EXPECT_EQ(jobs_->CancelJob(tenant_, job.name())->state(), v1::Job::CANCELLING);  // idempotent

  EXPECT_TRUE(Beat(a, All(on_a, v1::RankStatus::RUNNING)).empty());
  Pass();
  EXPECT_EQ(Get(job).state(), v1::Job::CANCELLING);
  Beat(a, {Status(on_a[0], v1::RankStatus::STOPPED), Status(on_a[1], v1::RankStatus::RUNNING)});
  Pass();
  EXPECT_EQ(Get(job).state(), v1::Job::CANCELLING);  // one process is still there
  Beat(a, All(on_a, v1::RankStatus::STOPPED));
  Pass();
  const v1::Job done = Get(job);
  EXPECT_EQ(done.state(), v1::Job::CANCELLED);
  EXPECT_THAT(done.state_reason(), HasSubstr("enough; every rank has stopped"));

  auto events = jobs_->ListJobEvents(tenant_, testing::EventsOf(job.name()));
  ASSERT_TRUE(events.ok());
  std::vector<std::string> tail;
  for (const auto& e : events->events()) {
    tail.push_back(e.type() == v1::JobEvent::STATE_CHANGED
                       ? v1::Job::State_Name(e.from_state()) + "->" +
                             v1::Job::State_Name(e.to_state())
                       : v1::JobEvent::Type_Name(e.type()));
  }
  EXPECT_THAT(tail, ::testing::ElementsAre("STATE_UNSPECIFIED->PENDING", "PENDING->SCHEDULED",
                                           "SCHEDULED->RUNNING", "CANCEL_REQUESTED",
                                           "RUNNING->CANCELLING", "CANCELLING->CANCELLED"));

  // A job without ranks is CANCELLED at once.
  v1::Job waiting = Submit(8);
  EXPECT_EQ(jobs_->CancelJob(tenant_, waiting.name())->state(), v1::Job::CANCELLED);
}

// jobs.proto: the spec is kept as submitted; every reader applies the defaults itself.
TEST_F(SchedulerTest, TheStoredSpecIsAsSubmittedAndPlacedWithItsDefaults) {
  Agent a = Register("a", 2);
  v1::JobSpec spec = testing::MinimalJobSpec();
  spec.clear_distributed();  // world size 1 by default
  spec.clear_checkpoint();
  spec.clear_hang_timeout_seconds();
  auto job = jobs_->CreateJob(tenant_, spec, "");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(Get(*job).spec(), spec))
      << Get(*job).spec().DebugString();
  Pass();
  EXPECT_EQ(Get(*job).state(), v1::Job::SCHEDULED) << Get(*job).state_reason();
  const auto desired = Beat(a, {});
  ASSERT_EQ(desired.size(), 1u);
  EXPECT_EQ(desired[0].world_size(), 1);
  EXPECT_FALSE(desired[0].spec().has_distributed());  // the trainer applies WithDefaults
}

}  // namespace
}  // namespace gradhub::api
