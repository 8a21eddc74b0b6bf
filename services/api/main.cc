// gradhub-api: the job API. Subcommands:
//   serve                     migrate, then serve gRPC until SIGTERM (the default)
//   migrate                   bring the database schema up to date and exit
//   create-tenant NAME        bootstrap: a tenant and its first token, printed once
//   create-node-token         bootstrap: a token for node agents, printed once
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cstdio>
#include <iostream>
#include <thread>

#include "services/api/admin_service.h"
#include "services/api/api_metrics.h"
#include "services/api/authenticator.h"
#include "services/api/config.h"
#include "services/api/grpc_metrics.h"
#include "services/api/job_manager.h"
#include "services/api/job_service.h"
#include "services/api/node_manager.h"
#include "services/api/node_service.h"
#include "services/api/rendezvous_store.h"
#include "services/api/rest_gateway.h"
#include "services/api/scheduler.h"
#include "services/api/store_service.h"
#include "services/common/abseil_mode.h"
#include "services/common/db/connection.h"
#include "services/common/db/migrator.h"
#include "services/common/db/pool.h"
#include "services/common/grpc_credentials.h"
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

// Idle gRPC threads kept for the next burst of calls (see SetSyncServerOption below).
constexpr int kMaxIdleRpcThreads = 64;

int Migrate(const gradhub::api::ApiConfig& config) {
  const gradhub::db::Migrator migrator(gradhub::db::BuiltinMigrations(),
                                       config.database.migration_lock_timeout);
  auto done = migrator.ApplyWith(config.database.Connection("gradhub-api migrate"));
  if (!done.ok()) {
    std::cerr << "gradhub-api migrate: " << done.status().message() << "\n";
    return 1;
  }
  std::cout << *done << "\n";
  return 0;
}

int CreateToken(const gradhub::api::ApiConfig& config, const std::string& tenant) {
  gradhub::db::Pool pool(config.database.Pool("gradhub-api"));
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

int Serve(const gradhub::api::ApiConfig& config) {
  auto credentials = gradhub::ServerCredentials(config.tls_cert_file, config.tls_key_file);
  if (!credentials.ok()) {
    std::cerr << "gradhub-api: " << credentials.status().message() << "\n";
    return 2;
  }
  if (int rc = Migrate(config); rc != 0) return rc;
  const gradhub::ShutdownSignals signals;

  gradhub::db::Pool pool(config.database.Pool("gradhub-api"));
  gradhub::api::Authenticator auth(&pool, config.admin_token);
  gradhub::api::JobManager jobs(
      &pool, gradhub::SpecLimits{.max_world_size = static_cast<int>(config.max_world_size)});
  gradhub::api::JobService job_service(&jobs, &auth);
  gradhub::api::RendezvousStore store;
  gradhub::api::StoreService store_service(&store, [&auth](const std::string& authorization) {
    return auth.RequireNodeOrAdmin(authorization);
  });
  gradhub::api::ApiMetrics metrics(&pool);
  gradhub::api::Scheduler scheduler(
      &pool, {.interval = config.scheduler_interval,
              .node_lease = config.heartbeat_interval * 3,
              .startup_grace = config.heartbeat_interval * 10,
              .backfill_window = config.backfill_window,
              .peer_failure_grace = std::max(absl::Seconds(3), config.heartbeat_interval * 2),
              .on_running = [&metrics](absl::Duration latency) {
                metrics.ObserveSchedulingLatency(latency);
              }});
  gradhub::api::NodeManagerOptions node_options;
  node_options.heartbeat_interval = config.heartbeat_interval;
  gradhub::api::NodeManager nodes(&pool, node_options);
  gradhub::api::NodeService node_service(&nodes, &auth, [&] { scheduler.Nudge(); });
  gradhub::api::AdminService admin_service(&auth);

  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.grpc_address, *credentials, &port);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(gradhub::api::MetricsInterceptorFactory(&metrics));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_request_bytes));
  // The sync server keeps at most MAX_POLLERS idle threads (default 2) and ends the rest: under
  // a few dozen concurrent calls that is a thread created and one ended per call, most of what
  // a CreateJob cost the server. Threads are still made only when every one is busy.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                              kMaxIdleRpcThreads);
  builder.RegisterService(&job_service);
  store_service.AddTo(builder);
  builder.RegisterService(&node_service);
  builder.RegisterService(&admin_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "gradhub-api: cannot serve gRPC on " << config.grpc_address << "\n";
    return 1;
  }
  store_service.Start();
  // Known only once the port is bound (it may be 0 = any).
  nodes.set_store_address(config.store_address.empty() ? "127.0.0.1:" + std::to_string(port)
                                                       : config.store_address);
  scheduler.Start();
  gradhub::api::RestGatewayOptions rest_options;
  rest_options.max_body_bytes = static_cast<size_t>(config.max_request_bytes);
  rest_options.tls_cert_file = config.tls_cert_file;
  rest_options.tls_key_file = config.tls_key_file;
  gradhub::api::RestGateway rest(&jobs, &auth, &metrics, rest_options);
  const absl::StatusOr<int> http_port =
      rest.Start(config.http_host, static_cast<int>(config.http_port));
  if (!http_port.ok()) {
    std::cerr << "gradhub-api: REST: " << http_port.status().message() << "\n";
    return 1;
  }
  // Lines a launcher can parse for the ports actually bound.
  std::cout << "gradhub-api: serving REST on port " << *http_port << std::endl;
  std::cout << "gradhub-api: serving gRPC on port " << port << std::endl;

  const int received = signals.Wait();
  std::cerr << "gradhub-api: signal " << received << ", shutting down\n";
  scheduler.Stop();
  store_service.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + absl::ToChronoSeconds(config.shutdown_grace));
  server->Wait();
  store_service.Stop();
  rest.Stop();
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
  if (args.empty() || (args.size() == 1 && args[0] == "serve")) return Serve(config);
  if (args.size() == 1 && args[0] == "migrate") return Migrate(config);
  if (args.size() == 2 && args[0] == "create-tenant") return CreateToken(config, args[1]);
  if (args.size() == 1 && args[0] == "create-node-token") return CreateToken(config, "");
  std::cerr << flags.Usage();
  return 2;
}
