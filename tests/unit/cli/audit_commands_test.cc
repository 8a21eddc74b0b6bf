// `gradhub admin audit` without a server: the filter its flags make, and its table.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "services/cli/audit_commands.h"
#include "services/cli/output.h"

namespace gradhub::cli {
namespace {

using ::testing::HasSubstr;

TEST(AuditFilterForTest, OneTermPerFlagGiven) {
  EXPECT_EQ(*AuditFilterFor({}), "");
  EXPECT_EQ(*AuditFilterFor({.tenant = "acme", .outcome = "not_found"}),
            "tenant=tenants/acme outcome=NOT_FOUND");
  EXPECT_EQ(*AuditFilterFor({.tenant = "tenants/acme",
                             .actor = "tenants/acme/tokens/3",
                             .method = "CancelJob",
                             .resource = "jobs/x"}),
            "tenant=tenants/acme actor=tenants/acme/tokens/3 method=CancelJob resource=jobs/x");
}

TEST(AuditFilterForTest, ValuesTheGrammarCannotHoldNameTheirFlag) {
  const absl::StatusOr<std::string> spaced = AuditFilterFor({.actor = "a b"});
  ASSERT_FALSE(spaced.ok());
  EXPECT_THAT(spaced.status().message(), HasSubstr("--actor: 'a b'"));
  const absl::StatusOr<std::string> equals = AuditFilterFor({.resource = "x=y"});
  ASSERT_FALSE(equals.ok());
  EXPECT_THAT(equals.status().message(), HasSubstr("--resource"));
}

TEST(AuditEventsTableTest, OneRowPerEventMessagesOnOneShortLine) {
  v1::AuditEvent ok, refused;
  ok.set_actor("tenants/a/tokens/3");
  ok.set_tenant("tenants/a");
  ok.set_method("gradhub.v1.JobService/CancelJob");
  ok.set_resource("jobs/x");
  ok.set_outcome("OK");
  ok.set_transport("rest");
  ok.mutable_time()->set_seconds(1700000000);
  refused.set_actor("unauthenticated");
  refused.set_method("gradhub.v1.NodeService/DrainNode");
  refused.set_outcome("UNAUTHENTICATED");
  refused.set_transport("grpc");
  refused.set_message("first line\nsecond " + std::string(80, 'x'));
  const std::string table = AuditEventsTable({&ok, &refused});
  EXPECT_THAT(table, HasSubstr("TIME"));
  EXPECT_THAT(table, HasSubstr("2023-11-14T22:13:20Z  tenants/a/tokens/3  tenants/a"));
  EXPECT_THAT(table, HasSubstr("JobService/CancelJob"));
  EXPECT_THAT(table, ::testing::Not(HasSubstr("gradhub.v1.")));
  EXPECT_THAT(table, HasSubstr("first line second xxx"));
  EXPECT_THAT(table, HasSubstr("x...\n"));
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 3);
}

}  // namespace
}  // namespace gradhub::cli
