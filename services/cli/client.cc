#include "services/cli/client.h"

#include <utility>

namespace gradhub::cli {

Client::Client(ClientOptions options)
    : options_(std::move(options)),
      channel_(grpc::CreateChannel(options_.server, options_.credentials != nullptr
                                                        ? options_.credentials
                                                        : grpc::InsecureChannelCredentials())),
      jobs_(v1::JobService::NewStub(channel_)),
      nodes_(v1::NodeService::NewStub(channel_)),
      admin_(v1::AdminService::NewStub(channel_)) {}

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
