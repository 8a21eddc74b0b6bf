#include "services/common/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/resource_quota.h>

#include <chrono>

#include "absl/strings/str_cat.h"

namespace gradhub {
namespace {

// What one client may take (edge_limits.h). A sync call beyond the thread quota is answered
// RESOURCE_EXHAUSTED by gRPC itself, before the handler; the streams limit is announced to
// clients in HTTP/2 SETTINGS, so they queue their calls beyond it.
void ApplyLimits(const GrpcLimits& limits, grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(limits.max_streams_per_connection));
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(limits.handshake_timeout)));
  // Clients fail over between replicas by keepalive pings every 2 s during calls
  // (api_targets.h); gRPC's default would answer pings more often than every 5 min with GOAWAY.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  if (limits.max_threads > 0) {
    grpc::ResourceQuota quota("gradhub-grpc-threads");
    quota.SetMaxThreads(static_cast<int>(limits.max_threads));
    builder.SetResourceQuota(quota);
  }
}

}  // namespace

void GrpcServer::Shutdown(absl::Duration grace) {
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(grace));
  server_->Wait();
}

absl::StatusOr<std::unique_ptr<GrpcServer>> StartGrpcServer(
    const GrpcServerOptions& options,
    const std::function<void(grpc::ServerBuilder&)>& add_services) {
  // Registers the plugin with every ServerBuilder made after it; idempotent.
  if (absl::Status limits = options.limits.Validate(); !limits.ok()) return limits;
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.address, options.credentials, &port);
  if (options.exclusive_port) builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (options.max_receive_bytes > 0) builder.SetMaxReceiveMessageSize(options.max_receive_bytes);
  if (options.max_send_bytes > 0) builder.SetMaxSendMessageSize(options.max_send_bytes);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                              options.max_idle_threads);
  ApplyLimits(options.limits, builder);
  add_services(builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC on ", options.address));
  }
  return std::make_unique<GrpcServer>(std::move(server), port);
}

}  // namespace gradhub
