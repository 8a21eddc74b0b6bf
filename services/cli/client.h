// The CLI's connections to gradhub-api and gradhub-checkpoint: a channel each, a stub per
// service, and the two things every call needs, the bearer token and a deadline.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "gradhub/v1/audit.grpc.pb.h"
#include "gradhub/v1/checkpoint.grpc.pb.h"
#include "gradhub/v1/code.grpc.pb.h"
#include "gradhub/v1/jobs.grpc.pb.h"
#include "gradhub/v1/nodes.grpc.pb.h"
#include "gradhub/v1/tenants.grpc.pb.h"

namespace gradhub::cli {

struct ClientOptions {
  // host:port of gradhub-api's gRPC listener, or several replicas' (api_targets.h).
  std::string server = "localhost:7070";
  // host:port of gradhub-checkpoint's gRPC listener.
  std::string checkpoint_server = "localhost:7071";
  // Plaintext unless set (gradhub::ClientCredentials).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Bearer secret; empty sends no authorization header (the server answers UNAUTHENTICATED).
  std::string token;
  // Deadline of each unary call. Without one a call to a host that drops packets would hang.
  absl::Duration timeout = absl::Seconds(30);
};

// Not thread-safe to construct; the stubs themselves may be used from any thread (gRPC's).
class Client {
 public:
  explicit Client(ClientOptions options);

  v1::JobService::StubInterface& jobs() { return *jobs_; }
  v1::NodeService::StubInterface& nodes() { return *nodes_; }
  v1::AdminService::StubInterface& admin() { return *admin_; }
  v1::AuditService::StubInterface& audit() { return *audit_; }
  v1::CheckpointService::StubInterface& checkpoints() { return *checkpoints_; }
  // Code archives live in gradhub-checkpoint too (code.proto).
  v1::CodeService::StubInterface& code() { return *code_; }

  // A fresh context for one call (gRPC contexts are single-use) carrying the token and the
  // deadline.
  std::unique_ptr<grpc::ClientContext> UnaryContext() const;
  // For streams that follow a job or its logs: no deadline, since they last as long as the job
  // does; the caller stops them with TryCancel or by reading to the end.
  std::unique_ptr<grpc::ClientContext> StreamContext() const;

 private:
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::StubInterface> jobs_;
  std::unique_ptr<v1::NodeService::StubInterface> nodes_;
  std::unique_ptr<v1::AdminService::StubInterface> admin_;
  std::unique_ptr<v1::AuditService::StubInterface> audit_;
  std::shared_ptr<grpc::Channel> checkpoint_channel_;
  std::unique_ptr<v1::CheckpointService::StubInterface> checkpoints_;
  std::unique_ptr<v1::CodeService::StubInterface> code_;
};

}  // namespace gradhub::cli
