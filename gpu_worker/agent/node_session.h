// The agent's side of its registration (nodes.proto, agent.h steps 1, 2 and 6): the node's name
// and session as the server stored them, the seq of the session's heartbeats, the heartbeat
// interval the server asks for and when a heartbeat last succeeded. And which failed calls the
// agent prints (RpcErrorLog).
//
// Not thread-safe: the protocol loop's (Run()'s thread).
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "gradhub/v1/nodes.pb.h"

namespace gradhub::agent {

inline constexpr absl::Duration kDefaultHeartbeatInterval = absl::Seconds(5);
// Bounds on the server's heartbeat_interval, so that a bad value cannot spin or stall the agent.
inline constexpr absl::Duration kMinHeartbeatInterval = absl::Milliseconds(100);
inline constexpr absl::Duration kMaxHeartbeatInterval = absl::Minutes(5);

// The server's heartbeat_interval within the bounds above; unset or not positive: the default.
absl::Duration HeartbeatIntervalFrom(const google::protobuf::Duration& proto);

class NodeSession {
 public:
  // Step 1: RegisterNode answered. `described_name` is the name the agent asked for, kept
  // when the server's answer has none. The seq starts over; the registration counts as the
  // last success (step 7's grace runs from it).
  void Start(const v1::RegisterNodeResponse& response, const std::string& described_name,
             absl::Time now);
  // Step 6: the server ended the session; register again.
  void End() { registered_ = false; }
  bool registered() const { return registered_; }
  const std::string& node_name() const { return node_name_; }
  const std::string& session_id() const { return session_id_; }

  // Step 2: a new seq for every request, retries included, so that the server processes each
  // one it receives in order and ignores only late duplicates.
  int64_t NextSeq() { return ++seq_; }
  absl::Duration interval() const { return interval_; }
  // A Heartbeat answer: its interval, and `now` as the last success.
  void HeartbeatSucceeded(const v1::HeartbeatResponse& response, absl::Time now);
  absl::Duration SinceSuccess(absl::Time now) const { return now - last_success_; }

 private:
  std::string node_name_;  // nodes/<name>
  std::string session_id_;
  bool registered_ = false;
  int64_t seq_ = 0;
  absl::Duration interval_ = kDefaultHeartbeatInterval;
  absl::Time last_success_ = absl::InfinitePast();
};

// Which failed calls the agent prints: one whose code differs from the last one printed, else
// the same failure once kPrintEvery has passed since, so that an outage prints a line every
// 30 s rather than one per retry.
class RpcErrorLog {
 public:
  static constexpr absl::Duration kPrintEvery = absl::Seconds(30);

  // A call failed with `code` at `now`: whether to print it (then it counts as printed).
  bool ShouldPrint(grpc::StatusCode code, absl::Time now);
  // A call succeeded: whether that ends failures that were printed (to say so once).
  bool Recovered();

 private:
  grpc::StatusCode last_code_ = grpc::StatusCode::OK;
  absl::Time last_print_ = absl::InfinitePast();
};

}  // namespace gradhub::agent
