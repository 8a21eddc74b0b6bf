#include "gpu_worker/store_client/grpc_store.h"

#include <grpcpp/grpcpp.h>

#include "gradhub/v1/store.grpc.pb.h"
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

class GrpcStore final : public ddp::Store {
 public:
  GrpcStore(const std::string& address, const GrpcStoreOptions& options,
            std::shared_ptr<grpc::ChannelCredentials> credentials)
      : address_(address),
        token_(options.token),
        rpc_timeout_(options.rpc_timeout),
        channel_(grpc::CreateChannel(address, std::move(credentials))),
        stub_(v1::StoreService::NewStub(channel_)) {}

  void Set(const std::string& key, const std::string& value) override {
    v1::SetRequest request;
    request.set_key(key);
    request.set_value(value);
    v1::SetResponse response;
    auto context = Context(rpc_timeout_);
    Check(stub_->Set(context.get(), request, &response), "Set", key);
  }

  std::string Get(const std::string& key, std::chrono::milliseconds timeout) override {
    v1::GetRequest request;
    request.set_key(key);
    SetDuration(timeout, request.mutable_timeout());
    v1::GetResponse response;
    auto context = Context(timeout + kDeadlineSlack);
    Check(stub_->Get(context.get(), request, &response), "Get", key);
    return response.value();
  }

  int64_t Add(const std::string& key, int64_t delta) override {
    v1::AddRequest request;
    request.set_key(key);
    request.set_delta(delta);
    v1::AddResponse response;
    auto context = Context(rpc_timeout_);
    Check(stub_->Add(context.get(), request, &response), "Add", key);
    return response.value();
  }

  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    v1::WaitRequest request;
    for (const auto& key : keys) request.add_keys(key);
    SetDuration(timeout, request.mutable_timeout());
    v1::WaitResponse response;
    auto context = Context(timeout + kDeadlineSlack);
    Check(stub_->Wait(context.get(), request, &response), "Wait", Join(keys));
  }

  bool Check(const std::vector<std::string>& keys) override {
    v1::CheckRequest request;
    for (const auto& key : keys) request.add_keys(key);
    v1::CheckResponse response;
    auto context = Context(rpc_timeout_);
    Check(stub_->Check(context.get(), request, &response), "Check", Join(keys));
    return response.ready();
  }

  int64_t DeletePrefix(const std::string& prefix) override {
    v1::DeletePrefixRequest request;
    request.set_prefix(prefix);
    v1::DeletePrefixResponse response;
    auto context = Context(rpc_timeout_);
    Check(stub_->DeletePrefix(context.get(), request, &response), "DeletePrefix", prefix);
    return response.deleted();
  }

 private:
  std::unique_ptr<grpc::ClientContext> Context(std::chrono::milliseconds deadline) const {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + deadline);
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
  return std::make_shared<GrpcStore>(address, options, *std::move(credentials));
}

}  // namespace gradhub::store_client
