#include "services/common/grpc_retry.h"

namespace gradhub {

bool IsTransient(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::ABORTED:
      return true;
    default:
      return false;
  }
}

bool IsRetryable(grpc::StatusCode code) {
  return IsTransient(code) || code == grpc::StatusCode::UNAUTHENTICATED;  // grpc_retry.h: why
}

}  // namespace gradhub
