#include <ATen/ATen.h>

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "gpu_worker/data/tensor_dataset.h"
#include "services/common/contract/user_error.h"

namespace gradhub::data {
namespace {

std::vector<std::string_view> SplitFields(std::string_view line, char delimiter) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  while (true) {
    const size_t end = line.find(delimiter, start);
    std::string_view field = line.substr(start, end == std::string_view::npos ? end : end - start);
    while (!field.empty() && (field.front() == ' ' || field.front() == '\t'))
      field.remove_prefix(1);
    while (!field.empty() &&
           (field.back() == ' ' || field.back() == '\t' || field.back() == '\r')) {
      field.remove_suffix(1);
    }
    if (field.size() >= 2 && field.front() == '"' && field.back() == '"') {
      field = field.substr(1, field.size() - 2);
    }
    fields.push_back(field);
    if (end == std::string_view::npos) return fields;
    start = end + 1;
  }
}

bool ParseNumber(std::string_view field, double* value) {
  if (field.empty()) return false;
  const std::string text(field);
  char* end = nullptr;
  *value = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && std::isfinite(*value);
}

// The most classes a CSV's labels may make: the model's output layer has one unit per class, so
// a label of 10^12 would ask for a layer no node can hold.
constexpr int64_t kMaxClasses = int64_t{1} << 20;

// A line of the file with its 1-based number.
using NumberedLine = std::pair<int64_t, std::string_view>;

// The lines of `contents` with their numbers, blank ones skipped.
std::vector<NumberedLine> NonBlankLines(std::string_view contents) {
  std::vector<NumberedLine> lines;
  int64_t number = 0;
  while (!contents.empty()) {
    const size_t end = contents.find('\n');
    std::string_view line = contents.substr(0, end);
    contents = end == std::string_view::npos ? std::string_view() : contents.substr(end + 1);
    ++number;
    if (line.find_first_not_of(" \t\r") != std::string_view::npos) lines.emplace_back(number, line);
  }
  return lines;
}

// Whether the first row names the columns: as the spec says, or under AUTO when any of its
// fields is not a number.
bool HasHeader(const v1::CsvDataset& spec, const std::vector<std::string_view>& first) {
  bool header = spec.header() == v1::CsvDataset::PRESENT;
  if (spec.header() == v1::CsvDataset::AUTO) {
    double ignored;
    for (std::string_view field : first) header = header || !ParseNumber(field, &ignored);
  }
  return header;
}

// The label's column (0-based): by index (negative counts from the end), by header name, or
// the last.
int64_t LabelColumn(const v1::CsvDataset& spec, const std::vector<std::string_view>& first,
                    bool header) {
  const int64_t columns = static_cast<int64_t>(first.size());
  switch (spec.label_case()) {
    case v1::CsvDataset::kLabelColumnIndex: {
      const int64_t index = spec.label_column_index();
      const int64_t label = index < 0 ? columns + index : index;
      if (label < 0 || label >= columns) {
        throw UserError("dataset.csv.labelColumnIndex", std::to_string(index) + " is outside the " +
                                                            std::to_string(columns) +
                                                            " columns of " + spec.path());
      }
      return label;
    }
    case v1::CsvDataset::kLabelColumnName: {
      if (!header) {
        throw UserError("dataset.csv.labelColumnName",
                        spec.path() + " has no header row to name columns");
      }
      for (int64_t i = 0; i < columns; ++i) {
        if (first[i] == spec.label_column_name()) return i;
      }
      // The header's names are file content: only their number is reported.
      throw UserError("dataset.csv.labelColumnName",
                      "'" + spec.label_column_name() + "' is not a column of " + spec.path() +
                          " (" + std::to_string(columns) + " columns in its header)");
    }
    case v1::CsvDataset::LABEL_NOT_SET:
      break;
  }
  return columns - 1;
}

// The rows' numbers: every column but the label's as float features, the label's apart.
struct CsvTable {
  std::vector<float> features;
  std::vector<double> labels;
};

CsvTable ParseRows(const std::vector<NumberedLine>& rows, const std::string& path, char delimiter,
                   int64_t columns, int64_t label) {
  CsvTable table;
  table.features.reserve(rows.size() * (columns - 1));
  table.labels.reserve(rows.size());
  for (const auto& [number, line] : rows) {
    const std::vector<std::string_view> fields = SplitFields(line, delimiter);
    const std::string where = path + ":" + std::to_string(number);
    if (static_cast<int64_t>(fields.size()) != columns) {
      throw UserError("", where + ": " + std::to_string(fields.size()) + " fields, expected " +
                              std::to_string(columns));
    }
    for (int64_t c = 0; c < columns; ++c) {
      double value;
      // The field's text is not echoed: messages reach the job's owner, the file may not be
      // theirs.
      auto column = [&] { return where + ": column " + std::to_string(c + 1); };
      if (!ParseNumber(fields[c], &value)) {
        throw UserError(
            "", column() + " (" + std::to_string(fields[c].size()) + " bytes) is not a number");
      }
      // Features and regression targets train as float32: a larger number would be inf.
      if (std::fabs(value) > FLT_MAX) {
        throw UserError("", column() + " is outside float32's range (magnitude above 3.4e38)");
      }
      if (c == label) {
        table.labels.push_back(value);
      } else {
        table.features.push_back(static_cast<float>(value));
      }
    }
  }
  return table;
}

// The task the labels make (classification of integer classes or regression), as a dataset.
std::unique_ptr<TensorDataset> ToDataset(const v1::CsvDataset& spec, CsvTable table,
                                         int64_t columns, int64_t label) {
  bool integral = true;
  double max_label = 0;
  for (double value : table.labels) {
    integral = integral && value >= 0 && value == std::floor(value);
    max_label = std::max(max_label, value);
  }
  const bool classification = spec.task() == v1::CsvDataset::CLASSIFICATION ||
                              (spec.task() == v1::CsvDataset::AUTO_TASK && integral);
  if (spec.task() == v1::CsvDataset::CLASSIFICATION && !integral) {
    throw UserError("dataset.csv.task", "CLASSIFICATION needs non-negative integer labels; " +
                                            spec.path() + " has others in column " +
                                            std::to_string(label + 1));
  }
  if (classification && max_label >= static_cast<double>(kMaxClasses)) {
    throw UserError("dataset.csv.task",
                    "classification takes labels below " + std::to_string(kMaxClasses) +
                        " (one output per class); " + spec.path() + " has a larger one in column " +
                        std::to_string(label + 1) + " (task: REGRESSION if they are values)");
  }
  const int64_t rows = static_cast<int64_t>(table.labels.size());
  DataShape shape;
  shape.sample_shape = {columns - 1};
  at::Tensor inputs = at::tensor(table.features, at::kFloat).reshape({rows, columns - 1});
  at::Tensor targets = at::tensor(table.labels, at::kDouble);
  if (classification) {
    shape.task = Task::kClassification;
    shape.num_classes = static_cast<int64_t>(max_label) + 1;
    targets = targets.to(at::kLong);
  } else {
    shape.task = Task::kRegression;
    targets = targets.to(at::kFloat);
  }
  Normalization normalization = Normalization::kNone;
  if (spec.normalize() == v1::CsvDataset::STANDARD) normalization = Normalization::kStandard;
  if (spec.normalize() == v1::CsvDataset::MINMAX) normalization = Normalization::kMinMax;
  return std::make_unique<TensorDataset>(std::move(inputs), std::move(targets), std::move(shape),
                                         normalization);
}

}  // namespace

std::unique_ptr<TensorDataset> ReadCsv(const v1::CsvDataset& spec) {
  const std::string& path = spec.path();
  const std::string contents = ReadFileContents(path, "dataset.csv.path");
  const char delimiter = spec.delimiter().empty() ? ',' : spec.delimiter()[0];
  const std::vector<NumberedLine> lines = NonBlankLines(contents);
  if (lines.empty()) throw UserError("dataset.csv.path", path + " has no rows");
  const std::vector<std::string_view> first = SplitFields(lines.front().second, delimiter);
  const bool header = HasHeader(spec, first);
  const int64_t columns = static_cast<int64_t>(first.size());
  if (columns < 2) {
    throw UserError("dataset.csv.path", path + ":" + std::to_string(lines.front().first) +
                                            ": needs at least 2 columns (features and a label), "
                                            "found 1; is the delimiter '" +
                                            std::string(1, delimiter) + "'?");
  }
  const int64_t label = LabelColumn(spec, first, header);
  const std::vector<NumberedLine> rows(lines.begin() + (header ? 1 : 0), lines.end());
  if (rows.empty()) throw UserError("dataset.csv.path", path + " has a header but no rows");
  return ToDataset(spec, ParseRows(rows, path, delimiter, columns, label), columns, label);
}

}  // namespace gradhub::data
