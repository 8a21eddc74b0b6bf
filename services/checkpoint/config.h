#pragma once

#include <string>

#include "absl/time/time.h"
#include "services/common/flags.h"
#include "services/common/server_settings.h"

namespace gradhub::checkpoint {

// Every setting of gradhub-checkpoint, with its flag, environment variable and default: those
// every server shares (server_settings.h), then the store's own.
struct CheckpointConfig {
  ServerSettings server{.database = {.connections = 8}, .shutdown_grace = absl::Seconds(30)};
  std::string grpc_host = "0.0.0.0";
  int64_t grpc_port = 7071;
  std::string http_host = "0.0.0.0";
  int64_t http_port = 8081;
  std::string data_dir = "/var/lib/gradhub/checkpoints";
  int64_t chunk_bytes = 1 << 20;
  int64_t max_transfers = 64;
  int64_t max_transfers_per_caller = 16;
  absl::Duration upload_ttl = absl::Hours(1);
  absl::Duration cleanup_interval = absl::Minutes(10);
  absl::Duration scrub_interval = absl::Hours(24);
  // Code archives of script jobs (code_store.h).
  int64_t max_code_bytes = int64_t{256} << 20;
  int64_t max_code_unpacked_bytes = int64_t{1} << 30;
  int64_t max_code_entries = 100000;
  // Encryption at rest (sealed_blob_store.h, key_store.h). An empty master_key_file means
  // <data_dir>/master.key, made when absent.
  std::string master_key_file;
  bool create_master_key = false;
  std::string old_master_key_file;  // for rewrap-keys

  // --master-key-file, or its default.
  std::string MasterKeyPath() const {
    return master_key_file.empty() ? data_dir + "/master.key" : master_key_file;
  }

  void Register(Flags& flags) {
    server.Register(flags, {.connections_env = "GRADHUB_CHECKPOINT_DATABASE_CONNECTIONS",
                            .migrates = true,
                            .tls_effect = "gRPC and REST serve TLS only"});
    flags.String("grpc-host", "GRADHUB_CHECKPOINT_GRPC_HOST", &grpc_host,
                 "Address gRPC (CheckpointService) listens on");
    flags.Int("grpc-port", "GRADHUB_CHECKPOINT_GRPC_PORT", &grpc_port,
              "Port for gRPC; 0 picks a free one (printed at start)");
    flags.String("http-host", "GRADHUB_CHECKPOINT_HTTP_HOST", &http_host,
                 "Address REST, /healthz, /readyz and /metrics listen on");
    flags.Int("http-port", "GRADHUB_CHECKPOINT_HTTP_PORT", &http_port,
              "Port for REST; 0 picks a free one (printed at start)");
    flags.String("data-dir", "GRADHUB_CHECKPOINT_DATA_DIR", &data_dir,
                 "Directory of the blobs and uploads in progress (one filesystem)");
    flags.Int("chunk-bytes", "GRADHUB_CHECKPOINT_CHUNK_BYTES", &chunk_bytes,
              "Largest data of one UploadChunkRequest (announced by StartUpload) and of one "
              "download message; at most 3 MiB");
    flags.Int("max-transfers", "GRADHUB_CHECKPOINT_MAX_TRANSFERS", &max_transfers,
              "Upload streams and downloads served at once (each holds up to ~12 MiB of "
              "buffers); beyond, RESOURCE_EXHAUSTED (HTTP 429), which trainers retry");
    flags.Int("max-transfers-per-caller", "GRADHUB_CHECKPOINT_MAX_TRANSFERS_PER_CALLER",
              &max_transfers_per_caller,
              "Of those, how many one tenant, one node or the admin may have at once");
    flags.Duration("upload-ttl", "GRADHUB_CHECKPOINT_UPLOAD_TTL", &upload_ttl,
                   "Uploads neither committed nor written to for this long are discarded");
    flags.Duration("cleanup-interval", "GRADHUB_CHECKPOINT_CLEANUP_INTERVAL", &cleanup_interval,
                   "Time between cleanups (stale uploads, orphan files, deletions left "
                   "unfinished); one also runs at start; 0 = only at start");
    flags.Duration("scrub-interval", "GRADHUB_CHECKPOINT_SCRUB_INTERVAL", &scrub_interval,
                   "Time between scrubs, which re-hash every committed blob; 0 = never");
    flags.Int("max-code-bytes", "GRADHUB_CHECKPOINT_MAX_CODE_BYTES", &max_code_bytes,
              "Largest code archive (the tar's bytes) an upload may carry");
    flags.Int("max-code-unpacked-bytes", "GRADHUB_CHECKPOINT_MAX_CODE_UNPACKED_BYTES",
              &max_code_unpacked_bytes, "Largest sum of a code archive's file sizes");
    flags.Int("max-code-entries", "GRADHUB_CHECKPOINT_MAX_CODE_ENTRIES", &max_code_entries,
              "Most entries (files, directories, links) in one code archive");
    flags.String("master-key-file", "GRADHUB_CHECKPOINT_MASTER_KEY_FILE", &master_key_file,
                 "File of the master key (32 random bytes, mode 0600) that wraps the data keys "
                 "blobs are encrypted under; keep it off the data directory's disk. Empty: "
                 "<data-dir>/master.key, made when absent (a copy of that disk is then a copy "
                 "of the key)");
    flags.Bool("create-master-key", "GRADHUB_CHECKPOINT_CREATE_MASTER_KEY", &create_master_key,
               "Make --master-key-file (32 random bytes, mode 0600) when it does not exist");
    flags.String("old-master-key-file", "GRADHUB_CHECKPOINT_OLD_MASTER_KEY_FILE",
                 &old_master_key_file,
                 "For rewrap-keys: the master key the data keys are wrapped by until now");
  }
};

}  // namespace gradhub::checkpoint
