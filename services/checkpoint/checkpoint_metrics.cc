#include "services/checkpoint/checkpoint_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace gradhub::checkpoint {
namespace {

// A commit is an fsync of up to gigabytes and a transaction: from 10 ms to a minute.
const prometheus::Histogram::BucketBoundaries kCommitBuckets = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                                1,    2.5,   5,    10,  30,   60};

prometheus::MetricFamily Gauge(const char* name, const char* help, double value) {
  prometheus::MetricFamily family{name, help, prometheus::MetricType::Gauge, {}};
  family.metric.emplace_back().gauge.value = value;
  return family;
}

}  // namespace

CheckpointMetrics::CheckpointMetrics(db::Pool* pool)
    : pool_(pool),
      registry_(std::make_shared<prometheus::Registry>()),
      received_(&prometheus::BuildCounter()
                     .Name("gradhub_checkpoint_received_bytes_total")
                     .Help("Checkpoint bytes received and stored by UploadChunks.")
                     .Register(*registry_)
                     .Add({})),
      sent_(&prometheus::BuildCounter()
                 .Name("gradhub_checkpoint_sent_bytes_total")
                 .Help("Checkpoint bytes sent by downloads, by transport.")
                 .Register(*registry_)),
      commit_latency_(&prometheus::BuildHistogram()
                           .Name("gradhub_checkpoint_commit_duration_seconds")
                           .Help("Time of a successful CommitCheckpoint: hash check, fsync, "
                                 "rename, transaction, retention.")
                           .Register(*registry_)
                           .Add({}, kCommitBuckets)),
      failures_(&prometheus::BuildCounter()
                     .Name("gradhub_checkpoint_failures_total")
                     .Help("Refused or failed checkpoint operations, by reason.")
                     .Register(*registry_)),
      bad_(&prometheus::BuildCounter()
                .Name("gradhub_checkpoint_bad_total")
                .Help("Checkpoints marked BAD (blob corrupt or missing), by where it was found.")
                .Register(*registry_)),
      transfers_(&prometheus::BuildGauge()
                      .Name("gradhub_checkpoint_transfers_in_progress")
                      .Help("Upload streams and downloads this process serves now (at most "
                            "--max-transfers).")
                      .Register(*registry_)
                      .Add({})) {}

CheckpointMetrics::~CheckpointMetrics() = default;

void CheckpointMetrics::RecordReceived(int64_t bytes) {
  received_->Increment(static_cast<double>(bytes));
}

void CheckpointMetrics::RecordSent(std::string_view transport, int64_t bytes) {
  sent_->Add({{"transport", std::string(transport)}}).Increment(static_cast<double>(bytes));
}

void CheckpointMetrics::RecordCommit(absl::Duration latency) {
  commit_latency_->Observe(absl::ToDoubleSeconds(latency));
}

void CheckpointMetrics::RecordFailure(std::string_view reason) {
  failures_->Add({{"reason", std::string(reason)}}).Increment();
}

void CheckpointMetrics::RecordBad(std::string_view found_by) {
  bad_->Add({{"found_by", std::string(found_by)}}).Increment();
}

void CheckpointMetrics::SetTransfersInProgress(int transfers) {
  transfers_->Set(static_cast<double>(transfers));
}

std::string CheckpointMetrics::Scrape() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  // Nothing when the database cannot be read: zero uploads would be a lie.
  auto rows =
      pool_->Exec("SELECT count(*)::bigint AS n FROM checkpoints WHERE state = 'UPLOADING'");
  if (rows.ok()) {
    families.push_back(Gauge("gradhub_checkpoint_uploads_in_progress",
                             "Uploads started and not yet committed or discarded.",
                             static_cast<double>(rows->row(0).Get<int64_t>("n"))));
  }
  families.push_back(Gauge("gradhub_checkpoint_database_up",
                           "1 when the scrape could read the database.", rows.ok() ? 1 : 0));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace gradhub::checkpoint
