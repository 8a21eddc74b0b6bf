#include "services/common/contract/progress_record.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <cstdio>
#include <variant>

#include "services/common/json_text.h"

namespace gradhub {
namespace {

constexpr std::string_view kRecordPrefix = R"({"event":")";
constexpr std::string_view kEvalKeyPrefix = "eval.";

// The parser reads JSON with protobuf (google.protobuf.Struct) rather than nlohmann: protobuf is
// in every build, a node's too, where nlohmann is not installed.
using Value = google::protobuf::Value;

// One optional member of ProgressRecord and its JSON key.
struct Field {
  const char* key;
  std::variant<std::optional<int64_t> ProgressRecord::*, std::optional<double> ProgressRecord::*,
               std::optional<std::string> ProgressRecord::*>
      member;
};

// The order the keys print in, after "event", "rank" and "step". The trainer printed each
// event's keys in this order before this file existed, so the lines stay byte for byte as
// they were.
const Field kFieldsBeforeEval[] = {
    {"totalSteps", &ProgressRecord::total_steps},
    {"epoch", &ProgressRecord::epoch},
    {"loss", &ProgressRecord::loss},
    {"lr", &ProgressRecord::learning_rate},
    {"samplesPerSecond", &ProgressRecord::samples_per_second},
    {"forwardSeconds", &ProgressRecord::forward_seconds},
    {"backwardSeconds", &ProgressRecord::backward_seconds},
    {"allreduceWaitSeconds", &ProgressRecord::allreduce_wait_seconds},
    {"optimizerSeconds", &ProgressRecord::optimizer_seconds},
    {"stepSeconds", &ProgressRecord::step_seconds},
    {"trainSeconds", &ProgressRecord::train_seconds},
    {"allreduceBytes", &ProgressRecord::allreduce_bytes},
    {"allreduceSeconds", &ProgressRecord::allreduce_seconds},
    {"optimizerStateBytes", &ProgressRecord::optimizer_state_bytes},
    {"busBandwidthBytesPerSecond", &ProgressRecord::bus_bandwidth_bytes_per_second},
    // Added with FP16; unset in every other run, whose lines are unchanged.
    {"lossScale", &ProgressRecord::loss_scale},
    {"skippedSteps", &ProgressRecord::skipped_steps},
};
const Field kFieldsAfterEval[] = {
    {"checkpoints", &ProgressRecord::checkpoints},
    {"checkpointBytes", &ProgressRecord::checkpoint_bytes},
    {"checkpointSnapshotSeconds", &ProgressRecord::checkpoint_snapshot_seconds},
    {"checkpointWaitSeconds", &ProgressRecord::checkpoint_wait_seconds},
    // Added with skipped checkpoints; unset in the records of runs that skip none.
    {"checkpointsSkipped", &ProgressRecord::checkpoints_skipped},
    {"parametersSha256", &ProgressRecord::parameters_sha256},
    {"checkpointInFlightStep", &ProgressRecord::checkpoint_in_flight_step},
    {"checkpointInFlightSeconds", &ProgressRecord::checkpoint_in_flight_seconds},
};

// --- writing ---

std::string Text(int64_t value) { return std::to_string(value); }

// 9 significant digits (%.9g, as an ostream with setprecision(9) prints); JSON has no NaN or
// infinity, so those are null.
std::string Text(double value) {
  if (!std::isfinite(value)) return "null";
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.9g", value);
  return buffer;
}

std::string Text(const std::string& value) { return QuoteJson(value); }

void Append(std::string_view key, const std::string& value, std::string& out) {
  out += ",\"";
  out += key;
  out += "\":";
  out += value;
}

template <size_t N>
void AppendFields(const ProgressRecord& record, const Field (&fields)[N], std::string& out) {
  for (const Field& field : fields) {
    std::visit(
        [&](auto member) {
          if (const auto& value = record.*member) Append(field.key, Text(*value), out);
        },
        field.member);
  }
}

// --- reading ---

// An integer said as a JSON number (protobuf reads every number as a double).
std::optional<int64_t> Integer(const Value& value) {
  if (value.kind_case() != Value::kNumberValue) return std::nullopt;
  const double number = value.number_value();
  // 2^63 itself is out of range; every double below it converts exactly.
  if (!std::isfinite(number) || std::trunc(number) != number || std::fabs(number) >= 0x1p63) {
    return std::nullopt;
  }
  return static_cast<int64_t>(number);
}

void Read(const Value& value, std::optional<int64_t>& out) { out = Integer(value); }

void Read(const Value& value, std::optional<double>& out) {
  if (value.kind_case() == Value::kNumberValue && std::isfinite(value.number_value())) {
    out = value.number_value();
  }
}

void Read(const Value& value, std::optional<std::string>& out) {
  if (value.kind_case() == Value::kStringValue) out = value.string_value();
}

const Field* FindField(const std::string& key) {
  for (const Field& field : kFieldsBeforeEval) {
    if (key == field.key) return &field;
  }
  for (const Field& field : kFieldsAfterEval) {
    if (key == field.key) return &field;
  }
  return nullptr;
}

std::optional<ProgressEvent> EventNamed(const Value& value) {
  if (value.kind_case() != Value::kStringValue) return std::nullopt;
  for (ProgressEvent event : {ProgressEvent::kProgress, ProgressEvent::kEval,
                              ProgressEvent::kCheckpointSkipped, ProgressEvent::kDone}) {
    if (value.string_value() == ProgressEventName(event)) return event;
  }
  return std::nullopt;
}

// Sets the record's member for `key`; keys it has none for are ignored.
void ReadKey(const std::string& key, const Value& value, ProgressRecord& record) {
  if (key == "rank") {
    Read(value, record.rank);
  } else if (key.compare(0, kEvalKeyPrefix.size(), kEvalKeyPrefix) == 0) {
    if (key.size() > kEvalKeyPrefix.size() && value.kind_case() == Value::kNumberValue &&
        std::isfinite(value.number_value())) {
      record.eval_metrics[key.substr(kEvalKeyPrefix.size())] = value.number_value();
    }
  } else if (const Field* field = FindField(key)) {
    std::visit([&](auto member) { Read(value, record.*member); }, field->member);
  }
}

}  // namespace

const char* ProgressEventName(ProgressEvent event) {
  switch (event) {
    case ProgressEvent::kProgress:
      return "progress";
    case ProgressEvent::kEval:
      return "eval";
    case ProgressEvent::kCheckpointSkipped:
      return "checkpoint_skipped";
    case ProgressEvent::kDone:
      return "done";
  }
  return "?";
}

std::string FormatProgressRecord(const ProgressRecord& record) {
  std::string out = "{\"event\":";
  out += QuoteJson(ProgressEventName(record.event));
  if (record.rank) Append("rank", Text(*record.rank), out);
  Append("step", Text(record.step), out);
  AppendFields(record, kFieldsBeforeEval, out);
  for (const auto& [name, value] : record.eval_metrics) {
    out += ',';
    out += QuoteJson(std::string(kEvalKeyPrefix) + name);
    out += ':';
    out += Text(value);
  }
  AppendFields(record, kFieldsAfterEval, out);
  out += '}';
  return out;
}

std::optional<ProgressRecord> ParseProgressRecord(std::string_view line) {
  // The prefix test first: most lines are not records, and are not worth a JSON parse.
  if (line.substr(0, kRecordPrefix.size()) != kRecordPrefix) return std::nullopt;
  google::protobuf::Struct object;
  if (!google::protobuf::util::JsonStringToMessage(std::string(line), &object).ok()) {
    return std::nullopt;
  }
  const auto& fields = object.fields();
  const auto event = fields.find("event");
  const auto step = fields.find("step");
  if (event == fields.end() || step == fields.end()) return std::nullopt;
  ProgressRecord record;
  const std::optional<ProgressEvent> kind = EventNamed(event->second);
  const std::optional<int64_t> step_number = Integer(step->second);
  if (!kind || !step_number || *step_number < 0) return std::nullopt;
  record.event = *kind;
  record.step = *step_number;
  for (const auto& [key, value] : fields) ReadKey(key, value, record);
  return record;
}

}  // namespace gradhub
