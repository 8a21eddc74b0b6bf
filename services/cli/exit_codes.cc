#include "services/cli/exit_codes.h"

#include "absl/status/status.h"

namespace gradhub::cli {

ExitCode ExitCodeFor(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return kOk;
    case grpc::StatusCode::NOT_FOUND:
      return kNotFound;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
      return kInvalidArgument;
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return kAuth;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return kUnavailable;
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::ABORTED:
      return kConflict;
    default:
      return kInternal;
  }
}

std::string StatusCodeName(grpc::StatusCode code) {
  // gRPC's codes are absl's, number for number; absl already spells them.
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace gradhub::cli
