#include "services/common/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>

#include <chrono>

#include "absl/strings/str_cat.h"

namespace gradhub {

void GrpcServer::Shutdown(absl::Duration grace) {
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(grace));
  server_->Wait();
}

absl::StatusOr<std::unique_ptr<GrpcServer>> StartGrpcServer(
    const GrpcServerOptions& options,
    const std::function<void(grpc::ServerBuilder&)>& add_services) {
  // Registers the plugin with every ServerBuilder made after it; idempotent.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.address, options.credentials, &port);
  if (options.exclusive_port) builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (options.max_receive_bytes > 0) builder.SetMaxReceiveMessageSize(options.max_receive_bytes);
  if (options.max_send_bytes > 0) builder.SetMaxSendMessageSize(options.max_send_bytes);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                              options.max_idle_threads);
  add_services(builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC on ", options.address));
  }
  return std::make_unique<GrpcServer>(std::move(server), port);
}

}  // namespace gradhub
