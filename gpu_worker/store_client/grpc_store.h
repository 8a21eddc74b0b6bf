// The engine's Store over the job API's StoreService (proto/gradhub/v1/store.proto), so that
// ranks on different nodes rendezvous through gradhub-api. Kept apart from the engine (which
// has no gRPC) and from torch (slow headers): the trainer links both and hands this to them
// as a plain ddp::Store.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "gpu_worker/ddp/store.h"

namespace gradhub::store_client {

// "grpc://host:port" (or "grpc:host:port") -> "host:port"; empty when `url` is not one.
std::string GrpcStoreAddress(const std::string& url);

// `address` is host:port of StoreService; `token`, when not empty, is sent as
// `authorization: Bearer <token>`; `rpc_timeout` bounds the calls that do not wait for keys
// (Set, Add, Check, DeletePrefix). Thread-safe, like every Store. Errors: StoreTimeoutError when the server says the keys did
// not come in time, StoreError for everything else (unreachable, refused, malformed).
std::shared_ptr<ddp::Store> MakeGrpcStore(
    const std::string& address, const std::string& token = "",
    std::chrono::milliseconds rpc_timeout = std::chrono::seconds(30));

}  // namespace gradhub::store_client
