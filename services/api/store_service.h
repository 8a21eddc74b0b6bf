// gRPC adapter of the rendezvous store: gradhub.v1.StoreService (proto/gradhub/v1/store.proto)
// over a RendezvousStore. Proto in, grpc::Status out; the rules live in rendezvous_store.h.
//
// Built on gRPC's callback API: a blocked Get/Wait is a grpc::ServerUnaryReactor parked in
// the store's waiter list, not a server thread, so a job whose 256 ranks all wait at once
// costs 256 small records. The reactor finishes when the store completes its waiter: the
// keys arrived, the timeout passed, the client cancelled (OnCancel -> CancelWait), or
// Shutdown().
//
// Timeout of a blocking call: request.timeout (unset or <= 0 = the store's default, 300 s),
// capped by the store's maximum and by the call's gRPC deadline.
//
// Shutting down a server that serves this: call StoreService::Shutdown() first, so that
// blocked calls finish with UNAVAILABLE and grpc::Server::Shutdown() does not wait for them.
//
// Messages: the store's value limit (1 MiB by default) keeps every request and response under
// gRPC's default 4 MiB message size. A server given a larger max_value_bytes must raise
// ServerBuilder::SetMaxReceiveMessageSize (and clients their receive limit) to match.
//
// Every call is first put to the service's Authorizer (gradhub-api: a node token, which the
// agent hands to its trainers, or the admin token).
//
// Thread-safe: gRPC calls the handlers from any thread; Shutdown() and pending_waiters() may
// be called from any thread.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "gradhub/v1/store.grpc.pb.h"
#include "services/api/rendezvous_store.h"

namespace gradhub::api {

// The one conversion from the services' error model to the wire: same code, same message.
grpc::Status ToGrpcStatus(const absl::Status& status);

class StoreService final : public gradhub::v1::StoreService::CallbackService {
 public:
  // OK when a call with this `authorization` metadata ("" when absent) may use the store;
  // otherwise the status the call fails with. Called on gRPC's callback threads: keep it fast.
  using Authorizer = std::function<absl::Status(const std::string& authorization)>;

  // `store` is not owned and must outlive the service and every call it serves.
  StoreService(RendezvousStore* store, Authorizer authorize);

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const gradhub::v1::SetRequest* request,
                                gradhub::v1::SetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const gradhub::v1::GetRequest* request,
                                gradhub::v1::GetResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context,
                                const gradhub::v1::AddRequest* request,
                                gradhub::v1::AddResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* context,
                                 const gradhub::v1::WaitRequest* request,
                                 gradhub::v1::WaitResponse* response) override;
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const gradhub::v1::CheckRequest* request,
                                  gradhub::v1::CheckResponse* response) override;
  grpc::ServerUnaryReactor* DeletePrefix(grpc::CallbackServerContext* context,
                                         const gradhub::v1::DeletePrefixRequest* request,
                                         gradhub::v1::DeletePrefixResponse* response) override;

  // Finishes every blocked Get/Wait with UNAVAILABLE and makes later ones fail at once.
  // Call before grpc::Server::Shutdown().
  void Shutdown();

  // Blocked Get/Wait calls, for tests and metrics.
  size_t pending_waiters() const;

 private:
  // A reactor finished with the Authorizer's error, or nullptr when the call may proceed.
  grpc::ServerUnaryReactor* Refused(grpc::CallbackServerContext* context) const;

  RendezvousStore* const store_;
  const Authorizer authorize_;
};

}  // namespace gradhub::api
