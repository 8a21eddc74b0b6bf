#include "services/metrics/job_directory.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/common/status_macros.h"

namespace gradhub::metrics {

std::string JobIdOf(const std::string& name) {
  constexpr char kPrefix[] = "jobs/";
  if (name.rfind(kPrefix, 0) != 0) return "";
  std::string id = absl::AsciiStrToLower(name.substr(sizeof(kPrefix) - 1));
  // 8-4-4-4-12 hex digits: anything else would not be a uuid[] element, let alone a job.
  if (id.size() != 36) return "";
  for (size_t i = 0; i < id.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? id[i] != '-' : !absl::ascii_isxdigit(static_cast<unsigned char>(id[i]))) return "";
  }
  return id;
}

absl::StatusOr<std::map<std::string, JobStatus>> PostgresJobDirectory::Lookup(
    const std::vector<std::string>& job_ids) {
  std::map<std::string, JobStatus> found;
  if (job_ids.empty()) return found;
  // Ids come from JobIdOf, so the array literal needs no quoting.
  GRADHUB_ASSIGN_OR_RETURN(db::Result rows,
                           pool_->Exec("SELECT id::text AS id, current_attempt, world_size,"
                                       " state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AS terminal"
                                       " FROM jobs WHERE id = ANY($1::uuid[])",
                                       {absl::StrCat("{", absl::StrJoin(job_ids, ","), "}")}));
  for (const db::Row& row : rows) {
    found[row.Get<std::string>("id")] = {row.Get<int32_t>("current_attempt"),
                                         row.Get<int32_t>("world_size"), row.Get<bool>("terminal")};
  }
  return found;
}

}  // namespace gradhub::metrics
