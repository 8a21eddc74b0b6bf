// The audit log's rules (services/common/audit/audited_calls.h), one test per rule: no
// database, no server.
#include "services/common/audit/audited_calls.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace gradhub::audit {
namespace {

using api::Principal;

constexpr char kJob[] = "jobs/0b9e2a0c-5a4e-4f8e-9a41-3c2d1e0f9a7b";

std::function<std::string(const std::string&)> Params(std::map<std::string, std::string> params) {
  return [params = std::move(params)](const std::string& name) {
    const auto found = params.find(name);
    return found == params.end() ? std::string() : found->second;
  };
}

Principal Tenant(const std::string& name, int64_t token_id) {
  Principal principal;
  principal.kind = Principal::Kind::kTenant;
  principal.tenant_name = name;
  principal.token_id = token_id;
  return principal;
}

Principal OfKind(Principal::Kind kind, int64_t token_id = 0) {
  Principal principal;
  principal.kind = kind;
  principal.token_id = token_id;
  return principal;
}

TEST(AuditedRpcsTest, ExactlyTheMutatingCallsOfTheIssue) {
  std::vector<std::string> methods;
  for (const AuditedRpc& rpc : AuditedRpcs()) methods.emplace_back(rpc.method);
  EXPECT_EQ(methods, (std::vector<std::string>{
                         "gradhub.v1.JobService/CreateJob",
                         "gradhub.v1.JobService/CancelJob",
                         "gradhub.v1.AdminService/CreateTenant",
                         "gradhub.v1.AdminService/CreateToken",
                         "gradhub.v1.AdminService/RevokeToken",
                         "gradhub.v1.NodeService/CordonNode",
                         "gradhub.v1.NodeService/DrainNode",
                         "gradhub.v1.CheckpointService/DeleteCheckpoint",
                         "gradhub.v1.CodeService/UploadCode",
                     }));
}

TEST(FindAuditedRpcTest, ByGrpcPathOrFullNameOnly) {
  const AuditedRpc* cancel = FindAuditedRpc("/gradhub.v1.JobService/CancelJob");
  ASSERT_NE(cancel, nullptr);
  EXPECT_EQ(cancel->method, "gradhub.v1.JobService/CancelJob");
  EXPECT_EQ(FindAuditedRpc("gradhub.v1.JobService/CancelJob"), cancel);
  for (const char* other : {"/gradhub.v1.JobService/GetJob", "/gradhub.v1.JobService/ListJobs",
                            "/gradhub.v1.NodeService/Heartbeat", "CancelJob", ""}) {
    EXPECT_EQ(FindAuditedRpc(other), nullptr) << other;
  }
}

TEST(MatchHttpCallTest, RoutesAsTheProtosRestCommentsSay) {
  const auto none = Params({});
  struct Case {
    const char* method;
    const char* path;
    const char* rpc;
    const char* target;
  };
  for (const Case& c : std::vector<Case>{
           {"POST", "/v1/jobs", "gradhub.v1.JobService/CreateJob", ""},
           {"POST", "/v1/jobs/abc:cancel", "gradhub.v1.JobService/CancelJob", "jobs/abc"},
           {"POST", "/v1/tenants/acme/tokens", "gradhub.v1.AdminService/CreateToken",
            "tenants/acme"},
           {"POST", "/v1/tenants/acme/tokens/7:revoke", "gradhub.v1.AdminService/RevokeToken",
            "tenants/acme/tokens/7"},
           {"POST", "/v1/nodes/n1:cordon", "gradhub.v1.NodeService/CordonNode", "nodes/n1"},
           {"POST", "/v1/nodes/n1:drain", "gradhub.v1.NodeService/DrainNode", "nodes/n1"},
           {"DELETE", "/v1/jobs/abc/checkpoints/40",
            "gradhub.v1.CheckpointService/DeleteCheckpoint", "jobs/abc/checkpoints/40"},
           {"PUT", "/v1/code", "gradhub.v1.CodeService/UploadCode", ""},
       }) {
    const std::optional<HttpCall> call = MatchHttpCall(c.method, c.path, none);
    ASSERT_TRUE(call.has_value()) << c.method << " " << c.path;
    EXPECT_EQ(call->rpc->method, c.rpc);
    EXPECT_EQ(call->target, c.target);
  }
  const std::optional<HttpCall> tenant =
      MatchHttpCall("POST", "/v1/tenants", Params({{"tenantId", "acme"}}));
  ASSERT_TRUE(tenant.has_value());
  EXPECT_EQ(tenant->target, "tenants/acme");
}

TEST(MatchHttpCallTest, ReadsAndOtherMethodsAreNotAudited) {
  const auto none = Params({});
  EXPECT_FALSE(MatchHttpCall("GET", "/v1/jobs", none));
  EXPECT_FALSE(MatchHttpCall("GET", "/v1/jobs/abc:cancel", none));
  EXPECT_FALSE(MatchHttpCall("POST", "/v1/jobs/abc:watch", none));
  EXPECT_FALSE(MatchHttpCall("PUT", "/v1/jobs/abc/checkpoints/3", none));  // a rank's upload
  EXPECT_FALSE(MatchHttpCall("POST", "/v1/jobs/a/b:cancel", none));
  EXPECT_FALSE(MatchHttpCall("POST", "/v1/jobs/:cancel", none));
}

TEST(ResourceOfTest, WhatACallMadeWhenItSucceededElseWhatItNamed) {
  EXPECT_EQ(ResourceOf(true, kJob, ""), kJob);  // CreateJob
  EXPECT_EQ(ResourceOf(false, "", ""), "");     // a refused CreateJob made nothing
  EXPECT_EQ(ResourceOf(true, "tenants/a/tokens/9", "tenants/a"), "tenants/a/tokens/9");
  EXPECT_EQ(ResourceOf(false, "", "tenants/a"), "tenants/a");
  EXPECT_EQ(ResourceOf(true, "", "jobs/x/checkpoints/4"), "jobs/x/checkpoints/4");  // Empty
}

TEST(ActorNameTest, AdminTokenNamesOrUnauthenticated) {
  EXPECT_EQ(ActorName(OfKind(Principal::Kind::kAdmin)), "admin");
  EXPECT_EQ(ActorName(Tenant("acme", 12)), "tenants/acme/tokens/12");
  EXPECT_EQ(ActorName(OfKind(Principal::Kind::kNode, 3)), "tenants/-/tokens/3");
  Principal job = OfKind(Principal::Kind::kJob, 44);
  job.tenant_name = "acme";  // the job's tenant; the token itself belongs to none
  EXPECT_EQ(ActorName(job), "tenants/-/tokens/44");
  EXPECT_EQ(ActorName(absl::UnauthenticatedError("missing or invalid bearer token")),
            "unauthenticated");
}

TEST(TenantOfTest, ATenantsCallsStayInItsOwnLog) {
  // Tenant b probing tenant a's job or tokens: b's event, never a's.
  EXPECT_EQ(TenantOf(Tenant("b", 1), kJob), "tenants/b");
  EXPECT_EQ(TenantOf(Tenant("b", 1), "tenants/a/tokens/3"), "tenants/b");
  Principal job = OfKind(Principal::Kind::kJob, 2);
  job.tenant_name = "c";
  EXPECT_EQ(TenantOf(job, kJob), "tenants/c");
}

TEST(TenantOfTest, OthersCallsBelongToTheTenantTheResourceNames) {
  for (const absl::StatusOr<Principal>& caller :
       {absl::StatusOr<Principal>(OfKind(Principal::Kind::kAdmin)),
        absl::StatusOr<Principal>(OfKind(Principal::Kind::kNode, 1)),
        absl::StatusOr<Principal>(absl::UnauthenticatedError("no"))}) {
    EXPECT_EQ(TenantOf(caller, "tenants/a"), "tenants/a");
    EXPECT_EQ(TenantOf(caller, "tenants/a/tokens/3"), "tenants/a");
    EXPECT_EQ(TenantOf(caller, "tenants/-/tokens/3"), "");  // a node token
    EXPECT_EQ(TenantOf(caller, "nodes/n1"), "");
    EXPECT_EQ(TenantOf(caller, kJob), "");  // the log finds the job's (JobOfResource)
    EXPECT_EQ(TenantOf(caller, ""), "");
  }
}

TEST(JobOfResourceTest, JobsAndTheirCheckpointsOnly) {
  const std::string id = std::string(kJob).substr(5);
  EXPECT_EQ(JobOfResource(kJob), id);
  EXPECT_EQ(JobOfResource(std::string(kJob) + "/checkpoints/40"), id);
  EXPECT_EQ(JobOfResource("jobs/not-a-uuid"), "");
  EXPECT_EQ(JobOfResource("nodes/n1"), "");
  EXPECT_EQ(JobOfResource("tenants/a"), "");
}

TEST(OutcomeTest, GrpcCodeNamesBothWays) {
  EXPECT_EQ(OutcomeName(absl::StatusCode::kOk), "OK");
  EXPECT_EQ(OutcomeName(absl::StatusCode::kPermissionDenied), "PERMISSION_DENIED");
  EXPECT_EQ(OutcomeName(absl::StatusCode::kUnauthenticated), "UNAUTHENTICATED");
  for (int number = 0; number <= 16; ++number) {
    const auto code = static_cast<absl::StatusCode>(number);
    EXPECT_EQ(OutcomeCode(OutcomeName(code)), code);
  }
  EXPECT_FALSE(OutcomeCode("not_found"));
  EXPECT_FALSE(OutcomeCode("FAILED"));
  EXPECT_FALSE(OutcomeCode(""));
}

TEST(BoundedTextTest, ValidUtf8WithoutNulWithinItsCharacters) {
  EXPECT_EQ(BoundedText("plain", 10), "plain");
  EXPECT_EQ(BoundedText(std::string("a\0b", 3), 10),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(BoundedText("a\xFF"
                        "b",
                        10),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(BoundedText("\xC0\xAF", 10), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong '/'
  EXPECT_EQ(BoundedText("\xED\xA0\x80", 10), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(BoundedText("\xE2\x82", 10), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // cut short
  // Characters, not bytes: 3 of "é" is 6 bytes.
  EXPECT_EQ(BoundedText("\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9", 3), "\xC3\xA9\xC3\xA9\xC3\xA9");
  EXPECT_EQ(BoundedText(std::string(600, 'x'), kMaxMessageChars).size(), 512u);
  EXPECT_EQ(BoundedText("\xF0\x9F\x98\x80", 1), "\xF0\x9F\x98\x80");  // U+1F600, 4 bytes
}

TEST(PeerAddressTest, HostAndPortFromEitherTransport) {
  EXPECT_EQ(GrpcPeerAddress("ipv4:127.0.0.1:5000"), "127.0.0.1:5000");
  EXPECT_EQ(GrpcPeerAddress("ipv6:[::1]:5000"), "[::1]:5000");
  EXPECT_EQ(GrpcPeerAddress("unix:/tmp/s"), "unix:/tmp/s");
  EXPECT_EQ(HttpPeerAddress("127.0.0.1", 5000), "127.0.0.1:5000");
  EXPECT_EQ(HttpPeerAddress("::1", 5000), "[::1]:5000");
}

}  // namespace
}  // namespace gradhub::audit
