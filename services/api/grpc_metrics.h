// A gRPC server interceptor that records every call in ApiMetrics: method, status code and the
// time from its arrival to its status (for a stream, its whole life).
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>

#include "services/api/api_metrics.h"

namespace gradhub::api {

// For ServerBuilder::experimental().SetInterceptorCreators; `metrics` must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MetricsInterceptorFactory(
    ApiMetrics* metrics);

}  // namespace gradhub::api
