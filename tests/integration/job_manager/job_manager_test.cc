// JobManager against a real PostgreSQL with the shipped migrations: creation and its
// idempotency, validation, tenant isolation, the lifecycle and its event history.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "services/api/job_manager.h"
#include "services/common/page_token.h"
#include "tests/integration/db/db_test_util.h"
#include "tests/support/job_specs.h"

namespace gradhub::api {
namespace {

using ::testing::HasSubstr;

class JobManagerTest : public db::DatabaseTest {
 protected:
  void SetUp() override {
    db::DatabaseTest::SetUp();
    Migrate();
    pool_ = MakePool(8);
    manager_ = std::make_unique<JobManager>(pool_.get(), SpecLimits{.max_world_size = 64});
    tenant_a_ = MakeTenant("tenant-a");
    tenant_b_ = MakeTenant("tenant-b");
  }

  int64_t MakeTenant(const std::string& name) {
    auto result = pool_->Exec("INSERT INTO tenants (name) VALUES ($1) RETURNING id", {name});
    EXPECT_TRUE(result.ok()) << result.status();
    return result->row(0).Get<int64_t>("id");
  }

  static v1::JobSpec ValidSpec() {
    v1::JobSpec spec = testing::MinimalJobSpec();
    spec.set_display_name("digits; DROP TABLE jobs; -- 'quoted' \"too\"");
    (*spec.mutable_labels())["team"] = "vision";
    spec.mutable_distributed()->set_world_size(4);
    return spec;
  }

  std::unique_ptr<db::Pool> pool_;
  std::unique_ptr<JobManager> manager_;
  int64_t tenant_a_ = 0;
  int64_t tenant_b_ = 0;
};

TEST_F(JobManagerTest, CreatedJobIsPendingAndStoredVerbatim) {
  auto job = manager_->CreateJob(tenant_a_, ValidSpec(), "req-1");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_THAT(job->name(), ::testing::StartsWith("jobs/"));
  EXPECT_EQ(job->tenant(), "tenants/tenant-a");
  EXPECT_EQ(job->state(), v1::Job::PENDING);
  auto again = manager_->GetJob(tenant_a_, job->name());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->spec().display_name(), ValidSpec().display_name());
  EXPECT_EQ(again->spec().labels().at("team"), "vision");
  EXPECT_EQ(again->spec().distributed().world_size(), 4);
  auto labels = pool_->Exec("SELECT labels->>'team' AS team FROM jobs");
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_EQ(labels->row(0).Get<std::string>("team"), "vision");
}

TEST_F(JobManagerTest, RetriedRequestIdMakesOneJob) {
  auto first = manager_->CreateJob(tenant_a_, ValidSpec(), "same");
  auto second = manager_->CreateJob(tenant_a_, ValidSpec(), "same");
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->name(), second->name());
  // The same request id from another tenant is another request.
  auto other = manager_->CreateJob(tenant_b_, ValidSpec(), "same");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->name(), first->name());
  v1::JobSpec changed = ValidSpec();
  changed.set_max_steps(7);
  EXPECT_EQ(manager_->CreateJob(tenant_a_, changed, "same").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(manager_->CreateJob(tenant_a_, ValidSpec(), std::string(65, 'x')).status().message(),
              HasSubstr("request_id"));
  auto count = pool_->Exec("SELECT count(*)::bigint AS n FROM jobs");
  EXPECT_EQ(count->row(0).Get<int64_t>("n"), 2);
}

// The NUL would make libpq send "r1": the request would be taken for a retry of r1.
TEST_F(JobManagerTest, ANulInARequestIdIsRefusedNotTakenForTheIdBeforeIt) {
  ASSERT_TRUE(manager_->CreateJob(tenant_a_, ValidSpec(), "r1").ok());
  v1::JobSpec other = ValidSpec();
  other.set_max_steps(7);
  for (const v1::JobSpec& spec : {ValidSpec(), other}) {
    auto refused = manager_->CreateJob(tenant_a_, spec, std::string("r1\0x", 4));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.status().message(), HasSubstr("request_id: holds a NUL character"));
  }
  auto count = pool_->Exec("SELECT count(*)::bigint AS n FROM jobs");
  EXPECT_EQ(count->row(0).Get<int64_t>("n"), 1);
}

TEST_F(JobManagerTest, TextLimitsCountCharacters) {
  std::string id;
  for (int i = 0; i < 64; ++i) id += "\xc3\xa9";  // 64 characters, 128 bytes
  auto job = manager_->CreateJob(tenant_a_, ValidSpec(), id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_THAT(manager_->CreateJob(tenant_a_, ValidSpec(), id + "x").status().message(),
              HasSubstr("request_id: is 65 characters long; at most 64 (characters are Unicode"));
  std::string reason;
  for (int i = 0; i < 1024; ++i) reason += "\xe2\x82\xac";
  EXPECT_THAT(manager_->CancelJob(tenant_a_, job->name(), reason + "x").status().message(),
              HasSubstr("reason: is 1025 characters long; at most 1024"));
  EXPECT_TRUE(manager_->CancelJob(tenant_a_, job->name(), reason).ok());
}

TEST_F(JobManagerTest, InvalidSpecNamesEveryFieldAndWritesNothing) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_distributed()->set_world_size(65);
  spec.mutable_optimizer()->mutable_sgd()->set_lr(-1);
  spec.mutable_dataset()->mutable_csv()->set_path("");
  auto job = manager_->CreateJob(tenant_a_, spec, "bad");
  ASSERT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("distributed.worldSize"));
  EXPECT_THAT(job.status().message(), HasSubstr("optimizer.sgd.lr"));
  EXPECT_THAT(job.status().message(), HasSubstr("dataset.csv.path"));
  auto count = pool_->Exec("SELECT count(*)::bigint AS n FROM jobs");
  EXPECT_EQ(count->row(0).Get<int64_t>("n"), 0);
}

TEST_F(JobManagerTest, OtherTenantsJobIsNotFound) {
  auto job = manager_->CreateJob(tenant_a_, ValidSpec(), "");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(manager_->GetJob(tenant_b_, job->name()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->CancelJob(tenant_b_, job->name()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->ListJobEvents(tenant_b_, testing::EventsOf(job->name())).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->GetJob(tenant_a_, "jobs/not-a-uuid").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->GetJob(tenant_a_, job->name())->state(), v1::Job::PENDING);
}

TEST_F(JobManagerTest, LifecycleRefusesIllegalTransitionsWithoutWriting) {
  auto job = manager_->CreateJob(tenant_a_, ValidSpec(), "");
  ASSERT_TRUE(job.ok());
  auto refused = manager_->Transition(job->name(), v1::Job::SUCCEEDED);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("PENDING"));
  ASSERT_TRUE(manager_->Transition(job->name(), v1::Job::SCHEDULED).ok());
  auto running = manager_->Transition(job->name(), v1::Job::RUNNING);
  ASSERT_TRUE(running.ok());
  EXPECT_TRUE(running->has_start_time());
  EventDetails rank_failed;
  rank_failed.message = "rank 1 exited";
  rank_failed.failure_kind = v1::JobEvent::JOB;
  rank_failed.rank = 1;
  rank_failed.exit_code = 11;
  auto failed = manager_->Transition(job->name(), v1::Job::FAILED, rank_failed);
  ASSERT_TRUE(failed.ok());
  EXPECT_TRUE(failed->has_end_time());
  auto cancel_after_end = manager_->CancelJob(tenant_a_, job->name());
  ASSERT_TRUE(cancel_after_end.ok()) << cancel_after_end.status();
  EXPECT_EQ(cancel_after_end->state(), v1::Job::FAILED) << "unchanged";

  auto events = manager_->ListJobEvents(tenant_a_, testing::EventsOf(job->name()));
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->events_size(), 4);  // submitted, scheduled, running, failed
  const v1::JobEvent& last = events->events(events->events_size() - 1);
  EXPECT_EQ(last.from_state(), v1::Job::RUNNING);
  EXPECT_EQ(last.to_state(), v1::Job::FAILED);
  EXPECT_EQ(last.failure_kind(), v1::JobEvent::JOB);
  EXPECT_EQ(last.rank(), 1);
  EXPECT_EQ(last.exit_code(), 11);
}

TEST_F(JobManagerTest, EventsArePagedByIdAndFilteredAndCancelKeepsItsReason) {
  auto job = manager_->CreateJob(tenant_a_, ValidSpec(), "");
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(manager_->Transition(job->name(), v1::Job::SCHEDULED).ok());
  ASSERT_TRUE(manager_->Transition(job->name(), v1::Job::RUNNING).ok());
  EXPECT_EQ(manager_->CancelJob(tenant_a_, job->name(), std::string(1025, 'x')).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto cancelled = manager_->CancelJob(tenant_a_, job->name(), "wrong learning rate");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_THAT(cancelled->state_reason(), HasSubstr("wrong learning rate"));

  auto all = manager_->ListJobEvents(tenant_a_, testing::EventsOf(job->name()));
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->events_size(), 5);  // pending, scheduled, running, cancel requested, cancelled
  EXPECT_TRUE(all->next_page_token().empty());
  std::vector<int64_t> paged;
  v1::ListJobEventsRequest request = testing::EventsOf(job->name());
  request.set_page_size(2);
  for (int page = 0; page < 10; ++page) {
    auto events = manager_->ListJobEvents(tenant_a_, request);
    ASSERT_TRUE(events.ok()) << events.status();
    EXPECT_LE(events->events_size(), 2);
    for (const v1::JobEvent& event : events->events()) paged.push_back(event.id());
    if (events->next_page_token().empty()) break;
    request.set_page_token(events->next_page_token());
  }
  std::vector<int64_t> ids;
  for (const v1::JobEvent& event : all->events()) ids.push_back(event.id());
  EXPECT_EQ(paged, ids);

  auto requested =
      manager_->ListJobEvents(tenant_a_, testing::EventsOf(job->name(), "type=CANCEL_REQUESTED"));
  ASSERT_TRUE(requested.ok());
  ASSERT_EQ(requested->events_size(), 1);
  EXPECT_EQ(requested->events(0).message(), "wrong learning rate");
  // Transition() alone never starts an attempt (the scheduler does), so all are attempt 0.
  auto changes = manager_->ListJobEvents(
      tenant_a_, testing::EventsOf(job->name(), "type=STATE_CHANGED AND attempt=0"));
  ASSERT_TRUE(changes.ok()) << changes.status();
  EXPECT_EQ(changes->events_size(), 4);
  EXPECT_EQ(manager_->ListJobEvents(tenant_a_, testing::EventsOf(job->name(), "attempt=3"))
                ->events_size(),
            0);

  for (const char* bad_filter : {"kind=RANK_FAILED", "type=EXPLODED", "attempt=-1"}) {
    auto refused = manager_->ListJobEvents(tenant_a_, testing::EventsOf(job->name(), bad_filter));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad_filter;
    EXPECT_THAT(refused.status().message(), HasSubstr("filter")) << bad_filter;
  }
  request.set_page_token("not-a-token");
  EXPECT_THAT(manager_->ListJobEvents(tenant_a_, request).status().message(),
              HasSubstr("page_token"));
}

TEST_F(JobManagerTest, ConcurrentCancelsAndTransitionsLeaveAConsistentHistory) {
  auto job = manager_->CreateJob(tenant_a_, ValidSpec(), "");
  ASSERT_TRUE(job.ok());
  std::atomic<int> cancel_ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 50; ++i) {
    threads.emplace_back([&, i] {
      if (i % 2 == 0) {
        cancel_ok += manager_->CancelJob(tenant_a_, job->name()).ok();
      } else {
        (void)manager_->Transition(job->name(), i % 4 == 1 ? v1::Job::SCHEDULED : v1::Job::RUNNING);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(cancel_ok.load(), 25) << "cancel is idempotent";
  auto final_job = manager_->GetJob(tenant_a_, job->name());
  EXPECT_EQ(final_job->state(), v1::Job::CANCELLED);
  auto events =
      manager_->ListJobEvents(tenant_a_, testing::EventsOf(job->name(), "type=STATE_CHANGED"));
  ASSERT_TRUE(events.ok());
  auto requested =
      manager_->ListJobEvents(tenant_a_, testing::EventsOf(job->name(), "type=CANCEL_REQUESTED"));
  EXPECT_EQ(requested->events_size(), 1) << "only the cancel that took effect is recorded";
  // A chain: each event starts where the previous ended, every step allowed, CANCELLED once.
  int cancelled = 0;
  for (int i = 1; i < events->events_size(); ++i) {
    EXPECT_EQ(events->events(i).from_state(), events->events(i - 1).to_state()) << "event " << i;
    EXPECT_TRUE(IsAllowedTransition(events->events(i).from_state(), events->events(i).to_state()));
    cancelled += events->events(i).to_state() == v1::Job::CANCELLED;
  }
  EXPECT_EQ(cancelled, 1);
  EXPECT_EQ(events->events(events->events_size() - 1).to_state(), v1::Job::CANCELLED);
}

TEST_F(JobManagerTest, ListPagesNewestFirstWithinTheTenant) {
  std::vector<std::string> created;
  for (int i = 0; i < 7; ++i) {
    v1::JobSpec spec = ValidSpec();
    (*spec.mutable_labels())["owner"] = i % 2 ? "Ann Lee" : "bo";
    auto job = manager_->CreateJob(tenant_a_, spec, "");
    ASSERT_TRUE(job.ok()) << job.status();
    created.insert(created.begin(), job->name());  // newest first
  }
  ASSERT_TRUE(manager_->CreateJob(tenant_b_, ValidSpec(), "").ok());
  ASSERT_TRUE(manager_->CancelJob(tenant_a_, created[2]).ok());

  std::vector<std::string> listed;
  v1::ListJobsRequest request;
  request.set_page_size(3);
  int pages = 0;
  do {
    auto page = manager_->ListJobs(tenant_a_, request);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const v1::Job& job : page->jobs()) listed.push_back(job.name());
    request.set_page_token(page->next_page_token());
    ++pages;
  } while (!request.page_token().empty() && pages < 10);
  EXPECT_EQ(listed, created);
  EXPECT_EQ(pages, 3);

  v1::ListJobsRequest cancelled;
  cancelled.set_filter("state=CANCELLED");
  auto only = manager_->ListJobs(tenant_a_, cancelled);
  ASSERT_TRUE(only.ok()) << only.status();
  ASSERT_EQ(only->jobs_size(), 1);
  EXPECT_EQ(only->jobs(0).name(), created[2]);

  v1::ListJobsRequest labelled;
  labelled.set_filter("labels.owner=\"Ann Lee\" AND labels.team=vision");
  auto ann = manager_->ListJobs(tenant_a_, labelled);
  ASSERT_TRUE(ann.ok()) << ann.status();
  EXPECT_EQ(ann->jobs_size(), 3);
}

TEST_F(JobManagerTest, ListRejectsBadArgumentsNamingThem) {
  v1::ListJobsRequest request;
  request.set_page_size(-1);
  EXPECT_THAT(manager_->ListJobs(tenant_a_, request).status().message(), HasSubstr("page_size"));
  request.set_page_size(5000);  // served as 1000
  EXPECT_TRUE(manager_->ListJobs(tenant_a_, request).ok());
  request.set_page_token("garbage");
  EXPECT_THAT(manager_->ListJobs(tenant_a_, request).status().message(), HasSubstr("page_token"));
  request.clear_page_token();
  request.set_page_size(0);
  auto job = manager_->CreateJob(tenant_a_, ValidSpec(), "");
  const std::string id = job->name().substr(5);
  // A token of the right form whose time PostgreSQL cannot add to the epoch (the probe's "out
  // of range" answered SQL text), of another list, or raw as the tokens once were.
  for (const std::string& token :
       {MakePageToken("jobs", {"9223372036854775807", id}), MakePageToken("jobs", {"-1", id}),
        MakePageToken("jobs", {"253402300800000000", id}), MakePageToken("jobs", {"1", "x"}),
        MakePageToken("job_events", {"1"}), "1700000000000000/" + id}) {
    request.set_page_token(token);
    const absl::Status status = manager_->ListJobs(tenant_a_, request).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << token;
    EXPECT_EQ(status.message(), "page_token: not a token this server returned") << token;
  }
  v1::ListJobEventsRequest events = testing::EventsOf(job->name());
  for (const std::string& token :
       {MakePageToken("job_events", {"-1"}), MakePageToken("job_events", {"99999999999999999999"}),
        MakePageToken("jobs", {"1", id}), std::string("5")}) {
    events.set_page_token(token);
    EXPECT_EQ(manager_->ListJobEvents(tenant_a_, events).status().message(),
              "page_token: not a token this server returned")
        << token;
  }
  request.clear_page_token();
  for (const char* filter : {"color=red", "state=SLEEPING", "state", "state=RUNNING OR x=y"}) {
    request.set_filter(filter);
    auto status = manager_->ListJobs(tenant_a_, request).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << filter;
    EXPECT_THAT(status.message(), HasSubstr("filter")) << filter;
  }
}

}  // namespace
}  // namespace gradhub::api
