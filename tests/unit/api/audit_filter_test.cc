// ListAuditEvents' pure rules (services/api/audit_reader.h): the filter's grammar with errors
// naming the field, page sizes, and opaque page tokens checked against their filter.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "services/api/audit_reader.h"

namespace gradhub::api {
namespace {

using ::testing::HasSubstr;

void ExpectRefused(const std::string& filter, const std::string& naming) {
  const absl::StatusOr<audit::AuditFilter> parsed = ParseAuditFilter(filter);
  ASSERT_FALSE(parsed.ok()) << filter;
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << filter;
  EXPECT_THAT(parsed.status().message(), HasSubstr(naming)) << filter;
}

TEST(ParseAuditFilterTest, TermsSeparatedBySpaces) {
  const absl::StatusOr<audit::AuditFilter> parsed = ParseAuditFilter(
      "tenant=tenants/acme  actor=tenants/acme/tokens/3 method=CancelJob "
      "resource=jobs/x outcome=NOT_FOUND");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tenant, "tenants/acme");
  EXPECT_EQ(parsed->actor, "tenants/acme/tokens/3");
  EXPECT_EQ(parsed->method, "CancelJob");
  EXPECT_EQ(parsed->resource, "jobs/x");
  EXPECT_EQ(parsed->outcome, "NOT_FOUND");
  const absl::StatusOr<audit::AuditFilter> empty = ParseAuditFilter("");
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->tenant || empty->actor || empty->method || empty->resource || empty->outcome);
}

TEST(ParseAuditFilterTest, ErrorsNameTheKeyOrTerm) {
  ExpectRefused("tenant", "'tenant' is not key=value");
  ExpectRefused("=x", "'=x' is not key=value");
  ExpectRefused("who=admin", "unknown key 'who' (tenant, actor, method, resource, outcome)");
  ExpectRefused("actor=admin actor=unauthenticated", "actor given twice");
  ExpectRefused("tenant=acme", "tenant 'acme' is not tenants/{tenant_id}");
  ExpectRefused("tenant=tenants/Acme", "tenant 'tenants/Acme'");
  ExpectRefused("outcome=not_found", "outcome 'not_found' is not OK or a gRPC status code name");
  ExpectRefused(std::string("resource=a\0b", 12), "the value of resource must be valid UTF-8");
  ExpectRefused("actor=\xFF", "the value of actor must be valid UTF-8");
  ExpectRefused("resource=" + std::string(513, 'x'), "at most 512 characters");
}

TEST(AuditPageSizeTest, OneToAThousandZeroIsAHundred) {
  EXPECT_EQ(*AuditPageSize(0), 100);
  EXPECT_EQ(*AuditPageSize(1), 1);
  EXPECT_EQ(*AuditPageSize(1000), 1000);
  for (int32_t bad : {-1, 1001}) {
    const absl::StatusOr<int32_t> size = AuditPageSize(bad);
    ASSERT_FALSE(size.ok());
    EXPECT_THAT(size.status().message(), HasSubstr("page_size"));
  }
}

TEST(AuditPageTokenTest, OpaqueAndBoundToItsFilter) {
  audit::AuditFilter filter;
  filter.tenant = "tenants/acme";
  const std::string token = AuditPageToken(42, filter);
  EXPECT_EQ(token.find("42"), std::string::npos) << "opaque: " << token;
  EXPECT_EQ(*AuditPageTokenBefore(token, filter), 42);

  audit::AuditFilter other = filter;
  other.tenant = "tenants/other";
  const absl::StatusOr<int64_t> elsewhere = AuditPageTokenBefore(token, other);
  ASSERT_FALSE(elsewhere.ok());
  EXPECT_THAT(elsewhere.status().message(), HasSubstr("page_token: returned for another filter"));
  audit::AuditFilter unset;  // no tenant differs from any tenant
  EXPECT_FALSE(AuditPageTokenBefore(token, unset).ok());
}

TEST(AuditPageTokenTest, ForgedOrMangledTokensAreInvalidArgumentNamingIt) {
  const audit::AuditFilter filter;
  const std::string good = AuditPageToken(7, filter);
  for (const std::string& bad :
       {std::string("7"), std::string("!!!"), good.substr(1), good + "x", AuditPageToken(0, filter),
        AuditPageToken(-5, filter), std::string("\0", 1),
        absl::WebSafeBase64Escape("99999999999999999999999.0123456789abcdef")}) {
    const absl::StatusOr<int64_t> before = AuditPageTokenBefore(bad, filter);
    ASSERT_FALSE(before.ok()) << bad;
    EXPECT_EQ(before.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(before.status().message(), HasSubstr("page_token")) << bad;
  }
}

}  // namespace
}  // namespace gradhub::api
