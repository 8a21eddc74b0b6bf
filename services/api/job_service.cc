#include "services/api/job_service.h"

#include <string>
#include <thread>

#include "services/api/job_records.h"
#include "services/api/node_service.h"

namespace gradhub::api {
namespace {

// Authenticates the caller, runs `call(tenant_id)` (returning absl::StatusOr<T>) and stores
// its value in *response.
template <typename T, typename Call>
grpc::Status AsTenant(const JobService& service, const grpc::ServerContext& context, T* response,
                      Call&& call, bool admin_sees_all = true) {
  absl::StatusOr<int64_t> tenant = service.Tenant(context, admin_sees_all);
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

absl::StatusOr<int64_t> JobService::Tenant(const grpc::ServerContext& context,
                                           bool admin_sees_all) const {
  absl::StatusOr<Principal> principal = auth_->Authenticate(AuthorizationOf(context));
  if (!principal.ok()) return principal.status();
  if (principal->kind == Principal::Kind::kAdmin && admin_sees_all) return kAnyTenant;
  if (principal->kind != Principal::Kind::kTenant) {
    return absl::PermissionDeniedError("jobs belong to tenants: use a tenant token");
  }
  return principal->tenant_id;
}

grpc::Status JobService::CreateJob(grpc::ServerContext* context,
                                   const v1::CreateJobRequest* request, v1::Job* response) {
  return AsTenant(*this, *context, response, [&](int64_t tenant) {
    return jobs_->CreateJob(tenant, request->spec(), request->request_id());
  }, /*admin_sees_all=*/false);
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

grpc::Status JobService::WatchJob(grpc::ServerContext* context,
                                  const v1::WatchJobRequest* request,
                                  grpc::ServerWriter<v1::Job>* writer) {
  absl::StatusOr<int64_t> tenant = Tenant(*context, true);
  if (!tenant.ok()) return ToGrpc(tenant.status());
  std::string sent_etag;
  while (!context->IsCancelled()) {
    absl::StatusOr<v1::Job> job = jobs_->GetJob(*tenant, request->name());
    if (!job.ok()) return ToGrpc(job.status());
    if (job->etag() != sent_etag) {
      if (!writer->Write(*job)) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
      sent_etag = job->etag();
    }
    if (IsTerminal(job->state())) return grpc::Status::OK;
    std::this_thread::sleep_for(kPollInterval);
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled");
}

grpc::Status JobService::GetJobLogs(grpc::ServerContext* context,
                                    const v1::GetJobLogsRequest* request,
                                    grpc::ServerWriter<v1::LogEntry>* writer) {
  absl::StatusOr<int64_t> tenant = Tenant(*context, true);
  if (!tenant.ok()) return ToGrpc(tenant.status());
  constexpr int32_t kPage = 1000;
  const int32_t rank = request->has_rank() ? request->rank() : -1;
  std::map<int32_t, int64_t> after;
  int32_t attempt = request->attempt();
  while (!context->IsCancelled()) {
    absl::StatusOr<JobManager::LogPage> page = jobs_->ReadLogs(
        *tenant, request->name(), attempt, rank, after, request->after_seq(), kPage);
    if (!page.ok()) return ToGrpc(page.status());
    attempt = page->attempt;  // a follower stays on the attempt it started with
    for (const v1::LogEntry& line : page->lines) {
      if (!writer->Write(line)) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
      after[line.rank()] = line.seq();
    }
    if (static_cast<int32_t>(page->lines.size()) == kPage) continue;
    // Lines arrive after the job ends (agents flush), so a follower leaves once the job has
    // ended and a read found nothing new.
    if (!request->follow() || (IsTerminal(page->job.state()) && page->lines.empty())) {
      return grpc::Status::OK;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled");
}

}  // namespace gradhub::api
