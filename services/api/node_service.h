// gradhub.v1.NodeService over gRPC: the agent protocol (node token, and the node's client
// certificate where there is one: node_identity.h) and the operators' node commands (admin
// token), both thin over NodeManager.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "gradhub/v1/nodes.grpc.pb.h"
#include "services/api/assignment_notifier.h"
#include "services/api/node_identity.h"
#include "services/api/node_manager.h"
#include "services/common/auth/authenticator.h"
#include "services/common/auth/call_authorization.h"

namespace gradhub::api {

struct NodeServiceOptions {
  // The agent calls must come with a verified client certificate (node_identity.h step 3);
  // the server's credentials must then ask for one (--tls-client-ca).
  bool require_client_certificate = false;
};

class NodeService final : public v1::NodeService::Service {
 public:
  // Not owned; all must outlive the service. `on_change` (may be empty) is called after a
  // call that may have changed what the scheduler should do (e.g. the scheduler's Nudge).
  // `notifier` (may be null: then WatchAssignments is UNIMPLEMENTED) wakes the streams.
  NodeService(NodeManager* nodes, const Authenticator* auth, std::function<void()> on_change = {},
              AssignmentNotifier* notifier = nullptr, NodeServiceOptions options = {})
      : nodes_(nodes),
        auth_(auth),
        on_change_(std::move(on_change)),
        notifier_(notifier),
        options_(options) {}

  grpc::Status RegisterNode(grpc::ServerContext* context, const v1::RegisterNodeRequest* request,
                            v1::RegisterNodeResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  // Step 8 of nodes.proto: the desired set, then again on each change (AssignmentNotifier),
  // and at least every kWatchKeepalive; ends when the client cancels, the session ends
  // (FAILED_PRECONDITION) or the notifier shuts down.
  grpc::Status WatchAssignments(grpc::ServerContext* context,
                                const v1::WatchAssignmentsRequest* request,
                                grpc::ServerWriter<v1::WatchAssignmentsResponse>* writer) override;
  grpc::Status ReportLogs(grpc::ServerContext* context,
                          grpc::ServerReader<v1::ReportLogsRequest>* reader,
                          v1::ReportLogsResponse* response) override;
  grpc::Status IssueRankCredential(grpc::ServerContext* context,
                                   const v1::IssueRankCredentialRequest* request,
                                   v1::IssueRankCredentialResponse* response) override;
  grpc::Status ListNodes(grpc::ServerContext* context, const v1::ListNodesRequest* request,
                         v1::ListNodesResponse* response) override;
  grpc::Status GetNode(grpc::ServerContext* context, const v1::GetNodeRequest* request,
                       v1::Node* response) override;
  grpc::Status CordonNode(grpc::ServerContext* context, const v1::CordonNodeRequest* request,
                          v1::Node* response) override;
  grpc::Status DrainNode(grpc::ServerContext* context, const v1::DrainNodeRequest* request,
                         v1::Node* response) override;

 private:
  // OK when the caller holds a token of `kind`; else the status to answer with.
  absl::Status Require(const grpc::ServerContext& context, Principal::Kind kind) const;
  // An agent call: a node token, and a client certificate of `node` where one was presented or
  // is required (nullopt: the call names no node).
  absl::Status RequireAgent(const grpc::ServerContext& context,
                            const std::optional<std::string>& node) const;

  NodeManager* nodes_;
  const Authenticator* auth_;
  std::function<void()> on_change_;
  AssignmentNotifier* notifier_;
  NodeServiceOptions options_;
};

}  // namespace gradhub::api
