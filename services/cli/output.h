// How the CLI prints: text for people (aligned tables, `key: value` blocks, a YAML rendering of
// specs) and the proto3 JSON mapping for scripts. Pure functions from messages to strings, so
// the commands decide where things go (stdout for results, stderr for notes) and tests need no
// server.
#pragma once

#include <google/protobuf/message.h>
#include <google/protobuf/timestamp.pb.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gradhub/v1/audit.pb.h"
#include "gradhub/v1/checkpoint.pb.h"
#include "gradhub/v1/jobs.pb.h"
#include "gradhub/v1/nodes.pb.h"
#include "gradhub/v1/tenants.pb.h"

namespace gradhub::cli {

enum class Format { kText, kJson };

// The proto3 JSON mapping, as REST sends it (lowerCamelCase names, enums by name, int64 as
// strings, fields with default values left out). `pretty` indents it for a single document;
// streams print one compact document per line (newline-delimited JSON, like REST's streams).
std::string ToJson(const google::protobuf::Message& message, bool pretty = true);

// Every number the CLI shows people, in plain (fixed) notation: `significant` significant
// digits, but never fewer than the integer part has, trailing zeros dropped. 18750.3 ->
// "18750", 0.123456 -> "0.1235", 0.000025 -> "0.000025", 2.0 -> "2". Only magnitudes no
// training reports (below 1e-9, from 1e16 up) fall back to scientific notation; NaN and the
// infinities print as "nan", "inf", "-inf".
inline constexpr int kDisplayDigits = 4;
std::string PlainNumber(double value, int significant = kDisplayDigits);
// The same notation with as many digits as it takes to read back as the same value (the
// shortest such text), for renderings that are parsed again (ToYaml). A float's digits are
// the float's: 0.1f -> "0.1".
std::string ExactNumber(double value);
std::string ExactNumber(float value);

// RFC 3339 in UTC to the second, or "-" for an unset timestamp.
std::string FormatTime(const google::protobuf::Timestamp& time);

// Columns separated by two spaces and padded to the widest cell; the first row is the header.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string Render() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// A message as block-style YAML: set fields only, lowerCamelCase names, enums by name. The
// result parses back with ParseJobSpec, so `describe` output can be edited and resubmitted.
std::string ToYaml(const google::protobuf::Message& message, int indent = 0);

// `get`: the job's status as `key: value` lines (the spec is left to `describe`). `describe`
// adds a `checkpoint:` line (CheckpointSummary).
std::string JobSummary(const v1::Job& job,
                       const std::optional<std::string>& checkpoint = std::nullopt);
// The newest committed checkpoint the events leave, where a restart would resume: the
// CHECKPOINT_COMMITTED event with the highest step whose step no later CHECKPOINT_CORRUPT
// took back; nullptr when there is none.
const v1::JobEvent* LatestCheckpoint(const std::vector<const v1::JobEvent*>& events);
// "step 75, 1.2 MiB (attempt 1, committed 2026-...)", or "none committed".
std::string CheckpointSummary(const v1::JobEvent* latest);
// `list`: one row per job.
std::string JobsTable(const std::vector<const v1::Job*>& jobs);
// `describe`: one row per event, oldest first.
std::string EventsTable(const std::vector<const v1::JobEvent*>& events);

// One `watch` update for a log or a pipe: `STATE step/total loss L samples/s S`.
std::string ProgressLine(const v1::Job& job);
// One `watch` update for a terminal: a bar of `width` cells, the percent done, the time left
// (TimeLeft; `ETA ?` while unknown, nothing once the job has ended), then the ProgressLine.
std::string ProgressBar(const v1::Job& job, int width = 30);
// The steps still to run at the last reported throughput: samples_per_second over the
// spec's global batch (job_spec.h GlobalBatchSize: batch per rank x data-parallel replicas x
// accumulation; the replicas are the ranks without a pipeline). nullopt before the first
// report, without a total or a throughput, and once the job has ended.
std::optional<absl::Duration> TimeLeft(const v1::Job& job);
// Whole seconds, two units at most: "45s", "2m05s", "1h02m", "3d04h".
std::string ShortDuration(absl::Duration duration);

// `metrics`: one row per point, in step order (step, attempt, loss, learning rate, samples/s,
// evaluation metrics by name); `-` for what a point does not have.
std::string MetricsTable(const v1::JobMetrics& metrics);
// `metrics`: the training loss against the step as plain ASCII, `width` x `height` cells of
// `*` between a loss axis (labelled at the top, middle and bottom rows) and a step axis
// (first and last step). "" when no point has a loss.
std::string LossPlot(const v1::JobMetrics& metrics, int width = 60, int height = 15);

// `logs`: `[rank R] text`.
std::string LogLine(const v1::LogEntry& entry);

std::string NodeSummary(const v1::Node& node);
std::string NodesTable(const std::vector<const v1::Node*>& nodes);
std::string TenantsTable(const std::vector<const v1::Tenant*>& tenants);
std::string TokenSummary(const v1::Token& token);

// `checkpoints list`: one row per checkpoint (name, step, attempt, state, size, the sha256's
// first 12 characters, commit time).
std::string CheckpointsTable(const std::vector<const v1::Checkpoint*>& checkpoints);
// 1536 -> "1.5 KiB"; below 1 KiB in bytes ("512 B").
std::string HumanBytes(int64_t bytes);

// `admin audit`: one row per event as given (newest first): time, actor, tenant, the rpc
// without its package, resource, outcome, transport, and the message on one line, cut to 60
// characters.
std::string AuditEventsTable(const std::vector<const v1::AuditEvent*>& events);

}  // namespace gradhub::cli
