#include "gpu_worker/store_client/grpc_store.h"

#include <grpcpp/grpcpp.h>

#include <functional>

#include "gradhub/v1/store.grpc.pb.h"
#include "services/common/api_targets.h"
#include "services/common/grpc_credentials.h"

namespace gradhub::store_client {
namespace {

// The server waits for the requested timeout; the deadline leaves it room to answer with
// DEADLINE_EXCEEDED naming the missing keys rather than the client giving up first.
constexpr std::chrono::seconds kDeadlineSlack{5};

void SetDuration(std::chrono::milliseconds duration, google::protobuf::Duration* out) {
  out->set_seconds(duration.count() / 1000);
  out->set_nanos(static_cast<int32_t>((duration.count() % 1000) * 1000000));
}

// How often an idempotent call is made again after UNAVAILABLE: once per replica that dies
// under it, within the call's one deadline.
constexpr int kUnavailableRetries = 3;

using WallTime = std::chrono::system_clock::time_point;

class GrpcStore final : public ddp::Store {
 public:
  GrpcStore(const std::string& address, const ApiTarget& target, const GrpcStoreOptions& options,
            std::shared_ptr<grpc::ChannelCredentials> credentials)
      : address_(address),
        token_(options.token),
        rpc_timeout_(options.rpc_timeout),
        channel_(CreateApiChannel(target, credentials, kClusterConnectTimeout)),
        stub_(v1::StoreService::NewStub(channel_)) {}

  // Set of one value is idempotent: made again on another replica after UNAVAILABLE.
  void Set(const std::string& key, const std::string& value) override {
    v1::SetRequest request;
    request.set_key(key);
    request.set_value(value);
    v1::SetResponse response;
    Check(Idempotent(rpc_timeout_,
                     [&](grpc::ClientContext* c) { return stub_->Set(c, request, &response); }),
          "Set", key);
  }

  std::string Get(const std::string& key, std::chrono::milliseconds timeout) override {
    v1::GetRequest request;
    request.set_key(key);
    SetDuration(timeout, request.mutable_timeout());
    v1::GetResponse response;
    Check(Idempotent(timeout + kDeadlineSlack,
                     [&](grpc::ClientContext* c) { return stub_->Get(c, request, &response); }),
          "Get", key);
    return response.value();
  }

  // Not idempotent: made once. A call that never left this process (no replica connected) is
  // made again by gRPC itself (transparent retry, wait_for_ready waits for the next replica);
  // one that failed UNAVAILABLE on a replica that died may or may not have added, and fails.
  int64_t Add(const std::string& key, int64_t delta) override {
    v1::AddRequest request;
    request.set_key(key);
    request.set_delta(delta);
    v1::AddResponse response;
    auto context = Context(Deadline(rpc_timeout_));
    Check(stub_->Add(context.get(), request, &response), "Add", key);
    return response.value();
  }

  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    v1::WaitRequest request;
    for (const auto& key : keys) request.add_keys(key);
    SetDuration(timeout, request.mutable_timeout());
    v1::WaitResponse response;
    Check(Idempotent(timeout + kDeadlineSlack,
                     [&](grpc::ClientContext* c) { return stub_->Wait(c, request, &response); }),
          "Wait", Join(keys));
  }

  bool Check(const std::vector<std::string>& keys) override {
    v1::CheckRequest request;
    for (const auto& key : keys) request.add_keys(key);
    v1::CheckResponse response;
    Check(Idempotent(rpc_timeout_,
                     [&](grpc::ClientContext* c) { return stub_->Check(c, request, &response); }),
          "Check", Join(keys));
    return response.ready();
  }

  // Made once, as Add: its count of deleted keys would be 0 the second time.
  int64_t DeletePrefix(const std::string& prefix) override {
    v1::DeletePrefixRequest request;
    request.set_prefix(prefix);
    v1::DeletePrefixResponse response;
    auto context = Context(Deadline(rpc_timeout_));
    Check(stub_->DeletePrefix(context.get(), request, &response), "DeletePrefix", prefix);
    return response.deleted();
  }

 private:
  static WallTime Deadline(std::chrono::milliseconds from_now) {
    return std::chrono::system_clock::now() + from_now;
  }

  // `call` with a fresh context until it ends other than UNAVAILABLE (its replica died under
  // it: the channel moves to the next one), at most kUnavailableRetries more times, all
  // within one deadline.
  grpc::Status Idempotent(std::chrono::milliseconds timeout,
                          const std::function<grpc::Status(grpc::ClientContext*)>& call) const {
    const WallTime deadline = Deadline(timeout);
    grpc::Status status;
    for (int tries = 0; tries <= kUnavailableRetries; ++tries) {
      auto context = Context(deadline);
      status = call(context.get());
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE ||
          std::chrono::system_clock::now() >= deadline) {
        break;
      }
    }
    return status;
  }

  std::unique_ptr<grpc::ClientContext> Context(WallTime deadline) const {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(deadline);
    // A store that is briefly unreachable (the api restarting) is waited for, within the
    // deadline, rather than failing the rendezvous at once.
    context->set_wait_for_ready(true);
    if (!token_.empty()) context->AddMetadata("authorization", "Bearer " + token_);
    return context;
  }

  void Check(const grpc::Status& status, const char* op, const std::string& what) const {
    if (status.ok()) return;
    const std::string prefix = std::string("store ") + address_ + ": " + op;
    // A deadline on a channel that never connected is an unreachable server, not keys that
    // failed to arrive.
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
        channel_->GetState(false) == GRPC_CHANNEL_READY) {
      // The server's timeout names the keys still missing, and only those (the Store
      // contract); only when the client's own deadline fired first are all of them named.
      const bool server_answered = status.error_message() != "Deadline Exceeded";
      throw ddp::StoreTimeoutError(prefix + (server_answered ? "" : " " + what) + ": " +
                                   status.error_message());
    }
    throw ddp::StoreError(prefix + " " + what + ": " + status.error_message());
  }

  static std::string Join(const std::vector<std::string>& keys) {
    std::string joined;
    for (const auto& key : keys) joined += (joined.empty() ? "" : ", ") + key;
    return joined;
  }

  const std::string address_;
  const std::string token_;
  const std::chrono::milliseconds rpc_timeout_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::StoreService::Stub> stub_;
};

}  // namespace

std::string GrpcStoreAddress(const std::string& url) {
  for (const char* scheme : {"grpc://", "grpc:"}) {
    if (url.rfind(scheme, 0) == 0) return url.substr(std::char_traits<char>::length(scheme));
  }
  return "";
}

std::shared_ptr<ddp::Store> MakeGrpcStore(const std::string& address,
                                          const GrpcStoreOptions& options) {
  auto credentials = ClientCredentials(options.tls_ca_file);
  if (!credentials.ok()) throw ddp::StoreError(std::string(credentials.status().message()));
  // The agent's GRADHUB_STORE: one address, a DNS name, or every replica's (api_targets.h).
  absl::StatusOr<ApiTarget> target = ParseApiTarget("GRADHUB_STORE", address);
  if (!target.ok()) throw ddp::StoreError(std::string(target.status().message()));
  return std::make_shared<GrpcStore>(address, *target, options, *std::move(credentials));
}

}  // namespace gradhub::store_client
