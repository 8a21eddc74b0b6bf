// The agent's small parts alone: LoopWaker (no wake-up lost, news cleared by the loop),
// NodeSession (a registration, seqs, the server's interval within bounds, the last success)
// and RpcErrorLog (a failure printed when it changes, else every 30 s; recovery said once).
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "gpu_worker/agent/loop_waker.h"
#include "gpu_worker/agent/node_session.h"

namespace gradhub::agent {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1700000000);

google::protobuf::Duration ProtoDuration(int64_t seconds, int32_t nanos = 0) {
  google::protobuf::Duration proto;
  proto.set_seconds(seconds);
  proto.set_nanos(nanos);
  return proto;
}

TEST(LoopWakerTest, NewsBeforeTheSleepEndsItAtOnce) {
  LoopWaker waker;
  waker.Notify();
  const absl::Time start = absl::Now();
  waker.SleepUntil(absl::Now() + absl::Seconds(30));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(waker.news());
  waker.ClearNews();
  EXPECT_FALSE(waker.news());
}

TEST(LoopWakerTest, NewsAndShutdownWakeASleeper) {
  LoopWaker waker;
  std::thread notifier([&] {
    absl::SleepFor(absl::Milliseconds(50));
    waker.Notify();
  });
  const absl::Time start = absl::Now();
  waker.SleepUntil(absl::Now() + absl::Seconds(30));
  notifier.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  waker.ClearNews();
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(50));
    waker.Shutdown();
  });
  waker.SleepUntil(absl::Now() + absl::Seconds(30));
  stopper.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(waker.shutdown());
  EXPECT_FALSE(waker.news());
}

TEST(LoopWakerTest, WithoutNewsItSleepsUntilTheDeadline) {
  LoopWaker waker;
  const absl::Time deadline = absl::Now() + absl::Milliseconds(100);
  waker.SleepUntil(deadline);
  EXPECT_GE(absl::Now(), deadline);
}

TEST(HeartbeatIntervalFromTest, TheServersValueWithinBounds) {
  EXPECT_EQ(HeartbeatIntervalFrom(ProtoDuration(2, 500000000)), absl::Milliseconds(2500));
  EXPECT_EQ(HeartbeatIntervalFrom(ProtoDuration(0)), kDefaultHeartbeatInterval);
  EXPECT_EQ(HeartbeatIntervalFrom(ProtoDuration(-3)), kDefaultHeartbeatInterval);
  EXPECT_EQ(HeartbeatIntervalFrom(ProtoDuration(0, 1000)), kMinHeartbeatInterval);
  EXPECT_EQ(HeartbeatIntervalFrom(ProtoDuration(3600)), kMaxHeartbeatInterval);
}

TEST(NodeSessionTest, ARegistrationStartsTheSeqOverAndCountsAsASuccess) {
  NodeSession session;
  EXPECT_FALSE(session.registered());
  EXPECT_EQ(session.interval(), kDefaultHeartbeatInterval);
  v1::RegisterNodeResponse response;
  response.set_session_id("s1");
  *response.mutable_heartbeat_interval() = ProtoDuration(1);
  session.Start(response, "nodes/asked", kNow);
  EXPECT_TRUE(session.registered());
  EXPECT_EQ(session.node_name(), "nodes/asked");  // the server sent no name
  EXPECT_EQ(session.session_id(), "s1");
  EXPECT_EQ(session.interval(), absl::Seconds(1));
  EXPECT_EQ(session.SinceSuccess(kNow + absl::Seconds(4)), absl::Seconds(4));
  EXPECT_EQ(session.NextSeq(), 1);
  EXPECT_EQ(session.NextSeq(), 2);  // every request, retries included

  session.End();
  EXPECT_FALSE(session.registered());
  response.mutable_node()->set_name("nodes/stored");
  response.set_session_id("s2");
  session.Start(response, "nodes/asked", kNow + absl::Seconds(10));
  EXPECT_EQ(session.node_name(), "nodes/stored");
  EXPECT_EQ(session.session_id(), "s2");
  EXPECT_EQ(session.NextSeq(), 1);
}

TEST(NodeSessionTest, AHeartbeatAnswerSetsTheIntervalAndTheLastSuccess) {
  NodeSession session;
  session.Start(v1::RegisterNodeResponse(), "nodes/a", kNow);
  v1::HeartbeatResponse response;
  *response.mutable_heartbeat_interval() = ProtoDuration(7);
  session.HeartbeatSucceeded(response, kNow + absl::Minutes(1));
  EXPECT_EQ(session.interval(), absl::Seconds(7));
  EXPECT_EQ(session.SinceSuccess(kNow + absl::Minutes(1)), absl::ZeroDuration());
}

TEST(RpcErrorLogTest, PrintsAChangedFailureAtOnceAndARepeatedOneEvery30Seconds) {
  RpcErrorLog log;
  EXPECT_TRUE(log.ShouldPrint(grpc::StatusCode::UNAVAILABLE, kNow));
  EXPECT_FALSE(log.ShouldPrint(grpc::StatusCode::UNAVAILABLE, kNow + absl::Seconds(30)));
  EXPECT_TRUE(log.ShouldPrint(grpc::StatusCode::UNAUTHENTICATED, kNow + absl::Seconds(31)));
  EXPECT_FALSE(log.ShouldPrint(grpc::StatusCode::UNAUTHENTICATED, kNow + absl::Seconds(40)));
  EXPECT_TRUE(log.ShouldPrint(grpc::StatusCode::UNAUTHENTICATED, kNow + absl::Seconds(62)));
}

TEST(RpcErrorLogTest, ARecoveryIsSaidOnceAndTheNextFailurePrints) {
  RpcErrorLog log;
  EXPECT_FALSE(log.Recovered());  // nothing failed
  ASSERT_TRUE(log.ShouldPrint(grpc::StatusCode::UNAVAILABLE, kNow));
  EXPECT_TRUE(log.Recovered());
  EXPECT_FALSE(log.Recovered());
  EXPECT_TRUE(log.ShouldPrint(grpc::StatusCode::UNAVAILABLE, kNow + absl::Seconds(1)));
}

}  // namespace
}  // namespace gradhub::agent
