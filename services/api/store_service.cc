#include "services/api/store_service.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "services/api/call_authorization.h"

namespace gradhub::api {
namespace {

using gradhub::v1::AddRequest;
using gradhub::v1::AddResponse;
using gradhub::v1::CheckRequest;
using gradhub::v1::CheckResponse;
using gradhub::v1::DeletePrefixRequest;
using gradhub::v1::DeletePrefixResponse;
using gradhub::v1::GetRequest;
using gradhub::v1::GetResponse;
using gradhub::v1::SetRequest;
using gradhub::v1::SetResponse;
using gradhub::v1::WaitRequest;
using gradhub::v1::WaitResponse;

// The reactor of a blocked Get/Wait. Lifetime: created by the handler, deleted in OnDone,
// which gRPC calls only after the handler has returned it, Finish() has completed and any
// OnCancel has run. Finish() is called exactly once, from the store's completion callback
// (the store guarantees exactly once); OnCancel only asks the store to complete the waiter,
// so a cancel racing with a Set cannot finish the call twice.
class BlockingReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit BlockingReactor(RendezvousStore* store) : store_(store) {}

  // Set by the handler before it returns the reactor, hence before OnCancel can run.
  void set_waiter(RendezvousStore::WaiterId id) { waiter_ = id; }

  void OnCancel() override {
    if (waiter_ != RendezvousStore::kNoWaiter) store_->CancelWait(waiter_);
  }
  void OnDone() override { delete this; }

 private:
  RendezvousStore* const store_;
  RendezvousStore::WaiterId waiter_ = RendezvousStore::kNoWaiter;
};

// request.timeout, with the store's default and cap, and never past the call's deadline.
absl::Duration BlockingTimeout(const RendezvousStore& store,
                               const grpc::CallbackServerContext& context,
                               const google::protobuf::Duration& requested) {
  absl::Duration timeout = store.EffectiveTimeout(absl::Seconds(requested.seconds()) +
                                                  absl::Nanoseconds(requested.nanos()));
  const auto deadline = context.deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    const absl::Duration left = absl::FromChrono(deadline - std::chrono::system_clock::now());
    // A call already past its deadline is being cancelled by gRPC; expire it at once anyway.
    timeout = std::min(timeout, std::max(left, absl::Milliseconds(1)));
  }
  return timeout;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numbering (both are google.rpc.Code).
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

StoreService::StoreService(RendezvousStore* store, Authorizer authorize)
    : store_(store), authorize_(std::move(authorize)) {}

grpc::ServerUnaryReactor* StoreService::Refused(grpc::CallbackServerContext* context) const {
  const absl::Status allowed = authorize_(AuthorizationOf(*context));
  if (allowed.ok()) return nullptr;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(allowed));
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Set(grpc::CallbackServerContext* context,
                                            const SetRequest* request, SetResponse* response) {
  if (grpc::ServerUnaryReactor* refused = Refused(context)) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(store_->Set(request->key(), request->value())));
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Add(grpc::CallbackServerContext* context,
                                            const AddRequest* request, AddResponse* response) {
  if (grpc::ServerUnaryReactor* refused = Refused(context)) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<int64_t> value = store_->Add(request->key(), request->delta());
  if (value.ok()) response->set_value(*value);
  reactor->Finish(ToGrpcStatus(value.status()));
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Check(grpc::CallbackServerContext* context,
                                              const CheckRequest* request,
                                              CheckResponse* response) {
  if (grpc::ServerUnaryReactor* refused = Refused(context)) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<bool> ready =
      store_->Check(std::vector<std::string>(request->keys().begin(), request->keys().end()));
  if (ready.ok()) response->set_ready(*ready);
  reactor->Finish(ToGrpcStatus(ready.status()));
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::DeletePrefix(grpc::CallbackServerContext* context,
                                                     const DeletePrefixRequest* request,
                                                     DeletePrefixResponse* response) {
  if (grpc::ServerUnaryReactor* refused = Refused(context)) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<int64_t> deleted = store_->DeletePrefix(request->prefix());
  if (deleted.ok()) response->set_deleted(*deleted);
  reactor->Finish(ToGrpcStatus(deleted.status()));
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Get(grpc::CallbackServerContext* context,
                                            const GetRequest* request, GetResponse* response) {
  if (grpc::ServerUnaryReactor* refused = Refused(context)) return refused;
  auto* reactor = new BlockingReactor(store_);
  // `response` lives until OnDone, i.e. past the Finish below.
  reactor->set_waiter(store_->Get(request->key(),
                                  BlockingTimeout(*store_, *context, request->timeout()),
                                  [reactor, response](absl::StatusOr<std::string> value) {
                                    if (value.ok()) response->set_value(std::move(*value));
                                    reactor->Finish(ToGrpcStatus(value.status()));
                                  }));
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Wait(grpc::CallbackServerContext* context,
                                             const WaitRequest* request, WaitResponse* response) {
  if (grpc::ServerUnaryReactor* refused = Refused(context)) return refused;
  auto* reactor = new BlockingReactor(store_);
  reactor->set_waiter(
      store_->Wait(std::vector<std::string>(request->keys().begin(), request->keys().end()),
                   BlockingTimeout(*store_, *context, request->timeout()),
                   [reactor](absl::Status status) { reactor->Finish(ToGrpcStatus(status)); }));
  return reactor;
}

void StoreService::Shutdown() { store_->Shutdown(); }

size_t StoreService::pending_waiters() const { return store_->pending_waiters(); }

}  // namespace gradhub::api
