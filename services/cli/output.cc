#include "services/cli/output.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/time_util.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "services/common/contract/job_spec.h"
#include "services/common/contract/job_states.h"
#include "services/common/json_text.h"

namespace gradhub::cli {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

std::string Labels(const google::protobuf::Map<std::string, std::string>& labels) {
  if (labels.empty()) return "-";
  // Map iteration order is unspecified; sorted, the same job always prints the same.
  const std::map<std::string, std::string> sorted(labels.begin(), labels.end());
  return absl::StrJoin(sorted, ",", absl::PairFormatter("="));
}

std::string OrDash(const std::string& text) { return text.empty() ? "-" : text; }

// `key: value` lines with the values aligned, for the single-object views.
class Block {
 public:
  Block& Add(const std::string& key, const std::string& value) {
    lines_.emplace_back(key, value);
    return *this;
  }
  std::string Render() const {
    size_t width = 0;
    for (const auto& [key, value] : lines_) width = std::max(width, key.size());
    std::string out;
    for (const auto& [key, value] : lines_) {
      absl::StrAppend(&out, key, ":", std::string(width - key.size() + 1, ' '), value, "\n");
    }
    return out;
  }

 private:
  std::vector<std::pair<std::string, std::string>> lines_;
};

// A YAML scalar for a string: plain when no YAML (or ParseJobSpec) reader could take it for
// anything else, otherwise double-quoted (YAML's double-quoted style is JSON's).
std::string YamlString(const std::string& text) {
  static const std::regex kPlain(R"([A-Za-z_/][A-Za-z0-9_./ -]*)");
  static const std::regex kReserved(R"((true|false|null|yes|no|on|off|y|n))", std::regex::icase);
  if (std::regex_match(text, kPlain) && text.back() != ' ' && !std::regex_match(text, kReserved)) {
    return text;
  }
  return QuoteJson(text);
}

// Magnitudes outside [kPlainFloor, kPlainCeiling) print in scientific notation: in plain
// notation they would be mostly zeros, and no loss, rate or throughput is that small or large.
constexpr double kPlainFloor = 1e-9;
constexpr double kPlainCeiling = 1e16;

std::optional<std::string> NonFinite(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return std::nullopt;
}

bool Plain(double value) {
  const double magnitude = std::fabs(value);
  return magnitude == 0 || (magnitude >= kPlainFloor && magnitude < kPlainCeiling);
}

// "2.500" -> "2.5", "3.000" -> "3", "-0" -> "0".
std::string TrimZeros(std::string text) {
  if (text.find('.') != std::string::npos) {
    text.erase(text.find_last_not_of('0') + 1);
    if (text.back() == '.') text.pop_back();
  }
  return text == "-0" ? "0" : text;
}

// The shortest text that reads back as `value` (std::to_chars), plain where Plain says so.
template <typename T>
std::string Exact(T value) {
  if (auto text = NonFinite(value)) return *text;
  char buffer[400];  // a fixed double below 1e16 takes at most ~30 characters
  const auto format = Plain(value) ? std::chars_format::fixed : std::chars_format::general;
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value, format);
  return std::string(buffer, result.ptr);
}

// A YAML scalar for a number; NaN and the infinities quoted, as the JSON mapping writes them.
template <typename T>
std::string YamlNumber(T value) {
  if (std::isnan(value)) return "\"NaN\"";
  if (std::isinf(value)) return value > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  return Exact(value);
}

std::string YamlScalar(const Message& message, const FieldDescriptor* field, int index) {
  const Reflection* r = message.GetReflection();
  const bool repeated = field->is_repeated();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(repeated ? r->GetRepeatedInt32(message, field, index)
                                   : r->GetInt32(message, field));
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(repeated ? r->GetRepeatedInt64(message, field, index)
                                   : r->GetInt64(message, field));
    case FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(repeated ? r->GetRepeatedUInt32(message, field, index)
                                   : r->GetUInt32(message, field));
    case FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(repeated ? r->GetRepeatedUInt64(message, field, index)
                                   : r->GetUInt64(message, field));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return YamlNumber(repeated ? r->GetRepeatedDouble(message, field, index)
                                 : r->GetDouble(message, field));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return YamlNumber(repeated ? r->GetRepeatedFloat(message, field, index)
                                 : r->GetFloat(message, field));
    case FieldDescriptor::CPPTYPE_BOOL:
      return (repeated ? r->GetRepeatedBool(message, field, index) : r->GetBool(message, field))
                 ? "true"
                 : "false";
    case FieldDescriptor::CPPTYPE_ENUM: {
      const int value = repeated ? r->GetRepeatedEnumValue(message, field, index)
                                 : r->GetEnumValue(message, field);
      const auto* named = field->enum_type()->FindValueByNumber(value);
      return named != nullptr ? named->name() : absl::StrCat(value);
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string text =
          repeated ? r->GetRepeatedString(message, field, index) : r->GetString(message, field);
      // bytes are base64 in the JSON mapping, and so here.
      return field->type() == FieldDescriptor::TYPE_BYTES ? QuoteJson(absl::Base64Escape(text))
                                                          : YamlString(text);
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return "";
}

bool IsEmpty(const Message& message) {
  std::vector<const FieldDescriptor*> fields;
  message.GetReflection()->ListFields(message, &fields);
  return fields.empty();
}

void AppendYaml(const Message& message, int indent, std::string* out) {
  const Reflection* r = message.GetReflection();
  const std::string pad(indent, ' ');
  std::vector<const FieldDescriptor*> fields;
  // ListFields: only the fields that are set, in field-number order, like the JSON mapping
  // without defaults.
  r->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    const std::string key = pad + field->json_name() + ":";
    if (field->is_map()) {
      const FieldDescriptor* key_field = field->message_type()->map_key();
      const FieldDescriptor* value_field = field->message_type()->map_value();
      std::map<std::string, std::string> entries;  // sorted for a stable rendering
      for (int i = 0; i < r->FieldSize(message, field); ++i) {
        const Message& entry = r->GetRepeatedMessage(message, field, i);
        entries[YamlScalar(entry, key_field, -1)] =
            value_field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE
                ? absl::StrCat(
                      "\n",
                      absl::StripSuffix(
                          ToYaml(entry.GetReflection()->GetMessage(entry, value_field), indent + 4),
                          "\n"))
                : " " + YamlScalar(entry, value_field, -1);
      }
      absl::StrAppend(out, key, "\n");
      for (const auto& [k, v] : entries) absl::StrAppend(out, pad, "  ", k, ":", v, "\n");
    } else if (field->is_repeated() && field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      absl::StrAppend(out, key, "\n");
      for (int i = 0; i < r->FieldSize(message, field); ++i) {
        const Message& item = r->GetRepeatedMessage(message, field, i);
        if (IsEmpty(item)) {
          absl::StrAppend(out, pad, "  - {}\n");
          continue;
        }
        // "- " takes the place of the first line's indentation.
        std::string rendered = ToYaml(item, indent + 4);
        rendered.replace(indent, 4, "  - ");
        absl::StrAppend(out, rendered);
      }
    } else if (field->is_repeated()) {
      std::vector<std::string> items;
      for (int i = 0; i < r->FieldSize(message, field); ++i) {
        items.push_back(YamlScalar(message, field, i));
      }
      absl::StrAppend(out, key, " [", absl::StrJoin(items, ", "), "]\n");
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      const Message& sub = r->GetMessage(message, field);
      if (IsEmpty(sub)) {
        // A set but empty message is meaningful (`lrSchedule: {constant: {}}`).
        absl::StrAppend(out, key, " {}\n");
      } else {
        absl::StrAppend(out, key, "\n");
        AppendYaml(sub, indent + 2, out);
      }
    } else {
      absl::StrAppend(out, key, " ", YamlScalar(message, field, -1), "\n");
    }
  }
}

std::string StateName(v1::Job::State state) { return v1::Job::State_Name(state); }

// Until the trainer reports a total (it derives one from max_epochs), the spec's max_steps is
// the best known bound; 0 when there is none.
int64_t TotalSteps(const v1::Job& job) {
  return job.progress().total_steps() > 0 ? job.progress().total_steps() : job.spec().max_steps();
}

// "step/total", "?" for a total that is not known (TotalSteps).
std::string Steps(const v1::Job& job) {
  const int64_t total = TotalSteps(job);
  return absl::StrCat(job.progress().step(), "/", total > 0 ? absl::StrCat(total) : "?");
}

std::string EventDetail(const v1::JobEvent& event) {
  std::vector<std::string> parts;
  if (event.type() == v1::JobEvent::STATE_CHANGED) {
    // A job's first event has no state before it.
    parts.push_back(absl::StrCat(
        event.from_state() == v1::Job::STATE_UNSPECIFIED ? "" : StateName(event.from_state()) + " ",
        "-> ", StateName(event.to_state())));
  }
  if (event.rank() >= 0) parts.push_back(absl::StrCat("rank ", event.rank()));
  if (!event.node().empty()) parts.push_back(event.node());
  if (event.exit_code() != 0) parts.push_back(absl::StrCat("exit code ", event.exit_code()));
  if (event.signal() != 0) parts.push_back(absl::StrCat("signal ", event.signal()));
  if (event.failure_kind() != v1::JobEvent::NONE) {
    parts.push_back(absl::StrCat(v1::JobEvent::FailureKind_Name(event.failure_kind()), " failure"));
  }
  if (!event.message().empty()) parts.push_back(event.message());
  return parts.empty() ? "-" : absl::StrJoin(parts, "; ");
}

}  // namespace

std::string ToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = pretty;
  std::string json;
  // Printing a valid message cannot fail (the failure cases are unresolvable Any types, of
  // which the API has none).
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  // add_whitespace already ends the document with a newline; a compact one gets it here.
  if (json.empty() || json.back() != '\n') json += '\n';
  return json;
}

std::string PlainNumber(double value, int significant) {
  if (auto text = NonFinite(value)) return *text;
  if (!Plain(value)) return absl::StrFormat("%.*g", significant, value);
  if (value == 0) return "0";
  // Digits after the point: what `significant` leaves after the integer part's; for |value| < 1
  // the leading zeros after the point count too (0.000025: exponent -5).
  const int exponent = static_cast<int>(std::floor(std::log10(std::fabs(value))));
  const int decimals = std::max(0, significant - 1 - exponent);
  return TrimZeros(absl::StrFormat("%.*f", decimals, value));
}

std::string ExactNumber(double value) { return Exact(value); }
std::string ExactNumber(float value) { return Exact(value); }

std::string FormatTime(const google::protobuf::Timestamp& time) {
  if (time.seconds() == 0 && time.nanos() == 0) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(time.seconds()),
                          absl::UTCTimeZone());
}

std::string Table::Render() const {
  std::vector<size_t> widths;
  for (const auto& row : rows_) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows_) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      if (i + 1 == row.size()) {
        line += row[i];  // no trailing blanks after the last column
      } else {
        absl::StrAppend(&line, row[i], std::string(widths[i] - row[i].size() + 2, ' '));
      }
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string ToYaml(const google::protobuf::Message& message, int indent) {
  std::string out;
  AppendYaml(message, indent, &out);
  return out;
}

const v1::JobEvent* LatestCheckpoint(const std::vector<const v1::JobEvent*>& events) {
  std::map<int64_t, const v1::JobEvent*> committed;  // step -> its newest commit
  for (const v1::JobEvent* event : events) {
    if (event->type() == v1::JobEvent::CHECKPOINT_COMMITTED) {
      committed[event->checkpoint_step()] = event;
    } else if (event->type() == v1::JobEvent::CHECKPOINT_CORRUPT) {
      committed.erase(event->checkpoint_step());
    }
  }
  return committed.empty() ? nullptr : committed.rbegin()->second;
}

std::string CheckpointSummary(const v1::JobEvent* latest) {
  if (latest == nullptr) return "none committed";
  return absl::StrCat("step ", latest->checkpoint_step(), ", ",
                      HumanBytes(latest->checkpoint_size_bytes()), " (attempt ", latest->attempt(),
                      ", committed ", FormatTime(latest->time()), ")");
}

std::string JobSummary(const v1::Job& job, const std::optional<std::string>& checkpoint) {
  const v1::JobProgress& progress = job.progress();
  std::string numbers = absl::StrCat(Steps(job), " steps");
  if (progress.has_last_report_time()) {
    absl::StrAppend(&numbers, ", epoch ", progress.epoch(), ", loss ", PlainNumber(progress.loss()),
                    ", ", PlainNumber(progress.samples_per_second()), " samples/s, lr ",
                    PlainNumber(progress.learning_rate()));
  }
  Block block;
  block.Add("name", job.name())
      .Add("displayName", OrDash(job.spec().display_name()))
      .Add("tenant", OrDash(job.tenant()))
      .Add("state", StateName(job.state()))
      .Add("reason", OrDash(job.state_reason()))
      .Add("attempt", absl::StrCat(job.attempt(), " (restarts: ", job.infrastructure_restarts(),
                                   " infrastructure, ", job.job_restarts(), " job)"))
      .Add("progress", numbers);
  if (checkpoint) block.Add("checkpoint", *checkpoint);
  if (!progress.eval_metrics().empty()) {
    const std::map<std::string, double> sorted(progress.eval_metrics().begin(),
                                               progress.eval_metrics().end());
    std::vector<std::string> metrics;
    for (const auto& [key, value] : sorted) metrics.push_back(key + "=" + PlainNumber(value));
    block.Add("eval", absl::StrJoin(metrics, ", "));
  }
  block.Add("labels", Labels(job.spec().labels()))
      .Add("created", FormatTime(job.create_time()))
      .Add("started", FormatTime(job.start_time()))
      .Add("ended", FormatTime(job.end_time()));
  return block.Render();
}

std::string JobsTable(const std::vector<const v1::Job*>& jobs) {
  Table table({"NAME", "STATE", "DISPLAY NAME", "STEP", "CREATED"});
  for (const v1::Job* job : jobs) {
    table.AddRow({job->name(), StateName(job->state()), OrDash(job->spec().display_name()),
                  Steps(*job), FormatTime(job->create_time())});
  }
  return table.Render();
}

std::string EventsTable(const std::vector<const v1::JobEvent*>& events) {
  Table table({"TIME", "ATTEMPT", "TYPE", "DETAIL"});
  for (const v1::JobEvent* event : events) {
    table.AddRow({FormatTime(event->time()), absl::StrCat(event->attempt()),
                  v1::JobEvent::Type_Name(event->type()), EventDetail(*event)});
  }
  return table.Render();
}

std::string ProgressLine(const v1::Job& job) {
  const v1::JobProgress& progress = job.progress();
  // Before the first report loss and throughput are unknown, not zero.
  const bool reported = progress.has_last_report_time();
  return absl::StrCat(StateName(job.state()), " ", Steps(job),
                      " loss=", reported ? PlainNumber(progress.loss()) : "-",
                      " samples/s=", reported ? PlainNumber(progress.samples_per_second()) : "-");
}

std::string ProgressBar(const v1::Job& job, int width) {
  const int64_t total = TotalSteps(job);
  if (total <= 0) return ProgressLine(job);
  const double fraction = std::clamp(static_cast<double>(job.progress().step()) / total, 0.0, 1.0);
  const int filled = static_cast<int>(fraction * width);
  std::string eta;
  if (!IsTerminal(job.state())) {
    const std::optional<absl::Duration> left = TimeLeft(job);
    eta = absl::StrCat(" ETA ", left ? ShortDuration(*left) : "?");
  }
  return absl::StrCat("[", std::string(filled, '#'), std::string(width - filled, '-'), "] ",
                      absl::StrFormat("%3d%%", static_cast<int>(fraction * 100)), eta, " ",
                      ProgressLine(job));
}

std::optional<absl::Duration> TimeLeft(const v1::Job& job) {
  const v1::JobProgress& progress = job.progress();
  const v1::JobSpec spec = WithDefaults(job.spec());  // stored as submitted
  const int64_t total = TotalSteps(job);
  const int64_t samples_per_step = GlobalBatchSize(spec);  // a pipeline's stages share samples
  if (IsTerminal(job.state()) || !progress.has_last_report_time() || total <= 0 ||
      samples_per_step <= 0 || !(progress.samples_per_second() > 0)) {
    return std::nullopt;
  }
  const int64_t steps_left = std::max<int64_t>(0, total - progress.step());
  return absl::Seconds(static_cast<double>(steps_left) * samples_per_step /
                       progress.samples_per_second());
}

std::string ShortDuration(absl::Duration duration) {
  const int64_t seconds = std::max<int64_t>(0, absl::ToInt64Seconds(duration));
  if (seconds < 60) return absl::StrCat(seconds, "s");
  if (seconds < 3600) return absl::StrFormat("%dm%02ds", seconds / 60, seconds % 60);
  if (seconds < 86400) return absl::StrFormat("%dh%02dm", seconds / 3600, seconds % 3600 / 60);
  return absl::StrFormat("%dd%02dh", seconds / 86400, seconds % 86400 / 3600);
}

std::string MetricsTable(const v1::JobMetrics& metrics) {
  Table table({"STEP", "ATTEMPT", "LOSS", "LR", "SAMPLES/S", "EVAL"});
  for (const v1::JobMetricPoint& point : metrics.points()) {
    const std::map<std::string, double> eval(point.eval_metrics().begin(),
                                             point.eval_metrics().end());
    std::vector<std::string> named;
    for (const auto& [name, value] : eval) named.push_back(name + "=" + PlainNumber(value));
    table.AddRow({absl::StrCat(point.step()), absl::StrCat(point.attempt()),
                  point.has_loss() ? PlainNumber(point.loss()) : "-",
                  point.has_learning_rate() ? PlainNumber(point.learning_rate()) : "-",
                  point.has_samples_per_second() ? PlainNumber(point.samples_per_second()) : "-",
                  named.empty() ? "-" : absl::StrJoin(named, " ")});
  }
  return table.Render();
}

std::string LossPlot(const v1::JobMetrics& metrics, int width, int height) {
  std::vector<std::pair<int64_t, double>> points;  // step, loss
  for (const v1::JobMetricPoint& point : metrics.points()) {
    if (point.has_loss() && std::isfinite(point.loss())) {
      points.emplace_back(point.step(), point.loss());
    }
  }
  if (points.empty() || width < 2 || height < 2) return "";
  auto by_step = [](const auto& a, const auto& b) { return a.first < b.first; };
  auto by_loss = [](const auto& a, const auto& b) { return a.second < b.second; };
  const auto [low_step, high_step] = std::minmax_element(points.begin(), points.end(), by_step);
  const auto [low_loss, high_loss] = std::minmax_element(points.begin(), points.end(), by_loss);
  const int64_t first = low_step->first, last = high_step->first;
  const double bottom = low_loss->second, top = high_loss->second;
  // Row 0 is the top. A flat loss sits on the middle row; a single step in the first column.
  std::vector<std::string> grid(height, std::string(width, ' '));
  for (const auto& [step, loss] : points) {
    const double x = last == first ? 0 : static_cast<double>(step - first) / (last - first);
    const double y = top == bottom ? 0 : (top - loss) / (top - bottom);
    const int column = static_cast<int>(std::lround(x * (width - 1)));
    const int row = top == bottom ? height / 2 : static_cast<int>(std::lround(y * (height - 1)));
    grid[row][column] = '*';
  }
  // Each labelled row shows the loss its cells stand for; a flat loss has but one.
  std::map<int, std::string> labels;
  if (top == bottom) {
    labels[height / 2] = PlainNumber(top);
  } else {
    for (int row : {0, (height - 1) / 2, height - 1}) {
      labels[row] = PlainNumber(top - (top - bottom) * row / (height - 1));
    }
  }
  size_t label_width = 0;
  for (const auto& [row, label] : labels) label_width = std::max(label_width, label.size());
  std::string out = "loss by step\n";
  for (int row = 0; row < height; ++row) {
    const std::string label = labels.count(row) ? labels[row] : "";
    absl::StrAppend(&out, std::string(label_width - label.size(), ' '), label, " |",
                    absl::StripTrailingAsciiWhitespace(grid[row]), "\n");
  }
  const std::string pad(label_width + 1, ' ');
  absl::StrAppend(&out, pad, "+", std::string(width, '-'), "\n");
  // The first step under the first column, the last one ending under the last column.
  const std::string left = absl::StrCat(first), right = absl::StrCat(last);
  const size_t used = left.size() + right.size();
  const std::string gap(static_cast<size_t>(width) > used ? width - used : 1, ' ');
  absl::StrAppend(&out, pad, " ", left, first == last ? "" : gap + right, " step\n");
  return out;
}

std::string LogLine(const v1::LogEntry& entry) {
  return absl::StrCat("[rank ", entry.rank(), "] ", entry.text());
}

std::string NodeSummary(const v1::Node& node) {
  Block block;
  block.Add("name", node.name())
      .Add("state", v1::Node::State_Name(node.state()))
      .Add("kind", v1::Node::DeviceKind_Name(node.kind()))
      .Add("slots", absl::StrCat(node.slots_in_use(), "/", node.slots(), " in use"))
      .Add("address", OrDash(node.address()))
      .Add("agentVersion", OrDash(node.agent_version()))
      .Add("lastHeartbeat", FormatTime(node.last_heartbeat_time()))
      .Add("labels", Labels(node.labels()));
  std::string out = block.Render();
  if (node.devices_size() > 0) {
    Table devices({"  INDEX", "NAME", "MEMORY", "COMPUTE", "UUID"});
    for (const v1::DeviceInfo& device : node.devices()) {
      devices.AddRow({absl::StrCat("  ", device.index()), device.name(),
                      HumanBytes(device.total_memory_bytes()), OrDash(device.compute_capability()),
                      OrDash(device.uuid())});
    }
    absl::StrAppend(&out, "devices:\n", devices.Render());
  }
  return out;
}

std::string NodesTable(const std::vector<const v1::Node*>& nodes) {
  Table table({"NAME", "STATE", "KIND", "SLOTS", "ADDRESS", "LAST HEARTBEAT"});
  for (const v1::Node* node : nodes) {
    table.AddRow({node->name(), v1::Node::State_Name(node->state()),
                  v1::Node::DeviceKind_Name(node->kind()),
                  absl::StrCat(node->slots_in_use(), "/", node->slots()), OrDash(node->address()),
                  FormatTime(node->last_heartbeat_time())});
  }
  return table.Render();
}

std::string TenantsTable(const std::vector<const v1::Tenant*>& tenants) {
  Table table({"NAME", "DISPLAY NAME", "CREATED"});
  for (const v1::Tenant* tenant : tenants) {
    table.AddRow(
        {tenant->name(), OrDash(tenant->display_name()), FormatTime(tenant->create_time())});
  }
  return table.Render();
}

std::string TokenSummary(const v1::Token& token) {
  return Block()
      .Add("name", token.name())
      .Add("kind", v1::Token::Kind_Name(token.kind()))
      .Add("description", OrDash(token.description()))
      .Add("prefix", OrDash(token.prefix()))
      .Add("created", FormatTime(token.create_time()))
      .Add("expires", token.has_expire_time() ? FormatTime(token.expire_time()) : "never")
      .Add("revoked", FormatTime(token.revoke_time()))
      .Render();
}

std::string HumanBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < sizeof(kUnits) / sizeof(kUnits[0])) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string CheckpointsTable(const std::vector<const v1::Checkpoint*>& checkpoints) {
  Table table({"NAME", "STEP", "ATTEMPT", "STATE", "SIZE", "SHA256", "COMMITTED"});
  for (const v1::Checkpoint* c : checkpoints) {
    table.AddRow({c->name(), absl::StrCat(c->step()), absl::StrCat(c->attempt()),
                  v1::Checkpoint::State_Name(c->state()), HumanBytes(c->size_bytes()),
                  OrDash(c->sha256().substr(0, 12)), FormatTime(c->commit_time())});
  }
  return table.Render();
}

namespace {

// `text` on one line (line breaks as spaces), cut to `max_chars` characters with "...".
std::string OneLine(const std::string& text, size_t max_chars) {
  std::string line;
  size_t chars = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char byte = static_cast<unsigned char>(text[i]);
    const bool starts_char = (byte & 0xC0) != 0x80;  // not a UTF-8 continuation byte
    if (starts_char && ++chars > max_chars) return line + "...";
    line += text[i] == '\n' || text[i] == '\r' ? ' ' : text[i];
  }
  return line;
}

}  // namespace

std::string AuditEventsTable(const std::vector<const v1::AuditEvent*>& events) {
  Table table({"TIME", "ACTOR", "TENANT", "METHOD", "RESOURCE", "OUTCOME", "VIA", "MESSAGE"});
  for (const v1::AuditEvent* event : events) {
    table.AddRow({FormatTime(event->time()), event->actor(), OrDash(event->tenant()),
                  std::string(absl::StripPrefix(event->method(), "gradhub.v1.")),
                  OrDash(event->resource()), event->outcome(), event->transport(),
                  OrDash(OneLine(event->message(), 60))});
  }
  return table.Render();
}

}  // namespace gradhub::cli
