#include "services/api/store_service.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/alarm.h>

#include "absl/time/time.h"
#include "services/api/store_scope.h"
#include "services/common/auth/call_authorization.h"
#include "services/common/grpc_status.h"

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

// request.timeout, with the store's default and cap, and never past the call's deadline.
absl::Duration BlockingTimeout(const RendezvousStore& store, const grpc::ServerContext& context,
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

// Every key of a request against the caller's scope (store_scope.h, rule 4), by method.
template <typename Request>  // Set, Get, Add: one key
absl::Status KeysInScope(absl::string_view scope, const Request& request) {
  return CheckKeyInScope(scope, "key", request.key());
}
absl::Status KeysInScope(absl::string_view scope, const WaitRequest& request) {
  return CheckKeysInScope(scope, "keys", request.keys());
}
absl::Status KeysInScope(absl::string_view scope, const CheckRequest& request) {
  return CheckKeysInScope(scope, "keys", request.keys());
}
absl::Status KeysInScope(absl::string_view scope, const DeletePrefixRequest& request) {
  return CheckKeyInScope(scope, "prefix", request.prefix());
}

}  // namespace

// One call of one method, from the request for it to its end. The queue's tags are the
// addresses of its Event members, so the queue thread knows the call and which event came back.
//
// Life of a call, every step on the queue thread but the authorization and the answer:
//   1. kRequested: gRPC has matched a client's call to this record (ok), or the server is
//      shutting down (not ok: no call began and no done event follows; deleted at once). A
//      fresh record is requested for the next call of the method, and the caller's
//      authorization metadata goes to an authorization thread (Authorize).
//   2. That thread runs the Authorizer (it may query the database) and keeps the scope it
//      returns; an alarm set to the past brings the call back to the queue thread as
//      kAuthorized (Admit). A call refused, or with a key outside the scope, is answered so;
//      one whose client gave up meanwhile (kDone came first) is answered CANCELLED without
//      reaching the store; any other runs its handler.
//   3. The handler, or later any thread that completes the store's waiter, hands over the
//      answer (Answer); another such alarm brings it back to the queue thread as kAnswered,
//      where it is sent. So only the queue thread ever touches the gRPC call or the waiter,
//      and the record cannot be deleted under a thread still authorizing or answering: both
//      come before the answer is sent, and so before kFinished.
//   4. kFinished (the answer sent or not) and kDone (gRPC's notification that the call is
//      over, finished or cancelled) come back in either order; on kDone of a cancelled call
//      the store's waiter is cancelled, which answers it CANCELLED. Deleted after both.
class StoreService::Call {
 public:
  enum class Kind { kRequested, kAuthorized, kAnswered, kFinished, kDone };
  struct Event {
    Call* call;
    Kind kind;
  };

  virtual ~Call() { service_->CountRecords(-1); }

  // Asks gRPC for the next call of this record's method.
  virtual void RequestCall() = 0;

  // On the queue thread, for each event of this call.
  void Proceed(Kind kind, bool ok) {
    switch (kind) {
      case Kind::kRequested:
        if (!ok) {
          delete this;
          return;
        }
        if (!service_->stopping_) Another()->RequestCall();
        events_due_ = 2;  // kFinished and kDone
        Authorize();
        return;
      case Kind::kAuthorized:
        Admit();
        return;
      case Kind::kAnswered:
        SendAnswer(answer_);
        return;
      case Kind::kDone:
        over_ = true;
        if (context_.IsCancelled() && waiter_ != RendezvousStore::kNoWaiter) {
          service_->store_->CancelWait(waiter_);
        }
        break;
      case Kind::kFinished:
        break;
    }
    if (--events_due_ == 0) delete this;
  }

 protected:
  explicit Call(StoreService* service) : service_(service) {
    service_->CountRecords(+1);
    context_.AsyncNotifyWhenDone(&done_);
  }

  // A fresh record of the same method.
  virtual Call* Another() const = 0;
  // OK when every key of the request lies in `scope`; else the status to answer.
  virtual absl::Status KeysInScope(absl::string_view scope) const = 0;
  // Runs the method's handler; returns the waiter it parked, if any.
  virtual RendezvousStore::WaiterId Handle() = 0;
  // Sends the answer, finishing the call with kFinished.
  virtual void SendAnswer(const grpc::Status& status) = 0;

  // From any thread, once: the call's answer (its response already filled).
  void Answer(grpc::Status status) {
    answer_ = std::move(status);
    answer_alarm_.Set(service_->queue_.get(), gpr_time_0(GPR_CLOCK_MONOTONIC), &answered_);
  }

  StoreService* const service_;
  grpc::ServerContext context_;
  Event requested_{this, Kind::kRequested};
  Event finished_{this, Kind::kFinished};

 private:
  // Step 2, on an authorization thread: the Authorizer's scope, then back to the queue thread.
  void Authorize() {
    service_->authorizations_->Submit([this, authorization = AuthorizationOf(context_)] {
      scope_ = service_->authorize_(authorization);
      authorized_alarm_.Set(service_->queue_.get(), gpr_time_0(GPR_CLOCK_MONOTONIC), &authorized_);
    });
  }

  // Step 2, back on the queue thread.
  void Admit() {
    if (over_) {
      Answer(grpc::Status(grpc::StatusCode::CANCELLED, "the call ended before it was authorized"));
    } else if (!scope_.ok()) {
      Answer(ToGrpc(scope_.status()));
    } else if (const absl::Status in_scope = KeysInScope(*scope_); !in_scope.ok()) {
      Answer(ToGrpc(in_scope));
    } else {
      waiter_ = Handle();
    }
  }

  Event authorized_{this, Kind::kAuthorized};
  Event answered_{this, Kind::kAnswered};
  Event done_{this, Kind::kDone};
  grpc::Alarm authorized_alarm_;
  grpc::Alarm answer_alarm_;
  absl::StatusOr<std::string> scope_;  // written by the authorization thread, before kAuthorized
  grpc::Status answer_;
  RendezvousStore::WaiterId waiter_ = RendezvousStore::kNoWaiter;
  bool over_ = false;  // kDone came
  int events_due_ = 0;
};

template <typename Request, typename Response>
class StoreService::UnaryCall final : public Call {
 public:
  using RequestMethod = void (v1::StoreService::AsyncService::*)(
      grpc::ServerContext*, Request*, grpc::ServerAsyncResponseWriter<Response>*,
      grpc::CompletionQueue*, grpc::ServerCompletionQueue*, void*);
  using Handler = RendezvousStore::WaiterId (StoreService::*)(const grpc::ServerContext&,
                                                              const Request&, Response*, Finish);

  UnaryCall(StoreService* service, RequestMethod request_method, Handler handler)
      : Call(service), request_method_(request_method), handler_(handler) {}

  void RequestCall() override {
    grpc::ServerCompletionQueue* queue = service_->queue_.get();
    (service_->service_.*request_method_)(&context_, &request_, &responder_, queue, queue,
                                          &requested_);
  }

 private:
  Call* Another() const override { return new UnaryCall(service_, request_method_, handler_); }

  absl::Status KeysInScope(absl::string_view scope) const override {
    return api::KeysInScope(scope, request_);
  }

  RendezvousStore::WaiterId Handle() override {
    return (service_->*handler_)(context_, request_, &response_,
                                 [this](const grpc::Status& status) { Answer(status); });
  }

  void SendAnswer(const grpc::Status& status) override {
    responder_.Finish(response_, status, &finished_);
  }

  const RequestMethod request_method_;
  const Handler handler_;
  Request request_;
  Response response_;
  grpc::ServerAsyncResponseWriter<Response> responder_{&context_};
};

StoreService::StoreService(RendezvousStore* store, Authorizer authorize)
    : store_(store), authorize_(std::move(authorize)) {}

StoreService::~StoreService() { Stop(); }

void StoreService::AddTo(grpc::ServerBuilder& builder) {
  builder.RegisterService(&service_);
  queue_ = builder.AddCompletionQueue();
}

void StoreService::Start() {
  authorizations_ = std::make_unique<WorkerPool>(kAuthorizationThreads);
  using Service = v1::StoreService::AsyncService;
  (new UnaryCall<SetRequest, SetResponse>(this, &Service::RequestSet, &StoreService::Set))
      ->RequestCall();
  (new UnaryCall<GetRequest, GetResponse>(this, &Service::RequestGet, &StoreService::Get))
      ->RequestCall();
  (new UnaryCall<AddRequest, AddResponse>(this, &Service::RequestAdd, &StoreService::Add))
      ->RequestCall();
  (new UnaryCall<WaitRequest, WaitResponse>(this, &Service::RequestWait, &StoreService::Wait))
      ->RequestCall();
  (new UnaryCall<CheckRequest, CheckResponse>(this, &Service::RequestCheck, &StoreService::Check))
      ->RequestCall();
  (new UnaryCall<DeletePrefixRequest, DeletePrefixResponse>(this, &Service::RequestDeletePrefix,
                                                            &StoreService::DeletePrefix))
      ->RequestCall();
  thread_ = std::thread([this] { Serve(); });
}

void StoreService::Stop() {
  if (queue_ == nullptr || stopped_) return;
  stopped_ = true;
  stopping_ = true;
  {
    // The server's shutdown hands back the requested records (not ok) and cancels the started
    // calls, which the queue thread then finishes.
    std::unique_lock lock(records_mu_);
    no_records_.wait(lock, [this] { return records_ == 0; });
  }
  queue_->Shutdown();
  if (thread_.joinable()) {
    thread_.join();
  } else {
    Serve();  // never started: only drains
  }
  authorizations_.reset();  // idle: every record, so every authorization, is over
}

void StoreService::CountRecords(int delta) {
  std::lock_guard lock(records_mu_);
  records_ += delta;
  if (records_ == 0) no_records_.notify_all();
}

void StoreService::Serve() {
  void* tag = nullptr;
  bool ok = false;
  while (queue_->Next(&tag, &ok)) {
    const auto* event = static_cast<const Call::Event*>(tag);
    event->call->Proceed(event->kind, ok);
  }
}

RendezvousStore::WaiterId StoreService::Set(const grpc::ServerContext&, const SetRequest& request,
                                            SetResponse*, Finish finish) {
  finish(ToGrpc(store_->Set(request.key(), request.value())));
  return RendezvousStore::kNoWaiter;
}

RendezvousStore::WaiterId StoreService::Add(const grpc::ServerContext&, const AddRequest& request,
                                            AddResponse* response, Finish finish) {
  absl::StatusOr<int64_t> value = store_->Add(request.key(), request.delta());
  if (value.ok()) response->set_value(*value);
  finish(ToGrpc(value.status()));
  return RendezvousStore::kNoWaiter;
}

RendezvousStore::WaiterId StoreService::Check(const grpc::ServerContext&,
                                              const CheckRequest& request, CheckResponse* response,
                                              Finish finish) {
  absl::StatusOr<bool> ready =
      store_->Check(std::vector<std::string>(request.keys().begin(), request.keys().end()));
  if (ready.ok()) response->set_ready(*ready);
  finish(ToGrpc(ready.status()));
  return RendezvousStore::kNoWaiter;
}

RendezvousStore::WaiterId StoreService::DeletePrefix(const grpc::ServerContext&,
                                                     const DeletePrefixRequest& request,
                                                     DeletePrefixResponse* response,
                                                     Finish finish) {
  absl::StatusOr<int64_t> deleted = store_->DeletePrefix(request.prefix());
  if (deleted.ok()) response->set_deleted(*deleted);
  finish(ToGrpc(deleted.status()));
  return RendezvousStore::kNoWaiter;
}

RendezvousStore::WaiterId StoreService::Get(const grpc::ServerContext& context,
                                            const GetRequest& request, GetResponse* response,
                                            Finish finish) {
  // `response` lives until the call's record is deleted, after the answer is sent.
  return store_->Get(request.key(), BlockingTimeout(*store_, context, request.timeout()),
                     [response, finish = std::move(finish)](absl::StatusOr<std::string> value) {
                       if (value.ok()) response->set_value(std::move(*value));
                       finish(ToGrpc(value.status()));
                     });
}

RendezvousStore::WaiterId StoreService::Wait(const grpc::ServerContext& context,
                                             const WaitRequest& request, WaitResponse*,
                                             Finish finish) {
  return store_->Wait(
      std::vector<std::string>(request.keys().begin(), request.keys().end()),
      BlockingTimeout(*store_, context, request.timeout()),
      [finish = std::move(finish)](absl::Status status) { finish(ToGrpc(status)); });
}

void StoreService::Shutdown() { store_->Shutdown(); }

size_t StoreService::pending_waiters() const { return store_->pending_waiters(); }

}  // namespace gradhub::api
