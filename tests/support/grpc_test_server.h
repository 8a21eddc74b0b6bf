// A real gRPC server for integration tests: our services on a free loopback port, reached over
// real channels, so that tests exercise serialization, deadlines, cancellation and shutdown as
// clients will see them.
//
//   gradhub::api::JobService service(&jobs, &auth);
//   gradhub::testing::TestGrpcServer server({&service});
//   auto stub = gradhub::v1::JobService::NewStub(server.NewChannel());
//
// A service on the asynchronous API (services/common/async_grpc_service.h), such as the
// StoreService, goes in a list of its own: TestGrpcServer server({&store_service});
//
// Declare the server after the services it serves so that it is destroyed first.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "services/common/async_grpc_service.h"

namespace gradhub::testing {

struct TestGrpcServerOptions {
  // When > 0, the server's grpc::ResourceQuota allows at most this many threads, to show that
  // a service does not need a thread per call.
  int max_threads = 0;
  // When > 0, the largest message the server accepts and channels from NewChannel() accept
  // (gRPC's default is 4 MiB).
  int max_message_bytes = 0;
};

// Thread-safe: address() and NewChannel() may be called from any thread; Shutdown() may be
// called from any thread, more than once, and before the destructor.
class TestGrpcServer {
 public:
  // How long the destructor lets in-flight calls finish before cancelling them.
  static constexpr std::chrono::milliseconds kDefaultShutdownDeadline{500};

  // Registers `services` (not owned; they must outlive the server), binds 127.0.0.1:0 (the OS
  // picks the port), starts, and returns when serving. Throws std::runtime_error when it cannot
  // bind or start.
  explicit TestGrpcServer(std::vector<grpc::Service*> services, TestGrpcServerOptions options = {})
      : TestGrpcServer(std::move(services), {}, options) {}
  // The same for services on the asynchronous API: each is added to the builder, started once
  // the server runs and stopped by Shutdown(). Each must outlive the server, and serves this
  // server only.
  explicit TestGrpcServer(std::vector<AsyncGrpcService*> services,
                          TestGrpcServerOptions options = {})
      : TestGrpcServer({}, std::move(services), options) {}
  // Shutdown(kDefaultShutdownDeadline) unless already shut down.
  ~TestGrpcServer();
  TestGrpcServer(const TestGrpcServer&) = delete;
  TestGrpcServer& operator=(const TestGrpcServer&) = delete;

  // "127.0.0.1:PORT".
  std::string address() const;
  int port() const { return port_; }

  // A new insecure channel to the server (its own connection: channels are not shared).
  std::shared_ptr<grpc::Channel> NewChannel() const;

  // Stops accepting calls, lets in-flight calls finish for at most `deadline`, cancels the
  // rest, and returns when the server has stopped. Later calls are no-ops. Used to test
  // clients that see a server go away.
  void Shutdown(std::chrono::milliseconds deadline);

 private:
  TestGrpcServer(std::vector<grpc::Service*> services,
                 std::vector<AsyncGrpcService*> async_services, TestGrpcServerOptions options);

  const TestGrpcServerOptions options_;
  const std::vector<AsyncGrpcService*> async_services_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::mutex shutdown_mu_;
  bool shut_down_ = false;
};

}  // namespace gradhub::testing
