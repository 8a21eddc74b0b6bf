// gradhub-checkpoint: the checkpoint store. Subcommands:
//   serve     migrate, clean up, then serve gRPC and REST until SIGTERM (the default)
//   migrate   bring the database schema up to date and exit
#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <signal.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/checkpoint_limits.h"
#include "services/checkpoint/checkpoint_manager.h"
#include "services/checkpoint/checkpoint_metrics.h"
#include "services/checkpoint/checkpoint_rest.h"
#include "services/checkpoint/checkpoint_service.h"
#include "services/checkpoint/config.h"
#include "services/checkpoint/local_blob_store.h"
#include "services/common/abseil_mode.h"
#include "services/common/auth/authenticator.h"
#include "services/common/db/migrator.h"
#include "services/common/db/pool.h"
#include "services/common/grpc_credentials.h"
#include "services/common/periodic_task.h"
#include "services/common/shutdown_signals.h"

namespace {

using gradhub::checkpoint::CheckpointConfig;

constexpr char kSummary[] =
    "gradhub-checkpoint: the gradhub checkpoint store (blobs on disk, rows in PostgreSQL).\n\n"
    "Usage: gradhub-checkpoint [flags] COMMAND\n\n"
    "Commands:\n"
    "  serve     apply migrations, clean up, then serve gRPC and REST until SIGTERM (default)\n"
    "  migrate   apply the schema migrations compiled into this binary, then exit";

constexpr int kMaxIdleRpcThreads = 32;
// Far above what a store's memory and threads serve: a mistyped limit is refused, not obeyed.
constexpr int64_t kMaxTransfers = 100000;
using gradhub::checkpoint::kMessageOverheadBytes;

void Log(const std::string& line) { std::cerr << "gradhub-checkpoint: " << line << std::endl; }

int Migrate(const CheckpointConfig& config) {
  const gradhub::db::Migrator migrator(gradhub::db::BuiltinMigrations(),
                                       config.server.database.migration_lock_timeout);
  auto done = migrator.ApplyWith(config.server.database.Connection("gradhub-checkpoint migrate"));
  if (!done.ok()) {
    Log(absl::StrCat("migrate: ", done.status().message()));
    return 1;
  }
  Log(*done);
  return 0;
}

void RunCleanup(gradhub::checkpoint::CheckpointManager& manager) {
  auto report = manager.Cleanup();
  Log(report.ok() ? "cleanup: " + report->ToString()
                  : absl::StrCat("cleanup failed: ", report.status().message()));
}

void RunScrub(gradhub::checkpoint::CheckpointManager& manager, const gradhub::PeriodicTask& task) {
  // A scrub reads every blob: a SIGTERM must not wait for all of them.
  auto report = manager.Scrub([&task] { return task.stopping(); });
  Log(report.ok() ? "scrub: " + report->ToString()
                  : absl::StrCat("scrub failed: ", report.status().message()));
}

std::unique_ptr<grpc::Server> StartGrpc(const CheckpointConfig& config,
                                        std::shared_ptr<grpc::ServerCredentials> credentials,
                                        grpc::Service* service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(config.grpc_host, ":", config.grpc_port), credentials,
                           port);
  // A second server on the same port must fail to start, not share it (gRPC's default): two
  // stores with different data directories behind one address would lose uploads.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.chunk_bytes) + kMessageOverheadBytes);
  builder.SetMaxSendMessageSize(static_cast<int>(config.chunk_bytes) + kMessageOverheadBytes);
  // As gradhub-api: keep idle threads for the next burst instead of one thread made per call.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                              kMaxIdleRpcThreads);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

// Keeps freed buffers of chunk size in the heap for the next chunk instead of handing them
// back to the kernel. gRPC allocates a buffer for each chunk it receives; with glibc's
// defaults those come fresh from the kernel, and a fresh page costs a fault and zeroing (on a
// VM also the host's first touch): about a third of the server's CPU per upload (0.45-0.65 ->
// 0.34-0.41 s per 256 MiB, tests/bench/checkpoint). The heap then keeps what the peak of concurrent
// uploads needed, a few chunks each. 32 MiB is the largest threshold glibc accepts on 64-bit.
void KeepChunkBuffersInTheHeap() {
  if (mallopt(M_MMAP_THRESHOLD, 32 << 20) != 1 || mallopt(M_TRIM_THRESHOLD, 256 << 20) != 1) {
    Log("mallopt failed: chunk buffers go back to the kernel after each chunk (slower uploads)");
  }
}

int Serve(const CheckpointConfig& config) {
  KeepChunkBuffersInTheHeap();
  if (config.chunk_bytes < gradhub::checkpoint::kMinChunkBytes ||
      config.chunk_bytes > gradhub::checkpoint::kMaxChunkBytes) {
    Log(absl::StrCat("--chunk-bytes: must be between ", gradhub::checkpoint::kMinChunkBytes,
                     " and ", gradhub::checkpoint::kMaxChunkBytes));
    return 2;
  }
  for (const auto& [flag, value] :
       {std::pair{"--max-transfers", config.max_transfers},
        {"--max-transfers-per-caller", config.max_transfers_per_caller}}) {
    if (value < 1 || value > kMaxTransfers) {
      Log(absl::StrCat(flag, ": must be between 1 and ", kMaxTransfers));
      return 2;
    }
  }
  auto credentials =
      gradhub::ServerCredentials(config.server.tls.cert_file, config.server.tls.key_file);
  if (!credentials.ok()) {
    Log(std::string(credentials.status().message()));
    return 2;
  }
  auto blobs = gradhub::checkpoint::LocalBlobStore::Open(config.data_dir);
  if (!blobs.ok()) {
    Log(absl::StrCat("--data-dir: ", blobs.status().message()));
    return 2;
  }
  if (int rc = Migrate(config); rc != 0) return rc;
  const gradhub::ShutdownSignals signals;

  gradhub::db::Pool pool(config.server.database.Pool("gradhub-checkpoint"));
  gradhub::api::Authenticator auth(&pool, config.server.admin_token);
  gradhub::checkpoint::CheckpointMetrics metrics(&pool);
  gradhub::checkpoint::CheckpointManager manager(
      &pool, blobs->get(), &metrics,
      {.chunk_size_bytes = static_cast<int32_t>(config.chunk_bytes),
       .upload_ttl = config.upload_ttl,
       .max_transfers = static_cast<int>(config.max_transfers),
       .max_transfers_per_caller = static_cast<int>(config.max_transfers_per_caller)});
  // Before the first call: what a crash left half done is finished or removed.
  RunCleanup(manager);

  gradhub::checkpoint::CheckpointService service(&manager, &auth, &metrics);
  int port = 0;
  std::unique_ptr<grpc::Server> server = StartGrpc(config, *credentials, &service, &port);
  if (!server || port == 0) {
    Log(absl::StrCat("cannot serve gRPC on ", config.grpc_host, ":", config.grpc_port));
    return 1;
  }
  gradhub::checkpoint::CheckpointRestOptions rest_options;
  rest_options.tls_cert_file = config.server.tls.cert_file;
  rest_options.tls_key_file = config.server.tls.key_file;
  gradhub::checkpoint::CheckpointRest rest(&manager, &auth, &metrics, rest_options);
  const absl::StatusOr<int> http_port =
      rest.Start(config.http_host, static_cast<int>(config.http_port));
  if (!http_port.ok()) {
    Log(absl::StrCat("REST: ", http_port.status().message()));
    return 1;
  }
  // Lines a launcher can parse for the ports actually bound.
  std::cout << "gradhub-checkpoint: serving REST on port " << *http_port << std::endl;
  std::cout << "gradhub-checkpoint: serving gRPC on port " << port << std::endl;

  gradhub::PeriodicTask cleanup(config.cleanup_interval, [&] { RunCleanup(manager); });
  gradhub::PeriodicTask scrub(config.scrub_interval, [&] { RunScrub(manager, scrub); });
  cleanup.Start();
  scrub.Start();

  const int received = signals.Wait();
  Log(absl::StrCat("signal ", received, ", shutting down"));
  // Stop accepting; calls in flight (an upload's stream, a commit) may finish within the grace.
  server->Shutdown(std::chrono::system_clock::now() +
                   absl::ToChronoSeconds(config.server.shutdown_grace));
  server->Wait();
  rest.Stop();
  cleanup.Stop();
  scrub.Stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gradhub::TurnOffMutexDeadlockDetection();
  CheckpointConfig config;
  gradhub::Flags flags("gradhub-checkpoint", kSummary);
  config.Register(flags);
  std::vector<std::string> args;
  if (std::optional<int> exit = flags.ParseOrExitCode(argc, argv, &args)) return *exit;
  if (args.empty() || (args.size() == 1 && args[0] == "serve")) return Serve(config);
  if (args.size() == 1 && args[0] == "migrate") return Migrate(config);
  std::cerr << flags.Usage();
  return 2;
}
