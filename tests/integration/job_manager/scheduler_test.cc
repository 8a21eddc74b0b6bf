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
    // As gradhub-api wires them (main.cc): the light pass judges the jobs it was told of, stored
    // without the reason the scheduler gives new jobs.
    jobs_->set_on_created([this](const v1::Job& job, const v1::JobSpec& spec) {
      scheduler_->JobSubmitted(job, spec);
    });
    jobs_->set_initial_reason([this](const v1::JobSpec& spec, const std::string& tenant) {
      return scheduler_->ReasonForNewJob(spec, tenant);
    });
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
    v1::Node node;
    node.set_name("nodes/" + name);
    node.set_slots(slots);
    node.set_kind(kind);
    for (const auto& [key, value] : labels) (*node.mutable_labels())[key] = value;
    // By default /data, where MinimalJobSpec's dataset is.
    for (const std::string& root : data_roots) node.add_data_roots(root);
    return Register(node);
  }

  Agent Register(const v1::Node& node) {
    v1::RegisterNodeRequest request;
    *request.mutable_node() = node;
    auto response = nodes_->RegisterNode(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return {NodeId(node.name()), response.ok() ? response->session_id() : ""};
  }

  // A tenant besides the fixture's: its id.
  int64_t NewTenant(const std::string& name) {
    auto tenant = pool_->Exec("INSERT INTO tenants (name) VALUES ($1) RETURNING id", {name});
    EXPECT_TRUE(tenant.ok()) << tenant.status();
    return tenant.ok() ? tenant->row(0).Get<int64_t>("id") : 0;
  }

  // A job of `tenant` (MinimalJobSpec with `world_size` ranks, changed by `change`).
  v1::Job SubmitAs(
      int64_t tenant, int world_size,
      const std::function<void(v1::JobSpec&)>& change = [](v1::JobSpec&) {}) {
    v1::JobSpec spec = testing::MinimalJobSpec();
    spec.mutable_distributed()->set_world_size(world_size);
    change(spec);
    auto job = jobs_->CreateJob(tenant, spec, "");
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  // Another scheduler in place of the fixture's, its backfill window `window` (the fixture's
  // is long enough never to end in a test).
  void UseBackfillWindow(absl::Duration window) {
    SchedulerOptions options;
    options.backfill_window = window;
    options.peer_failure_grace = absl::Seconds(600);
    scheduler_ = std::make_unique<Scheduler>(pool_.get(), options);
  }

  // One heartbeat reporting `ranks`; returns the desired set.
  std::vector<v1::RankAssignment> Beat(Agent& agent, const std::vector<v1::RankStatus>& ranks) {
    const v1::HeartbeatResponse response = BeatAnswer(agent, ranks);
    return {response.desired_ranks().begin(), response.desired_ranks().end()};
  }

  // The same, returning the whole answer.
  v1::HeartbeatResponse BeatAnswer(Agent& agent, const std::vector<v1::RankStatus>& ranks) {
    v1::HeartbeatRequest request;
    request.set_node("nodes/" + agent.name);
    request.set_session_id(agent.session);
    request.set_seq(++agent.seq);
    for (const auto& rank : ranks) *request.add_ranks() = rank;
    auto response = nodes_->Heartbeat(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : v1::HeartbeatResponse();
  }

  // The answer's discarded_attempts as "jobs/x/1" strings.
  static std::vector<std::string> Discarded(const v1::HeartbeatResponse& response) {
    std::vector<std::string> out;
    for (const v1::AttemptRef& ref : response.discarded_attempts()) {
      out.push_back(ref.job() + "/" + std::to_string(ref.attempt()));
    }
    return out;
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

// A rank's message is its last stderr lines, a tenant's bytes. A NUL in them must neither fail
// the node's heartbeat (the database refuses a parameter holding one) nor cut the message.
TEST_F(SchedulerTest, ARankMessageHoldingANulNeitherFailsTheHeartbeatNorIsCut) {
  Agent a = Register("a", 1);
  v1::Job job = Submit(1, 0);
  Pass();
  auto on_a = Beat(a, {});
  ASSERT_EQ(on_a.size(), 1u);
  v1::RankStatus failed = Status(on_a[0], v1::RankStatus::FAILED, 3);
  failed.set_message(std::string("Trace\0back: boom", 16));
  Beat(a, {failed});
  Pass();
  auto events = jobs_->ListJobEvents(tenant_, testing::EventsOf(job.name()));
  ASSERT_TRUE(events.ok()) << events.status();
  bool found = false;
  for (const auto& e : events->events()) {
    if (e.type() != v1::JobEvent::RANK_FAILED) continue;
    found = true;
    EXPECT_THAT(e.message(), HasSubstr("Traceback: boom"));
  }
  EXPECT_TRUE(found);
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

// Heartbeat step 4a (nodes.proto): a killed rank's survivors are named in discarded_attempts
// (their agent SIGKILLs them at once) until they are gone; a cancelled job's ranks never are.
TEST_F(SchedulerTest, AKilledRanksSurvivorsAreDiscardedACancelledJobsAreNot) {
  Agent a = Register("a", 2);
  v1::Job job = Submit(2);
  Pass();
  auto on_a = Beat(a, {});
  ASSERT_EQ(on_a.size(), 2u);
  EXPECT_TRUE(Discarded(BeatAnswer(a, All(on_a, v1::RankStatus::RUNNING))).empty());
  Pass();
  ASSERT_EQ(Get(job).state(), v1::Job::RUNNING);

  Beat(a,
       {Status(on_a[0], v1::RankStatus::RUNNING), Status(on_a[1], v1::RankStatus::FAILED, 0, 9)});
  Pass();
  ASSERT_EQ(Get(job).state(), v1::Job::RESTARTING);
  const v1::HeartbeatResponse survivors = BeatAnswer(a, {Status(on_a[0], v1::RankStatus::RUNNING)});
  EXPECT_EQ(survivors.desired_ranks_size(), 0);
  EXPECT_EQ(Discarded(survivors), std::vector<std::string>{job.name() + "/1"});
  // Gone: nothing left to discard, and the next attempt is placed.
  EXPECT_TRUE(Discarded(BeatAnswer(a, {Status(on_a[0], v1::RankStatus::STOPPED)})).empty());
  Pass();
  ASSERT_EQ(Get(job).attempt(), 2);

  auto second = Beat(a, {});
  ASSERT_EQ(second.size(), 2u);
  Beat(a, All(second, v1::RankStatus::RUNNING));
  ASSERT_TRUE(jobs_->CancelJob(tenant_, job.name()).ok());
  const v1::HeartbeatResponse cancelled = BeatAnswer(a, All(second, v1::RankStatus::RUNNING));
  EXPECT_EQ(cancelled.desired_ranks_size(), 0);
  EXPECT_TRUE(Discarded(cancelled).empty()) << "a cancel keeps SIGTERM and the grace";
}

// A drained node's attempt fails too, but its ranks keep the grace: rank 0 saves on SIGTERM.
TEST_F(SchedulerTest, ADrainedNodesRanksAreNotDiscarded) {
  Agent a = Register("a", 2);
  Register("b", 2);
  v1::Job job = Submit(2);
  Pass();
  auto on_a = Beat(a, {});
  ASSERT_EQ(on_a.size(), 2u);
  Beat(a, All(on_a, v1::RankStatus::RUNNING));
  Pass();
  ASSERT_TRUE(nodes_->DrainNode("nodes/a").ok());
  Pass();
  // The drain failed the attempt (FAILED here: the job has no INFRASTRUCTURE restarts).
  ASSERT_THAT(Get(job).state_reason(), HasSubstr("nodes/a is being drained"));
  const v1::HeartbeatResponse drained = BeatAnswer(a, All(on_a, v1::RankStatus::RUNNING));
  EXPECT_EQ(drained.desired_ranks_size(), 0);
  EXPECT_TRUE(Discarded(drained).empty());
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

// Leadership (leader_lease.h): a replica that does not lead runs no pass; once it leads, it
// does.
TEST_F(SchedulerTest, OnlyTheLeadingReplicasPassesAct) {
  Register("a", 2);
  const v1::Job job = Submit(2);
  LeaderLease other(pool_.get(), {.holder = "other", .lease = absl::Seconds(30)});
  LeaderLease mine(pool_.get(), {.holder = "mine", .lease = absl::Seconds(30)});
  ASSERT_TRUE(other.Tick().ok());
  ASSERT_TRUE(mine.Tick().ok());
  SchedulerOptions options;
  options.leader = &mine;
  Scheduler standby(pool_.get(), options);
  ASSERT_TRUE(standby.RunOnce().ok());
  EXPECT_EQ(Get(job).state(), v1::Job::PENDING) << "a standby placed a job";
  other.Stop();  // releases the term
  ASSERT_TRUE(mine.Tick().ok());
  ASSERT_TRUE(mine.Current().has_value());
  ASSERT_TRUE(standby.RunOnce().ok());
  EXPECT_EQ(Get(job).state(), v1::Job::SCHEDULED);
}

// The fence's row lock takes a transaction id, which makes a transaction a durable commit (a WAL
// flush). A pass with nothing to write -- a job running on, one waiting for a full cluster,
// every node heartbeating -- takes none; once a rank's report calls for a write, the leader's
// next pass makes it. Counted by transaction ids, not by the WAL position, which the server's
// own background records (a standby snapshot every 15 s) move at any time.
TEST_F(SchedulerTest, ALeadersPassWithNothingToDoCommitsNothingDurable) {
  Agent a = Register("a", 2);
  const v1::Job running = Submit(2), waiting = Submit(1);
  LeaderLease lease(pool_.get(), {.holder = "leader", .lease = absl::Seconds(30)});
  ASSERT_TRUE(lease.Tick().ok());
  SchedulerOptions options;
  options.leader = &lease;
  Scheduler leader(pool_.get(), options);
  ASSERT_TRUE(leader.RunOnce().ok());
  auto on_a = Beat(a, {});
  Beat(a, All(on_a, v1::RankStatus::RUNNING));
  ASSERT_TRUE(leader.RunOnce().ok());
  ASSERT_EQ(Get(running).state(), v1::Job::RUNNING);
  ASSERT_EQ(Get(waiting).state(), v1::Job::PENDING);
  auto next_transaction_id = [&] {  // the first not yet assigned; reading it assigns none
    auto next = pool_->Exec("SELECT pg_snapshot_xmax(pg_current_snapshot())::text AS next");
    EXPECT_TRUE(next.ok()) << next.status();
    return next.ok() ? next->row(0).Get<std::string>("next") : "";
  };
  const std::string before = next_transaction_id();
  for (int pass = 0; pass < 3; ++pass) ASSERT_TRUE(leader.RunOnce().ok());
  EXPECT_EQ(next_transaction_id(), before) << "an idle pass took a transaction id";

  Beat(a, All(on_a, v1::RankStatus::SUCCEEDED));
  ASSERT_TRUE(leader.RunOnce().ok());
  EXPECT_EQ(Get(running).state(), v1::Job::SUCCEEDED);
}

// A new term, like a starting api, counts a node's silence only from its own start: the
// previous leader, or this replica before a pause, recorded nothing meanwhile.
TEST_F(SchedulerTest, ANewTermGivesSilentNodesTheStartupGrace) {
  Agent a = Register("a", 2);
  v1::Job job = Submit(2);
  Pass();
  auto on_a = Beat(a, {});
  Beat(a, All(on_a, v1::RankStatus::RUNNING));
  Pass();
  ASSERT_EQ(Get(job).state(), v1::Job::RUNNING);
  SchedulerOptions options;
  options.startup_grace = absl::Milliseconds(300);
  LeaderLease lease(pool_.get(), {.holder = "leader", .lease = absl::Milliseconds(600)});
  options.leader = &lease;
  Scheduler leader(pool_.get(), options);
  ASSERT_TRUE(lease.Tick().ok());  // term 1
  absl::SleepFor(absl::Milliseconds(400));
  ASSERT_TRUE(lease.Tick().ok());           // renewed: term 1, its grace over
  absl::SleepFor(absl::Milliseconds(800));  // paused: no heartbeat recorded, no renewal
  ASSERT_TRUE(
      pool_->Exec("UPDATE nodes SET last_heartbeat_time = now() - interval '1 minute'").ok());
  ASSERT_TRUE(leader.RunOnce().ok());  // woke: its term is over, it does nothing
  EXPECT_EQ(nodes_->GetNode("nodes/a")->state(), v1::Node::READY);
  ASSERT_TRUE(lease.Tick().ok());  // term 2 begins now
  ASSERT_EQ(lease.Current()->number, 2);
  ASSERT_TRUE(leader.RunOnce().ok());
  EXPECT_EQ(nodes_->GetNode("nodes/a")->state(), v1::Node::READY);
  EXPECT_EQ(Get(job).state(), v1::Job::RUNNING);
  // Still silent once term 2's grace is over: lost, as it would be in any term.
  absl::SleepFor(absl::Milliseconds(400));
  ASSERT_TRUE(lease.Tick().ok());
  ASSERT_TRUE(leader.RunOnce().ok());
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

// --- Tenants in one queue (issue 36) ---------------------------------------------------------

// A job no registered node could ever hold once held every job behind it, of every tenant,
// past the backfill window, and its reason named the other tenant's job.
TEST_F(SchedulerTest, AnInfeasibleJobOfOneTenantDoesNotHoldAnothersFeasibleJob) {
  UseBackfillWindow(absl::ZeroDuration());  // every job that does not fit is past its window
  const int64_t alpha = NewTenant("alpha"), beta = NewTenant("beta");
  Register("a", 2);
  const v1::Job huge = SubmitAs(alpha, 8);
  Pass();
  const v1::Job small = SubmitAs(beta, 1);
  Pass();
  EXPECT_EQ(jobs_->GetJob(beta, small.name())->state(), v1::Job::SCHEDULED);
  const v1::Job aside = *jobs_->GetJob(alpha, huge.name());
  EXPECT_EQ(aside.state(), v1::Job::PENDING);
  EXPECT_EQ(aside.state_reason(),
            "needs 8 slots; the registered nodes that could run it have 2 in all");

  // A node that makes it feasible is seen by the next pass.
  Register("big", 8);
  Pass();
  EXPECT_EQ(jobs_->GetJob(alpha, huge.name())->state(), v1::Job::SCHEDULED);
}

TEST_F(SchedulerTest, BehindAnotherTenantsBlockedJobTheReasonNamesNoJob) {
  UseBackfillWindow(absl::ZeroDuration());
  const int64_t alpha = NewTenant("alpha"), beta = NewTenant("beta");
  Register("a", 2);
  const v1::Job running = SubmitAs(beta, 1);
  Pass();
  ASSERT_EQ(jobs_->GetJob(beta, running.name())->state(), v1::Job::SCHEDULED);
  // alpha holds no slot and beta one: alpha's job comes first, does not fit, and (past its
  // window) keeps the slots that free up. beta's next job waits for them without learning
  // which job of which tenant holds it up.
  const v1::Job blocked = SubmitAs(alpha, 2);
  const v1::Job behind = SubmitAs(beta, 1);
  Pass();
  EXPECT_EQ(jobs_->GetJob(alpha, blocked.name())->state(), v1::Job::PENDING);
  const v1::Job waiting = *jobs_->GetJob(beta, behind.name());
  EXPECT_EQ(waiting.state(), v1::Job::PENDING);
  EXPECT_EQ(waiting.state_reason(),
            "waiting for 1 slots: those that free up are kept for a job ahead that has waited "
            "longer than the backfill window (0)");
  EXPECT_THAT(waiting.state_reason(), ::testing::Not(HasSubstr(JobId(blocked.name()))));
}

TEST_F(SchedulerTest, ATenantFloodingTheQueueDoesNotStarveAnother) {
  const int64_t alpha = NewTenant("alpha"), beta = NewTenant("beta");
  Agent a = Register("a", 2);
  std::vector<v1::Job> flood;
  for (int i = 0; i < 10; ++i) flood.push_back(SubmitAs(alpha, 1));
  Pass();
  const v1::Job late = SubmitAs(beta, 1);
  Pass();
  EXPECT_EQ(jobs_->GetJob(beta, late.name())->state(), v1::Job::PENDING);
  EXPECT_EQ(jobs_->GetJob(beta, late.name())->state_reason(),
            "needs 1 slots, no ready node has a free slot");

  // One of alpha's two running jobs ends: its slot goes to beta, which holds none, not to
  // alpha's third job, submitted long before.
  const std::vector<v1::RankAssignment> on_a = Beat(a, {});
  ASSERT_EQ(on_a.size(), 2u);
  Beat(a, {Status(on_a[0], v1::RankStatus::RUNNING), Status(on_a[1], v1::RankStatus::RUNNING)});
  Pass();
  Beat(a, {Status(on_a[0], v1::RankStatus::SUCCEEDED), Status(on_a[1], v1::RankStatus::RUNNING)});
  Pass();
  EXPECT_EQ(jobs_->GetJob(beta, late.name())->state(), v1::Job::SCHEDULED)
      << jobs_->GetJob(beta, late.name())->state_reason();
  int scheduled = 0;
  for (const v1::Job& job : flood) {
    scheduled += jobs_->GetJob(alpha, job.name())->state() == v1::Job::SCHEDULED;
  }
  EXPECT_EQ(scheduled, 0) << "alpha's jobs wait (one RUNNING, one SUCCEEDED)";
}

TEST_F(SchedulerTest, AFullClusterHasOnlyItsNewJobsJudgedUntilSomethingChanges) {
  Register("a", 1);
  const v1::Job first = Submit(1), second = Submit(1);
  Pass();
  ASSERT_EQ(Get(first).state(), v1::Job::SCHEDULED);
  const std::string no_slot = "needs 1 slots, no ready node has a free slot";
  ASSERT_EQ(Get(second).state_reason(), no_slot);
  // A reason the full pass would write again, were it to go over the queue.
  ASSERT_TRUE(pool_
                  ->Exec("UPDATE jobs SET state_reason = 'left by an earlier pass' WHERE id = $1",
                         {second.name().substr(std::string("jobs/").size())})
                  .ok());

  Pass();  // finds the cluster full: a light pass, after which new jobs are judged at once
  const v1::Job third = Submit(1);
  EXPECT_EQ(third.state_reason(), no_slot) << "stored with the job: CreateJob's answer says it";
  // Created through another replica, which had no verdict to give: stored without a reason,
  // the job reaches this scheduler as a signal (replica_signals.h).
  JobManager other_replica(pool_.get(), SpecLimits{.max_world_size = 64});
  v1::JobSpec spec = testing::MinimalJobSpec();
  spec.mutable_distributed()->set_world_size(1);
  const absl::StatusOr<v1::Job> fourth = other_replica.CreateJob(tenant_, spec, "");
  ASSERT_TRUE(fourth.ok()) << fourth.status();
  EXPECT_EQ(fourth->state_reason(), "");
  scheduler_->JobCreated(fourth->name());
  Pass();
  EXPECT_EQ(Get(*fourth).state_reason(), no_slot) << "the light pass judges the new job";
  EXPECT_EQ(Get(third).state_reason(), no_slot);
  EXPECT_EQ(Get(second).state_reason(), "left by an earlier pass") << "and only the new jobs";

  scheduler_->Nudge();  // a rank exited, a node came, a job was cancelled: the whole queue
  Pass();
  EXPECT_EQ(Get(second).state_reason(), no_slot);
  EXPECT_EQ(Get(first).state(), v1::Job::SCHEDULED);
}

TEST_F(SchedulerTest, BehindAQueueClosedByAnEarlierPassTheLightPassGivesItsReason) {
  UseBackfillWindow(absl::ZeroDuration());
  Register("a", 2);
  const v1::Job running = Submit(2), big = Submit(2);
  Pass();  // places the first; the second has waited past its (zero) window and closes the queue:
           // no node is free, and the next job is judged by the light pass
  ASSERT_EQ(Get(running).state(), v1::Job::SCHEDULED);
  ASSERT_EQ(Get(big).state(), v1::Job::PENDING);
  const v1::Job behind = Submit(1);
  Pass();
  EXPECT_EQ(Get(behind).state(), v1::Job::PENDING) << "the queue is closed behind " << big.name();
  const std::string light = Get(behind).state_reason();
  EXPECT_THAT(light, HasSubstr("waiting behind " + big.name()));
  scheduler_->Nudge();
  Pass();
  EXPECT_EQ(Get(behind).state_reason(), light) << "a full pass gives the same reason";
}

TEST_F(SchedulerTest, AJobAskingMoreMemoryThanAnySlotWaitsAsideNamingTheField) {
  UseBackfillWindow(absl::ZeroDuration());
  v1::Node node;
  node.set_name("nodes/a");
  node.set_slots(2);
  node.add_data_roots("/data");
  node.set_memory_per_slot_bytes(int64_t{1} << 30);
  Register(node);
  EXPECT_EQ(nodes_->GetNode("nodes/a")->memory_per_slot_bytes(), int64_t{1} << 30);
  const v1::Job greedy =
      SubmitAs(tenant_, 1, [](v1::JobSpec& spec) { spec.set_memory_per_rank_mib(2048); });
  const v1::Job modest =
      SubmitAs(tenant_, 1, [](v1::JobSpec& spec) { spec.set_memory_per_rank_mib(1024); });
  Pass();
  EXPECT_EQ(Get(greedy).state(), v1::Job::PENDING);
  EXPECT_THAT(Get(greedy).state_reason(), HasSubstr("memoryPerRankMib 2048"));
  EXPECT_EQ(Get(modest).state(), v1::Job::SCHEDULED) << Get(modest).state_reason();

  node.set_memory_per_slot_bytes(int64_t{4} << 30);  // the agent restarts with more
  Register(node);
  Pass();
  EXPECT_EQ(Get(greedy).state(), v1::Job::SCHEDULED) << Get(greedy).state_reason();
}

// A node with a root of tenant alpha's own, besides the shared /data.
v1::Node NodeWithTenantRoot(const std::string& name) {
  v1::Node node;
  node.set_name("nodes/" + name);
  node.set_slots(2);
  node.add_data_roots("/data");
  v1::TenantDataRoot* root = node.add_tenant_data_roots();
  root->set_tenant("tenants/alpha");
  root->set_path("/alpha");
  return node;
}

void UseAlphasRoot(v1::JobSpec& spec) {
  spec.mutable_dataset()->mutable_csv()->set_path("/alpha/x.csv");
}

TEST_F(SchedulerTest, CreateJobRefusesAPathUnderAnotherTenantsRoot) {
  const int64_t alpha = NewTenant("alpha"), beta = NewTenant("beta");
  Agent a = Register(NodeWithTenantRoot("a"));
  const v1::Node stored = *nodes_->GetNode("nodes/a");
  ASSERT_EQ(stored.tenant_data_roots_size(), 1);
  EXPECT_EQ(stored.tenant_data_roots(0).tenant(), "tenants/alpha");
  EXPECT_EQ(stored.tenant_data_roots(0).path(), "/alpha");
  v1::JobSpec spec = testing::MinimalJobSpec();
  UseAlphasRoot(spec);
  const absl::StatusOr<v1::Job> refused = jobs_->CreateJob(beta, spec, "");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("dataset.csv.path"));
  EXPECT_THAT(refused.status().message(), HasSubstr("may use (/data)"));

  const v1::Job own = SubmitAs(alpha, 1, UseAlphasRoot);
  Pass();
  EXPECT_EQ(jobs_->GetJob(alpha, own.name())->state(), v1::Job::SCHEDULED);
  const std::vector<v1::RankAssignment> desired = Beat(a, {});
  ASSERT_EQ(desired.size(), 1u);
  EXPECT_EQ(desired[0].tenant(), "tenants/alpha");
}

TEST_F(SchedulerTest, AJobNamingAnotherTenantsRootIsNeverPlaced) {
  const int64_t alpha = NewTenant("alpha"), beta = NewTenant("beta");
  // Created while no node is registered: only the paths' form is checked then.
  const v1::Job theirs = SubmitAs(beta, 1, UseAlphasRoot);
  const v1::Job own = SubmitAs(alpha, 1, UseAlphasRoot);
  Register(NodeWithTenantRoot("a"));
  Pass();
  const v1::Job waiting = *jobs_->GetJob(beta, theirs.name());
  EXPECT_EQ(waiting.state(), v1::Job::PENDING);
  EXPECT_THAT(waiting.state_reason(), HasSubstr("data roots"));
  EXPECT_EQ(jobs_->GetJob(alpha, own.name())->state(), v1::Job::SCHEDULED);
  Pass();
  EXPECT_EQ(jobs_->GetJob(beta, theirs.name())->state(), v1::Job::PENDING);
}

TEST_F(SchedulerTest, RegisterNodeRefusesMalformedTenantRootsAndMemory) {
  v1::RegisterNodeRequest request;
  *request.mutable_node() = NodeWithTenantRoot("a");
  request.mutable_node()->mutable_tenant_data_roots(0)->set_tenant("alpha");
  request.mutable_node()->add_tenant_data_roots()->set_path("/x/../etc");
  request.mutable_node()->mutable_tenant_data_roots(1)->set_tenant("tenants/alpha");
  request.mutable_node()->set_memory_per_slot_bytes(-1);
  const auto refused = nodes_->RegisterNode(request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("node.tenant_data_roots.tenant: 'alpha'"));
  EXPECT_THAT(refused.status().message(), HasSubstr("node.tenant_data_roots.path: '/x/../etc'"));
  EXPECT_THAT(refused.status().message(), HasSubstr("node.memory_per_slot_bytes: -1"));
}

}  // namespace
}  // namespace gradhub::api
