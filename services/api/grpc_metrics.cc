#include "services/api/grpc_metrics.h"

#include <string>

namespace gradhub::api {
namespace {

using grpc::experimental::InterceptionHookPoints;

class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(ApiMetrics* metrics, std::string method)
      : metrics_(metrics), method_(std::move(method)), start_(absl::Now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      metrics_->RecordRequest("grpc", method_,
                              static_cast<absl::StatusCode>(methods->GetSendStatus().error_code()),
                              absl::Now() - start_);
    }
    methods->Proceed();
  }

 private:
  ApiMetrics* metrics_;
  const std::string method_;
  const absl::Time start_;
};

class MetricsInterceptorFactoryImpl final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MetricsInterceptorFactoryImpl(ApiMetrics* metrics) : metrics_(metrics) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new MetricsInterceptor(metrics_, MethodLabel(info->method()));
  }

 private:
  // "/gradhub.v1.JobService/CreateJob" -> "JobService.CreateJob", the label REST uses too.
  static std::string MethodLabel(const char* full) {
    std::string method(full == nullptr ? "" : full);
    const size_t slash = method.rfind('/');
    const size_t dot = method.rfind('.', slash);
    if (slash == std::string::npos || dot == std::string::npos) return method;
    return method.substr(dot + 1, slash - dot - 1) + "." + method.substr(slash + 1);
  }

  ApiMetrics* metrics_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MetricsInterceptorFactory(
    ApiMetrics* metrics) {
  return std::make_unique<MetricsInterceptorFactoryImpl>(metrics);
}

}  // namespace gradhub::api
