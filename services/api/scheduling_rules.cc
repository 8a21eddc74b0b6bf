#include "services/api/scheduling_rules.h"

#include <algorithm>
#include <cstddef>
#include <set>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "services/common/contract/data_paths.h"
#include "services/common/contract/job_spec.h"
#include "services/common/contract/trainer_exit_codes.h"

namespace gradhub::api {
namespace {

std::string KindName(v1::Node::DeviceKind kind) { return v1::Node::DeviceKind_Name(kind); }

// --- the filters (NodeFilters), each an admission test and the reason when no node passes ---

bool LabelsMatch(const NodeRecord& node, const JobNeeds& job) {
  for (const auto& [key, value] : job.spec.node_selector()) {
    const auto it = node.labels.find(key);
    if (it == node.labels.end() || it->second != value) return false;
  }
  return true;
}

std::string NoLabelledNode(const JobNeeds& job) {
  std::vector<std::string> wanted;
  for (const auto& [key, value] : job.spec.node_selector()) wanted.push_back(key + "=" + value);
  std::sort(wanted.begin(), wanted.end());
  return absl::StrCat("no node with label ", absl::StrJoin(wanted, ","));
}

bool ServesFiles(const NodeRecord& node, const JobNeeds& job) {
  if (node.tenant_data_roots.empty()) return RootsServeSpec(node.data_roots, job.spec);
  return RootsServeSpec(RootsOfTenant(node, job.tenant), job.spec);
}

std::string NoNodeServesFiles(const JobNeeds& job) {
  return absl::StrCat(
      "no node's data roots hold every file the spec names (see each node's dataRoots",
      job.tenant.empty() ? "" : absl::StrCat(", and tenantDataRoots of ", std::string(job.tenant)),
      ")");
}

bool OfDeviceKind(const NodeRecord& node, const JobNeeds& job) {
  return std::find(job.kinds.begin(), job.kinds.end(), node.kind) != job.kinds.end();
}

std::string NoNodeOfDeviceKind(const JobNeeds& job) {
  std::vector<std::string> names;
  for (const auto kind : job.kinds) names.push_back(KindName(kind));
  return absl::StrCat(
      "backend ", v1::DistributedSpec::Backend_Name(job.spec.distributed().backend()),
      job.spec.precision() == v1::JobSpec::FP16 ? " with precision FP16" : "",
      RunsOnGlooOnly(job.spec) ? " with schedule INTERLEAVED_ONE_F_ONE_B" : "", " runs on ",
      absl::StrJoin(names, " or "), " nodes; no such node is registered");
}

bool RunsScripts(const NodeRecord& node, const JobNeeds& job) {
  return !job.spec.has_script() || node.master_port_base > 0;
}

std::string NoNodeRunsScripts(const JobNeeds&) {
  return "no eligible node runs script jobs (gradhub-agent --master-port-base is 0 on all)";
}

constexpr int64_t kMiB = int64_t{1} << 20;

bool HasMemoryPerRank(const NodeRecord& node, const JobNeeds& job) {
  const int64_t mib = job.spec.memory_per_rank_mib();
  // Whole MiB of the node's cap, so that a large ask cannot overflow when multiplied.
  return mib <= 0 || node.memory_per_slot_bytes <= 0 || mib <= node.memory_per_slot_bytes / kMiB;
}

std::string NoNodeHasMemoryPerRank(const JobNeeds& job) {
  return absl::StrCat("memoryPerRankMib ", job.spec.memory_per_rank_mib(),
                      ": no eligible node gives a rank that much (see each node's "
                      "memoryPerSlotBytes)");
}

bool TakesRanks(const NodeRecord& node, const JobNeeds&) {
  return node.state == v1::Node::READY && node.heartbeating;
}

bool HasFreeSlot(const NodeRecord& node, const JobNeeds&) { return !node.free_slots.empty(); }

std::string NoReadyNodeWithAFreeSlot(const JobNeeds& job) {
  return absl::StrCat("needs ", job.spec.distributed().world_size(),
                      " slots, no ready node has a free slot");
}

// The slots a job could hold at once on `nodes` (at most ranks_per_node of each), used or not,
// on the device kind of its kinds that has the most; only READY heartbeating nodes when
// `ready_only`.
int64_t SlotCapacity(const JobNeeds& job, const std::vector<const NodeRecord*>& nodes,
                     bool ready_only) {
  const int64_t per_node = job.spec.distributed().ranks_per_node();
  int64_t most = 0;
  for (const v1::Node::DeviceKind kind : job.kinds) {
    int64_t slots = 0;
    for (const NodeRecord* node : nodes) {
      if (node->kind != kind || (ready_only && !TakesRanks(*node, job))) continue;
      const int64_t all = std::max<int64_t>(node->slots, node->free_slots.size());
      slots += per_node > 0 ? std::min(all, per_node) : all;
    }
    most = std::max(most, slots);
  }
  return most;
}

std::string PerNodeCap(const v1::JobSpec& spec) {
  const int32_t per_node = spec.distributed().ranks_per_node();
  return per_node > 0 ? absl::StrCat(" (at most ", per_node, " per node)") : "";
}

// How many ranks each node takes (PlaceGang's steps 2 and 3), in the nodes' order: first whole
// replicas of `stages` ranks (step 3a), then the ranks of the replicas left over the slots left
// (3b). `whole[i]` + `split[i]` ranks go to node i.
struct RanksPerNode {
  std::vector<size_t> whole, split;
};
RanksPerNode CountRanksPerNode(const std::vector<size_t>& usable, size_t world_size,
                               size_t stages) {
  RanksPerNode counts{std::vector<size_t>(usable.size()), std::vector<size_t>(usable.size())};
  size_t left = world_size;
  for (size_t i = 0; i < usable.size(); ++i) {
    counts.whole[i] = std::min(usable[i] / stages * stages, left);
    left -= counts.whole[i];
  }
  for (size_t i = 0; i < usable.size(); ++i) {
    counts.split[i] = std::min(usable[i] - counts.whole[i], left);
    left -= counts.split[i];
  }
  return counts;
}

// PlaceGang's steps 2 and 3 on the nodes of one device kind that are eligible.
std::vector<RankPlacement> Pack(std::vector<const NodeRecord*> eligible, int32_t world_size,
                                int32_t ranks_per_node, int32_t stages) {
  std::stable_sort(eligible.begin(), eligible.end(), [](const auto* a, const auto* b) {
    return a->free_slots.size() > b->free_slots.size();
  });
  const size_t per_node = ranks_per_node > 0 ? static_cast<size_t>(ranks_per_node) : SIZE_MAX;
  std::vector<size_t> usable;
  for (const NodeRecord* node : eligible) {
    usable.push_back(std::min(node->free_slots.size(), per_node));
  }
  const RanksPerNode counts = CountRanksPerNode(usable, static_cast<size_t>(world_size),
                                                static_cast<size_t>(std::max(1, stages)));
  std::vector<RankPlacement> placed;
  std::vector<int32_t> taken(eligible.size(), 0);  // the node's ranks so far: its local ranks
  const auto take = [&](size_t i, size_t count) {
    for (size_t k = 0; k < count; ++k, ++taken[i]) {
      const NodeRecord* node = eligible[i];
      placed.push_back({static_cast<int32_t>(placed.size()), taken[i], node->free_slots[taken[i]],
                        node->id, node->name});
    }
  };
  for (size_t i = 0; i < eligible.size(); ++i) take(i, counts.whole[i]);
  for (size_t i = 0; i < eligible.size(); ++i) take(i, counts.split[i]);
  if (placed.size() != static_cast<size_t>(world_size)) placed.clear();
  return placed;
}

// PlaceGang's step 3 when every filter admits some node but the gang does not fit them.
std::string TooFewSlots(const v1::JobSpec& spec, const std::vector<const NodeRecord*>& admitted) {
  const int32_t per_node = spec.distributed().ranks_per_node();
  size_t usable = 0, largest = 0;
  for (const NodeRecord* node : admitted) {
    const size_t free = node->free_slots.size();
    largest = std::max(largest, free);
    usable += per_node > 0 ? std::min(free, static_cast<size_t>(per_node)) : free;
  }
  return absl::StrCat("needs ", spec.distributed().world_size(), " slots", PerNodeCap(spec), ", ",
                      usable, " usable on ", admitted.size(), " ready nodes, ", largest,
                      " free on the largest node");
}

// "nodes/a (ranks 0-1)" for each run of consecutive ranks on one node among ranks[first, end).
std::vector<std::string> NodeRuns(const std::vector<RankPlacement>& ranks, size_t first,
                                  size_t end) {
  std::vector<std::string> runs;
  for (size_t i = first + 1; i <= end; ++i) {
    if (i < end && ranks[i].node == ranks[first].node) continue;
    const int32_t low = ranks[first].rank, high = ranks[i - 1].rank;
    runs.push_back(absl::StrCat("nodes/", ranks[first].node,
                                low == high ? absl::StrCat(" (rank ", low, ")")
                                            : absl::StrCat(" (ranks ", low, "-", high, ")")));
    first = i;
  }
  return runs;
}

}  // namespace

std::vector<v1::Node::DeviceKind> DeviceKindsFor(const v1::JobSpec& spec) {
  if (NeedsCuda(spec)) return {v1::Node::CUDA};
  if (TrainsOnCpu(spec) || RunsOnGlooOnly(spec)) return {v1::Node::CPU};
  return {v1::Node::CUDA, v1::Node::CPU};
}

std::vector<std::string> RootsOfTenant(const NodeRecord& node, std::string_view tenant) {
  std::vector<std::string> roots = node.data_roots;
  for (const TenantRoot& root : node.tenant_data_roots) {
    if (!tenant.empty() && root.tenant == tenant) roots.push_back(root.path);
  }
  return roots;
}

const std::vector<NodeFilter>& NodeFilters() {
  static const std::vector<NodeFilter> kFilters = {
      {"NodeSelector", LabelsMatch, NoLabelledNode, true},
      {"DataRoots", ServesFiles, NoNodeServesFiles, true},
      {"DeviceKind", OfDeviceKind, NoNodeOfDeviceKind, true},
      {"RunsScripts", RunsScripts, NoNodeRunsScripts, true},
      {"Memory", HasMemoryPerRank, NoNodeHasMemoryPerRank, true},
      {"Ready", TakesRanks, NoReadyNodeWithAFreeSlot, false},
      {"FreeSlot", HasFreeSlot, NoReadyNodeWithAFreeSlot, false},
  };
  return kFilters;
}

Admission AdmitNodes(const JobNeeds& job, const std::vector<NodeRecord>& nodes,
                     bool capability_only) {
  const std::vector<NodeFilter>& filters = NodeFilters();
  size_t applied = filters.size();  // the capability filters come first
  if (capability_only) {
    applied = 0;
    while (applied < filters.size() && filters[applied].capability) ++applied;
  }
  Admission admission;
  // The reason is that of the first filter no node passes together with every filter before
  // it: the filter where the node that got furthest stopped.
  size_t furthest = 0;
  for (const NodeRecord& node : nodes) {
    size_t passed = 0;
    while (passed < applied && filters[passed].admits(node, job)) ++passed;
    furthest = std::max(furthest, passed);
    if (passed == applied) admission.nodes.push_back(&node);
  }
  if (nodes.empty()) {
    admission.why = "no node is registered";
  } else if (admission.nodes.empty()) {
    admission.why = filters[furthest].why_none(job);
  }
  return admission;
}

Feasibility JudgeFeasibility(const JobNeeds& job, const std::vector<NodeRecord>& nodes) {
  Feasibility verdict;
  const Admission capable = AdmitNodes(job, nodes, /*capability_only=*/true);  // step 1
  if (capable.nodes.empty()) {
    verdict.never = capable.why;
    return verdict;
  }
  const int32_t world_size = job.spec.distributed().world_size();
  const int64_t slots = SlotCapacity(job, capable.nodes, /*ready_only=*/false);  // step 2
  if (slots < world_size) {
    verdict.never =
        absl::StrCat("needs ", world_size, " slots", PerNodeCap(job.spec),
                     "; the registered nodes that could run it have ", slots, " in all");
    return verdict;
  }
  verdict.fits_when_idle = SlotCapacity(job, capable.nodes, true) >= world_size;  // step 3
  return verdict;
}

GangPlacement PlaceGang(const v1::JobSpec& spec, const std::vector<NodeRecord>& nodes,
                        std::string_view tenant) {
  const JobNeeds job(spec, tenant);
  GangPlacement placement;
  const Admission admitted = AdmitNodes(job, nodes);  // step 1
  if (admitted.nodes.empty()) {
    placement.why = admitted.why;
    return placement;
  }
  for (const v1::Node::DeviceKind kind : job.kinds) {
    std::vector<const NodeRecord*> of_kind;
    for (const NodeRecord* node : admitted.nodes) {
      if (node->kind == kind) of_kind.push_back(node);
    }
    placement.ranks = Pack(std::move(of_kind), spec.distributed().world_size(),
                           spec.distributed().ranks_per_node(), ParallelismOf(spec).stages);
    if (placement.placed()) {
      placement.kind = kind;
      placement.pipeline_stages = ParallelismOf(spec).stages;
      return placement;
    }
  }
  placement.why = TooFewSlots(spec, admitted.nodes);  // step 4
  return placement;
}

std::string PlacementShape(const v1::JobSpec& spec) {
  v1::JobSpec shape = spec;
  shape.clear_display_name();
  shape.clear_labels();
  shape.clear_optimizer();
  shape.clear_lr_schedule();
  shape.clear_batch_size_per_rank();
  shape.clear_grad_accumulation_steps();
  shape.clear_max_steps();
  shape.clear_max_epochs();
  shape.clear_eval_every_steps();
  shape.clear_log_every_steps();
  shape.clear_grad_clip_norm();
  shape.clear_checkpoint();
  shape.clear_max_restarts();
  shape.clear_hang_timeout_seconds();
  if (shape.has_distributed()) shape.mutable_distributed()->clear_collective_timeout_seconds();
  shape.clear_priority();
  shape.clear_seed();
  if (shape.has_parallelism()) {  // placement reads the stages only (PlaceGang step 3)
    const int32_t stages = shape.parallelism().pipeline_stages();
    shape.clear_parallelism();
    if (stages != 0) shape.mutable_parallelism()->set_pipeline_stages(stages);
  }
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);  // map fields (nodeSelector) in key order
    shape.SerializeToCodedStream(&coded);
  }
  return bytes;
}

GangPlacement PlaceGangAvoiding(const v1::JobSpec& spec, const std::vector<NodeRecord>& nodes,
                                std::string_view tenant, const std::vector<NodePair>& avoid) {
  const size_t pairs = std::min<size_t>(avoid.size(), 4);
  for (size_t way = 0; pairs > 0 && way < (size_t{1} << pairs); ++way) {  // step 2
    std::set<std::string> left_out;
    for (size_t i = 0; i < pairs; ++i) {
      const NodePair& pair = avoid[i];
      left_out.insert((way >> i) & 1 ? pair.first : pair.second);
    }
    std::vector<NodeRecord> others;
    for (const NodeRecord& node : nodes) {
      if (left_out.count("nodes/" + node.name) == 0) others.push_back(node);
    }
    GangPlacement placement = PlaceGang(spec, others, tenant);
    if (placement.placed()) {
      placement.avoided.assign(avoid.begin(), avoid.begin() + static_cast<ptrdiff_t>(pairs));
      return placement;
    }
  }
  return PlaceGang(spec, nodes, tenant);  // steps 1 and 3
}

std::optional<std::string> QueuePass::Closed(const QueuedJob& job) const {
  if (!blocked_by_) return std::nullopt;
  const std::string window = absl::FormatDuration(backfill_window_);
  // Another tenant's job is not named: its name is not this tenant's to know.
  if (job.tenant != blocked_tenant_) {
    return absl::StrCat("waiting for ", job.spec ? job.spec->distributed().world_size() : 0,
                        " slots: those that free up are kept for a job ahead that has waited "
                        "longer than the backfill window (",
                        window, ")");
  }
  return absl::StrCat("waiting behind ", *blocked_by_,
                      ", which comes first and has waited longer than the backfill window (",
                      window, ")");
}

GangPlacement QueuePass::Decide(const QueuedJob& job, const Feasibility& feasibility,
                                const std::vector<NodeRecord>& nodes,
                                std::optional<std::string>* unfit, bool may_close) {
  GangPlacement placement;
  if (!feasibility.never.empty()) {  // step 2: aside, holding nothing
    placement.why = feasibility.never;
    return placement;
  }
  if (std::optional<std::string> why = Closed(job)) {  // step 3
    placement.why = *std::move(why);
    return placement;
  }
  if (*unfit) {  // step 4
    placement.why = **unfit;
  } else {
    placement = PlaceGangAvoiding(*job.spec, nodes, job.tenant, job.unreachable_pairs);
  }
  if (placement.placed()) return placement;
  *unfit = placement.why;
  if (may_close && !blocked_by_ && feasibility.fits_when_idle && job.waited >= backfill_window_) {
    blocked_by_ = job.name;
    blocked_tenant_ = job.tenant;
  }
  return placement;
}

GangPlacement QueuePass::Next(const QueuedJob& job) { return Judge(job, true); }

GangPlacement QueuePass::JudgeSubmitted(const QueuedJob& job) { return Judge(job, false); }

GangPlacement QueuePass::Judge(const QueuedJob& job, bool queued) {
  if (job.stopping) {  // step 1
    GangPlacement placement;
    placement.why = absl::StrCat("waiting for the ranks of attempt ", job.attempt, " to stop");
    return placement;
  }
  KeyVerdict unshared;
  KeyVerdict* verdict = &unshared;
  bool judged = false;
  if (!job.shape.empty()) {
    std::string key = job.tenant;  // tenant NUL shape
    key.push_back('\0');
    key.append(job.shape.data(), job.shape.size());
    auto [it, added] = verdicts_.try_emplace(std::move(key));
    verdict = &it->second;
    judged = !added;
  }
  if (!judged) verdict->feasibility = JudgeFeasibility(JobNeeds(*job.spec, job.tenant), snapshot_);
  GangPlacement placement =
      Decide(job, verdict->feasibility, snapshot_, &verdict->unfit, /*may_close=*/queued);
  if (placement.placed() && queued) TakeSlots(placement);
  return placement;
}

void QueuePass::TakeSlots(const GangPlacement& placement) {
  // The placed ranks' slots are taken for the rest of the pass.
  for (const RankPlacement& rank : placement.ranks) {
    for (NodeRecord& node : snapshot_) {
      if (node.id != rank.node_id) continue;
      auto& free = node.free_slots;
      free.erase(std::remove(free.begin(), free.end(), rank.slot), free.end());
    }
  }
}

void QueuePass::CloseBehind(std::string job, std::string tenant) {
  blocked_by_ = std::move(job);
  blocked_tenant_ = std::move(tenant);
}

GangPlacement QueuePass::Confirm(const QueuedJob& job, const std::vector<NodeRecord>& nodes) {
  if (job.stopping) return Next(job);  // step 1 alone: it reads no nodes
  std::optional<std::string> unfit;
  return Decide(job, JudgeFeasibility(JobNeeds(*job.spec, job.tenant), nodes), nodes, &unfit);
}

bool QueuePosition::Before(const QueuePosition& other) const {
  if (priority != other.priority) return priority > other.priority;
  if (create_us != other.create_us) return create_us < other.create_us;
  return name < other.name;
}

bool FairShareOrder::Turn::operator<(const Turn& other) const {
  if (held != other.held) return held < other.held;
  if (head->Before(*other.head)) return true;
  if (other.head->Before(*head)) return false;
  return tenant < other.tenant;
}

FairShareOrder::FairShareOrder(std::vector<FairShareEntry> jobs,
                               const std::map<std::string, int64_t>& held)
    : jobs_(std::move(jobs)) {
  std::unordered_map<std::string, size_t> index;
  for (const FairShareEntry& job : jobs_) {
    const auto [it, added] = index.try_emplace(job.tenant, tenants_.size());
    if (added) {
      const auto slots = held.find(job.tenant);
      tenants_.push_back({slots == held.end() ? 0 : slots->second, {}, 0});
    }
    tenant_of_.push_back(it->second);
    by_priority_.push_back(by_priority_.size());
  }
  std::sort(by_priority_.begin(), by_priority_.end(),
            [&](size_t a, size_t b) { return jobs_[a].position.Before(jobs_[b].position); });
}

void FairShareOrder::Enqueue(size_t tenant) {
  const Tenant& of = tenants_[tenant];
  if (of.next < of.jobs.size()) turns_.insert({of.held, &jobs_[of.jobs[of.next]].position, tenant});
}

bool FairShareOrder::StartNextPriority() {
  if (next_level_ == by_priority_.size()) return false;
  const int32_t priority = jobs_[by_priority_[next_level_]].position.priority;
  std::vector<size_t> present;
  for (; next_level_ < by_priority_.size(); ++next_level_) {
    const size_t job = by_priority_[next_level_];
    if (jobs_[job].position.priority != priority) break;
    Tenant& tenant = tenants_[tenant_of_[job]];
    if (tenant.next == tenant.jobs.size()) {  // its jobs of a higher priority were all served
      tenant.jobs.clear();
      tenant.next = 0;
      present.push_back(tenant_of_[job]);
    }
    tenant.jobs.push_back(job);  // in QueuePosition order: by_priority_ is
  }
  for (const size_t tenant : present) Enqueue(tenant);
  return true;
}

std::optional<size_t> FairShareOrder::Next() {
  if (last_) Enqueue(tenant_of_[*last_]);  // its next job's turn, with what it holds now
  last_.reset();
  while (turns_.empty()) {
    if (!StartNextPriority()) return std::nullopt;
  }
  const Turn turn = *turns_.begin();
  turns_.erase(turns_.begin());
  Tenant& tenant = tenants_[turn.tenant];
  last_ = tenant.jobs[tenant.next++];
  return last_;
}

void FairShareOrder::Placed() {
  if (last_) tenants_[tenant_of_[*last_]].held += jobs_[*last_].slots;
}

bool FastPathMayPlace(const QueuePosition& job, const std::optional<QueuePosition>& blocking,
                      bool capacity_changed) {
  return !capacity_changed && (!blocking || job.priority > blocking->priority);
}

bool AnyNodeTakesARank(const std::vector<NodeRecord>& nodes) {
  const v1::JobSpec no_spec;
  const JobNeeds any(no_spec);  // the two filters read nothing of the job
  return std::any_of(nodes.begin(), nodes.end(), [&any](const NodeRecord& node) {
    return TakesRanks(node, any) && HasFreeSlot(node, any);
  });
}

bool QueueNeedsFullPass(const QueueWatch& watch, absl::Duration refresh) {
  return !watch.full_pass_in_term              // 1
         || watch.changed                      // 2
         || watch.some_node_free               // 3
         || watch.since_full_pass >= refresh;  // 4, else 5
}

std::string PlacementMessage(int32_t attempt, const GangPlacement& placement) {
  const std::string cuda = placement.kind == v1::Node::CUDA ? ", CUDA" : "";
  const size_t stages = static_cast<size_t>(std::max(1, placement.pipeline_stages));
  std::string avoided;
  for (const auto& [from, to] : placement.avoided) {
    absl::StrAppend(&avoided, avoided.empty() ? "; kept " : ", ", from, " and ", to, " apart");
  }
  if (!avoided.empty()) absl::StrAppend(&avoided, " (they could not reach each other)");
  if (stages == 1) {
    return absl::StrCat("attempt ", attempt, " placed on ",
                        absl::StrJoin(NodeRuns(placement.ranks, 0, placement.ranks.size()), ", "),
                        cuda, avoided);
  }
  std::vector<std::string> replicas;
  for (size_t first = 0; first < placement.ranks.size(); first += stages) {
    const size_t end = std::min(first + stages, placement.ranks.size());
    replicas.push_back(absl::StrCat("replica ", first / stages, " on ",
                                    absl::StrJoin(NodeRuns(placement.ranks, first, end), " and ")));
  }
  return absl::StrCat("attempt ", attempt, " placed ", stages, " stages x ", replicas.size(),
                      replicas.size() == 1 ? " replica: " : " replicas: ",
                      absl::StrJoin(replicas, ", "), cuda, avoided);
}

v1::JobEvent::FailureKind FailureKindOfExit(int exit_code, int signal) {
  if (signal == 0 && exit_code == trainer::kExitUserError) return v1::JobEvent::USER;
  // Out of memory at the rank's limit: reported as this code, with signal 9 when the kernel's
  // cgroup OOM killer stopped it. The spec needs more than a slot gives; a retry cannot help.
  if (exit_code == trainer::kExitOutOfMemory) return v1::JobEvent::USER;
  if (signal == 0 &&
      (exit_code == trainer::kExitInfrastructure || exit_code == trainer::kExitPreempted)) {
    return v1::JobEvent::INFRASTRUCTURE;
  }
  return v1::JobEvent::JOB;
}

v1::JobEvent::FailureKind FailureKindOfScriptExit(int exit_code, int signal) {
  if (exit_code == trainer::kExitOutOfMemory) return v1::JobEvent::USER;  // the agent's verdict
  if (signal != 0) return v1::JobEvent::JOB;
  return v1::JobEvent::USER;
}

std::string RankFailureMessage(int32_t rank, bool stopped, int exit_code, int signal,
                               const std::string& agent_message) {
  if (stopped) {
    constexpr absl::string_view kAgentPrefix = "stopped by the agent: ";
    absl::string_view why = agent_message;
    if (absl::StartsWith(why, kAgentPrefix)) why.remove_prefix(kAgentPrefix.size());
    return absl::StrCat("rank ", rank, " was stopped by its agent", why.empty() ? "" : ": ", why);
  }
  const std::string exit = signal != 0 ? absl::StrCat("killed by signal ", signal)
                                       : absl::StrCat("exited with code ", exit_code);
  // Without output of its own the agent reports the exit itself, which says nothing new.
  const bool has_line = !agent_message.empty() && agent_message != exit;
  if (!has_line) return absl::StrCat("rank ", rank, signal != 0 ? " was " : " ", exit);
  // A script's agent sends its last few lines (a traceback), one a line.
  const bool lines = absl::StrContains(agent_message, '\n');
  return absl::StrCat("rank ", rank, signal != 0 ? " was " : " ", exit,
                      lines ? " (last log lines: " : " (last log line: ",
                      absl::StrReplaceAll(agent_message, {{"\n", " | "}}), ")");
}

namespace {

v1::JobEvent::FailureKind KindOf(const RankReport& rank, bool script) {
  if (rank.state == "STOPPED") return v1::JobEvent::INFRASTRUCTURE;
  return script ? FailureKindOfScriptExit(rank.exit_code, rank.signal)
                : FailureKindOfExit(rank.exit_code, rank.signal);
}

// Whether the verdict waits before blaming `rank` (JudgeAttempt step 2): an infrastructure
// failure, or a script's non-zero exit, which may be its peer's death as well as its own bug.
bool MayBeAConsequence(const RankReport& rank, bool script) {
  const v1::JobEvent::FailureKind kind = KindOf(rank, script);
  return kind == v1::JobEvent::INFRASTRUCTURE ||
         (script && kind == v1::JobEvent::USER && rank.signal == 0 &&
          rank.exit_code != trainer::kExitOutOfMemory);
}

// JudgeAttempt's steps 1-2: the rank to blame, or null.
const RankReport* Culprit(const AttemptSnapshot& attempt, absl::Duration peer_failure_grace) {
  const RankReport* deferred = nullptr;
  int running = 0;  // ranks that could still report the real cause
  for (const RankReport& rank : attempt.ranks) {
    running += rank.state == "STARTING" || rank.state == "RUNNING";
    if (rank.state != "FAILED" && rank.state != "STOPPED") continue;
    if (!MayBeAConsequence(rank, attempt.script)) return &rank;  // step 1
    if (deferred == nullptr || (deferred->state != "STOPPED" && rank.state == "STOPPED")) {
      deferred = &rank;
    }
  }
  if (deferred == nullptr) return nullptr;
  const bool graced = deferred->seconds_in_state >= absl::ToDoubleSeconds(peer_failure_grace);
  return graced || running == 0 ? deferred : nullptr;
}

}  // namespace

AttemptVerdict JudgeAttempt(const AttemptSnapshot& attempt, absl::Duration peer_failure_grace) {
  AttemptVerdict verdict;
  if (const RankReport* culprit = Culprit(attempt, peer_failure_grace)) {
    AttemptFailure failure;
    failure.event = v1::JobEvent::RANK_FAILED;
    failure.kind = KindOf(*culprit, attempt.script);
    failure.rank = culprit->rank;
    failure.node = "nodes/" + culprit->node;
    failure.exit_code = culprit->exit_code;
    failure.signal = culprit->signal;
    failure.message = RankFailureMessage(culprit->rank, culprit->state == "STOPPED",
                                         culprit->exit_code, culprit->signal, culprit->message);
    verdict.failure = std::move(failure);
    return verdict;
  }
  const size_t ranks = attempt.ranks.size();
  size_t started = 0, succeeded = 0;
  for (const RankReport& rank : attempt.ranks) {
    started += rank.state == "STARTING" || rank.state == "RUNNING" || rank.state == "SUCCEEDED";
    succeeded += rank.state == "SUCCEEDED";
  }
  verdict.now_running = attempt.job_state == v1::Job::SCHEDULED && started == ranks;  // step 3
  if (verdict.now_running) verdict.started_reason = absl::StrCat("all ", ranks, " ranks started");
  const bool running = attempt.job_state == v1::Job::RUNNING || verdict.now_running;
  if (running && succeeded == ranks) {
    verdict.succeeded = true;
    verdict.succeeded_reason = absl::StrCat("all ", ranks, " ranks exited 0");
    return verdict;
  }
  if (verdict.now_running) return verdict;  // it started just now: the watchdog counts from here
  // A script is watched once it has reported a step: before that, nothing says it would report.
  if (attempt.script && !attempt.seconds_since_step) return verdict;
  const double idle = std::min(attempt.seconds_since_start,
                               attempt.seconds_since_step.value_or(attempt.seconds_since_start));
  const double heard_for = attempt.seconds_since_recordable.value_or(idle);
  if (std::min(idle, heard_for) > attempt.hang_timeout_seconds) {  // step 4
    AttemptFailure failure;
    failure.event = v1::JobEvent::HANG_DETECTED;
    failure.kind = v1::JobEvent::JOB;
    failure.message = absl::StrCat("no training step for ", static_cast<int64_t>(idle),
                                   " s (hang_timeout_seconds ", attempt.hang_timeout_seconds, ")");
    verdict.failure = std::move(failure);
  }
  return verdict;
}

RestartDecision DecideRestart(const v1::Job& job, v1::JobEvent::FailureKind kind,
                              const std::string& cause) {
  RestartDecision decision;
  int32_t used = 0, allowed = 0;
  if (kind == v1::JobEvent::INFRASTRUCTURE) {
    decision.counter = "infra_restarts";
    used = job.infrastructure_restarts();
    allowed = job.spec().max_restarts().infrastructure();
  } else if (kind == v1::JobEvent::JOB) {
    decision.counter = "job_restarts";
    used = job.job_restarts();
    allowed = job.spec().max_restarts().job();
  }
  const std::string kind_name = v1::JobEvent::FailureKind_Name(kind);
  decision.reason = cause;
  if (decision.counter == nullptr || used >= allowed) {
    if (decision.counter != nullptr) {
      absl::StrAppend(&decision.reason, " (", used, " of ", allowed, " ", kind_name,
                      " restarts used)");
    }
    decision.counter = nullptr;
    return decision;
  }
  decision.restart = true;
  absl::StrAppend(&decision.reason, "; restart ", used + 1, " of ", allowed);
  return decision;
}

DrainPlan PlanDrains(const std::vector<DrainingRank>& ranks) {
  DrainPlan plan;
  std::set<int64_t> busy;
  std::set<std::pair<std::string, int32_t>> restarting;
  for (const DrainingRank& rank : ranks) {
    if (!rank.job_id) continue;
    busy.insert(rank.node_id);
    if (!restarting.emplace(*rank.job_id, rank.attempt).second) continue;
    DrainPlan::Restart restart;
    restart.job_id = *rank.job_id;
    restart.attempt = rank.attempt;
    restart.failure.event = v1::JobEvent::NODE_LOST;
    restart.failure.kind = v1::JobEvent::INFRASTRUCTURE;
    restart.failure.node = "nodes/" + rank.node;
    restart.failure.rank = rank.rank;
    restart.failure.message = restart.failure.node + " is being drained";
    plan.restarts.push_back(std::move(restart));
  }
  std::set<int64_t> cordoned;
  for (const DrainingRank& rank : ranks) {
    if (!busy.count(rank.node_id) && cordoned.insert(rank.node_id).second) {
      plan.cordon.push_back(rank.node_id);
    }
  }
  return plan;
}

bool FailureDiscardsRanks(const AttemptFailure& failure) {
  return failure.event == v1::JobEvent::RANK_FAILED || failure.event == v1::JobEvent::HANG_DETECTED;
}

absl::Time HeartbeatsRecordableSince(absl::Time api_start, absl::Time database_last_unreachable) {
  return std::max(api_start, database_last_unreachable);
}

bool MayDeclareNodesLost(absl::Time now, absl::Time recordable_since, absl::Duration grace) {
  return now - recordable_since >= grace;
}

bool SilentNodeIsLost(absl::Duration silent, absl::Duration outage_grace,
                      bool has_live_peers_elsewhere) {
  if (silent >= outage_grace) return true;  // 1
  return !has_live_peers_elsewhere;         // 2, 3
}

std::string NodeLostReason(const std::string& node, double silent_seconds, absl::Duration lease) {
  return absl::StrCat("nodes/", node, " lost: no heartbeat for ",
                      static_cast<int64_t>(silent_seconds), " s (lease ",
                      absl::FormatDuration(lease), ")");
}

RankFate FateOfLiveRank(const LiveRank& rank, bool fresh_report) {
  const bool runnable = rank.rank_state == "ASSIGNED" || rank.rank_state == "STARTING" ||
                        rank.rank_state == "RUNNING";
  const bool job_in_flight = rank.job_state == "SCHEDULED" || rank.job_state == "RUNNING";
  const bool attempt_in_flight =
      rank.attempt_state == "SCHEDULED" || rank.attempt_state == "RUNNING";
  if (runnable && job_in_flight && rank.current_attempt && attempt_in_flight) {
    return RankFate::kDesired;
  }
  if (!fresh_report) return RankFate::kUnchanged;
  return rank.running_on_agent ? RankFate::kStopping : RankFate::kStopped;
}

bool StopsAtOnce(const LiveRank& rank) {
  return rank.attempt_state == "FAILED" && rank.attempt_discarded;
}

}  // namespace gradhub::api
