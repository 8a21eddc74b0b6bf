#include "tests/support/grpc_test_server.h"

#include <stdexcept>
#include <utility>

namespace gradhub::testing {

TestGrpcServer::TestGrpcServer(std::vector<grpc::Service*> services,
                               std::vector<AsyncGrpcService*> async_services,
                               TestGrpcServerOptions options)
    : options_(options), async_services_(std::move(async_services)) {
  grpc::ServerBuilder builder;
  // Port 0: the OS picks a free port, so parallel test binaries never collide. No
  // SO_REUSEPORT: a second server must not silently share a port with us.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
  for (grpc::Service* service : services) {
    if (service == nullptr) throw std::runtime_error("TestGrpcServer: null service");
    builder.RegisterService(service);
  }
  for (AsyncGrpcService* service : async_services_) {
    if (service == nullptr) throw std::runtime_error("TestGrpcServer: null service");
    service->AddTo(builder);
  }
  if (options_.max_threads > 0) {
    grpc::ResourceQuota quota("gradhub-test-server");
    quota.SetMaxThreads(options_.max_threads);
    builder.SetResourceQuota(quota);
  }
  if (options_.max_message_bytes > 0) {
    builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
    builder.SetMaxSendMessageSize(options_.max_message_bytes);
  }
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    if (server_ != nullptr) server_->Shutdown();
    throw std::runtime_error(
        "TestGrpcServer: could not bind 127.0.0.1:0 or start the server (see gRPC's log)");
  }
  for (AsyncGrpcService* service : async_services_) service->Start();
}

TestGrpcServer::~TestGrpcServer() { Shutdown(kDefaultShutdownDeadline); }

std::string TestGrpcServer::address() const { return "127.0.0.1:" + std::to_string(port_); }

std::shared_ptr<grpc::Channel> TestGrpcServer::NewChannel() const {
  grpc::ChannelArguments args;
  // A subchannel pool of its own: without it every channel to the same address shares one
  // connection; with it each channel is its own connection, as separate clients would be.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (options_.max_message_bytes > 0) {
    args.SetMaxReceiveMessageSize(options_.max_message_bytes);
    args.SetMaxSendMessageSize(options_.max_message_bytes);
  }
  return grpc::CreateCustomChannel(address(), grpc::InsecureChannelCredentials(), args);
}

void TestGrpcServer::Shutdown(std::chrono::milliseconds deadline) {
  std::lock_guard<std::mutex> lock(shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  server_->Shutdown(std::chrono::system_clock::now() + deadline);
  server_->Wait();
  for (AsyncGrpcService* service : async_services_) service->Stop();
}

}  // namespace gradhub::testing
