// What gradhub-checkpoint exposes at /metrics (Prometheus text format): bytes received and
// sent, commit latency, failures by reason, BAD blobs found, uploads in progress (counted in
// PostgreSQL at scrape time, so every replica reports the same truth), and the transfers this
// process serves now.
//
// Thread-safe: the Record* methods may be called from any thread (prometheus-cpp's metrics are
// atomic).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/time/time.h"
#include "services/common/db/pool.h"

namespace prometheus {
class Registry;
template <typename T>
class Family;
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace gradhub::checkpoint {

class CheckpointMetrics {
 public:
  // `pool` (not owned) is read at each scrape.
  explicit CheckpointMetrics(db::Pool* pool);
  ~CheckpointMetrics();

  // Bytes of UploadChunks data stored (re-sent bytes not counted).
  void RecordReceived(int64_t bytes);
  // Bytes of blobs sent; `transport` is "grpc" or "rest".
  void RecordSent(std::string_view transport, int64_t bytes);
  // A successful CommitCheckpoint, from its arrival to its answer.
  void RecordCommit(absl::Duration latency);
  // A refused or failed operation, by a short fixed reason ("sha256_mismatch", "gap", ...).
  void RecordFailure(std::string_view reason);
  // A checkpoint marked BAD, by where it was found ("download", "scrub", "cleanup").
  void RecordBad(std::string_view found_by);
  // Transfers (upload streams, downloads) this process serves now (transfer_slots.h).
  void SetTransfersInProgress(int transfers);

  // The text exposition format, version 0.0.4.
  std::string Scrape() const;

  // Where other parts of the server register what they count (the audit recorder's
  // gradhub_audit_write_failures_total); Scrape shows it.
  prometheus::Registry& registry() { return *registry_; }

 private:
  db::Pool* pool_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter* received_;
  prometheus::Family<prometheus::Counter>* sent_;
  prometheus::Histogram* commit_latency_;
  prometheus::Family<prometheus::Counter>* failures_;
  prometheus::Family<prometheus::Counter>* bad_;
  prometheus::Gauge* transfers_;
};

}  // namespace gradhub::checkpoint
