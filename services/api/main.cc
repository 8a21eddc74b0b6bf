// gradhub-api: the job API. Subcommands:
//   serve                     migrate, then serve gRPC until SIGTERM (the default)
//   migrate                   bring the database schema up to date and exit
//   create-tenant NAME        bootstrap: a tenant and its first token, printed once
//   create-node-token         bootstrap: a token for node agents, printed once
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <thread>

#include "services/api/admin_service.h"
#include "services/api/api_metrics.h"
#include "services/api/assignment_notifier.h"
#include "services/api/audit_reader.h"
#include "services/api/audit_service.h"
#include "services/api/config.h"
#include "services/api/grpc_metrics.h"
#include "services/api/job_manager.h"
#include "services/api/job_service.h"
#include "services/api/leader_lease.h"
#include "services/api/node_manager.h"
#include "services/api/node_service.h"
#include "services/api/postgres_rendezvous_backend.h"
#include "services/api/rendezvous_store.h"
#include "services/api/replica_signals.h"
#include "services/api/rest_gateway.h"
#include "services/api/scheduler.h"
#include "services/api/store_scope.h"
#include "services/api/store_service.h"
#include "services/common/abseil_mode.h"
#include "services/common/audit/audit_log.h"
#include "services/common/audit/call_auditor.h"
#include "services/common/audit/grpc_audit.h"
#include "services/common/auth/authenticator.h"
#include "services/common/contract/defaults.h"
#include "services/common/db/connection.h"
#include "services/common/db/migrator.h"
#include "services/common/db/pool.h"
#include "services/common/grpc_credentials.h"
#include "services/common/grpc_server.h"
#include "services/common/shutdown_signals.h"

namespace {

constexpr char kSummary[] =
    "gradhub-api: the gradhub job API.\n\n"
    "Usage: gradhub-api [flags] COMMAND\n\n"
    "Commands:\n"
    "  serve               apply migrations, then serve gRPC and REST until SIGTERM (default)\n"
    "  migrate             apply the schema migrations compiled into this binary, then exit\n"
    "  create-tenant NAME  create a tenant and print its first token (shown once)\n"
    "  create-node-token   print a new token for node agents (shown once)";

// Idle gRPC threads kept for the next burst of calls (GrpcServerOptions::max_idle_threads).
constexpr int kMaxIdleRpcThreads = 64;

int Migrate(const gradhub::api::ApiConfig& config) {
  const gradhub::db::Migrator migrator(gradhub::db::BuiltinMigrations(),
                                       config.server.database.migration_lock_timeout);
  auto done = migrator.ApplyWith(config.server.database.Connection("gradhub-api migrate"));
  if (!done.ok()) {
    std::cerr << "gradhub-api migrate: " << done.status().message() << "\n";
    return 1;
  }
  std::cout << *done << "\n";
  return 0;
}

int CreateToken(const gradhub::api::ApiConfig& config, const std::string& tenant) {
  gradhub::db::Pool pool(config.server.database.Pool("gradhub-api"));
  gradhub::api::Authenticator auth(&pool, "");
  absl::StatusOr<gradhub::api::NewToken> token;
  if (tenant.empty()) {
    token = auth.CreateNodeToken("created by gradhub-api create-node-token");
  } else {
    auto id = auth.CreateTenant(tenant, "");
    if (!id.ok()) {
      std::cerr << "gradhub-api create-tenant: " << id.status().message() << "\n";
      return 1;
    }
    token = auth.CreateTenantToken(tenant, "created by gradhub-api create-tenant");
  }
  if (!token.ok()) {
    std::cerr << "gradhub-api: " << token.status().message() << "\n";
    return 1;
  }
  std::cout << token->secret << "\n";
  return 0;
}

// A changed desired set wakes this replica's WatchAssignments streams at once and the other
// replicas' through `signals` (sent after the scheduler's commit: replica_signals.h).
gradhub::api::SchedulerOptions SchedulerOptionsFor(const gradhub::api::ApiConfig& config,
                                                   gradhub::api::ApiMetrics* metrics,
                                                   gradhub::api::AssignmentNotifier* notifier,
                                                   gradhub::api::ReplicaSignals* signals,
                                                   gradhub::api::LeaderLease* leader) {
  return {.interval = config.scheduler_interval,
          .node_lease = config.heartbeat_interval * gradhub::defaults::kLeaseHeartbeats,
          .startup_grace = config.heartbeat_interval * 10,
          .node_outage_grace = config.node_outage_grace,
          .backfill_window = config.backfill_window,
          .peer_failure_grace = std::max(absl::Seconds(3), config.heartbeat_interval * 2),
          .on_running =
              [metrics](absl::Duration latency) { metrics->ObserveSchedulingLatency(latency); },
          .leader = leader,
          .on_assignments_changed =
              [notifier, signals] {
                notifier->Notify();
                signals->PublishAssignmentsChanged();
              }};
}

gradhub::api::NodeManagerOptions NodeManagerOptionsFor(const gradhub::api::ApiConfig& config) {
  gradhub::api::NodeManagerOptions options;
  options.heartbeat_interval = config.heartbeat_interval;
  return options;
}

// A connection for the leader lease's ticks (one at a time), whose statements end within a
// lease: a renewal that takes longer has failed anyway (leader_lease.h step 3).
gradhub::db::PoolOptions LeaderPoolOptions(const gradhub::api::ApiConfig& config) {
  gradhub::db::PoolOptions options = config.server.database.Pool("gradhub-api leader");
  options.max_connections = 1;
  options.connection.statement_timeout = config.leader_lease;
  // A renewal unanswered for a quarter lease has failed: the pool then fails the next ticks
  // at once (pool.h) instead of each waiting out the silence, and the leader steps down on
  // time.
  options.connection.silence_timeout =
      std::min(options.connection.silence_timeout, config.leader_lease / 4);
  options.connection.connect_timeout =
      std::min(options.connection.connect_timeout, config.leader_lease / 4);
  options.acquire_timeout = config.leader_lease;
  return options;
}

// The api's managers and the gRPC services over them, built in dependency order (members are
// initialized in declaration order and destroyed in reverse, so that no service outlives what
// it points to). Nothing runs yet: StartGrpc and StartBackground start them.
struct ApiServices {
  explicit ApiServices(const gradhub::api::ApiConfig& config)
      : pool(config.server.database.Pool("gradhub-api")),
        auth(&pool, config.server.admin_token),
        jobs(&pool, gradhub::SpecLimits{.max_world_size = static_cast<int>(config.max_world_size)}),
        job_service(&jobs, &auth, &auditor),
        // The rendezvous store's keys in PostgreSQL, shared with every other replica (issue
        // #35): a rendezvous survives the death of the replica that took its keys.
        store(gradhub::api::RendezvousStoreOptions{},
              std::make_unique<gradhub::api::PostgresRendezvousBackend>(&pool)),
        // A database lookup per call of a script rank (its job token is never cached), on
        // one of the store's authorization threads, not its queue thread (store_service.h).
        store_service(&store,
                      [this](const std::string& authorization) {
                        return gradhub::api::AuthorizeStoreCall(auth, authorization);
                      }),
        metrics(&pool),
        leader_pool(LeaderPoolOptions(config)),
        // A replica that becomes the leader runs a pass at once.
        leader(&leader_pool, {.lease = config.leader_lease,
                              .on_change =
                                  [this](bool leading) {
                                    metrics.SetLeading(leading);
                                    if (leading) scheduler.Nudge();
                                  }}),
        scheduler(&pool, SchedulerOptionsFor(config, &metrics, &notifier, &signals, &leader)),
        signals(&pool, ReplicaSignalsOptionsFor(config)),
        nodes(&pool, NodeManagerOptionsFor(config)),
        node_service(&nodes, &auth, [this] { NudgeAll(); }, &notifier,
                     {.require_client_certificate = config.require_node_certificates}),
        tenants(&auth),
        admin_service(&auth, &tenants),
        audit_log(&pool),
        auditor(&auth, &audit_log, {.registry = &metrics.registry(), .server_name = "gradhub-api"}),
        audit_reader(&auth, &audit_log),
        audit_service(&audit_reader) {
    // Every replica's scheduler and streams hear of changes made here: locally at once, the
    // others through `signals`, published after the change committed (replica_signals.h).
    jobs.set_on_created([this](const gradhub::v1::Job& job, const gradhub::v1::JobSpec& spec) {
      scheduler.JobSubmitted(job, spec);
      signals.PublishJobCreated(job.name());
    });
    jobs.set_initial_reason([this](const gradhub::v1::JobSpec& spec, const std::string& tenant) {
      return scheduler.ReasonForNewJob(spec, tenant);
    });
    jobs.set_on_cancelled([this] {
      NudgeAll();
      notifier.Notify();
      signals.PublishAssignmentsChanged();
    });
  }
  // The scheduler's loop publishes through `signals`, destroyed before it.
  ~ApiServices() { scheduler.Stop(); }

  // The scheduler of this replica and, through `signals`, every other's.
  void NudgeAll() {
    scheduler.Nudge();
    signals.PublishNudge();
  }

  gradhub::api::ReplicaSignalsOptions ReplicaSignalsOptionsFor(
      const gradhub::api::ApiConfig& config) {
    return {.connection = config.server.database.Connection("gradhub-api signals"),
            .on_assignments_changed = [this] { notifier.Notify(); },
            .on_job_created = [this](const std::string& name) { scheduler.JobCreated(name); },
            .on_nudge = [this] { scheduler.Nudge(); }};
  }

  gradhub::db::Pool pool;
  gradhub::api::Authenticator auth;
  gradhub::api::JobManager jobs;
  gradhub::api::JobService job_service;
  gradhub::api::RendezvousStore store;
  gradhub::api::StoreService store_service;
  gradhub::api::ApiMetrics metrics;
  gradhub::api::AssignmentNotifier notifier;
  // The lease's own connections: its renewals never wait behind requests for the pool.
  gradhub::db::Pool leader_pool;
  gradhub::api::LeaderLease leader;
  gradhub::api::Scheduler scheduler;
  gradhub::api::ReplicaSignals signals;  // after scheduler: its listener calls into it
  gradhub::api::NodeManager nodes;
  gradhub::api::NodeService node_service;
  gradhub::api::TenantManager tenants;
  gradhub::api::AdminService admin_service;
  gradhub::audit::PostgresAuditLog audit_log;
  gradhub::audit::CallAuditor auditor;  // records audited calls of gRPC and REST alike
  gradhub::api::AuditReader audit_reader;
  gradhub::api::AuditService audit_service;
};

// The gRPC server with every service registered (and the interceptors that count their calls
// and record the audited ones), bound and started.
absl::StatusOr<std::unique_ptr<gradhub::GrpcServer>> StartGrpc(
    const gradhub::api::ApiConfig& config,
    const std::shared_ptr<grpc::ServerCredentials>& credentials, ApiServices& services) {
  const gradhub::GrpcServerOptions options{
      .address = config.grpc_address,
      .credentials = credentials,
      .max_idle_threads = kMaxIdleRpcThreads,
      .max_receive_bytes = static_cast<int>(config.max_request_bytes),
      .limits = config.server.grpc};
  return gradhub::StartGrpcServer(options, [&services](grpc::ServerBuilder& builder) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    interceptors.push_back(gradhub::api::MetricsInterceptorFactory(&services.metrics));
    interceptors.push_back(gradhub::audit::AuditInterceptorFactory(&services.auditor));
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
    builder.RegisterService(&services.job_service);
    services.store_service.AddTo(builder);
    builder.RegisterService(&services.node_service);
    builder.RegisterService(&services.admin_service);
    builder.RegisterService(&services.audit_service);
  });
}

// What runs beside the calls, once gRPC is up: the store's completions and the scheduler.
void StartBackground(const gradhub::api::ApiConfig& config, int grpc_port, ApiServices& services) {
  services.store_service.Start();
  // Known only once the port is bound (it may be 0 = any).
  services.nodes.set_store_address(config.store_address.empty()
                                       ? "127.0.0.1:" + std::to_string(grpc_port)
                                       : config.store_address);
  if (absl::Status started = services.signals.Start(); !started.ok()) {
    std::cerr << "gradhub-api: replica signals: " << started << "\n";  // fixed options: a bug
  }
  services.scheduler.Start();
  services.leader.Start();
}

// REST serves the same managers as gRPC; a drain nudges the scheduler as NodeService's does.
gradhub::api::RestBackends RestBackendsOf(ApiServices& services) {
  return gradhub::api::RestBackends{
      .jobs = &services.jobs,
      .nodes = &services.nodes,
      .tenants = &services.tenants,
      .auth = &services.auth,
      .metrics = &services.metrics,
      .on_nodes_changed = [&services] { services.NudgeAll(); },
      .audit_events = &services.audit_reader,
      .auditor = &services.auditor,
      .leadership = [&services] { return services.leader.Describe(); }};
}

gradhub::api::RestGatewayOptions RestOptionsFor(const gradhub::api::ApiConfig& config) {
  gradhub::api::RestGatewayOptions options;
  options.max_body_bytes = static_cast<size_t>(config.max_request_bytes);
  options.tls_cert_file = config.server.tls.cert_file;
  options.tls_key_file = config.server.tls.key_file;
  options.limits = config.server.http;
  options.streams = config.rest_streams;
  return options;
}

// Blocks until SIGTERM or SIGINT, then stops taking work in this order: the scheduler first
// (no new placements), the store's waiters, gRPC calls (given shutdown_grace to finish), REST.
void WaitForShutdown(const gradhub::ShutdownSignals& signals, const gradhub::api::ApiConfig& config,
                     ApiServices& services, gradhub::GrpcServer& server,
                     gradhub::api::RestGateway& rest) {
  const int received = signals.Wait();
  std::cerr << "gradhub-api: signal " << received << ", shutting down\n";
  services.signals.Stop();  // no more calls into the scheduler from other replicas' signals
  services.scheduler.Stop();
  services.leader.Stop();        // releases the term: another replica takes over at its next tick
  services.notifier.Shutdown();  // ends the agents' WatchAssignments streams
  services.store_service.Shutdown();
  server.Shutdown(config.server.shutdown_grace);
  services.store_service.Stop();
  rest.Stop();
}

int Serve(const gradhub::api::ApiConfig& config) {
  if (config.require_node_certificates && config.server.tls.client_ca_file.empty()) {
    std::cerr << "gradhub-api: --tls-require-client-cert needs --tls-client-ca\n";
    return 2;
  }
  auto credentials = gradhub::ServerCredentials(
      config.server.tls.cert_file, config.server.tls.key_file, config.server.tls.client_ca_file);
  if (!credentials.ok()) {
    std::cerr << "gradhub-api: " << credentials.status().message() << "\n";
    return 2;
  }
  if (int rc = Migrate(config); rc != 0) return rc;
  const gradhub::ShutdownSignals signals;
  ApiServices services(config);
  absl::StatusOr<std::unique_ptr<gradhub::GrpcServer>> server =
      StartGrpc(config, *credentials, services);
  if (!server.ok()) {
    std::cerr << "gradhub-api: " << server.status().message() << "\n";
    return 1;
  }
  StartBackground(config, (*server)->port(), services);
  gradhub::api::RestGateway rest(RestBackendsOf(services), RestOptionsFor(config));
  const absl::StatusOr<int> http_port =
      rest.Start(config.http_host, static_cast<int>(config.http_port));
  if (!http_port.ok()) {
    std::cerr << "gradhub-api: REST: " << http_port.status().message() << "\n";
    return 1;
  }
  // Lines a launcher can parse for the ports actually bound.
  std::cout << "gradhub-api: serving REST on port " << *http_port << std::endl;
  std::cout << "gradhub-api: serving gRPC on port " << (*server)->port() << std::endl;
  WaitForShutdown(signals, config, services, **server, rest);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gradhub::TurnOffMutexDeadlockDetection();
  gradhub::api::ApiConfig config;
  gradhub::Flags flags("gradhub-api", kSummary);
  config.Register(flags);
  std::vector<std::string> args;
  if (std::optional<int> exit = flags.ParseOrExitCode(argc, argv, &args)) return *exit;
  gradhub::HideSecretFlagValues(argc, argv, {"--admin-token", "--database-url"});
  if (args.empty() || (args.size() == 1 && args[0] == "serve")) return Serve(config);
  if (args.size() == 1 && args[0] == "migrate") return Migrate(config);
  if (args.size() == 2 && args[0] == "create-tenant") return CreateToken(config, args[1]);
  if (args.size() == 1 && args[0] == "create-node-token") return CreateToken(config, "");
  std::cerr << flags.Usage();
  return 2;
}
