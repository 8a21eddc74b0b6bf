// The bearer credential of a gRPC call, for every gRPC service of every gradhub server.
#pragma once

#include <grpcpp/server_context.h>

#include <string>

namespace gradhub::api {

// The `authorization` metadata of a call, "" when absent.
inline std::string AuthorizationOf(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  const auto header = metadata.find("authorization");
  return header == metadata.end() ? "" : std::string(header->second.data(), header->second.size());
}

}  // namespace gradhub::api
