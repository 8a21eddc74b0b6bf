#include "services/api/job_service.h"

#include <string>

namespace gradhub::api {
namespace {

// Authenticates the caller, runs `call(tenant_id)` (returning absl::StatusOr<T>) and stores
// its value in *response.
template <typename T, typename Call>
grpc::Status AsTenant(const JobService& service, const grpc::ServerContext& context, T* response,
                      Call&& call) {
  absl::StatusOr<int64_t> tenant = service.Tenant(context);
  if (!tenant.ok()) return ToGrpc(tenant.status());
  absl::StatusOr<T> result = call(*tenant);
  if (!result.ok()) return ToGrpc(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::StatusOr<int64_t> JobService::Tenant(const grpc::ServerContext& context) const {
  const auto& metadata = context.client_metadata();
  const auto header = metadata.find("authorization");
  const std::string authorization =
      header == metadata.end() ? "" : std::string(header->second.data(), header->second.size());
  absl::StatusOr<Principal> principal = auth_->Authenticate(authorization);
  if (!principal.ok()) return principal.status();
  if (principal->kind != Principal::Kind::kTenant) {
    return absl::PermissionDeniedError("jobs belong to tenants: use a tenant token");
  }
  return principal->tenant_id;
}

grpc::Status JobService::CreateJob(grpc::ServerContext* context,
                                   const v1::CreateJobRequest* request, v1::Job* response) {
  return AsTenant(*this, *context, response, [&](int64_t tenant) {
    return jobs_->CreateJob(tenant, request->spec(), request->request_id());
  });
}

grpc::Status JobService::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                v1::Job* response) {
  return AsTenant(*this, *context, response,
                  [&](int64_t tenant) { return jobs_->GetJob(tenant, request->name()); });
}

grpc::Status JobService::ListJobs(grpc::ServerContext* context,
                                  const v1::ListJobsRequest* request,
                                  v1::ListJobsResponse* response) {
  return AsTenant(*this, *context, response,
                  [&](int64_t tenant) { return jobs_->ListJobs(tenant, *request); });
}

grpc::Status JobService::CancelJob(grpc::ServerContext* context,
                                   const v1::CancelJobRequest* request, v1::Job* response) {
  return AsTenant(*this, *context, response,
                  [&](int64_t tenant) { return jobs_->CancelJob(tenant, request->name()); });
}

grpc::Status JobService::ListJobEvents(grpc::ServerContext* context,
                                       const v1::ListJobEventsRequest* request,
                                       v1::ListJobEventsResponse* response) {
  return AsTenant(*this, *context, response,
                  [&](int64_t tenant) { return jobs_->ListJobEvents(tenant, request->parent()); });
}

}  // namespace gradhub::api
