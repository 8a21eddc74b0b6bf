// StoreService as gradhub-api runs it (AuthorizeStoreCall over a real Authenticator and
// PostgreSQL), on loopback, with real job tokens: a rank (trainer or script) touches its own
// attempt's keys and nothing else (services/api/store_scope.h), and its token dies with its
// attempt.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "gradhub/v1/store.grpc.pb.h"
#include "services/api/rendezvous_store.h"
#include "services/api/store_scope.h"
#include "services/api/store_service.h"
#include "services/common/auth/authenticator.h"
#include "tests/integration/db/db_test_util.h"
#include "tests/integration/store_service/token_client.h"
#include "tests/support/grpc_test_server.h"

namespace gradhub::api {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr char kAdminToken[] = "store-admin-secret-for-tests";

using Rank = testing::TokenClient;

class StoreJobTokenTest : public db::DatabaseTest {
 protected:
  void SetUp() override {
    db::DatabaseTest::SetUp();
    Migrate();
    pool_ = MakePool(8);
    auth_ = std::make_unique<Authenticator>(pool_.get(), kAdminToken);
    service_ = std::make_unique<StoreService>(&store_, [this](const std::string& authorization) {
      return AuthorizeStoreCall(*auth_, authorization);
    });
    server_ =
        std::make_unique<testing::TestGrpcServer>(std::vector<AsyncGrpcService*>{service_.get()});
    tenant_ = *auth_->CreateTenant("team-a", "");
    job_ = InsertJob(tenant_, /*attempt=*/2);
    token_ = JobToken(job_, 2, 0);
  }
  void TearDown() override {
    server_.reset();  // before the service it serves
    service_.reset();
  }

  // A RUNNING job of `tenant` at `attempt`; its id.
  std::string InsertJob(int64_t tenant, int attempt) {
    auto job = pool_->Exec(
        "INSERT INTO jobs (tenant_id, spec, world_size, state, current_attempt)"
        " VALUES ($1, '{}'::jsonb, 8, 'RUNNING', $2) RETURNING id::text AS id",
        {tenant, attempt});
    EXPECT_TRUE(job.ok()) << job.status();
    return job->row(0).Get<std::string>("id");
  }
  std::string JobToken(const std::string& job, int attempt, int rank) {
    auto token = auth_->CreateJobToken(job, attempt, rank);
    EXPECT_TRUE(token.ok()) << token.status();
    return token->secret;
  }
  Rank As(const std::string& token) { return Rank(server_->NewChannel(), token); }
  // As gradhub.distributed keys it: under the attempt's prefix, then python/.
  std::string Key(const std::string& job, int attempt, const std::string& name) {
    return AttemptKeyPrefix(job, attempt) + "python/" + name;
  }

  std::unique_ptr<db::Pool> pool_;
  std::unique_ptr<Authenticator> auth_;
  RendezvousStore store_;
  std::unique_ptr<StoreService> service_;
  std::unique_ptr<testing::TestGrpcServer> server_;
  int64_t tenant_ = 0;
  std::string job_, token_;
};

TEST_F(StoreJobTokenTest, AJobTokenUsesEveryMethodOnItsOwnAttemptsKeys) {
  Rank rank = As(token_);
  ASSERT_TRUE(rank.Set(Key(job_, 2, "addr/0"), "10.0.0.1:4000").ok());
  std::string value;
  ASSERT_TRUE(rank.Get(Key(job_, 2, "addr/0"), &value).ok());
  EXPECT_EQ(value, "10.0.0.1:4000");
  int64_t count = 0;
  ASSERT_TRUE(rank.Add(Key(job_, 2, "count"), &count).ok());
  EXPECT_EQ(count, 1);
  EXPECT_TRUE(rank.Wait({Key(job_, 2, "addr/0"), Key(job_, 2, "count")}).ok());
  EXPECT_TRUE(rank.Check({Key(job_, 2, "count")}).ok());
  EXPECT_TRUE(rank.DeletePrefix(AttemptKeyPrefix(job_, 2)).ok());
  EXPECT_FALSE(*store_.Check({Key(job_, 2, "count")}));
}

TEST_F(StoreJobTokenTest, AnyKeyOutsideItsAttemptIsPermissionDeniedAndUntouched) {
  const std::string sibling = InsertJob(tenant_, 2);  // the same tenant's
  const std::string foreign = InsertJob(*auth_->CreateTenant("team-b", ""), 2);
  // Other attempts' keys, there beforehand, and keys in no attempt at all, which the scope
  // refuses before the store would call them malformed.
  const std::vector<std::string> theirs = {
      Key(sibling, 2, "addr/0"), Key(foreign, 2, "addr/0"), Key(job_, 1, "addr/0"),
      Key(job_, 3, "addr/0"),    Key(job_, 20, "addr/0"),  // attempt 2's prefix without its slash
  };
  std::vector<std::string> outside = theirs;
  outside.insert(outside.end(), {"x/addr/0", "jobs/" + job_ + "/python/addr/0"});
  Rank admin = As(kAdminToken);
  for (const std::string& key : theirs) ASSERT_TRUE(admin.Set(key, "theirs").ok()) << key;
  Rank rank = As(token_);
  for (const std::string& key : outside) {
    for (const grpc::Status& status :
         {rank.Set(key, "forged"), rank.Get(key), rank.Add(key), rank.Check({key}),
          rank.Wait({Key(job_, 2, "mine"), key}), rank.DeletePrefix(key)}) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << key;
      EXPECT_THAT(status.error_message(), HasSubstr(key));
    }
  }
  for (const std::string& prefix :
       {std::string("jobs/"), "jobs/" + job_ + "/", AttemptKeyPrefix(job_, 2).substr(1),
        "jobs/" + job_ + "/attempts/2"}) {
    const grpc::Status status = rank.DeletePrefix(prefix);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << prefix;
    EXPECT_THAT(status.error_message(), HasSubstr("prefix: "));
  }
  std::string value;
  for (const std::string& key : theirs) {
    ASSERT_TRUE(admin.Get(key, &value).ok()) << key;
    EXPECT_EQ(value, "theirs") << key;
  }
  EXPECT_EQ(service_->pending_waiters(), 0u);
}

TEST_F(StoreJobTokenTest, TheAdminTokenTouchesAnyAttemptTenantAndNodeTokensNone) {
  EXPECT_TRUE(As(kAdminToken).Set(Key(job_, 7, "x"), "v").ok());
  EXPECT_TRUE(As(kAdminToken).DeletePrefix(AttemptKeyPrefix(job_, 7)).ok());
  const std::string tenant = auth_->CreateTenantToken("team-a", "")->secret;
  const std::string node = auth_->CreateNodeToken("agents")->secret;
  for (const std::string& token : {tenant, node}) {
    for (const grpc::Status& refused :
         {As(token).Set(Key(job_, 2, "x")), As(token).Get(Key(job_, 2, "x")),
          As(token).DeletePrefix(AttemptKeyPrefix(job_, 2))}) {
      EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
      EXPECT_THAT(refused.error_message(), HasSubstr("not a tenant's or a node's"));
    }
  }
  for (const std::string& token : {std::string(), std::string("ghj_not-a-token")}) {
    EXPECT_EQ(As(token).Get(Key(job_, 2, "x")).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_FALSE(*store_.Check({Key(job_, 2, "x")}));
}

TEST_F(StoreJobTokenTest, TheTokenOfAnAttemptThatEndedIsRefusedEvenForItsOwnKeys) {
  Rank rank = As(token_);
  ASSERT_TRUE(rank.Set(Key(job_, 2, "a")).ok());
  // The attempt failed; attempt 3 runs. Not cached: the very next call sees it.
  ASSERT_TRUE(pool_->Exec("UPDATE jobs SET current_attempt = 3 WHERE id = $1::uuid", {job_}).ok());
  EXPECT_EQ(rank.Set(Key(job_, 2, "b")).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(rank.Get(Key(job_, 2, "a")).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  Rank next = As(JobToken(job_, 3, 0));
  ASSERT_TRUE(next.Set(Key(job_, 3, "a")).ok());
  // The job ended.
  ASSERT_TRUE(pool_->Exec("UPDATE jobs SET state = 'SUCCEEDED' WHERE id = $1::uuid", {job_}).ok());
  EXPECT_EQ(next.Set(Key(job_, 3, "b")).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_FALSE(*store_.Check({Key(job_, 2, "b")}));
  EXPECT_FALSE(*store_.Check({Key(job_, 3, "b")}));
}

// A c10d-style rendezvous of `world` ranks, each a thread with its own channel and token:
// count in (Add), publish an address (Set), wait for all (Wait), read all (Get each): 3 +
// world calls a rank. Returns the wall time.
Clock::duration Rendezvous(testing::TestGrpcServer& server, const std::vector<std::string>& tokens,
                           const std::string& prefix) {
  const int world = static_cast<int>(tokens.size());
  std::vector<std::string> addresses;
  for (int r = 0; r < world; ++r) addresses.push_back(prefix + "addr/" + std::to_string(r));
  std::vector<Rank> ranks;
  for (const std::string& token : tokens) ranks.emplace_back(server.NewChannel(), token);
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      Rank& rank = ranks[r];
      EXPECT_TRUE(rank.Add(prefix + "count").ok());
      EXPECT_TRUE(rank.Set(addresses[r], "host:" + std::to_string(r)).ok());
      EXPECT_TRUE(rank.Wait(addresses).ok());
      for (const std::string& address : addresses) EXPECT_TRUE(rank.Get(address).ok());
    });
  }
  for (std::thread& thread : threads) thread.join();
  return Clock::now() - start;
}

// Job tokens cost a database lookup per call (never cached). Every rank, trainers included,
// rendezvouses with one now: this measures what that adds to a rendezvous of 8 ranks (8 x 11 =
// 88 calls) against the same with the admin token (no lookup), as a node token used to cost.
TEST_F(StoreJobTokenTest, ARendezvousOfEightRanksWithJobTokens) {
  constexpr int kWorld = 8;
  std::vector<std::string> job_tokens, admin_tokens(kWorld, kAdminToken);
  for (int r = 0; r < kWorld; ++r) job_tokens.push_back(JobToken(job_, 2, r));
  // Warm: channels, PostgreSQL's plan cache.
  Rendezvous(*server_, job_tokens, AttemptKeyPrefix(job_, 2) + "warm/");
  Rendezvous(*server_, admin_tokens, AttemptKeyPrefix(job_, 2) + "warm-admin/");
  using std::chrono::microseconds;
  auto us = [](Clock::duration d) { return std::chrono::duration_cast<microseconds>(d).count(); };
  const auto with_job = us(Rendezvous(*server_, job_tokens, AttemptKeyPrefix(job_, 2) + "r1/"));
  const auto with_admin = us(Rendezvous(*server_, admin_tokens, AttemptKeyPrefix(job_, 2) + "r2/"));
  std::cout << "rendezvous of " << kWorld << " ranks (" << kWorld * (3 + kWorld)
            << " calls): job tokens " << with_job << " us, no token lookup " << with_admin
            << " us\n";
  RecordProperty("job_token_rendezvous_us", static_cast<int>(with_job));
  RecordProperty("no_lookup_rendezvous_us", static_cast<int>(with_admin));
}

}  // namespace
}  // namespace gradhub::api
