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

struct GrpcStoreOptions {
  // Sent as `authorization: Bearer <token>` when not empty: a rank's job token, which the api
  // confines to its attempt's keys (jobs/<id>/attempts/<n>/), or the admin token.
  std::string token;
  // PEM certificates to trust for TLS to the api; empty = plaintext.
  std::string tls_ca_file;
  // Bounds the calls that do not wait for keys (Set, Add, Check, DeletePrefix).
  std::chrono::milliseconds rpc_timeout = std::chrono::seconds(30);
};

// `address` is host:port of StoreService, or every replica's, comma-separated
// (services/common/api_targets.h); Set, Get, Wait and Check are made again on the next replica
// when theirs dies mid-call, Add and DeletePrefix are not (grpc_store.cc). Thread-safe, like every
// Store. Errors: StoreTimeoutError when the server says the keys did not come in time, StoreError
// for everything else (unreachable, refused, malformed; here already an unreadable tls_ca_file).
std::shared_ptr<ddp::Store> MakeGrpcStore(const std::string& address,
                                          const GrpcStoreOptions& options = {});

}  // namespace gradhub::store_client
