// Authenticator against a real PostgreSQL: who a token belongs to, what is refused, and that
// no secret is stored in clear.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "services/common/auth/authenticator.h"
#include "tests/integration/db/db_test_util.h"

namespace gradhub::api {
namespace {

using ::testing::HasSubstr;

class AuthenticatorTest : public db::DatabaseTest {
 protected:
  void SetUp() override {
    db::DatabaseTest::SetUp();
    Migrate();
    pool_ = MakePool(2);
    auth_ = std::make_unique<Authenticator>(pool_.get(), "admin-secret");
  }
  std::unique_ptr<db::Pool> pool_;
  std::unique_ptr<Authenticator> auth_;
};

TEST_F(AuthenticatorTest, TokensNameTheirTenantOrNode) {
  auto a = auth_->CreateTenant("team-a", "Team A");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(auth_->CreateTenant("team-b", "").ok());
  auto token_a = auth_->CreateTenantToken("team-a", "ci");
  auto token_b = auth_->CreateTenantToken("team-b", "");
  auto node = auth_->CreateNodeToken("agents");
  ASSERT_TRUE(token_a.ok() && token_b.ok() && node.ok());
  EXPECT_NE(token_a->secret, token_b->secret);

  auto who = auth_->Authenticate("Bearer " + token_a->secret);
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->kind, Principal::Kind::kTenant);
  EXPECT_EQ(who->tenant_id, *a);
  EXPECT_EQ(who->tenant_name, "team-a");
  EXPECT_EQ(auth_->Authenticate("Bearer " + token_b->secret)->tenant_name, "team-b");
  EXPECT_EQ(auth_->Authenticate("Bearer " + node->secret)->kind, Principal::Kind::kNode);
  EXPECT_EQ(auth_->Authenticate("Bearer admin-secret")->kind, Principal::Kind::kAdmin);
}

TEST_F(AuthenticatorTest, MissingWrongRevokedAndMalformedAreUnauthenticated) {
  ASSERT_TRUE(auth_->CreateTenant("team-a", "").ok());
  auto token = auth_->CreateTenantToken("team-a", "");
  ASSERT_TRUE(token.ok());
  for (const std::string& header :
       {std::string(), std::string("Bearer "), token->secret, "Basic " + token->secret,
        "Bearer " + token->secret + "x", std::string("Bearer admin-secre")}) {
    EXPECT_EQ(auth_->Authenticate(header).status().code(), absl::StatusCode::kUnauthenticated)
        << header;
  }
  ASSERT_TRUE(pool_->Exec("UPDATE api_tokens SET revoke_time = now()").ok());
  EXPECT_EQ(auth_->Authenticate("Bearer " + token->secret).status().code(),
            absl::StatusCode::kUnauthenticated);
  Authenticator no_admin(pool_.get(), "");
  EXPECT_EQ(no_admin.Authenticate("Bearer ").status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(AuthenticatorTest, RevokingThroughTheAuthenticatorTakesEffectAtOnceDespiteTheCache) {
  ASSERT_TRUE(auth_->CreateTenant("team-a", "").ok());
  auto token = auth_->CreateTenantToken("team-a", "");
  ASSERT_TRUE(token.ok());
  const std::string header = "Bearer " + token->secret;
  ASSERT_TRUE(auth_->Authenticate(header).ok());
  // Behind the cache's back (another replica revoking): trusted until the entry expires...
  ASSERT_TRUE(pool_->Exec("UPDATE api_tokens SET revoke_time = now()").ok());
  EXPECT_TRUE(auth_->Authenticate(header).ok()) << "cached for kTokenCacheTtl";
  Authenticator other_replica(pool_.get(), "");
  EXPECT_EQ(other_replica.Authenticate(header).status().code(), absl::StatusCode::kUnauthenticated);
  // ...but a revocation through this instance is refused here at once.
  ASSERT_TRUE(auth_->RevokeToken("team-a", token->id).ok());
  EXPECT_EQ(auth_->Authenticate(header).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(AuthenticatorTest, SecretsAreNotStoredInClear) {
  ASSERT_TRUE(auth_->CreateTenant("team-a", "").ok());
  auto token = auth_->CreateTenantToken("team-a", "laptop");
  ASSERT_TRUE(token.ok());
  auto dump = pool_->Exec(
      "SELECT count(*)::bigint AS n FROM api_tokens t"
      " WHERE position($1 IN row_to_json(t)::text) > 0"
      " OR position(substr($1, 11) IN row_to_json(t)::text) > 0",
      {token->secret});
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_EQ(dump->row(0).Get<int64_t>("n"), 0);
}

TEST_F(AuthenticatorTest, TenantNamesAreCheckedAndUnique) {
  EXPECT_THAT(auth_->CreateTenant("Team A", "").status().message(), HasSubstr("name"));
  ASSERT_TRUE(auth_->CreateTenant("team-a", "").ok());
  EXPECT_EQ(auth_->CreateTenant("team-a", "").status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(auth_->CreateTenantToken("nobody", "").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(AuthenticatorTest, TenantTextsAreRefusedByNameNotCutOrSentToTheDatabase) {
  EXPECT_THAT(auth_->CreateTenant("team-a", std::string("A\0B", 3)).status().message(),
              HasSubstr("display_name: holds a NUL character"));
  std::string id;
  for (int i = 0; i < 64; ++i) id += "\xc3\xa9";  // 64 characters, 128 bytes
  EXPECT_TRUE(auth_->CreateTenant("team-a", "", id).ok());
  EXPECT_THAT(auth_->CreateTenant("team-b", "", id + "x").status().message(),
              HasSubstr("request_id: is 65 characters long; at most 64"));
}

}  // namespace
}  // namespace gradhub::api
