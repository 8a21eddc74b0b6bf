// A gRPC service on the asynchronous (completion queue) API, as a server sees it.
//
// Why not the callback API, which needs none of this: in gRPC 1.51 (Debian 12) a server that
// mixes callback and sync services binds some of its connections to the callback completion
// queue, whose "nexting" threads sleep 100 ms after every second without a callback event
// (CallbackAlternativeCQ in completion_queue_cc.cc). Every call on those connections, sync
// ones included, then stalls for up to 100 ms every 1.1 s: a CreateJob p99 of ~90 ms at any
// load (tests/bench/create_jobs). A completion queue of the service's own, polled without a
// timeout by a thread of its own, has no idle phase.
//
// Unlike a grpc::Service, such a service takes part in the server's whole life. A server that
// carries one calls, in this order:
//   1. AddTo(builder), before ServerBuilder::BuildAndStart();
//   2. Start(), once the server runs;
//   3. grpc::Server::Shutdown() as usual: the service finishes its calls meanwhile;
//   4. Stop(), after Shutdown() returned and before the grpc::Server is destroyed: the calls
//      gRPC hands back from the queue still refer to the server.
#pragma once

namespace grpc {
class ServerBuilder;
}

namespace gradhub {

class AsyncGrpcService {
 public:
  virtual ~AsyncGrpcService() = default;

  // Registers the service and its completion queue with `builder`. Once.
  virtual void AddTo(grpc::ServerBuilder& builder) = 0;

  // Starts taking calls. Once, after BuildAndStart() of the builder given to AddTo.
  virtual void Start() = 0;

  // Shuts the queue down, drains it and joins the service's threads. After the server's
  // Shutdown(), before its destruction; later calls do nothing.
  virtual void Stop() = 0;
};

}  // namespace gradhub
