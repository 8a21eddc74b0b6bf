#include "services/cli/client.h"

#include <utility>

#include "services/checkpoint/checkpoint_limits.h"
#include "services/common/api_targets.h"
#include "services/common/grpc_receive_window.h"

namespace gradhub::cli {
namespace {

// --server as api_targets.h makes it (one address, a DNS name, or every replica's).
std::shared_ptr<grpc::Channel> ApiChannel(const ClientOptions& options) {
  absl::StatusOr<ApiTarget> target = ParseApiTarget("--server", options.server);
  // Invocation refused a --server that does not parse; what is left fails the calls as an
  // unreachable server.
  return CreateApiChannel(
      target.ok() ? *target : ApiTarget{.target = options.server},
      options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials(),
      kCommandConnectTimeout);
}

}  // namespace

Client::Client(ClientOptions options)
    : options_(std::move(options)),
      channel_(ApiChannel(options_)),
      jobs_(v1::JobService::NewStub(channel_)),
      nodes_(v1::NodeService::NewStub(channel_)),
      admin_(v1::AdminService::NewStub(channel_)),
      audit_(v1::AuditService::NewStub(channel_)) {
  grpc::ChannelArguments args;
  // Downloads are streams without a deadline (they last as long as the bytes do); keepalive
  // pings notice a server or network that went away mid-stream.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetMaxReceiveMessageSize(checkpoint::kMaxChunkBytes + checkpoint::kMessageOverheadBytes);
  BoundReceiveWindow(args);
  checkpoint_channel_ = grpc::CreateCustomChannel(
      options_.checkpoint_server,
      options_.credentials != nullptr ? options_.credentials : grpc::InsecureChannelCredentials(),
      args);
  checkpoints_ = v1::CheckpointService::NewStub(checkpoint_channel_);
  code_ = v1::CodeService::NewStub(checkpoint_channel_);
}

std::unique_ptr<grpc::ClientContext> Client::StreamContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!options_.token.empty()) {
    context->AddMetadata("authorization", "Bearer " + options_.token);
  }
  return context;
}

std::unique_ptr<grpc::ClientContext> Client::UnaryContext() const {
  std::unique_ptr<grpc::ClientContext> context = StreamContext();
  context->set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  return context;
}

}  // namespace gradhub::cli
