// How every gradhub server serves gRPC (gradhub-api, gradhub-checkpoint, gradhub-metrics): TLS
// or plaintext from the shared --tls-* flags, a pool of idle threads kept for bursts, server
// reflection, one line on stderr when the port cannot be bound, and shutdown with a grace.
//
// Server reflection (grpc.reflection.v1alpha.ServerReflection) is on everywhere: grpcurl,
// Postman or Evans list the services and call them without the proto files. It serves the
// descriptors compiled into the binary, nothing else; calls still need a token.
#pragma once

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/common/edge_limits.h"

namespace gradhub {

struct GrpcServerOptions {
  std::string address;  // host:port; port 0 picks a free one
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Idle threads the sync server keeps for the next burst of calls. gRPC's default (2) ends
  // every thread beyond, so under a few dozen concurrent calls each call made and ended one:
  // most of what a CreateJob cost the api. Threads are still made only when all are busy.
  int max_idle_threads = 32;
  // The largest message received and sent; 0 = gRPC's default (4 MiB received).
  int max_receive_bytes = 0;
  int max_send_bytes = 0;
  // When true, a second server on the same port fails to start instead of sharing it (gRPC's
  // default, SO_REUSEPORT).
  bool exclusive_port = false;
  // Streams per connection, threads in all, handshake time (edge_limits.h; the server's flags).
  GrpcLimits limits{};
};

// A started server and the port it bound. Thread-safe as grpc::Server is.
class GrpcServer {
 public:
  GrpcServer(std::unique_ptr<grpc::Server> server, int port)
      : server_(std::move(server)), port_(port) {}

  int port() const { return port_; }
  grpc::Server& server() { return *server_; }

  // Stops accepting calls, lets those in flight finish for `grace`, cancels the rest, and
  // returns once every call has ended.
  void Shutdown(absl::Duration grace);

 private:
  std::unique_ptr<grpc::Server> server_;
  int port_;
};

// Builds a server with `options` and server reflection; `add_services` registers the server's
// services (and anything else of its own: interceptors, channel arguments) on the builder.
// Binds and starts. INVALID_ARGUMENT naming the flag of a limit out of range; UNAVAILABLE naming
// the address when it cannot bind.
absl::StatusOr<std::unique_ptr<GrpcServer>> StartGrpcServer(
    const GrpcServerOptions& options,
    const std::function<void(grpc::ServerBuilder&)>& add_services);

}  // namespace gradhub
