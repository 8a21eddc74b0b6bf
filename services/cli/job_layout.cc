#include "services/cli/job_layout.h"

#include <optional>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gpu_worker/models/stages.h"
#include "services/cli/output.h"
#include "services/common/contract/job_spec.h"

namespace gradhub::cli {
namespace {

// "4 layers (split by parameter count)": what the spec says of how the stages split the model.
std::string LayersText(const v1::JobSpec& spec) {
  const std::string split = spec.parallelism().balance() == v1::ParallelismSpec::MEASURED_TIME
                                ? "split by measured time"
                                : "split by parameter count";
  if (spec.model().has_torchscript()) return "its top-level children (" + split + ")";
  const std::optional<int64_t> layers = models::ZooLayerCount(spec.model());
  if (!layers) return split;
  return absl::StrCat(*layers, " layers (", split, ")");
}

std::string ShapeLine(const v1::JobSpec& spec, const Parallelism& parallelism) {
  const auto schedule = spec.parallelism().schedule();
  std::string line = absl::StrCat(parallelism.stages, " stages x ", parallelism.replicas,
                                  parallelism.replicas == 1 ? " replica" : " replicas",
                                  ", schedule ", v1::ParallelismSpec::Schedule_Name(schedule));
  if (parallelism.chunks_per_stage > 1) {
    absl::StrAppend(&line, " (", parallelism.chunks_per_stage, " chunks per stage)");
  }
  absl::StrAppend(&line, ", ", parallelism.micro_batches, " micro-batches, ", LayersText(spec));
  return line;
}

}  // namespace

std::map<int32_t, std::string> NodesOfRanks(const std::string& placement_message) {
  static const std::regex kRun(R"((nodes/[^ ()]+) \(ranks? ([0-9]+)(?:-([0-9]+))?\))");
  std::map<int32_t, std::string> nodes;
  for (auto it = std::sregex_iterator(placement_message.begin(), placement_message.end(), kRun);
       it != std::sregex_iterator(); ++it) {
    int32_t low = 0, high = 0;
    if (!absl::SimpleAtoi((*it)[2].str(), &low)) continue;
    if (!(*it)[3].matched) {
      high = low;
    } else if (!absl::SimpleAtoi((*it)[3].str(), &high)) {
      continue;
    }
    for (int32_t rank = low; rank <= high; ++rank) nodes[rank] = (*it)[1].str();
  }
  return nodes;
}

const v1::JobEvent* CurrentPlacement(const v1::Job& job,
                                     const std::vector<const v1::JobEvent*>& events) {
  const v1::JobEvent* placement = nullptr;
  for (const v1::JobEvent* event : events) {
    if (event->type() == v1::JobEvent::STATE_CHANGED && event->to_state() == v1::Job::SCHEDULED &&
        event->attempt() == job.attempt()) {
      placement = event;
    }
  }
  return placement;
}

std::string PipelineLayout(const v1::Job& job, const std::vector<const v1::JobEvent*>& events) {
  const Parallelism parallelism = ParallelismOf(job.spec());
  if (!parallelism.pipelined()) return "";
  const v1::JobEvent* placement = CurrentPlacement(job, events);
  const std::map<int32_t, std::string> nodes =
      placement != nullptr ? NodesOfRanks(placement->message()) : std::map<int32_t, std::string>{};
  Table table({"REPLICA", "STAGE", "RANK", "NODE"});
  for (int32_t replica = 0; replica < parallelism.replicas; ++replica) {
    for (int32_t stage = 0; stage < parallelism.stages; ++stage) {
      const int32_t rank = replica * parallelism.stages + stage;
      const auto node = nodes.find(rank);
      table.AddRow({absl::StrCat(replica), absl::StrCat(stage), absl::StrCat(rank),
                    node == nodes.end() ? "-" : node->second});
    }
  }
  std::string text = "layout: " + ShapeLine(job.spec(), parallelism) + "\n";
  for (absl::string_view line : absl::StrSplit(table.Render(), '\n', absl::SkipEmpty())) {
    absl::StrAppend(&text, "  ", line, "\n");
  }
  return text;
}

}  // namespace gradhub::cli
