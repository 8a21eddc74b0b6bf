// Fuzzes ParseProgressRecord (services/common/contract/progress_record.h) with the lines a
// rank's stdout may hold: the agent (rank_process.cc) and the api (job_metrics.cc) parse every
// line of tenant-controlled output, at most kMaxLineBytes (64 KiB) each.
// Besides "never crashes", it checks the documented round trip: a parsed record, formatted,
// parses again and formats to the same line (9 significant digits are stable), so the writer
// and the parser cannot drift apart on anything a line can carry.
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "services/common/contract/progress_record.h"

namespace {
constexpr size_t kMaxLineBytes = 64 * 1024;  // gpu_worker/agent/rank_process.h
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxLineBytes) return 0;
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  const std::optional<gradhub::ProgressRecord> record = gradhub::ParseProgressRecord(line);
  if (!record) return 0;
  const std::string formatted = gradhub::FormatProgressRecord(*record);
  const std::optional<gradhub::ProgressRecord> again = gradhub::ParseProgressRecord(formatted);
  if (!again || gradhub::FormatProgressRecord(*again) != formatted) std::abort();
  return 0;
}
