#pragma once

// The boundary of every gRPC service: managers answer absl::Status(Or); handlers hand that to
// gRPC through these, so each code means the same on every service.

#include <grpcpp/support/status.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradhub {

// absl::Status -> grpc::Status, code and message unchanged (absl::StatusCode and
// grpc::StatusCode share their numbering: both are google.rpc.Code).
inline grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

// A manager's answer as the handler's: its value into *response, or its error.
template <typename T>
grpc::Status Answer(absl::StatusOr<T> result, T* response) {
  if (!result.ok()) return ToGrpc(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

// The usual handler in one call: `caller` is who authentication found (or why not); runs
// `call(*caller)`, which returns absl::StatusOr<T>, and answers with it.
template <typename Caller, typename T, typename Call>
grpc::Status AnswerFor(const absl::StatusOr<Caller>& caller, T* response, Call&& call) {
  if (!caller.ok()) return ToGrpc(caller.status());
  return Answer<T>(std::forward<Call>(call)(*caller), response);
}

}  // namespace gradhub
