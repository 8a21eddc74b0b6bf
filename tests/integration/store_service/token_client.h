// A StoreService client with one bearer token on a channel of its own, as a rank has: for the
// tests of who may touch which keys (store_service_test, store_job_token_test).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "gradhub/v1/store.grpc.pb.h"

namespace gradhub::testing {

class TokenClient {
 public:
  // `token` "" sends no authorization; `deadline` bounds every call.
  TokenClient(std::shared_ptr<grpc::Channel> channel, std::string token,
              std::chrono::milliseconds deadline = std::chrono::seconds(20))
      : stub_(v1::StoreService::NewStub(std::move(channel))),
        token_(std::move(token)),
        deadline_(deadline) {}

  grpc::Status Set(const std::string& key, const std::string& value = "v") {
    v1::SetRequest request;
    request.set_key(key);
    request.set_value(value);
    return Call(&v1::StoreService::Stub::Set, request);
  }
  // Waits up to 2 s for the key.
  grpc::Status Get(const std::string& key, std::string* value = nullptr) {
    v1::GetRequest request;
    request.set_key(key);
    request.mutable_timeout()->set_seconds(2);
    v1::GetResponse response;
    grpc::Status status = Call(&v1::StoreService::Stub::Get, request, &response);
    if (value != nullptr) *value = response.value();
    return status;
  }
  grpc::Status Add(const std::string& key, int64_t* value = nullptr) {
    v1::AddRequest request;
    request.set_key(key);
    request.set_delta(1);
    v1::AddResponse response;
    grpc::Status status = Call(&v1::StoreService::Stub::Add, request, &response);
    if (value != nullptr) *value = response.value();
    return status;
  }
  // Waits up to 2 s for the keys.
  grpc::Status Wait(const std::vector<std::string>& keys) {
    v1::WaitRequest request;
    for (const std::string& key : keys) request.add_keys(key);
    request.mutable_timeout()->set_seconds(2);
    return Call(&v1::StoreService::Stub::Wait, request);
  }
  grpc::Status Check(const std::vector<std::string>& keys) {
    v1::CheckRequest request;
    for (const std::string& key : keys) request.add_keys(key);
    return Call(&v1::StoreService::Stub::Check, request);
  }
  grpc::Status DeletePrefix(const std::string& prefix) {
    v1::DeletePrefixRequest request;
    request.set_prefix(prefix);
    return Call(&v1::StoreService::Stub::DeletePrefix, request);
  }

 private:
  template <typename Request, typename Response>
  using Method = grpc::Status (v1::StoreService::Stub::*)(grpc::ClientContext*, const Request&,
                                                          Response*);

  template <typename Request, typename Response>
  grpc::Status Call(Method<Request, Response> method, const Request& request,
                    Response* response = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + deadline_);
    if (!token_.empty()) context.AddMetadata("authorization", "Bearer " + token_);
    Response ignored;
    return ((*stub_).*method)(&context, request, response != nullptr ? response : &ignored);
  }

  std::unique_ptr<v1::StoreService::Stub> stub_;
  std::string token_;
  std::chrono::milliseconds deadline_;
};

}  // namespace gradhub::testing
