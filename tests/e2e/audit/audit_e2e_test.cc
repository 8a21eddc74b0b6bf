// The audit log end to end (issue 36): real gradhub-api and gradhub-checkpoint processes on a
// real PostgreSQL, called over gRPC and REST by tenants, the admin and strangers, and read back
// through AuditService (gRPC, REST) and `gradhub admin audit`. The acceptance: a cancel by
// tenant A is recorded (actor = A's token, resource = the job, outcome OK) and tenant B can
// neither list it nor ask for A's events.
#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "gradhub/v1/audit.grpc.pb.h"
#include "gradhub/v1/checkpoint.grpc.pb.h"
#include "gradhub/v1/jobs.grpc.pb.h"
#include "gradhub/v1/nodes.grpc.pb.h"
#include "gradhub/v1/tenants.grpc.pb.h"
#include "tests/support/job_specs.h"
#include "tests/support/local_cluster.h"
#include "tests/support/subprocess.h"

namespace gradhub {
namespace {

using ::testing::HasSubstr;
using testing::LocalCluster;
using ::testing::Not;
using testing::RunResult;

constexpr char kAdminBearer[] = "Bearer local-cluster-admin";

// A tenant made through AdminService, and its first token.
struct Tenant {
  std::string name;        // tenants/<id>
  std::string bearer;      // "Bearer <secret>"
  std::string token_name;  // tenants/<id>/tokens/<n>: the actor of its calls
};

std::unique_ptr<grpc::ClientContext> Context(const std::string& bearer) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->AddMetadata("authorization", bearer);
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return context;
}

// One cluster for the binary: api and checkpoint store, no agents (nothing here runs a job).
// Each test makes its own tenants, so that their events do not mix.
class AuditE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::LocalClusterOptions options;
    options.agents = {};
    options.checkpoint_service = true;
    cluster_ = new LocalCluster(options);
    started_ = cluster_->Start();
  }
  static void TearDownTestSuite() { delete cluster_; }

  void SetUp() override {
    ASSERT_TRUE(started_) << "the cluster did not start";
    auto api = grpc::CreateChannel(cluster_->api_address(), grpc::InsecureChannelCredentials());
    admin_ = v1::AdminService::NewStub(api);
    audit_ = v1::AuditService::NewStub(api);
    nodes_ = v1::NodeService::NewStub(api);
    checkpoints_ = v1::CheckpointService::NewStub(
        grpc::CreateChannel(cluster_->checkpoint_address(), grpc::InsecureChannelCredentials()));
  }

  Tenant NewTenant(const std::string& prefix) {
    static int count = 0;
    Tenant tenant;
    v1::CreateTenantRequest create;
    create.set_tenant_id(prefix + "-" + std::to_string(++count));
    v1::Tenant created;
    EXPECT_TRUE(admin_->CreateTenant(Context(kAdminBearer).get(), create, &created).ok());
    tenant.name = created.name();
    v1::CreateTokenRequest token;
    token.set_parent(tenant.name);
    token.mutable_token()->set_kind(v1::Token::TENANT);
    v1::CreateTokenResponse made;
    EXPECT_TRUE(admin_->CreateToken(Context(kAdminBearer).get(), token, &made).ok());
    tenant.bearer = "Bearer " + made.secret();
    tenant.token_name = made.token().name();
    return tenant;
  }

  std::string CreateJob(const Tenant& tenant) {
    v1::CreateJobRequest request;
    *request.mutable_spec() = testing::MinimalJobSpec();
    v1::Job job;
    const grpc::Status status =
        cluster_->jobs().CreateJob(Context(tenant.bearer).get(), request, &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return job.name();
  }

  grpc::Status Cancel(const std::string& bearer, const std::string& job) {
    v1::CancelJobRequest request;
    request.set_name(job);
    v1::Job cancelled;
    return cluster_->jobs().CancelJob(Context(bearer).get(), request, &cancelled);
  }

  grpc::Status List(const std::string& bearer, const std::string& filter,
                    v1::ListAuditEventsResponse* events) {
    v1::ListAuditEventsRequest request;
    request.set_filter(filter);
    request.set_page_size(1000);
    return audit_->ListAuditEvents(Context(bearer).get(), request, events);
  }

  // The admin's view of the events that match `filter`, newest first.
  std::vector<v1::AuditEvent> Events(const std::string& filter) {
    v1::ListAuditEventsResponse events;
    const grpc::Status status = List(kAdminBearer, filter, &events);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return {events.events().begin(), events.events().end()};
  }

  // The single event of `method` on `resource`, as the admin lists it.
  v1::AuditEvent OnlyEvent(const std::string& method, const std::string& resource) {
    const std::vector<v1::AuditEvent> events = Events("method=" + method + " resource=" + resource);
    EXPECT_EQ(events.size(), 1u) << method << " on " << resource;
    return events.empty() ? v1::AuditEvent() : events[0];
  }

  static httplib::Result Rest(int port, const std::string& method, const std::string& path,
                              const std::string& bearer, const std::string& body = "") {
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(10);
    const httplib::Headers headers = {{"Authorization", bearer}};
    if (method == "GET") return client.Get(path, headers);
    if (method == "DELETE") return client.Delete(path, headers);
    if (method == "PUT") return client.Put(path, headers, body, "application/octet-stream");
    return client.Post(path, headers, body, "application/json");
  }

  static RunResult Cli(const std::string& bearer, std::vector<std::string> args) {
    args.insert(args.begin(), {testing::BinaryPath("gradhub"), "--server", cluster_->api_address(),
                               "--checkpoint-server", cluster_->checkpoint_address(), "--token",
                               bearer.substr(std::string("Bearer ").size())});
    std::map<std::string, std::string> env;
    for (const char* name : {"GRADHUB_SERVER", "GRADHUB_TOKEN", "GRADHUB_TLS_CA", "GRADHUB_OUTPUT",
                             "GRADHUB_TIMEOUT", "GRADHUB_CHECKPOINT_SERVER"}) {
      env.emplace(name, "");
    }
    return testing::Run(std::move(args), env, std::chrono::seconds(60));
  }

  static LocalCluster* cluster_;
  static bool started_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
  std::unique_ptr<v1::AuditService::Stub> audit_;
  std::unique_ptr<v1::NodeService::Stub> nodes_;
  std::unique_ptr<v1::CheckpointService::Stub> checkpoints_;
};

LocalCluster* AuditE2eTest::cluster_ = nullptr;
bool AuditE2eTest::started_ = false;

TEST_F(AuditE2eTest, ACancelByTenantAIsRecordedAndTenantBCannotReadIt) {
  const Tenant a = NewTenant("a"), b = NewTenant("b");
  const std::string job = CreateJob(a);
  ASSERT_FALSE(job.empty());
  // A cancels over REST.
  const auto cancelled =
      Rest(cluster_->api_http_port(), "POST", "/v1/" + job + ":cancel", a.bearer, "{}");
  ASSERT_TRUE(cancelled);
  ASSERT_EQ(cancelled->status, 200) << cancelled->body;

  const v1::AuditEvent event = OnlyEvent("CancelJob", job);
  EXPECT_EQ(event.actor(), a.token_name);
  EXPECT_EQ(event.tenant(), a.name);
  EXPECT_EQ(event.method(), "gradhub.v1.JobService/CancelJob");
  EXPECT_EQ(event.resource(), job);
  EXPECT_EQ(event.outcome(), "OK");
  EXPECT_EQ(event.message(), "");
  EXPECT_EQ(event.transport(), "rest");
  EXPECT_THAT(event.peer(), HasSubstr("127.0.0.1:"));
  EXPECT_THAT(event.name(), HasSubstr("auditEvents/"));
  EXPECT_GT(event.time().seconds(), 0);

  // A reads it (its filter forced to its tenant); B's listing does not contain it.
  v1::ListAuditEventsResponse own, others;
  ASSERT_TRUE(List(a.bearer, "method=CancelJob resource=" + job, &own).ok());
  ASSERT_EQ(own.events_size(), 1);
  EXPECT_EQ(own.events(0).name(), event.name());
  ASSERT_TRUE(List(b.bearer, "", &others).ok());
  for (const v1::AuditEvent& seen : others.events()) {
    EXPECT_EQ(seen.tenant(), b.name) << seen.ShortDebugString();
    EXPECT_NE(seen.resource(), job);
  }
  // B asking for A's events is refused, over gRPC and REST.
  v1::ListAuditEventsResponse refused;
  const grpc::Status denied = List(b.bearer, "tenant=" + a.name, &refused);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED) << denied.error_message();
  EXPECT_EQ(refused.events_size(), 0);
  const auto rest_denied =
      Rest(cluster_->api_http_port(), "GET", "/v1/auditEvents?filter=tenant%3D" + a.name, b.bearer);
  ASSERT_TRUE(rest_denied);
  EXPECT_EQ(rest_denied->status, 403) << rest_denied->body;
  EXPECT_THAT(rest_denied->body, HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(rest_denied->body, Not(HasSubstr(job)));
}

TEST_F(AuditE2eTest, TheCliPrintsTheEventAsATableAndAsJson) {
  const Tenant a = NewTenant("cli"), b = NewTenant("cli");
  const std::string job = CreateJob(a);
  ASSERT_TRUE(Cancel(a.bearer, job).ok());

  const RunResult table = Cli(kAdminBearer, {"admin", "audit", "--tenant", a.name.substr(8),
                                             "--method", "CancelJob", "--outcome", "ok"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("ACTOR"));
  EXPECT_THAT(table.out, HasSubstr("JobService/CancelJob"));
  EXPECT_THAT(table.out, HasSubstr(a.token_name));
  EXPECT_THAT(table.out, HasSubstr(job));
  EXPECT_THAT(table.out, HasSubstr("grpc"));

  const RunResult json =
      Cli(a.bearer, {"admin", "audit", "--resource", job, "--method", "CancelJob", "-o", "json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  v1::ListAuditEventsResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.out, &parsed).ok()) << json.out;
  ASSERT_EQ(parsed.events_size(), 1) << json.out;
  EXPECT_EQ(parsed.events(0).actor(), a.token_name);
  EXPECT_EQ(parsed.events(0).outcome(), "OK");

  // B through the CLI: A's tenant is refused, its own listing has nothing of A's.
  const RunResult refused = Cli(b.bearer, {"admin", "audit", "--tenant", a.name});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.err, HasSubstr("PERMISSION_DENIED"));
  const RunResult own = Cli(b.bearer, {"admin", "audit", "--resource", job});
  EXPECT_EQ(own.exit_code, 0) << own.err;
  EXPECT_THAT(own.out, Not(HasSubstr(a.token_name)));

  const RunResult limited = Cli(kAdminBearer, {"admin", "audit", "--limit", "1"});
  ASSERT_EQ(limited.exit_code, 0) << limited.err;
  EXPECT_EQ(std::count(limited.out.begin(), limited.out.end(), '\n'), 2) << limited.out;
  EXPECT_THAT(limited.err, HasSubstr("raise --limit"));
  EXPECT_EQ(Cli(kAdminBearer, {"admin", "audit", "--limit", "0"}).exit_code, 2);
  EXPECT_EQ(Cli(kAdminBearer, {"admin", "audit", "--actor", "a b"}).exit_code, 2);
}

TEST_F(AuditE2eTest, RefusedCallsAreRecordedWithTheirCode) {
  const Tenant a = NewTenant("refused"), b = NewTenant("refused");
  const std::string job = CreateJob(a);
  // B probing A's job: NOT_FOUND, in B's log, not A's.
  EXPECT_EQ(Cancel(b.bearer, job).error_code(), grpc::StatusCode::NOT_FOUND);
  std::vector<v1::AuditEvent> events = Events("actor=" + b.token_name + " resource=" + job);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].outcome(), "NOT_FOUND");
  EXPECT_EQ(events[0].tenant(), b.name);
  EXPECT_EQ(events[0].transport(), "grpc");
  EXPECT_THAT(events[0].message(), HasSubstr("not found"));
  // A stranger's bad token: unauthenticated, on A's job so in A's log too.
  EXPECT_EQ(Cancel("Bearer ghk_not-a-token", job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  events = Events("actor=unauthenticated resource=" + job);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].outcome(), "UNAUTHENTICATED");
  EXPECT_EQ(events[0].tenant(), a.name);
  // A tenant token at an operator's call, over REST: PERMISSION_DENIED, in its own log.
  const auto drain = Rest(cluster_->api_http_port(), "POST", "/v1/nodes/n1:drain", a.bearer);
  ASSERT_TRUE(drain);
  EXPECT_EQ(drain->status, 403);
  events = Events("actor=" + a.token_name + " method=DrainNode");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].outcome(), "PERMISSION_DENIED");
  EXPECT_EQ(events[0].resource(), "nodes/n1");
  EXPECT_EQ(events[0].tenant(), a.name);
  EXPECT_EQ(events[0].transport(), "rest");
  // A spec refused over REST: nothing was made, so no resource.
  const auto bad =
      Rest(cluster_->api_http_port(), "POST", "/v1/jobs", a.bearer, R"({"maxSteps": "many"})");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  events = Events("actor=" + a.token_name + " method=CreateJob outcome=INVALID_ARGUMENT");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].resource(), "");
  // Node tokens read no audit events.
  v1::ListAuditEventsResponse nothing;
  EXPECT_EQ(List("Bearer " + cluster_->node_token(), "", &nothing).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

// An OK create's event is written with its job (AuditedRpc::ok_event_written_by_handler): still
// exactly one event per call, on both transports, retries by request_id included, and none for
// a job that was not made.
TEST_F(AuditE2eTest, EachCreateIsRecordedOnceOnBothTransportsRetriesIncluded) {
  const Tenant a = NewTenant("creates");
  v1::CreateJobRequest request;
  *request.mutable_spec() = testing::MinimalJobSpec();
  request.set_request_id("first");
  v1::Job made, again;
  ASSERT_TRUE(cluster_->jobs().CreateJob(Context(a.bearer).get(), request, &made).ok());
  ASSERT_TRUE(cluster_->jobs().CreateJob(Context(a.bearer).get(), request, &again).ok());
  ASSERT_EQ(again.name(), made.name());
  request.mutable_spec()->set_max_steps(request.spec().max_steps() + 1);
  EXPECT_EQ(cluster_->jobs().CreateJob(Context(a.bearer).get(), request, &again).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);

  std::string body;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(testing::MinimalJobSpec(), &body).ok());
  const int port = cluster_->api_http_port();
  const auto rest_made = Rest(port, "POST", "/v1/jobs?requestId=second", a.bearer, body);
  const auto rest_again = Rest(port, "POST", "/v1/jobs?requestId=second", a.bearer, body);
  ASSERT_TRUE(rest_made && rest_again);
  ASSERT_EQ(rest_made->status, 200) << rest_made->body;
  ASSERT_EQ(rest_again->status, 200) << rest_again->body;
  v1::Job rest_job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(rest_made->body, &rest_job).ok());

  const std::vector<v1::AuditEvent> grpc_events =
      Events("actor=" + a.token_name + " method=CreateJob resource=" + made.name());
  ASSERT_EQ(grpc_events.size(), 2u);  // the create and its retry
  for (const v1::AuditEvent& event : grpc_events) {
    EXPECT_EQ(event.outcome(), "OK");
    EXPECT_EQ(event.tenant(), a.name);
    EXPECT_EQ(event.transport(), "grpc");
    EXPECT_THAT(event.peer(), HasSubstr("127.0.0.1:"));
    EXPECT_EQ(event.method(), "gradhub.v1.JobService/CreateJob");
  }
  const std::vector<v1::AuditEvent> rest_events =
      Events("actor=" + a.token_name + " method=CreateJob resource=" + rest_job.name());
  ASSERT_EQ(rest_events.size(), 2u);
  for (const v1::AuditEvent& event : rest_events) {
    EXPECT_EQ(event.outcome(), "OK");
    EXPECT_EQ(event.tenant(), a.name);
    EXPECT_EQ(event.transport(), "rest");
  }
  // The retry with another spec made nothing; its event names the job it collided with.
  const std::vector<v1::AuditEvent> refused =
      Events("actor=" + a.token_name + " method=CreateJob outcome=ALREADY_EXISTS");
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].resource(), "");
  EXPECT_THAT(refused[0].message(), HasSubstr(made.name()));
  // Five calls, five events: none twice, none lost.
  EXPECT_EQ(Events("actor=" + a.token_name + " method=CreateJob").size(), 5u);
  // The tenant reads its own creates.
  v1::ListAuditEventsResponse own;
  ASSERT_TRUE(List(a.bearer, "method=CreateJob", &own).ok());
  EXPECT_EQ(own.events_size(), 5);
}

TEST_F(AuditE2eTest, AdminCallsAndTheCheckpointStoresCallsOnBothTransports) {
  const Tenant a = NewTenant("ops");
  // The admin's own calls made by NewTenant, over gRPC.
  EXPECT_EQ(OnlyEvent("CreateTenant", a.name).actor(), "admin");
  const v1::AuditEvent token = OnlyEvent("CreateToken", a.token_name);
  EXPECT_EQ(token.tenant(), a.name);
  EXPECT_EQ(token.outcome(), "OK");
  // RevokeToken over REST; CordonNode of no such node over gRPC.
  const auto revoked = Rest(cluster_->api_http_port(), "POST", "/v1/" + a.token_name + ":revoke",
                            kAdminBearer, "{}");
  ASSERT_TRUE(revoked);
  EXPECT_EQ(revoked->status, 200) << revoked->body;
  EXPECT_EQ(OnlyEvent("RevokeToken", a.token_name).transport(), "rest");
  v1::CordonNodeRequest cordon;
  cordon.set_name("nodes/ghost-" + a.name.substr(8));
  cordon.set_cordon(true);
  v1::Node node;
  EXPECT_EQ(nodes_->CordonNode(Context(kAdminBearer).get(), cordon, &node).error_code(),
            grpc::StatusCode::NOT_FOUND);
  const v1::AuditEvent cordoned = OnlyEvent("CordonNode", cordon.name());
  EXPECT_EQ(cordoned.outcome(), "NOT_FOUND");
  EXPECT_EQ(cordoned.tenant(), "");

  // gradhub-checkpoint: DeleteCheckpoint over gRPC and REST, by a tenant with a fresh token.
  const Tenant c = NewTenant("store");
  const std::string job = CreateJob(c);
  v1::DeleteCheckpointRequest remove;
  remove.set_name(job + "/checkpoints/5");
  google::protobuf::Empty empty;
  EXPECT_EQ(checkpoints_->DeleteCheckpoint(Context(c.bearer).get(), remove, &empty).error_code(),
            grpc::StatusCode::NOT_FOUND);
  const auto deleted =
      Rest(cluster_->checkpoint_http_port(), "DELETE", "/v1/" + job + "/checkpoints/6", c.bearer);
  ASSERT_TRUE(deleted);
  EXPECT_EQ(deleted->status, 404);
  const v1::AuditEvent grpc_delete = OnlyEvent("DeleteCheckpoint", job + "/checkpoints/5");
  EXPECT_EQ(grpc_delete.actor(), c.token_name);
  EXPECT_EQ(grpc_delete.tenant(), c.name);
  EXPECT_EQ(grpc_delete.transport(), "grpc");
  EXPECT_EQ(OnlyEvent("DeleteCheckpoint", job + "/checkpoints/6").transport(), "rest");

  // UploadCode: `gradhub code push` (gRPC) names the archive; a bad body over REST is refused.
  testing::TempDir code;
  std::ofstream(code.path() + "/train.py") << "print('" << c.name << "')\n";
  const RunResult pushed = Cli(c.bearer, {"code", "push", code.path()});
  ASSERT_EQ(pushed.exit_code, 0) << pushed.err;
  const std::string digest = pushed.out.substr(0, pushed.out.find('\n'));  // sha256:<hex>
  const v1::AuditEvent upload = OnlyEvent("UploadCode", "code/" + digest.substr(7));
  EXPECT_EQ(upload.outcome(), "OK");
  EXPECT_EQ(upload.actor(), c.token_name);
  const auto garbage =
      Rest(cluster_->checkpoint_http_port(), "PUT", "/v1/code", c.bearer, "not a tar archive");
  ASSERT_TRUE(garbage);
  EXPECT_GE(garbage->status, 400);
  const std::vector<v1::AuditEvent> refused =
      Events("actor=" + c.token_name + " method=UploadCode");
  ASSERT_EQ(refused.size(), 2u);
  EXPECT_EQ(refused[0].transport(), "rest");
  EXPECT_NE(refused[0].outcome(), "OK");
  EXPECT_EQ(refused[0].tenant(), c.name);
}

TEST_F(AuditE2eTest, RestListingPagesAndNamesBadParameters) {
  const Tenant a = NewTenant("pages");
  for (int i = 0; i < 3; ++i) CreateJob(a);
  const int port = cluster_->api_http_port();
  const std::string filter = "?filter=method%3DCreateJob&pageSize=2";
  const auto first = Rest(port, "GET", "/v1/auditEvents" + filter, a.bearer);
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200) << first->body;
  v1::ListAuditEventsResponse page;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(first->body, &page).ok());
  ASSERT_EQ(page.events_size(), 2);
  ASSERT_FALSE(page.next_page_token().empty());
  const auto second = Rest(
      port, "GET", "/v1/auditEvents" + filter + "&pageToken=" + page.next_page_token(), a.bearer);
  ASSERT_TRUE(second);
  v1::ListAuditEventsResponse rest;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(second->body, &rest).ok());
  ASSERT_EQ(rest.events_size(), 1);
  EXPECT_TRUE(rest.next_page_token().empty());
  for (const v1::AuditEvent& seen : page.events()) EXPECT_NE(seen.name(), rest.events(0).name());

  for (const auto& [query, naming] : std::vector<std::pair<std::string, std::string>>{
           {"?pageToken=bogus", "page_token"},
           {"?filter=color%3Dred", "unknown key 'color'"},
           {"?pageSize=5000", "page_size"},
           {"?pageSize=x", "pageSize"}}) {
    const auto bad = Rest(port, "GET", "/v1/auditEvents" + query, a.bearer);
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 400) << query;
    EXPECT_THAT(bad->body, HasSubstr(naming)) << query;
  }
  const auto stranger = Rest(port, "GET", "/v1/auditEvents", "Bearer nope");
  ASSERT_TRUE(stranger);
  EXPECT_EQ(stranger->status, 401);
}

}  // namespace
}  // namespace gradhub
