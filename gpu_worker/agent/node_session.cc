#include "gpu_worker/agent/node_session.h"

#include <algorithm>

namespace gradhub::agent {

absl::Duration HeartbeatIntervalFrom(const google::protobuf::Duration& proto) {
  const absl::Duration interval = absl::Seconds(proto.seconds()) + absl::Nanoseconds(proto.nanos());
  if (interval <= absl::ZeroDuration()) return kDefaultHeartbeatInterval;
  return std::clamp(interval, kMinHeartbeatInterval, kMaxHeartbeatInterval);
}

void NodeSession::Start(const v1::RegisterNodeResponse& response, const std::string& described_name,
                        absl::Time now) {
  node_name_ = response.node().name().empty() ? described_name : response.node().name();
  session_id_ = response.session_id();
  interval_ = HeartbeatIntervalFrom(response.heartbeat_interval());
  seq_ = 0;
  registered_ = true;
  last_success_ = now;
}

void NodeSession::HeartbeatSucceeded(const v1::HeartbeatResponse& response, absl::Time now) {
  last_success_ = now;
  interval_ = HeartbeatIntervalFrom(response.heartbeat_interval());
}

bool RpcErrorLog::ShouldPrint(grpc::StatusCode code, absl::Time now) {
  if (code == last_code_ && now - last_print_ <= kPrintEvery) return false;
  last_code_ = code;
  last_print_ = now;
  return true;
}

bool RpcErrorLog::Recovered() {
  const bool was_failing = last_code_ != grpc::StatusCode::OK;
  last_code_ = grpc::StatusCode::OK;
  return was_failing;
}

}  // namespace gradhub::agent
