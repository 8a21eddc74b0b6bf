// gRPC adapter of the rendezvous store: gradhub.v1.StoreService (proto/gradhub/v1/store.proto)
// over a RendezvousStore. Proto in, grpc::Status out; the rules live in rendezvous_store.h.
//
// Built on gRPC's asynchronous API (see services/common/async_grpc_service.h for why not the
// callback API): one completion queue with one thread of its own, which runs every handler. A
// blocked Get/Wait is a small call record parked in the store's waiter list, not a server
// thread, so a job whose 256 ranks all wait at once costs 256 records. The call finishes when
// the store completes its waiter: the keys arrived, the timeout passed, the client cancelled
// (gRPC's done notification -> CancelWait), or Shutdown().
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
// Every call is first put to the service's Authorizer, which says which keys the caller may
// touch (gradhub-api: store_scope.h's rules; the admin token any key, a rank's job token its
// own attempt's keys, a tenant's or a node's token none), and then every key of the call is
// checked against that scope: a key outside it refuses the call before it reaches the store.
// The Authorizer runs on a small pool of threads of the service's own, never on the queue
// thread: it may query the database (gradhub-api looks a job token up on every call, since
// job tokens end with their attempt and are never cached), and a query on the queue thread
// would hold up every other call of every job behind it.
//
// Thread-safe: Shutdown() and pending_waiters() may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gradhub/v1/store.grpc.pb.h"
#include "services/api/rendezvous_store.h"
#include "services/api/worker_pool.h"
#include "services/common/async_grpc_service.h"

namespace gradhub::api {

class StoreService final : public AsyncGrpcService {
 public:
  // The key prefix a call with this `authorization` metadata ("" when absent) is confined to
  // ("" = any key, store_scope.h's kAnyKey); otherwise the status the call fails with (say
  // UNAUTHENTICATED or PERMISSION_DENIED). Runs before every call on one of the service's
  // authorization threads, several at once: it may block (a database query) but must be
  // thread-safe.
  using Authorizer = std::function<absl::StatusOr<std::string>(const std::string& authorization)>;

  // Authorizations at once: a rendezvous's calls come in bursts of the job's world size, and
  // each authorization of a job token holds one of the api's pooled database connections (8 by
  // default) for one indexed lookup, so half of them at most.
  static constexpr int kAuthorizationThreads = 4;

  // `store` is not owned and must outlive the service and every call it serves.
  StoreService(RendezvousStore* store, Authorizer authorize);
  // Stop(): when the service was added to a server, that server must still exist.
  ~StoreService() override;
  StoreService(const StoreService&) = delete;
  StoreService& operator=(const StoreService&) = delete;

  void AddTo(grpc::ServerBuilder& builder) override;
  void Start() override;
  void Stop() override;

  // Finishes every blocked Get/Wait with UNAVAILABLE and makes later ones fail at once.
  // Call before grpc::Server::Shutdown(), which would otherwise wait out its deadline for them.
  void Shutdown();

  // Blocked Get/Wait calls, for tests and metrics.
  size_t pending_waiters() const;

 private:
  class Call;
  template <typename Request, typename Response>
  class UnaryCall;

  // Handlers, one per method, run on the service's thread once the call is authorized and its
  // keys are in the caller's scope. Each
  // fills *response and calls finish(status) exactly once, at once or later from any thread, and
  // returns the store waiter to cancel if the client gives up first (kNoWaiter when none).
  using Finish = std::function<void(const grpc::Status&)>;
  RendezvousStore::WaiterId Set(const grpc::ServerContext& context, const v1::SetRequest& request,
                                v1::SetResponse* response, Finish finish);
  RendezvousStore::WaiterId Get(const grpc::ServerContext& context, const v1::GetRequest& request,
                                v1::GetResponse* response, Finish finish);
  RendezvousStore::WaiterId Add(const grpc::ServerContext& context, const v1::AddRequest& request,
                                v1::AddResponse* response, Finish finish);
  RendezvousStore::WaiterId Wait(const grpc::ServerContext& context, const v1::WaitRequest& request,
                                 v1::WaitResponse* response, Finish finish);
  RendezvousStore::WaiterId Check(const grpc::ServerContext& context,
                                  const v1::CheckRequest& request, v1::CheckResponse* response,
                                  Finish finish);
  RendezvousStore::WaiterId DeletePrefix(const grpc::ServerContext& context,
                                         const v1::DeletePrefixRequest& request,
                                         v1::DeletePrefixResponse* response, Finish finish);

  // Polls the queue until it is shut down and drained.
  void Serve();
  // Counts the call records alive (+1 made, -1 deleted).
  void CountRecords(int delta);

  RendezvousStore* const store_;
  const Authorizer authorize_;
  v1::StoreService::AsyncService service_;
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  std::thread thread_;
  // Runs authorize_ off the queue thread; from Start() until Stop() has drained the records.
  std::unique_ptr<WorkerPool> authorizations_;

  bool stopped_ = false;
  // Set by Stop(): no further call is requested.
  std::atomic<bool> stopping_{false};
  // Call records alive: requested, or started and not yet over. The queue may be shut down only
  // once there are none, for a record alive could still begin an operation on it (gRPC aborts
  // the process then), and grpc::Server::Shutdown() does not wait for them.
  std::mutex records_mu_;
  std::condition_variable no_records_;
  int records_ = 0;
};

}  // namespace gradhub::api
