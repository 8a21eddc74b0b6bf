#include "services/common/grpc_retry.h"

#include <gtest/gtest.h>

namespace gradhub {
namespace {

using grpc::StatusCode;

TEST(GrpcRetryTest, TransientFailuresAreRetryable) {
  for (StatusCode code : {StatusCode::UNAVAILABLE, StatusCode::DEADLINE_EXCEEDED,
                          StatusCode::CANCELLED, StatusCode::UNKNOWN, StatusCode::INTERNAL,
                          StatusCode::RESOURCE_EXHAUSTED, StatusCode::ABORTED}) {
    EXPECT_TRUE(IsTransient(code)) << code;
    EXPECT_TRUE(IsRetryable(code)) << code;
  }
}

// The deliberate choice of grpc_retry.h: a refused token is retried within the caller's
// deadline (a rotation race, a replica behind), as the agent's heartbeats always did.
TEST(GrpcRetryTest, UnauthenticatedIsRetryable) {
  EXPECT_TRUE(IsRetryable(StatusCode::UNAUTHENTICATED));
  EXPECT_TRUE(IsRetryable(grpc::Status(StatusCode::UNAUTHENTICATED, "missing or invalid token")));
  // By a node's clients, not by a person at a terminal: the CLI shows it at once.
  EXPECT_FALSE(IsTransient(StatusCode::UNAUTHENTICATED));
}

TEST(GrpcRetryTest, AnswersAboutTheRequestAreFinal) {
  for (StatusCode code :
       {StatusCode::INVALID_ARGUMENT, StatusCode::NOT_FOUND, StatusCode::ALREADY_EXISTS,
        StatusCode::PERMISSION_DENIED, StatusCode::FAILED_PRECONDITION, StatusCode::OUT_OF_RANGE,
        StatusCode::UNIMPLEMENTED, StatusCode::DATA_LOSS}) {
    EXPECT_FALSE(IsRetryable(code)) << code;
    EXPECT_FALSE(IsTransient(code)) << code;
  }
}

TEST(GrpcRetryTest, SuccessIsNotRetried) {
  EXPECT_FALSE(IsRetryable(StatusCode::OK));
  EXPECT_FALSE(IsRetryable(grpc::Status::OK));
}

TEST(GrpcRetryTest, ClientBackoffIsJitteredAndCapped) {
  Backoff backoff(kGrpcBackoff, /*seed=*/3);
  std::chrono::nanoseconds last{};
  for (int i = 0; i < 20; ++i) last = backoff.Next();
  EXPECT_LE(last, std::chrono::milliseconds(6000));
  EXPECT_GE(last, std::chrono::milliseconds(4000));
  EXPECT_GT(kGrpcBackoff.jitter, 0);
}

}  // namespace
}  // namespace gradhub
