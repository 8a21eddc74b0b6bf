#include "services/checkpoint/checkpoint_records.h"

#include <google/protobuf/util/time_util.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/common/job_records.h"
#include "services/common/status_macros.h"

namespace gradhub::checkpoint {

const char kCheckpointColumns[] =
    "c.id, c.job_id::text AS job_id, c.upload_id::text AS upload_id, c.blob_path, c.state,"
    " coalesce(encode(c.sha256, 'hex'), '') AS sha256, c.crc32c, c.crc32c_covers_sha256,"
    " c.attempt, c.step, c.size_bytes,"
    " coalesce(c.request_id, '') AS request_id, coalesce(c.bad_reason, '') AS bad_reason,"
    " c.metadata::text AS metadata,"
    " (extract(epoch FROM c.create_time) * 1e6)::bigint AS create_us,"
    " (extract(epoch FROM c.commit_time) * 1e6)::bigint AS commit_us";

absl::StatusOr<CheckpointRow> CheckpointFromRow(const db::Row& row) {
  CheckpointRow c;
  c.id = row.Get<int64_t>("id");
  c.job_id = row.Get<std::string>("job_id");
  c.upload_id = row.Get<std::string>("upload_id");
  c.blob_key = row.Get<std::string>("blob_path");
  c.state = row.Get<std::string>("state");
  c.sha256 = row.Get<std::string>("sha256");
  if (!row.IsNull("crc32c")) c.crc32c = static_cast<uint32_t>(row.Get<int64_t>("crc32c"));
  c.crc32c_covers_sha256 = row.Get<bool>("crc32c_covers_sha256");
  c.attempt = row.Get<int32_t>("attempt");
  c.step = row.Get<int64_t>("step");
  c.size_bytes = row.Get<int64_t>("size_bytes");
  c.request_id = row.Get<std::string>("request_id");
  c.bad_reason = row.Get<std::string>("bad_reason");
  v1::Checkpoint& p = c.proto;
  p.set_name(CheckpointName(c.job_id, c.step));
  p.set_job("jobs/" + c.job_id);
  p.set_attempt(c.attempt);
  p.set_step(c.step);
  p.set_size_bytes(c.size_bytes);
  p.set_sha256(c.sha256);
  if (c.crc32c.has_value() && c.crc32c_covers_sha256) p.set_crc32c(*c.crc32c);
  const nlohmann::json metadata = nlohmann::json::parse(row.Get<std::string>("metadata"), nullptr,
                                                        /*allow_exceptions=*/false);
  if (!metadata.is_object())
    return absl::InternalError("stored checkpoint metadata is not an object");
  for (const auto& [key, value] : metadata.items()) {
    if (value.is_string()) (*p.mutable_metadata())[key] = value.get<std::string>();
  }
  v1::Checkpoint::State state = v1::Checkpoint::STATE_UNSPECIFIED;
  v1::Checkpoint::State_Parse(c.state, &state);  // DELETED is no state of the API: unspecified
  p.set_state(state);
  *p.mutable_create_time() = api::MicrosColumn(row, "create_us");
  if (!row.IsNull("commit_us")) *p.mutable_commit_time() = api::MicrosColumn(row, "commit_us");
  return c;
}

std::string CheckpointName(const std::string& job_id, int64_t step) {
  return absl::StrCat("jobs/", job_id, "/checkpoints/", step);
}

absl::StatusOr<ParsedName> ParseCheckpointName(const std::string& name) {
  static const std::regex kName("(jobs/[^/]+)/checkpoints/([0-9]{1,18})");
  std::smatch match;
  ParsedName parsed;
  if (!std::regex_match(name, match, kName) ||
      (parsed.job_id = api::JobId(match[1].str())).empty() ||
      !absl::SimpleAtoi(match[2].str(), &parsed.step)) {
    return absl::NotFoundError(absl::StrCat("checkpoint '", name, "' not found"));
  }
  return parsed;
}

std::string BlobKey(const std::string& job_id, int64_t step, const std::string& upload_id) {
  return absl::StrCat(job_id, "/", step, "-", upload_id);
}

bool IsSha256Hex(const std::string& text) {
  if (text.size() != 64) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool IsUuid(const std::string& text) {
  static const std::regex kUuid("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}");
  return std::regex_match(text, kUuid);
}

absl::StatusOr<bool> MarkBad(db::Pool& pool, int64_t id, const std::string& reason) {
  return pool.Transact([&](db::Transaction& tx) -> absl::StatusOr<bool> {
    GRADHUB_ASSIGN_OR_RETURN(
        db::Result rows,
        tx.Exec("UPDATE checkpoints SET state = 'BAD', bad_reason = $2, bad_time = now()"
                " WHERE id = $1 AND state = 'COMMITTED'"
                " RETURNING job_id::text AS job_id, attempt, step",
                {id, reason}));
    if (rows.empty()) return false;
    const db::Row row = rows.row(0);
    api::EventDetails corrupt = api::Because(
        absl::StrCat("checkpoint at step ", row.Get<int64_t>("step"), " is BAD: ", reason));
    corrupt.checkpoint_step = row.Get<int64_t>("step");  // describe: no longer the latest
    GRADHUB_RETURN_IF_ERROR(
        api::AppendEvent(tx, row.Get<std::string>("job_id"), row.Get<int32_t>("attempt"),
                         v1::JobEvent::CHECKPOINT_CORRUPT, std::nullopt, std::nullopt, corrupt));
    return true;
  });
}

}  // namespace gradhub::checkpoint
