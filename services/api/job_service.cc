#include "services/api/job_service.h"

#include <string>

#include "services/common/audit/audited_calls.h"
#include "services/common/audit/grpc_audit.h"
#include "services/common/auth/call_authorization.h"
#include "services/common/grpc_status.h"
#include "services/common/job_records.h"

namespace gradhub::api {

absl::StatusOr<int64_t> JobService::Tenant(const grpc::ServerContext& context,
                                           JobAccess access) const {
  return auth_->JobTenant(AuthorizationOf(context), access);
}

grpc::Status JobService::CreateJob(grpc::ServerContext* context,
                                   const v1::CreateJobRequest* request, v1::Job* response) {
  return AnswerFor(Tenant(*context, JobAccess::kCreate), response, [&](int64_t tenant) {
    std::optional<audit::AuditRecord> event;
    if (auditor_ != nullptr)
      event = auditor_->EventOf(audit::GrpcCallOf(*context, audit::kCreateJobMethod));
    return jobs_->CreateJob(tenant, request->spec(), request->request_id(), std::move(event));
  });
}

grpc::Status JobService::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                v1::Job* response) {
  return AnswerFor(Tenant(*context, JobAccess::kReadOrCancel), response,
                   [&](int64_t tenant) { return jobs_->GetJob(tenant, request->name()); });
}

grpc::Status JobService::ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                                  v1::ListJobsResponse* response) {
  return AnswerFor(Tenant(*context, JobAccess::kReadOrCancel), response,
                   [&](int64_t tenant) { return jobs_->ListJobs(tenant, *request); });
}

grpc::Status JobService::CancelJob(grpc::ServerContext* context,
                                   const v1::CancelJobRequest* request, v1::Job* response) {
  return AnswerFor(Tenant(*context, JobAccess::kReadOrCancel), response, [&](int64_t tenant) {
    return jobs_->CancelJob(tenant, request->name(), request->reason());
  });
}

grpc::Status JobService::ListJobEvents(grpc::ServerContext* context,
                                       const v1::ListJobEventsRequest* request,
                                       v1::ListJobEventsResponse* response) {
  return AnswerFor(Tenant(*context, JobAccess::kReadOrCancel), response,
                   [&](int64_t tenant) { return jobs_->ListJobEvents(tenant, *request); });
}

grpc::Status JobService::GetJobMetrics(grpc::ServerContext* context,
                                       const v1::GetJobMetricsRequest* request,
                                       v1::JobMetrics* response) {
  return AnswerFor(Tenant(*context, JobAccess::kReadOrCancel), response,
                   [&](int64_t tenant) { return jobs_->GetJobMetrics(tenant, *request); });
}

grpc::Status JobService::WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                                  grpc::ServerWriter<v1::Job>* writer) {
  const absl::StatusOr<int64_t> tenant = Tenant(*context, JobAccess::kReadOrCancel);
  if (!tenant.ok()) return ToGrpc(tenant.status());
  return ToGrpc(jobs_->WatchJob(
      *tenant, request->name(), [&](const v1::Job& job) { return writer->Write(job); },
      [&] { return context->IsCancelled(); }));
}

grpc::Status JobService::GetJobLogs(grpc::ServerContext* context,
                                    const v1::GetJobLogsRequest* request,
                                    grpc::ServerWriter<v1::LogEntry>* writer) {
  const absl::StatusOr<int64_t> tenant = Tenant(*context, JobAccess::kReadOrCancel);
  if (!tenant.ok()) return ToGrpc(tenant.status());
  return ToGrpc(jobs_->StreamLogs(
      *tenant, *request, [&](const v1::LogEntry& line) { return writer->Write(line); },
      [&] { return context->IsCancelled(); }));
}

}  // namespace gradhub::api
