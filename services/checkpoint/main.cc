// gradhub-checkpoint: the checkpoint store. Subcommands:
//   serve     migrate, clean up, then serve gRPC and REST until SIGTERM (the default)
//   migrate   bring the database schema up to date and exit
//   rewrap-keys, rotate-key TENANT   encryption at rest's key rotations (key_store.h)
#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <signal.h>

#include <algorithm>
#include <climits>
#include <iostream>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/blob_scopes.h"
#include "services/checkpoint/checkpoint_limits.h"
#include "services/checkpoint/checkpoint_manager.h"
#include "services/checkpoint/checkpoint_metrics.h"
#include "services/checkpoint/checkpoint_rest.h"
#include "services/checkpoint/checkpoint_service.h"
#include "services/checkpoint/code_rest.h"
#include "services/checkpoint/code_service.h"
#include "services/checkpoint/code_store.h"
#include "services/checkpoint/config.h"
#include "services/checkpoint/key_store.h"
#include "services/checkpoint/local_blob_store.h"
#include "services/checkpoint/sealed_blob_store.h"
#include "services/common/abseil_mode.h"
#include "services/common/audit/audit_log.h"
#include "services/common/audit/call_auditor.h"
#include "services/common/audit/grpc_audit.h"
#include "services/common/audit/http_audit.h"
#include "services/common/auth/authenticator.h"
#include "services/common/db/migrator.h"
#include "services/common/db/pool.h"
#include "services/common/grpc_credentials.h"
#include "services/common/grpc_server.h"
#include "services/common/heap_mode.h"
#include "services/common/periodic_task.h"
#include "services/common/shutdown_signals.h"

namespace {

using gradhub::checkpoint::CheckpointConfig;
using gradhub::checkpoint::MasterKey;

constexpr char kSummary[] =
    "gradhub-checkpoint: the gradhub checkpoint store (blobs on disk, rows in PostgreSQL).\n\n"
    "Usage: gradhub-checkpoint [flags] COMMAND\n\n"
    "Commands:\n"
    "  serve     apply migrations, clean up, then serve gRPC and REST until SIGTERM (default)\n"
    "  migrate   apply the schema migrations compiled into this binary, then exit\n"
    "  rewrap-keys\n"
    "            re-wrap every data key wrapped by --old-master-key-file with\n"
    "            --master-key-file (after a master key rotation), then exit\n"
    "  rotate-key TENANT\n"
    "            give TENANT (or _code: the code archives' key) a new data key for new\n"
    "            blobs; blobs sealed before keep theirs, then exit";

constexpr int kMaxIdleRpcThreads = 32;
// Far above what a store's memory and threads serve: a mistyped limit is refused, not obeyed.
constexpr int64_t kMaxTransfers = 100000;
constexpr int64_t kMaxCodeBytes = int64_t{1} << 40;
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

// --master-key-file's key. Made first when it does not exist and either --create-master-key
// or the default path (in the data directory) allows it.
absl::StatusOr<MasterKey> LoadMasterKey(const CheckpointConfig& config) {
  const std::string path = config.MasterKeyPath();
  const bool by_default = config.master_key_file.empty();
  if (by_default) {
    Log(absl::StrCat("the master key is ", path,
                     ", on the data directory's disk: a copy of that "
                     "disk holds the key too; pass --master-key-file on another volume"));
  }
  absl::StatusOr<MasterKey> key = MasterKey::Load(path);
  if (!absl::IsNotFound(key.status()) || !(by_default || config.create_master_key)) return key;
  key = MasterKey::Create(path);
  if (absl::IsAlreadyExists(key.status())) return MasterKey::Load(path);  // made meanwhile
  if (key.ok()) Log(absl::StrCat("created master key ", key->id(), " in ", path));
  return key;
}

// rewrap-keys: after a master key rotation, every data key wrapped by the old master key is
// wrapped by the new one (key_store.h); blobs are untouched.
int RewrapKeys(const CheckpointConfig& config) {
  if (config.old_master_key_file.empty()) {
    Log("rewrap-keys: --old-master-key-file: required (the master key used until now)");
    return 2;
  }
  absl::StatusOr<MasterKey> master = LoadMasterKey(config);
  absl::StatusOr<MasterKey> old = MasterKey::Load(config.old_master_key_file);
  for (const auto* key : {&master, &old}) {
    if (!key->ok()) {
      Log(absl::StrCat("rewrap-keys: ", key->status().message()));
      return 2;
    }
  }
  if (int rc = Migrate(config); rc != 0) return rc;
  gradhub::db::Pool pool(config.server.database.Pool("gradhub-checkpoint rewrap-keys"));
  gradhub::checkpoint::KeyStore keys(&pool, &*master);
  const absl::StatusOr<int> rewrapped = keys.Rewrap(*old);
  if (!rewrapped.ok()) {
    Log(absl::StrCat("rewrap-keys: ", rewrapped.status().message()));
    return 1;
  }
  Log(absl::StrCat("rewrap-keys: ", *rewrapped, " data keys re-wrapped from master key ", old->id(),
                   " to ", master->id()));
  const absl::Status left = keys.CheckAllWrappedByMaster();
  if (!left.ok()) Log(absl::StrCat("rewrap-keys: ", left.message()));
  return left.ok() ? 0 : 1;
}

// rotate-key NAME: a new current data key for tenant NAME, or for the platform (`_code`).
int RotateKey(const CheckpointConfig& config, const std::string& name) {
  absl::StatusOr<MasterKey> master = LoadMasterKey(config);
  if (!master.ok()) {
    Log(absl::StrCat("rotate-key: ", master.status().message()));
    return 2;
  }
  if (int rc = Migrate(config); rc != 0) return rc;
  gradhub::db::Pool pool(config.server.database.Pool("gradhub-checkpoint rotate-key"));
  gradhub::checkpoint::KeyScope scope = gradhub::checkpoint::KeyScope::Platform();
  if (name != "_code") {
    absl::StatusOr<gradhub::db::Result> tenant =
        pool.Exec("SELECT id FROM tenants WHERE name = $1", {name});
    if (!tenant.ok() || tenant->empty()) {
      Log(absl::StrCat("rotate-key: no tenant '", name, "'"));
      return 2;
    }
    scope = gradhub::checkpoint::KeyScope::Tenant(tenant->row(0).Get<int64_t>("id"));
  }
  gradhub::checkpoint::KeyStore keys(&pool, &*master);
  const absl::StatusOr<gradhub::checkpoint::DataKey> rotated = keys.Rotate(scope);
  if (!rotated.ok()) {
    Log(absl::StrCat("rotate-key: ", rotated.status().message()));
    return 1;
  }
  Log(absl::StrCat("rotate-key: new blobs of ", scope.ToString(), " are sealed under data key ",
                   gradhub::checkpoint::UuidText(rotated->id),
                   "; blobs sealed before keep their keys"));
  return 0;
}

// One line for the log: what a cleanup or a scrub did, or why it failed.
template <typename Report>
void LogReport(const char* what, const absl::StatusOr<Report>& report) {
  Log(report.ok() ? absl::StrCat(what, ": ", report->ToString())
                  : absl::StrCat(what, " failed: ", report.status().message()));
}

void RunCleanup(gradhub::checkpoint::CheckpointManager& manager,
                gradhub::checkpoint::CodeStore& code) {
  LogReport("cleanup", manager.Cleanup());
  LogReport("code cleanup", code.Cleanup());
}

void RunScrub(gradhub::checkpoint::CheckpointManager& manager, gradhub::checkpoint::CodeStore& code,
              const gradhub::PeriodicTask& task) {
  // A scrub reads every blob: a SIGTERM must not wait for all of them.
  const auto stop = [&task] { return task.stopping(); };
  LogReport("scrub", manager.Scrub(stop));
  if (!task.stopping()) LogReport("code scrub", code.Scrub(stop));
}

// The gRPC server with `services` registered and `auditor` recording the audited calls
// (DeleteCheckpoint, UploadCode).
absl::StatusOr<std::unique_ptr<gradhub::GrpcServer>> StartGrpc(
    const CheckpointConfig& config, std::shared_ptr<grpc::ServerCredentials> credentials,
    std::vector<grpc::Service*> services, gradhub::audit::CallAuditor* auditor) {
  // Checkpoint chunks and code upload messages (code.proto: 4 MiB of data) both fit.
  const int max_message = std::max(static_cast<int>(config.chunk_bytes),
                                   gradhub::checkpoint::kMaxCodeMessageDataBytes) +
                          kMessageOverheadBytes;
  return gradhub::StartGrpcServer(
      {.address = absl::StrCat(config.grpc_host, ":", config.grpc_port),
       .credentials = std::move(credentials),
       .max_idle_threads = kMaxIdleRpcThreads,
       .max_receive_bytes = max_message,
       .max_send_bytes = max_message,
       // Two stores with different data directories behind one address would lose uploads.
       .exclusive_port = true,
       .limits = config.server.grpc},
      [services, auditor](grpc::ServerBuilder& builder) {
        std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
            interceptors;
        interceptors.push_back(gradhub::audit::AuditInterceptorFactory(auditor));
        builder.experimental().SetInterceptorCreators(std::move(interceptors));
        for (grpc::Service* service : services) builder.RegisterService(service);
      });
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

// The flags Serve checks before it touches anything; a message naming the flag when one is out
// of range.
absl::Status CheckLimits(const CheckpointConfig& config) {
  if (config.chunk_bytes < gradhub::checkpoint::kMinChunkBytes ||
      config.chunk_bytes > gradhub::checkpoint::kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("--chunk-bytes: must be between ",
                                                   gradhub::checkpoint::kMinChunkBytes, " and ",
                                                   gradhub::checkpoint::kMaxChunkBytes));
  }
  for (const auto& [flag, value, most] :
       {std::tuple{"--max-transfers", config.max_transfers, kMaxTransfers},
        {"--max-transfers-per-caller", config.max_transfers_per_caller, kMaxTransfers},
        {"--max-code-bytes", config.max_code_bytes, kMaxCodeBytes},
        {"--max-code-unpacked-bytes", config.max_code_unpacked_bytes, kMaxCodeBytes},
        {"--max-code-entries", config.max_code_entries, int64_t{INT32_MAX}}}) {
    if (value < 1 || value > most) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": must be between 1 and ", most));
    }
  }
  return absl::OkStatus();
}

// The store's parts, built in dependency order (members are initialized in declaration order
// and destroyed in reverse, so that nothing outlives what it points to). Nothing runs yet.
struct CheckpointServer {
  // `files`: where the sealed blobs are kept (the local filesystem).
  CheckpointServer(const CheckpointConfig& config, gradhub::checkpoint::BlobStore* files,
                   const MasterKey* master)
      : pool(config.server.database.Pool("gradhub-checkpoint")),
        keys(&pool, master),
        scopes(&pool),
        blobs(files, &keys, &scopes),
        auth(&pool, config.server.admin_token),
        metrics(&pool),
        audit_log(&pool),
        auditor(&auth, &audit_log,
                {.registry = &metrics.registry(), .server_name = "gradhub-checkpoint"}),
        manager(&pool, &blobs, &metrics,
                {.chunk_size_bytes = static_cast<int32_t>(config.chunk_bytes),
                 .upload_ttl = config.upload_ttl,
                 .max_transfers = static_cast<int>(config.max_transfers),
                 .max_transfers_per_caller = static_cast<int>(config.max_transfers_per_caller)}),
        code(&pool, &blobs, &manager.transfer_slots(), &metrics, CodeOptionsFor(config)),
        service(&manager, &auth, &metrics),
        code_service(&code, &auth, &metrics),
        rest(&manager, &auth, &metrics, RestOptionsFor(config)),
        code_rest(rest.http_server(), &code, &auth, &metrics),
        cleanup(config.cleanup_interval, [this] { RunCleanup(manager, code); }),
        scrub(config.scrub_interval, [this] { RunScrub(manager, code, scrub); }) {
    gradhub::audit::AuditHttpCalls(rest.http_server(), &auditor);  // both REST faces' calls
  }

  static gradhub::checkpoint::CheckpointRestOptions RestOptionsFor(const CheckpointConfig& config) {
    gradhub::checkpoint::CheckpointRestOptions options;
    options.tls_cert_file = config.server.tls.cert_file;
    options.tls_key_file = config.server.tls.key_file;
    options.limits = config.server.http;
    return options;
  }

  static gradhub::checkpoint::CodeStoreOptions CodeOptionsFor(const CheckpointConfig& config) {
    return {.limits = {.max_archive_bytes = config.max_code_bytes,
                       .max_unpacked_bytes = config.max_code_unpacked_bytes,
                       .max_entries = static_cast<int32_t>(config.max_code_entries)},
            .upload_ttl = config.upload_ttl,
            .log = Log};
  }

  gradhub::db::Pool pool;
  // Encryption at rest: every blob sealed under its tenant's data key.
  gradhub::checkpoint::KeyStore keys;
  gradhub::checkpoint::CheckpointBlobScopes scopes;
  gradhub::checkpoint::SealedBlobStore blobs;
  gradhub::api::Authenticator auth;
  gradhub::checkpoint::CheckpointMetrics metrics;
  gradhub::audit::PostgresAuditLog audit_log;
  gradhub::audit::CallAuditor auditor;  // records DeleteCheckpoint and UploadCode calls
  gradhub::checkpoint::CheckpointManager manager;
  gradhub::checkpoint::CodeStore code;
  gradhub::checkpoint::CheckpointService service;
  gradhub::checkpoint::CodeService code_service;
  gradhub::checkpoint::CheckpointRest rest;
  gradhub::checkpoint::CodeRest code_rest;  // routes on rest's listener
  gradhub::PeriodicTask cleanup;
  gradhub::PeriodicTask scrub;
};

// Serves gRPC and REST until SIGTERM or SIGINT, then stops: gRPC first (calls in flight, an
// upload's stream or a commit, may finish within the grace), then REST and the periodic tasks.
int ServeUntilSignal(const CheckpointConfig& config, const gradhub::ShutdownSignals& signals,
                     std::shared_ptr<grpc::ServerCredentials> credentials,
                     CheckpointServer& store) {
  auto server = StartGrpc(config, std::move(credentials), {&store.service, &store.code_service},
                          &store.auditor);
  if (!server.ok()) {
    Log(std::string(server.status().message()));
    return 1;
  }
  const absl::StatusOr<int> http_port =
      store.rest.Start(config.http_host, static_cast<int>(config.http_port));
  if (!http_port.ok()) {
    Log(absl::StrCat("REST: ", http_port.status().message()));
    return 1;
  }
  // Lines a launcher can parse for the ports actually bound.
  std::cout << "gradhub-checkpoint: serving REST on port " << *http_port << std::endl;
  std::cout << "gradhub-checkpoint: serving gRPC on port " << (*server)->port() << std::endl;
  store.cleanup.Start();
  store.scrub.Start();
  const int received = signals.Wait();
  Log(absl::StrCat("signal ", received, ", shutting down"));
  (*server)->Shutdown(config.server.shutdown_grace);
  store.rest.Stop();
  store.cleanup.Stop();
  store.scrub.Stop();
  return 0;
}

int Serve(const CheckpointConfig& config) {
  KeepChunkBuffersInTheHeap();
  if (absl::Status limits = CheckLimits(config); !limits.ok()) {
    Log(std::string(limits.message()));
    return 2;
  }
  auto credentials = gradhub::ServerCredentials(
      config.server.tls.cert_file, config.server.tls.key_file, config.server.tls.client_ca_file);
  if (!credentials.ok()) {
    Log(std::string(credentials.status().message()));
    return 2;
  }
  auto blobs = gradhub::checkpoint::LocalBlobStore::Open(config.data_dir);
  if (!blobs.ok()) {
    Log(absl::StrCat("--data-dir: ", blobs.status().message()));
    return 2;
  }
  const absl::StatusOr<MasterKey> master = LoadMasterKey(config);
  if (!master.ok()) {
    Log(std::string(master.status().message()));
    return 2;
  }
  if (int rc = Migrate(config); rc != 0) return rc;
  const gradhub::ShutdownSignals signals;
  CheckpointServer store(config, blobs->get(), &*master);
  // Keys this master key cannot unwrap would fail every read of their tenants: refused now.
  if (absl::Status wrapped = store.keys.CheckAllWrappedByMaster(); !wrapped.ok()) {
    Log(std::string(wrapped.message()));
    return 2;
  }
  // Before the first call: what a crash left half done is finished or removed.
  RunCleanup(store.manager, store.code);
  return ServeUntilSignal(config, signals, *std::move(credentials), store);
}

}  // namespace

int main(int argc, char** argv) {
  gradhub::TurnOffMutexDeadlockDetection();
  gradhub::KeepFreedHeapForTheNextMessage(gradhub::kForMessages);
  CheckpointConfig config;
  gradhub::Flags flags("gradhub-checkpoint", kSummary);
  config.Register(flags);
  std::vector<std::string> args;
  if (std::optional<int> exit = flags.ParseOrExitCode(argc, argv, &args)) return *exit;
  gradhub::HideSecretFlagValues(argc, argv, {"--admin-token", "--database-url"});
  if (args.empty() || (args.size() == 1 && args[0] == "serve")) return Serve(config);
  if (args.size() == 1 && args[0] == "migrate") return Migrate(config);
  if (args.size() == 1 && args[0] == "rewrap-keys") return RewrapKeys(config);
  if (args.size() == 2 && args[0] == "rotate-key") return RotateKey(config, args[1]);
  std::cerr << flags.Usage();
  return 2;
}
