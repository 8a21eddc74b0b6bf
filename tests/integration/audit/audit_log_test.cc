// The audit log against a real PostgreSQL: PostgresAuditLog (rows, order, insert-only, a job's
// tenant), CallAuditor (who the caller is, bounded text, a lost row counted and logged but not
// failing the call) and AuditReader (who reads what, filters, pages).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <string>
#include <thread>
#include <vector>

#include "services/api/audit_reader.h"
#include "services/common/audit/audit_log.h"
#include "services/common/audit/audited_calls.h"
#include "services/common/audit/call_auditor.h"
#include "services/common/auth/authenticator.h"
#include "tests/integration/db/db_test_util.h"

namespace gradhub::audit {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kCancel[] = "gradhub.v1.JobService/CancelJob";
constexpr char kAdmin[] = "Bearer audit-admin";

class AuditLogTest : public db::DatabaseTest {
 protected:
  void SetUp() override {
    db::DatabaseTest::SetUp();
    Migrate();
    pool_ = MakePool(2);
    auth_ = std::make_unique<api::Authenticator>(pool_.get(), "audit-admin");
    log_ = std::make_unique<PostgresAuditLog>(pool_.get());
    auditor_ = std::make_unique<CallAuditor>(
        auth_.get(), log_.get(),
        CallAuditorOptions{.registry = &registry_,
                           .server_name = "test",
                           .log = [this](const std::string& line) { logged_.push_back(line); }});
    reader_ = std::make_unique<api::AuditReader>(auth_.get(), log_.get());
  }

  // A tenant and a token of it: {"Bearer <secret>", "tenants/<name>/tokens/<id>"}.
  std::pair<std::string, std::string> NewTenant(const std::string& name) {
    EXPECT_TRUE(auth_->CreateTenant(name, "").ok());
    absl::StatusOr<api::NewToken> token = auth_->CreateTenantToken(name, "");
    EXPECT_TRUE(token.ok());
    return {"Bearer " + token->secret, "tenants/" + name + "/tokens/" + std::to_string(token->id)};
  }

  // A job row of `tenant`, as jobs/{uuid}.
  std::string NewJob(const std::string& tenant) {
    auto rows = pool_->Exec(
        "INSERT INTO jobs (tenant_id, spec, world_size)"
        " SELECT id, '{}', 1 FROM tenants WHERE name = $1 RETURNING id::text AS id",
        {tenant});
    EXPECT_TRUE(rows.ok()) << rows.status();
    return "jobs/" + rows->row(0).Get<std::string>("id");
  }

  void Record(const std::string& authorization, const std::string& resource,
              absl::Status outcome = absl::OkStatus(), const char* method = kCancel) {
    auditor_->Record({.method = method,
                      .authorization = authorization,
                      .transport = "grpc",
                      .peer = "127.0.0.1:4000",
                      .resource = resource,
                      .outcome = std::move(outcome)});
  }

  std::vector<v1::AuditEvent> All() {
    auto events = log_->List({.limit = 1000});
    EXPECT_TRUE(events.ok()) << events.status();
    std::vector<v1::AuditEvent> out;
    for (const StoredAuditEvent& stored : *events) out.push_back(stored.event);
    return out;
  }

  absl::StatusOr<v1::ListAuditEventsResponse> List(const std::string& authorization,
                                                   const std::string& filter = "",
                                                   int32_t page_size = 0,
                                                   const std::string& page_token = "") {
    absl::StatusOr<api::AuditScope> scope = reader_->Authorize(authorization);
    if (!scope.ok()) return scope.status();
    v1::ListAuditEventsRequest request;
    request.set_filter(filter);
    request.set_page_size(page_size);
    request.set_page_token(page_token);
    return reader_->List(*scope, request);
  }

  static std::vector<std::string> Resources(const v1::ListAuditEventsResponse& response) {
    std::vector<std::string> resources;
    for (const v1::AuditEvent& event : response.events()) resources.push_back(event.resource());
    return resources;
  }

  std::unique_ptr<db::Pool> pool_;
  std::unique_ptr<api::Authenticator> auth_;
  std::unique_ptr<PostgresAuditLog> log_;
  prometheus::Registry registry_;
  std::vector<std::string> logged_;
  std::unique_ptr<CallAuditor> auditor_;
  std::unique_ptr<api::AuditReader> reader_;
};

TEST_F(AuditLogTest, RowsComeBackNewestFirstWithEveryField) {
  ASSERT_TRUE(log_->Append({.actor = "admin",
                            .tenant = "tenants/a",
                            .method = kCancel,
                            .resource = "jobs/x",
                            .outcome = "OK",
                            .transport = "grpc",
                            .peer = "127.0.0.1:1"})
                  .ok());
  ASSERT_TRUE(log_->Append({.actor = "unauthenticated",
                            .method = kCancel,
                            .resource = "jobs/y",
                            .outcome = "UNAUTHENTICATED",
                            .message = "missing or invalid",
                            .transport = "rest",
                            .peer = "[::1]:2"})
                  .ok());
  absl::StatusOr<std::vector<StoredAuditEvent>> events = log_->List({.limit = 10});
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 2u);
  const v1::AuditEvent& newest = (*events)[0].event;
  EXPECT_EQ(newest.name(), "auditEvents/" + std::to_string((*events)[0].id));
  EXPECT_GT((*events)[0].id, (*events)[1].id);
  EXPECT_EQ(newest.actor(), "unauthenticated");
  EXPECT_EQ(newest.tenant(), "");
  EXPECT_EQ(newest.outcome(), "UNAUTHENTICATED");
  EXPECT_EQ(newest.message(), "missing or invalid");
  EXPECT_EQ(newest.transport(), "rest");
  EXPECT_EQ(newest.peer(), "[::1]:2");
  EXPECT_GT(newest.time().seconds(), 1700000000);
  EXPECT_EQ((*events)[1].event.tenant(), "tenants/a");
  EXPECT_EQ((*events)[1].event.resource(), "jobs/x");
}

TEST_F(AuditLogTest, ConcurrentAppendsAreAllWrittenAndABadRowFailsAlone) {
  constexpr int kCallers = 40;
  std::vector<absl::Status> statuses(kCallers);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      // Caller 7's row breaks a CHECK (no actor): it alone must fail, whatever batch it joins.
      statuses[i] = log_->Append({.actor = i == 7 ? "" : "admin",
                                  .method = kCancel,
                                  .resource = "nodes/n" + std::to_string(i),
                                  .outcome = "OK",
                                  .transport = "grpc"});
    });
  }
  for (std::thread& caller : callers) caller.join();
  for (int i = 0; i < kCallers; ++i) EXPECT_EQ(statuses[i].ok(), i != 7) << i << statuses[i];
  std::vector<std::string> resources;
  for (const v1::AuditEvent& event : All()) resources.push_back(event.resource());
  EXPECT_EQ(resources.size(), static_cast<size_t>(kCallers - 1));
  EXPECT_THAT(resources, ::testing::Not(::testing::Contains("nodes/n7")));
}

TEST_F(AuditLogTest, RowsAreInsertOnlyForEveryone) {
  ASSERT_TRUE(
      log_->Append({.actor = "admin", .method = kCancel, .outcome = "OK", .transport = "grpc"})
          .ok());
  for (const char* change : {"UPDATE audit_events SET outcome = 'INTERNAL'",
                             "DELETE FROM audit_events", "TRUNCATE audit_events"}) {
    const auto changed = pool_->Exec(change);
    EXPECT_FALSE(changed.ok()) << change;
  }
  ASSERT_EQ(All().size(), 1u);
  EXPECT_EQ(All()[0].outcome(), "OK");
}

TEST_F(AuditLogTest, TheCallerIsNamedByItsTokenAndItsTenantOwnsTheEvent) {
  const auto [a, a_token] = NewTenant("team-a");
  const auto [b, b_token] = NewTenant("team-b");
  const std::string job = NewJob("team-a");
  Record(a, job);
  Record(b, job, absl::NotFoundError("job not found"));  // b probing a's job
  Record("Bearer nonsense", job, absl::UnauthenticatedError("missing or invalid bearer token"));
  Record(kAdmin, job);
  Record(kAdmin, "nodes/n1", absl::OkStatus(), "gradhub.v1.NodeService/DrainNode");
  const std::vector<v1::AuditEvent> events = All();
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[4].actor(), a_token);
  EXPECT_EQ(events[4].tenant(), "tenants/team-a");
  EXPECT_EQ(events[4].outcome(), "OK");
  EXPECT_EQ(events[3].actor(), b_token);
  EXPECT_EQ(events[3].tenant(), "tenants/team-b");
  EXPECT_EQ(events[3].outcome(), "NOT_FOUND");
  EXPECT_EQ(events[3].message(), "job not found");
  EXPECT_EQ(events[2].actor(), "unauthenticated");
  EXPECT_EQ(events[2].tenant(), "tenants/team-a") << "the job's tenant";
  EXPECT_EQ(events[1].actor(), "admin");
  EXPECT_EQ(events[1].tenant(), "tenants/team-a") << "the job's tenant";
  EXPECT_EQ(events[0].tenant(), "");
  EXPECT_EQ(events[0].method(), "gradhub.v1.NodeService/DrainNode");
  EXPECT_EQ(events[0].peer(), "127.0.0.1:4000");
}

TEST_F(AuditLogTest, ClientTextIsStoredValidAndBounded) {
  Record(kAdmin, std::string("jobs/a\0b", 8) + "\xFF" + std::string(600, 'r'),
         absl::InvalidArgumentError(std::string(700, 'm')));
  const std::vector<v1::AuditEvent> events = All();
  ASSERT_EQ(events.size(), 1u) << (logged_.empty() ? "" : logged_[0]);
  EXPECT_EQ(events[0].message(), std::string(512, 'm'));
  EXPECT_EQ(events[0].resource().substr(0, 13),
            "jobs/a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD");
  EXPECT_EQ(events[0].outcome(), "INVALID_ARGUMENT");
  EXPECT_EQ(auditor_->write_failures(), 0);
}

TEST_F(AuditLogTest, ALostRowIsCountedAndLoggedWithoutFailingTheCall) {
  ASSERT_TRUE(pool_->Exec("ALTER TABLE audit_events RENAME TO audit_events_gone").ok());
  Record(kAdmin, "nodes/n1", absl::OkStatus(), "gradhub.v1.NodeService/CordonNode");
  EXPECT_EQ(auditor_->write_failures(), 1);
  ASSERT_EQ(logged_.size(), 1u);
  EXPECT_THAT(logged_[0], HasSubstr("audit event lost"));
  EXPECT_THAT(logged_[0], HasSubstr("method=gradhub.v1.NodeService/CordonNode"));
  EXPECT_THAT(logged_[0], HasSubstr("resource=nodes/n1"));
  const std::string metrics = prometheus::TextSerializer().Serialize(registry_.Collect());
  EXPECT_THAT(metrics, HasSubstr("gradhub_audit_write_failures_total{method=\"gradhub.v1."
                                 "NodeService/CordonNode\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("gradhub_audit_write_failures_total{method=\"gradhub.v1."
                                 "JobService/CancelJob\"} 0"));
}

TEST_F(AuditLogTest, TheAdminReadsAllATenantOnlyItsOwn) {
  const auto [a, a_token] = NewTenant("team-a");
  const auto [b, b_token] = NewTenant("team-b");
  const std::string job = NewJob("team-a");
  Record(a, job);
  Record(b, "jobs/b-thing", absl::NotFoundError("no"));
  EXPECT_THAT(Resources(*List(kAdmin)), ElementsAre("jobs/b-thing", job));
  EXPECT_THAT(Resources(*List(a)), ElementsAre(job));
  EXPECT_THAT(Resources(*List(b)), ElementsAre("jobs/b-thing"));
  EXPECT_THAT(Resources(*List(b, "tenant=tenants/team-b")), ElementsAre("jobs/b-thing"));
  // Asking for another tenant's events is refused, naming why.
  const auto other = List(b, "tenant=tenants/team-a");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other.status().message(), HasSubstr("tenant=tenants/team-a"));
  // Nodes, ranks and strangers read nothing.
  absl::StatusOr<api::NewToken> node = auth_->CreateNodeToken("");
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(List("Bearer " + node->secret).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(List("Bearer nonsense").status().code(), absl::StatusCode::kUnauthenticated);
}

// CreateJob writes its OK event with the job (JobInserter): the recorder leaves that outcome
// alone, records the call's other outcomes, and gives the handler the event it would write.
TEST_F(AuditLogTest, AnOkCreateJobIsLeftToItsHandlerAndItsRefusalsAreRecorded) {
  const auto [a, a_token] = NewTenant("team-create");
  Record(a, "jobs/3", absl::OkStatus(), kCreateJobMethod);
  Record(a, "", absl::InvalidArgumentError("invalid job spec: model: required"), kCreateJobMethod);
  const std::vector<v1::AuditEvent> events = All();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].outcome(), "INVALID_ARGUMENT");
  EXPECT_EQ(events[0].actor(), a_token);

  const AuditRecord event = auditor_->EventOf(
      {.method = kCreateJobMethod, .authorization = a, .transport = "rest", .peer = "[::1]:7"});
  EXPECT_EQ(event.actor, a_token);
  EXPECT_EQ(event.tenant, "tenants/team-create");
  EXPECT_EQ(event.method, kCreateJobMethod);
  EXPECT_EQ(event.outcome, "OK");
  EXPECT_EQ(event.resource, "");
  EXPECT_EQ(event.transport, "rest");
  EXPECT_EQ(event.peer, "[::1]:7");
  EXPECT_EQ(auditor_->write_failures(), 0);
}

TEST_F(AuditLogTest, FiltersMatchEveryTermAtOnce) {
  const auto [a, a_token] = NewTenant("team-a");
  Record(a, "jobs/1");
  Record(a, "jobs/2", absl::NotFoundError("no"));
  Record(a, "nodes/n3", absl::OkStatus(), "gradhub.v1.NodeService/DrainNode");
  Record(kAdmin, "tenants/team-a/tokens/9", absl::OkStatus(),
         "gradhub.v1.AdminService/RevokeToken");
  EXPECT_THAT(Resources(*List(kAdmin, "outcome=NOT_FOUND")), ElementsAre("jobs/2"));
  EXPECT_THAT(Resources(*List(kAdmin, "method=DrainNode")), ElementsAre("nodes/n3"));
  EXPECT_THAT(Resources(*List(kAdmin, "method=gradhub.v1.JobService/CancelJob outcome=OK")),
              ElementsAre("jobs/1"));
  EXPECT_THAT(Resources(*List(kAdmin, "actor=admin tenant=tenants/team-a")),
              ElementsAre("tenants/team-a/tokens/9"));
  EXPECT_THAT(Resources(*List(kAdmin, "actor=" + a_token + " resource=jobs/2")),
              ElementsAre("jobs/2"));
  EXPECT_EQ(List(kAdmin, "color=red").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(AuditLogTest, PagesWalkEveryEventOnceNewestFirst) {
  for (int i = 0; i < 5; ++i) Record(kAdmin, "nodes/n" + std::to_string(i));
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    const auto page = List(kAdmin, "actor=admin", 2, token);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const std::string& resource : Resources(*page)) seen.push_back(resource);
    token = page->next_page_token();
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_THAT(seen, ElementsAre("nodes/n4", "nodes/n3", "nodes/n2", "nodes/n1", "nodes/n0"));
  EXPECT_EQ(pages, 3);
  // A token from one filter does not continue another's listing.
  const auto first = List(kAdmin, "actor=admin", 2);
  const auto elsewhere = List(kAdmin, "outcome=OK", 2, first->next_page_token());
  EXPECT_EQ(elsewhere.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(elsewhere.status().message(), HasSubstr("page_token"));
  EXPECT_EQ(List(kAdmin, "", 1001).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradhub::audit
