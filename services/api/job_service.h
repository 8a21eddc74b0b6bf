// gradhub.v1.JobService over gRPC: authentication from the `authorization` metadata, then a
// call into JobManager, whose absl::Status maps one to one onto the gRPC status. The
// synchronous API: every call is a few short SQL statements on gRPC's thread pool, which is
// what that pool is for.
#pragma once

#include "gradhub/v1/jobs.grpc.pb.h"
#include "services/api/job_manager.h"
#include "services/common/audit/call_auditor.h"
#include "services/common/auth/authenticator.h"

namespace gradhub::api {

class JobService final : public v1::JobService::Service {
 public:
  // Not owned; all must outlive the service. `auditor`: where CreateJob's audit event comes
  // from, which CreateJob writes with the job (AuditedRpc::ok_event_written_by_handler);
  // nullptr on a server that audits nothing.
  JobService(JobManager* jobs, const Authenticator* auth, const audit::CallAuditor* auditor)
      : jobs_(jobs), auth_(auth), auditor_(auditor) {}

  grpc::Status CreateJob(grpc::ServerContext* context, const v1::CreateJobRequest* request,
                         v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  grpc::Status ListJobEvents(grpc::ServerContext* context, const v1::ListJobEventsRequest* request,
                             v1::ListJobEventsResponse* response) override;
  grpc::Status GetJobMetrics(grpc::ServerContext* context, const v1::GetJobMetricsRequest* request,
                             v1::JobMetrics* response) override;

  // Streams the job whenever it changes (JobManager::WatchJob), until it ends or the client goes.
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::Job>* writer) override;
  grpc::Status GetJobLogs(grpc::ServerContext* context, const v1::GetJobLogsRequest* request,
                          grpc::ServerWriter<v1::LogEntry>* writer) override;

 private:
  absl::StatusOr<int64_t> Tenant(const grpc::ServerContext& context, JobAccess access) const;

  JobManager* jobs_;
  const Authenticator* auth_;
  const audit::CallAuditor* auditor_;
};

}  // namespace gradhub::api
