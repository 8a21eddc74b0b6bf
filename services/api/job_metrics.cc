#include "services/api/job_metrics.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "services/common/contract/progress_record.h"
#include "services/common/job_records.h"
#include "services/common/status_macros.h"

namespace gradhub::api {
namespace {

// The lines of one batch folded into one per step, so that the upsert below never meets the
// same row twice in one statement (PostgreSQL refuses that), in step order.
std::map<int64_t, MetricLine> MergeByStep(const std::vector<MetricLine>& lines) {
  std::map<int64_t, MetricLine> steps;
  for (const MetricLine& line : lines) {
    auto [it, fresh] = steps.try_emplace(line.step, line);
    if (fresh) continue;
    MetricLine& merged = it->second;
    if (line.progress) {
      merged.progress = true;
      merged.epoch = line.epoch;
      merged.loss = line.loss;
      merged.learning_rate = line.learning_rate;
      merged.samples_per_second = line.samples_per_second;
    }
    for (const auto& [name, value] : line.eval_metrics) merged.eval_metrics[name] = value;
  }
  return steps;
}

nlohmann::json Nullable(const std::optional<double>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

// Bounds a job's rows. Once it has more than kMaxProgressPointsPerJob progress points, every
// second one of the older half of them (by step) is deleted, the very first kept: a quarter of
// the progress points go, so this runs once per ~2,500 new points, and the older a stretch of
// the history, the more often it has been halved, while the recent steps a user watches stay
// at full resolution. Evaluation points are never deleted: they are few (one per
// eval_every_steps) and each one is a measurement that cannot be interpolated from others.
absl::Status ThinOldPoints(db::Transaction& tx, const std::string& job_id) {
  GRADHUB_ASSIGN_OR_RETURN(db::Result counted,
                           tx.Exec("SELECT count(*)::bigint AS n FROM job_metric_points"
                                   " WHERE job_id = $1::uuid AND eval_metrics IS NULL",
                                   {job_id}));
  if (counted.row(0).Get<int64_t>("n") <= kMaxProgressPointsPerJob) return absl::OkStatus();
  return tx
      .Exec(
          "DELETE FROM job_metric_points p USING ("
          "   SELECT step, row_number() OVER (ORDER BY step) AS n, count(*) OVER () AS total"
          "   FROM job_metric_points WHERE job_id = $1::uuid AND eval_metrics IS NULL) o"
          " WHERE p.job_id = $1::uuid AND p.step = o.step"
          " AND o.n % 2 = 0 AND o.n <= o.total / 2",
          {job_id})
      .status();
}

// The picks of DownsampleByStep among `candidates` (ascending indices): the first candidate
// in each of `intervals` equal intervals of the job's step range.
std::vector<size_t> OnePerInterval(const std::vector<int64_t>& steps,
                                   const std::vector<size_t>& candidates, int64_t intervals) {
  const long double first = steps.front();
  const long double width = static_cast<long double>(steps.back()) - first + 1;
  std::vector<size_t> picked;
  int64_t previous = -1;
  for (size_t i : candidates) {
    const auto interval = static_cast<int64_t>((steps[i] - first) / width * intervals);
    if (interval == previous) continue;
    picked.push_back(i);
    previous = interval;
  }
  return picked;
}

v1::JobMetricPoint PointFromRow(const db::Row& row) {
  v1::JobMetricPoint point;
  point.set_step(row.Get<int64_t>("step"));
  point.set_attempt(row.Get<int32_t>("attempt"));
  *point.mutable_time() = MicrosColumn(row, "time_us");
  if (!row.IsNull("loss")) point.set_loss(row.Get<double>("loss"));
  if (!row.IsNull("learning_rate")) point.set_learning_rate(row.Get<double>("learning_rate"));
  if (!row.IsNull("samples_per_second")) {
    point.set_samples_per_second(row.Get<double>("samples_per_second"));
  }
  if (!row.IsNull("eval_metrics")) {
    // Written by RecordMetricPoints from finite numbers only.
    const auto eval = nlohmann::json::parse(row.Get<std::string>("eval_metrics"), nullptr, false);
    if (eval.is_object()) {
      for (const auto& [name, value] : eval.items()) {
        if (value.is_number()) (*point.mutable_eval_metrics())[name] = value.get<double>();
      }
    }
  }
  return point;
}

}  // namespace

std::optional<MetricLine> ParseMetricLine(const std::string& line) {
  const std::optional<ProgressRecord> record = ParseProgressRecord(line);
  if (!record ||
      (record->event != ProgressEvent::kProgress && record->event != ProgressEvent::kEval)) {
    return std::nullopt;
  }
  MetricLine out;
  out.step = record->step;
  out.progress = record->event == ProgressEvent::kProgress;
  if (out.progress) {
    out.epoch = record->epoch;
    out.loss = record->loss;
    out.learning_rate = record->learning_rate;
    out.samples_per_second = record->samples_per_second;
    out.total_steps = record->total_steps.value_or(0);
  } else {
    out.eval_metrics = record->eval_metrics;
  }
  return out;
}

absl::Status RecordMetricPoints(db::Transaction& tx, const std::string& job_id, int32_t attempt,
                                const std::vector<MetricLine>& lines) {
  if (lines.empty() || attempt < 1) return absl::OkStatus();
  nlohmann::json points = nlohmann::json::array();
  for (const auto& [step, line] : MergeByStep(lines)) {
    nlohmann::json eval = nullptr;
    if (!line.eval_metrics.empty()) eval = line.eval_metrics;
    points.push_back({{"step", step},
                      {"loss", Nullable(line.loss)},
                      {"lr", Nullable(line.learning_rate)},
                      {"sps", Nullable(line.samples_per_second)},
                      {"eval", std::move(eval)}});
  }
  // On a step already recorded: the same attempt fills in what it had not reported (the
  // evaluation of a step whose progress came in an earlier batch; a re-shipped line changes
  // nothing), a newer attempt's point replaces the older one's, an older attempt's is ignored
  // (it cannot pass the current_attempt test anyway, unless a restart raced this batch).
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result written,
      tx.Exec("INSERT INTO job_metric_points AS p"
              " (job_id, step, attempt, loss, learning_rate, samples_per_second, eval_metrics)"
              " SELECT j.id, t.step, $2, t.loss, t.lr, t.sps, t.eval"
              " FROM jobs j, jsonb_to_recordset($3::jsonb) AS t(step bigint,"
              "   loss double precision, lr double precision, sps double precision, eval jsonb)"
              " WHERE j.id = $1::uuid AND j.current_attempt = $2"
              " ON CONFLICT (job_id, step) DO UPDATE SET"
              " attempt = EXCLUDED.attempt,"
              " time = CASE WHEN p.attempt = EXCLUDED.attempt THEN p.time ELSE EXCLUDED.time END,"
              " loss = CASE WHEN p.attempt = EXCLUDED.attempt"
              "   THEN coalesce(EXCLUDED.loss, p.loss) ELSE EXCLUDED.loss END,"
              " learning_rate = CASE WHEN p.attempt = EXCLUDED.attempt"
              "   THEN coalesce(EXCLUDED.learning_rate, p.learning_rate)"
              "   ELSE EXCLUDED.learning_rate END,"
              " samples_per_second = CASE WHEN p.attempt = EXCLUDED.attempt"
              "   THEN coalesce(EXCLUDED.samples_per_second, p.samples_per_second)"
              "   ELSE EXCLUDED.samples_per_second END,"
              " eval_metrics = CASE WHEN p.attempt <> EXCLUDED.attempt THEN EXCLUDED.eval_metrics"
              "   WHEN EXCLUDED.eval_metrics IS NULL THEN p.eval_metrics"
              "   ELSE coalesce(p.eval_metrics, '{}'::jsonb) || EXCLUDED.eval_metrics END"
              " WHERE p.attempt <= EXCLUDED.attempt",
              {job_id, attempt,
               points.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)}));
  if (written.affected() == 0) return absl::OkStatus();  // not the current attempt
  return ThinOldPoints(tx, job_id);
}

absl::Status RecordJobProgress(db::Transaction& tx, const std::string& job_id, int32_t attempt,
                               const std::vector<MetricLine>& lines) {
  const MetricLine* progress = nullptr;  // the last progress line
  const MetricLine* eval = nullptr;      // the last line with evaluation metrics
  int64_t last_step = 0;
  for (const MetricLine& line : lines) {
    if (line.progress) progress = &line;
    if (!line.eval_metrics.empty()) eval = &line;
    last_step = std::max(last_step, line.step);
  }
  if (progress == nullptr && eval == nullptr) return absl::OkStatus();
  const MetricLine none;
  const MetricLine& p = progress != nullptr ? *progress : none;
  std::optional<std::string> eval_json;
  if (eval != nullptr) eval_json = nlohmann::json(eval->eval_metrics).dump();
  // coalesce: what this batch does not say keeps its stored value.
  return tx
      .Exec(
          "UPDATE jobs SET progress_step = coalesce($3::bigint, progress_step),"
          " progress_total_steps = CASE WHEN $4::bigint > 0 THEN $4::bigint"
          "   ELSE progress_total_steps END,"
          " progress_epoch = coalesce($5::bigint, progress_epoch),"
          " progress_loss = coalesce($6::float8, progress_loss),"
          " progress_learning_rate = coalesce($7::float8, progress_learning_rate),"
          " progress_samples_per_second = coalesce($8::float8, progress_samples_per_second),"
          " progress_eval_metrics = coalesce($9::jsonb, progress_eval_metrics),"
          " progress_time = now()"
          " WHERE id = $1::uuid AND current_attempt = $2"
          " AND (state IN ('SCHEDULED', 'RUNNING')"
          "      OR (state = 'SUCCEEDED' AND progress_step <= $10))",
          {job_id, attempt, progress != nullptr ? std::optional<int64_t>(p.step) : std::nullopt,
           p.total_steps, p.epoch, p.loss, p.learning_rate, p.samples_per_second, eval_json,
           last_step})
      .status();
}

absl::StatusOr<v1::JobMetrics> ReadJobMetrics(db::Transaction& tx, const v1::Job& job,
                                              size_t max_points) {
  // Every row, and the choice made here: the bound at ingestion keeps a job's rows to about
  // 10,000 plus its evaluations, and the choice needs all their steps anyway.
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      tx.Exec("SELECT p.step, p.attempt, (extract(epoch FROM p.time) * 1e6)::bigint AS time_us,"
              " p.loss, p.learning_rate, p.samples_per_second, p.eval_metrics::text AS eval_metrics"
              " FROM job_metric_points p WHERE p.job_id = $1::uuid ORDER BY p.step",
              {JobId(job.name())}));
  std::vector<int64_t> steps;
  std::vector<bool> evaluations;
  for (const db::Row& row : rows) {
    steps.push_back(row.Get<int64_t>("step"));
    evaluations.push_back(!row.IsNull("eval_metrics"));
  }
  v1::JobMetrics metrics;
  metrics.set_name(job.name());
  metrics.set_total_steps(job.progress().total_steps());
  metrics.set_recorded_points(rows.rows());
  for (size_t i : DownsampleByStep(steps, evaluations, max_points)) {
    *metrics.add_points() = PointFromRow(rows.row(static_cast<int>(i)));
  }
  return metrics;
}

std::vector<size_t> DownsampleByStep(const std::vector<int64_t>& steps,
                                     const std::vector<bool>& keep, size_t max_points) {
  const size_t n = steps.size();
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  if (n <= max_points) return all;
  std::vector<size_t> required, others;
  for (size_t i = 0; i < n; ++i) {
    (i == 0 || i + 1 == n || keep[i] ? required : others).push_back(i);
  }
  if (required.size() >= max_points) {
    // More evaluations than room: evenly by position, which keeps the first and the last.
    if (max_points <= 1) return {n - 1};
    const size_t m = required.size();
    std::vector<size_t> picked;
    for (size_t k = 0; k < max_points; ++k)
      picked.push_back(required[k * (m - 1) / (max_points - 1)]);
    return picked;
  }
  // As many equal intervals as leave at most `budget` picks: intervals that hold no candidate
  // (a stretch thinned at ingestion, or between sparse log lines) give nothing, so the count
  // is found by bisection rather than set to the budget. n > max_points makes every candidate
  // its own interval too many, so the search has an upper end.
  const size_t budget = max_points - required.size();
  int64_t lo = static_cast<int64_t>(budget);
  int64_t hi =
      std::min<int64_t>(steps.back() - steps.front(), std::numeric_limits<int64_t>::max() - 1) + 1;
  std::vector<size_t> best = OnePerInterval(steps, others, lo);
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    std::vector<size_t> picked = OnePerInterval(steps, others, mid);
    if (picked.size() <= budget) {
      lo = mid;
      best = std::move(picked);
    } else {
      hi = mid - 1;
    }
  }
  best.insert(best.end(), required.begin(), required.end());
  std::sort(best.begin(), best.end());
  return best;
}

}  // namespace gradhub::api
