// The rendezvous store's key scope (services/api/store_scope.h) without a server or a
// database: a test per rule, named after it. store_job_token_test runs the same rules through
// gRPC with real tokens.
#include "services/api/store_scope.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gradhub/v1/store.pb.h"

namespace gradhub::api {
namespace {

using ::testing::HasSubstr;

constexpr char kJob[] = "0b7e3c1a-7d2f-4c55-9a51-3f1f0c2e9d10";

Principal Of(Principal::Kind kind) {
  Principal principal;
  principal.kind = kind;
  return principal;
}

Principal JobToken(const std::string& job_id, int32_t attempt) {
  Principal principal = Of(Principal::Kind::kJob);
  principal.tenant_id = 3;
  principal.job_id = job_id;
  principal.attempt = attempt;
  principal.rank = 1;
  return principal;
}

TEST(StoreScopeRule1, TheAdminTokenTouchesAnyKey) {
  const absl::StatusOr<std::string> scope = StoreScopeOf(Of(Principal::Kind::kAdmin));
  ASSERT_TRUE(scope.ok()) << scope.status();
  EXPECT_EQ(*scope, kAnyKey);
  EXPECT_TRUE(CheckKeyInScope(*scope, "key", "anything/at/all").ok());
  EXPECT_TRUE(CheckKeyInScope(*scope, "prefix", "jobs/").ok());
}

TEST(StoreScopeRule2, AJobTokenIsConfinedToItsAttemptsPrefix) {
  const absl::StatusOr<std::string> scope = StoreScopeOf(JobToken(kJob, 2));
  ASSERT_TRUE(scope.ok()) << scope.status();
  EXPECT_EQ(*scope, std::string("jobs/") + kJob + "/attempts/2/");
  EXPECT_EQ(*scope, AttemptKeyPrefix(kJob, 2));
  EXPECT_TRUE(CheckKeyInScope(*scope, "key", *scope + "python/addr/0").ok());
  EXPECT_TRUE(CheckKeyInScope(*scope, "prefix", *scope).ok());  // DeletePrefix of all its keys
}

TEST(StoreScopeRule2, AJobTokenThatNamesNoAttemptIsRefused) {
  for (const Principal& principal : {JobToken("", 2), JobToken(kJob, 0), JobToken(kJob, -1)}) {
    const absl::StatusOr<std::string> scope = StoreScopeOf(principal);
    EXPECT_TRUE(absl::IsPermissionDenied(scope.status())) << principal.job_id << principal.attempt;
  }
}

TEST(StoreScopeRule3, ATenantTokenGetsNoStoreAccess) {
  const absl::StatusOr<std::string> scope = StoreScopeOf(Of(Principal::Kind::kTenant));
  EXPECT_TRUE(absl::IsPermissionDenied(scope.status())) << scope.status();
  EXPECT_THAT(scope.status().message(), HasSubstr("job token"));
}

TEST(StoreScopeRule3, ANodeTokenGetsNoStoreAccess) {
  const absl::StatusOr<std::string> scope = StoreScopeOf(Of(Principal::Kind::kNode));
  EXPECT_TRUE(absl::IsPermissionDenied(scope.status())) << scope.status();
  EXPECT_THAT(scope.status().message(), HasSubstr("not a tenant's or a node's"));
}

TEST(StoreScopeRule4, AKeyOutsideTheScopeIsPermissionDeniedNamingFieldAndKey) {
  const std::string scope = AttemptKeyPrefix(kJob, 2);
  const std::vector<std::string> outside = {
      AttemptKeyPrefix("another-job", 2) + "addr",
      AttemptKeyPrefix(kJob, 1) + "addr",
      AttemptKeyPrefix(kJob, 20) + "addr",  // "attempts/2" is a string prefix of it
      std::string("jobs/") + kJob + "/attempts/2",
      "jobs/",
      "addr",
      "",
  };
  for (const std::string& key : outside) {
    const absl::Status status = CheckKeyInScope(scope, "prefix", key);
    EXPECT_TRUE(absl::IsPermissionDenied(status)) << key;
    EXPECT_THAT(status.message(), HasSubstr("prefix: \"" + key + "\""));
    EXPECT_THAT(status.message(), HasSubstr(scope));
  }
}

TEST(StoreScopeRule4, AKeyInTheMessageIsEscapedAndCut) {
  const std::string key = std::string("\x01\n", 2) + std::string(1000, 'k');
  const absl::Status status = CheckKeyInScope(AttemptKeyPrefix(kJob, 2), "key", key);
  EXPECT_THAT(status.message(), HasSubstr("\\x01\\n"));
  EXPECT_THAT(status.message(), HasSubstr("kkk...\""));
  EXPECT_LT(status.message().size(), 400u);
}

TEST(StoreScopeRule4, EveryKeyOfAListIsCheckedAndTheFirstOutsideNamedByIndex) {
  const std::string scope = AttemptKeyPrefix(kJob, 2);
  v1::WaitRequest wait;  // the proto's repeated field, as StoreService passes it
  wait.add_keys(scope + "a");
  wait.add_keys(scope + "b");
  EXPECT_TRUE(CheckKeysInScope(scope, "keys", wait.keys()).ok());
  wait.add_keys(AttemptKeyPrefix(kJob, 1) + "c");
  wait.add_keys("d");
  const absl::Status status = CheckKeysInScope(scope, "keys", wait.keys());
  EXPECT_TRUE(absl::IsPermissionDenied(status));
  EXPECT_THAT(status.message(), HasSubstr("keys[2]: "));
  EXPECT_TRUE(CheckKeysInScope(kAnyKey, "keys", wait.keys()).ok());
  EXPECT_TRUE(CheckKeysInScope(scope, "keys", std::vector<std::string>{}).ok());
}

}  // namespace
}  // namespace gradhub::api
