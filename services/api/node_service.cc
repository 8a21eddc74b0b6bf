#include "services/api/node_service.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <string>

#include "absl/time/clock.h"

#include "services/api/job_service.h"
#include "services/common/grpc_status.h"

namespace gradhub::api {
namespace {

// A stream that saw no change sends its set again this often: a proxy or load balancer in
// between never sees it idle long enough to cut it.
constexpr absl::Duration kWatchKeepalive = absl::Seconds(30);

}  // namespace

absl::Status NodeService::Require(const grpc::ServerContext& context, Principal::Kind kind) const {
  absl::StatusOr<Principal> principal = auth_->Authenticate(AuthorizationOf(context));
  if (!principal.ok()) return principal.status();
  if (principal->kind == kind) return absl::OkStatus();
  return absl::PermissionDeniedError(kind == Principal::Kind::kNode
                                         ? "the agent protocol takes a node token"
                                         : "node administration takes the admin token");
}

absl::Status NodeService::RequireAgent(const grpc::ServerContext& context,
                                       const std::optional<std::string>& node) const {
  if (absl::Status token = Require(context, Principal::Kind::kNode); !token.ok()) return token;
  // NodeId: "nodes/a" and "a" name the same node; a malformed name matches no certificate.
  return CheckNodeIdentity(
      PeerCertificateOf(context), options_.require_client_certificate,
      node.has_value() ? std::optional<std::string>(NodeId(*node)) : std::nullopt);
}

grpc::Status NodeService::RegisterNode(grpc::ServerContext* context,
                                       const v1::RegisterNodeRequest* request,
                                       v1::RegisterNodeResponse* response) {
  if (auto status = RequireAgent(*context, request->node().name()); !status.ok()) {
    return ToGrpc(status);
  }
  grpc::Status answer = Answer(nodes_->RegisterNode(*request), response);
  if (on_change_) on_change_();
  return answer;
}

grpc::Status NodeService::Heartbeat(grpc::ServerContext* context,
                                    const v1::HeartbeatRequest* request,
                                    v1::HeartbeatResponse* response) {
  if (auto status = RequireAgent(*context, request->node()); !status.ok()) return ToGrpc(status);
  grpc::Status answer = Answer(nodes_->Heartbeat(*request), response);
  // A rank that exited, started or freed its slot is for the scheduler to act on now.
  for (const v1::RankStatus& rank : request->ranks()) {
    if (rank.state() != v1::RankStatus::RUNNING && on_change_) {
      on_change_();
      break;
    }
  }
  return answer;
}

grpc::Status NodeService::WatchAssignments(
    grpc::ServerContext* context, const v1::WatchAssignmentsRequest* request,
    grpc::ServerWriter<v1::WatchAssignmentsResponse>* writer) {
  if (auto status = RequireAgent(*context, request->node()); !status.ok()) return ToGrpc(status);
  if (notifier_ == nullptr) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this server pushes no assignments");
  }
  // Sent again only when it differs (or as a keepalive): most changes are other nodes'.
  std::string last_sent;
  absl::Time sent_at = absl::InfinitePast();
  const auto cancelled = [context] { return context->IsCancelled(); };
  while (!cancelled() && !notifier_->shutting_down()) {
    const uint64_t seen = notifier_->generation();  // before the read: a change after it wakes us
    absl::StatusOr<v1::WatchAssignmentsResponse> desired = nodes_->DesiredAssignments(*request);
    if (!desired.ok()) return ToGrpc(desired.status());
    std::string bytes;
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    desired->SerializeToCodedStream(&coded);
    coded.Trim();
    const absl::Time now = absl::Now();
    if (bytes != last_sent || now - sent_at >= kWatchKeepalive) {
      if (!writer->Write(*desired)) return grpc::Status::OK;  // the client went away
      last_sent = std::move(bytes);
      sent_at = now;
    }
    notifier_->WaitForChange(seen, sent_at + kWatchKeepalive, cancelled);
  }
  return grpc::Status::OK;
}

grpc::Status NodeService::ReportLogs(grpc::ServerContext* context,
                                     grpc::ServerReader<v1::ReportLogsRequest>* reader,
                                     v1::ReportLogsResponse* response) {
  // The request names a rank, not a node: a certificate is required where certificates are, and
  // any node's will do (its ranks' logs may be shipped after they left the node's assignments).
  if (auto status = RequireAgent(*context, std::nullopt); !status.ok()) return ToGrpc(status);
  v1::ReportLogsRequest batch;
  std::string stream_of;  // "job/attempt/rank" of the first message
  while (reader->Read(&batch)) {
    const std::string key =
        batch.job() + "/" + std::to_string(batch.attempt()) + "/" + std::to_string(batch.rank());
    if (stream_of.empty()) stream_of = key;
    if (key != stream_of) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "one ReportLogs stream carries one rank: " + stream_of + ", not " + key);
    }
    absl::StatusOr<int64_t> acked = nodes_->StoreLogs(batch);
    if (!acked.ok()) return ToGrpc(acked.status());
    response->set_acked_seq(std::max(response->acked_seq(), *acked));
  }
  return grpc::Status::OK;
}

grpc::Status NodeService::IssueRankCredential(grpc::ServerContext* context,
                                              const v1::IssueRankCredentialRequest* request,
                                              v1::IssueRankCredentialResponse* response) {
  if (auto status = RequireAgent(*context, request->node()); !status.ok()) return ToGrpc(status);
  absl::StatusOr<std::string> job_id = nodes_->CheckRankOnNode(*request);
  if (!job_id.ok()) return ToGrpc(job_id.status());
  absl::StatusOr<NewToken> token =
      auth_->CreateJobToken(*job_id, request->attempt(), request->rank());
  if (!token.ok()) return ToGrpc(token.status());
  response->set_token(token->secret);
  return grpc::Status::OK;
}

grpc::Status NodeService::ListNodes(grpc::ServerContext* context,
                                    const v1::ListNodesRequest* request,
                                    v1::ListNodesResponse* response) {
  if (auto status = Require(*context, Principal::Kind::kAdmin); !status.ok()) return ToGrpc(status);
  return Answer(nodes_->ListNodes(*request), response);
}

grpc::Status NodeService::GetNode(grpc::ServerContext* context, const v1::GetNodeRequest* request,
                                  v1::Node* response) {
  if (auto status = Require(*context, Principal::Kind::kAdmin); !status.ok()) return ToGrpc(status);
  return Answer(nodes_->GetNode(request->name()), response);
}

grpc::Status NodeService::CordonNode(grpc::ServerContext* context,
                                     const v1::CordonNodeRequest* request, v1::Node* response) {
  if (auto status = Require(*context, Principal::Kind::kAdmin); !status.ok()) return ToGrpc(status);
  return Answer(nodes_->CordonNode(request->name(), request->cordon()), response);
}

grpc::Status NodeService::DrainNode(grpc::ServerContext* context,
                                    const v1::DrainNodeRequest* request, v1::Node* response) {
  if (auto status = Require(*context, Principal::Kind::kAdmin); !status.ok()) return ToGrpc(status);
  grpc::Status answer = Answer(nodes_->DrainNode(request->name()), response);
  if (on_change_) on_change_();
  return answer;
}

}  // namespace gradhub::api
