#include "services/common/grpc_retry.h"

namespace gradhub {

bool IsRetryable(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::UNAUTHENTICATED:  // see grpc_retry.h for why
      return true;
    default:
      return false;
  }
}

}  // namespace gradhub
