// The control plane's rules (services/api/scheduling_rules.h) without a database: a test per
// rule, named after it. scheduler_test runs the same rules through PostgreSQL end to end.
#include "services/api/scheduling_rules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "services/common/contract/job_spec.h"
#include "services/common/contract/trainer_exit_codes.h"
#include "services/common/contract/user_error.h"

namespace gradhub::api {
namespace {

using ::testing::HasSubstr;

NodeRecord Node(int64_t id, const std::string& name, int free_slots,
                v1::Node::DeviceKind kind = v1::Node::CPU) {
  NodeRecord node;
  node.id = id;
  node.name = name;
  node.kind = kind;
  node.heartbeating = true;
  node.slots = free_slots;
  for (int32_t slot = 0; slot < free_slots; ++slot) node.free_slots.push_back(slot);
  return node;
}

// A node of `slots` slots of which the first `used` hold ranks.
NodeRecord BusyNode(int64_t id, const std::string& name, int slots, int used) {
  NodeRecord node = Node(id, name, slots);
  node.free_slots.erase(node.free_slots.begin(), node.free_slots.begin() + used);
  return node;
}

v1::JobSpec Spec(int32_t world_size, int32_t ranks_per_node = 0,
                 v1::DistributedSpec::Backend backend = v1::DistributedSpec::AUTO) {
  v1::JobSpec spec;
  spec.mutable_distributed()->set_world_size(world_size);
  spec.mutable_distributed()->set_ranks_per_node(ranks_per_node);
  spec.mutable_distributed()->set_backend(backend);
  return spec;
}

// "a:0,a:1,b:0": node and slot of each rank, in rank order.
std::string Where(const GangPlacement& placement) {
  std::string out;
  for (const RankPlacement& rank : placement.ranks) {
    if (!out.empty()) out += ",";
    out += rank.node + ":" + std::to_string(rank.slot);
  }
  return out;
}

// --- scheduling filters ---

const NodeFilter& Filter(const std::string& name) {
  for (const NodeFilter& filter : NodeFilters()) {
    if (filter.name == name) return filter;
  }
  ADD_FAILURE() << "no filter " << name;
  return NodeFilters().front();
}

TEST(NodeFilters, GiveTheirReasonsMostSpecificFirst) {
  std::vector<std::string> names;
  for (const NodeFilter& filter : NodeFilters()) names.push_back(filter.name);
  EXPECT_EQ(names, (std::vector<std::string>{"NodeSelector", "DataRoots", "DeviceKind",
                                             "RunsScripts", "Memory", "Ready", "FreeSlot"}));
}

TEST(NodeFilters, OnlyReadyAndFreeSlotAskWhatANodeOffersNow) {
  std::vector<std::string> now;
  for (const NodeFilter& filter : NodeFilters()) {
    if (!filter.capability) now.push_back(filter.name);
  }
  EXPECT_EQ(now, (std::vector<std::string>{"Ready", "FreeSlot"}));
}

TEST(NodeFilters, NodeSelectorAdmitsNodesWithEveryLabel) {
  v1::JobSpec spec = Spec(1);
  (*spec.mutable_node_selector())["zone"] = "b";
  (*spec.mutable_node_selector())["gpu"] = "h100";
  const JobNeeds job(spec);
  NodeRecord node = Node(1, "a", 1);
  node.labels = {{"zone", "b"}};
  EXPECT_FALSE(Filter("NodeSelector").admits(node, job));
  node.labels["gpu"] = "h200";
  EXPECT_FALSE(Filter("NodeSelector").admits(node, job));
  node.labels["gpu"] = "h100";
  node.labels["extra"] = "any";
  EXPECT_TRUE(Filter("NodeSelector").admits(node, job));
  EXPECT_TRUE(Filter("NodeSelector").admits(Node(2, "b", 1), JobNeeds(Spec(1))));
  EXPECT_EQ(Filter("NodeSelector").why_none(job), "no node with label gpu=h100,zone=b");
}

TEST(NodeFilters, DataRootsAdmitNodesServingEveryFileTheSpecNames) {
  v1::JobSpec spec = Spec(1);
  spec.mutable_dataset()->mutable_csv()->set_path("/data/train.csv");
  spec.mutable_model()->mutable_torchscript()->set_path("/models/m.pt");
  const JobNeeds job(spec);
  NodeRecord node = Node(1, "a", 1);
  node.data_roots = {"/data"};
  EXPECT_FALSE(Filter("DataRoots").admits(node, job));
  node.data_roots.push_back("/models");
  EXPECT_TRUE(Filter("DataRoots").admits(node, job));
  EXPECT_TRUE(Filter("DataRoots").admits(Node(2, "b", 1), JobNeeds(Spec(1))));  // no files
  EXPECT_THAT(Filter("DataRoots").why_none(job), HasSubstr("data roots"));
}

TEST(RootsOfTenant, AreTheSharedRootsAndTheTenantsOwnNeverAnothers) {
  NodeRecord node = Node(1, "a", 1);
  node.data_roots = {"/shared"};
  node.tenant_data_roots = {{"tenants/a", "/a"}, {"tenants/b", "/b"}, {"tenants/a", "/a2"}};
  EXPECT_EQ(RootsOfTenant(node, "tenants/a"), (std::vector<std::string>{"/shared", "/a", "/a2"}));
  EXPECT_EQ(RootsOfTenant(node, "tenants/b"), (std::vector<std::string>{"/shared", "/b"}));
  EXPECT_EQ(RootsOfTenant(node, "tenants/c"), (std::vector<std::string>{"/shared"}));
  EXPECT_EQ(RootsOfTenant(node, ""), (std::vector<std::string>{"/shared"}));
}

TEST(NodeFilters, DataRootsAdmitATenantsOwnRootsOnlyForItsJobs) {
  v1::JobSpec spec = Spec(1);
  spec.mutable_dataset()->mutable_csv()->set_path("/tenant-a/train.csv");
  NodeRecord node = Node(1, "a", 1);
  node.tenant_data_roots = {{"tenants/a", "/tenant-a"}};
  EXPECT_TRUE(Filter("DataRoots").admits(node, JobNeeds(spec, "tenants/a")));
  EXPECT_FALSE(Filter("DataRoots").admits(node, JobNeeds(spec, "tenants/b")));
  EXPECT_FALSE(Filter("DataRoots").admits(node, JobNeeds(spec)));
  EXPECT_THAT(Filter("DataRoots").why_none(JobNeeds(spec, "tenants/b")),
              HasSubstr("tenantDataRoots of tenants/b"));
}

TEST(NodeFilters, MemoryAdmitsNodesWhoseSlotHoldsARank) {
  v1::JobSpec spec = Spec(1);
  NodeRecord node = Node(1, "a", 1);
  node.memory_per_slot_bytes = int64_t{2048} << 20;  // 2 GiB
  EXPECT_TRUE(Filter("Memory").admits(node, JobNeeds(spec))) << "0 asks for a slot's share";
  spec.set_memory_per_rank_mib(2048);
  EXPECT_TRUE(Filter("Memory").admits(node, JobNeeds(spec)));
  spec.set_memory_per_rank_mib(2049);
  EXPECT_FALSE(Filter("Memory").admits(node, JobNeeds(spec)));
  node.memory_per_slot_bytes += (int64_t{1} << 20) - 1;  // a MiB short of 2049
  EXPECT_FALSE(Filter("Memory").admits(node, JobNeeds(spec)));
  node.memory_per_slot_bytes = 0;                  // no limit
  spec.set_memory_per_rank_mib(int64_t{1} << 40);  // would overflow as bytes
  EXPECT_TRUE(Filter("Memory").admits(node, JobNeeds(spec)));
  node.memory_per_slot_bytes = int64_t{1} << 59;  // 2^39 MiB
  EXPECT_FALSE(Filter("Memory").admits(node, JobNeeds(spec)));
  spec.set_memory_per_rank_mib(4096);
  EXPECT_EQ(Filter("Memory").why_none(JobNeeds(spec)),
            "memoryPerRankMib 4096: no eligible node gives a rank that much (see each node's "
            "memoryPerSlotBytes)");
}

TEST(NodeFilters, DeviceKindAdmitsTheKindsTheJobRunsOn) {
  const NodeRecord cpu = Node(1, "c", 1), cuda = Node(2, "g", 1, v1::Node::CUDA);
  const v1::JobSpec nccl = Spec(1, 0, v1::DistributedSpec::NCCL);
  const v1::JobSpec gloo = Spec(1, 0, v1::DistributedSpec::GLOO);
  EXPECT_FALSE(Filter("DeviceKind").admits(cpu, JobNeeds(nccl)));
  EXPECT_TRUE(Filter("DeviceKind").admits(cuda, JobNeeds(nccl)));
  EXPECT_TRUE(Filter("DeviceKind").admits(cpu, JobNeeds(gloo)));
  EXPECT_FALSE(Filter("DeviceKind").admits(cuda, JobNeeds(gloo)));
  EXPECT_TRUE(Filter("DeviceKind").admits(cpu, JobNeeds(Spec(1))));
  EXPECT_TRUE(Filter("DeviceKind").admits(cuda, JobNeeds(Spec(1))));
  v1::JobSpec fp16 = Spec(1);
  fp16.set_precision(v1::JobSpec::FP16);
  EXPECT_FALSE(Filter("DeviceKind").admits(cpu, JobNeeds(fp16)));
  EXPECT_EQ(Filter("DeviceKind").why_none(JobNeeds(fp16)),
            "backend AUTO with precision FP16 runs on CUDA nodes; no such node is registered");
}

TEST(NodeFilters, RunsScriptsAdmitsNodesWithAMasterPortBaseForScriptJobs) {
  v1::JobSpec script = Spec(1);
  script.mutable_script()->set_entrypoint("train.py");
  NodeRecord node = Node(1, "a", 1);
  EXPECT_FALSE(Filter("RunsScripts").admits(node, JobNeeds(script)));
  EXPECT_TRUE(Filter("RunsScripts").admits(node, JobNeeds(Spec(1))));  // the trainer needs none
  node.master_port_base = 29500;
  EXPECT_TRUE(Filter("RunsScripts").admits(node, JobNeeds(script)));
  EXPECT_THAT(Filter("RunsScripts").why_none(JobNeeds(script)), HasSubstr("--master-port-base"));
}

TEST(NodeFilters, ReadyAdmitsReadyNodesWithinTheirLease) {
  const JobNeeds job(Spec(1));
  NodeRecord node = Node(1, "a", 1);
  EXPECT_TRUE(Filter("Ready").admits(node, job));
  for (const auto state : {v1::Node::CORDONED, v1::Node::DRAINING, v1::Node::LOST}) {
    node.state = state;
    EXPECT_FALSE(Filter("Ready").admits(node, job)) << v1::Node::State_Name(state);
  }
  node.state = v1::Node::READY;
  node.heartbeating = false;
  EXPECT_FALSE(Filter("Ready").admits(node, job));
  EXPECT_EQ(Filter("Ready").why_none(JobNeeds(Spec(3))),
            "needs 3 slots, no ready node has a free slot");
}

TEST(NodeFilters, FreeSlotAdmitsNodesWithOne) {
  const JobNeeds job(Spec(2));
  EXPECT_TRUE(Filter("FreeSlot").admits(Node(1, "a", 1), job));
  EXPECT_FALSE(Filter("FreeSlot").admits(Node(1, "a", 0), job));
  EXPECT_EQ(Filter("FreeSlot").why_none(job), "needs 2 slots, no ready node has a free slot");
}

TEST(AdmitNodes, TheReasonIsWhereTheNodeThatGotFurthestStopped) {
  v1::JobSpec spec = Spec(1, 0, v1::DistributedSpec::NCCL);
  (*spec.mutable_node_selector())["zone"] = "b";
  NodeRecord unlabelled_gpu = Node(1, "g", 1, v1::Node::CUDA);
  NodeRecord labelled_cpu = Node(2, "c", 1);
  labelled_cpu.labels["zone"] = "b";
  const JobNeeds job(spec);
  // The labelled node passes the selector and the roots, and stops at the device kind.
  Admission admitted = AdmitNodes(job, {unlabelled_gpu, labelled_cpu});
  EXPECT_TRUE(admitted.nodes.empty());
  EXPECT_EQ(admitted.why, "backend NCCL runs on CUDA nodes; no such node is registered");
  EXPECT_EQ(AdmitNodes(job, {unlabelled_gpu}).why, "no node with label zone=b");
  unlabelled_gpu.labels["zone"] = "b";
  admitted = AdmitNodes(job, {labelled_cpu, unlabelled_gpu});
  ASSERT_EQ(admitted.nodes.size(), 1u);
  EXPECT_EQ(admitted.nodes[0]->name, "g");
  EXPECT_EQ(admitted.why, "");
}

TEST(AdmitNodes, WithoutAnyNodeSaysNoneIsRegistered) {
  // It used to say that no node's data roots held the files, of a job that names none.
  EXPECT_EQ(AdmitNodes(JobNeeds(Spec(1)), {}).why, "no node is registered");
  EXPECT_EQ(PlaceGang(Spec(1), {}).why, "no node is registered");
}

TEST(AdmitNodes, CapabilityOnlyAsksNothingOfStateOrFreeSlots) {
  NodeRecord cordoned_full = BusyNode(1, "a", 2, 2);
  cordoned_full.state = v1::Node::CORDONED;
  cordoned_full.heartbeating = false;
  const JobNeeds job(Spec(1));
  EXPECT_TRUE(AdmitNodes(job, {cordoned_full}).nodes.empty());
  EXPECT_EQ(AdmitNodes(job, {cordoned_full}, /*capability_only=*/true).nodes.size(), 1u);
  v1::JobSpec big = Spec(1);
  big.set_memory_per_rank_mib(1024);
  cordoned_full.memory_per_slot_bytes = int64_t{512} << 20;
  EXPECT_THAT(AdmitNodes(JobNeeds(big), {cordoned_full}, true).why,
              HasSubstr("memoryPerRankMib 1024"));
}

// --- feasibility ---

TEST(JudgeFeasibility, WithoutAnyNodeNothingCouldRunTheJob) {
  EXPECT_EQ(JudgeFeasibility(JobNeeds(Spec(1)), {}).never, "no node is registered");
}

TEST(JudgeFeasibility, ANodeThatCouldHoldTheJobCountsWhateverItRunsOrItsState) {
  NodeRecord full = BusyNode(1, "a", 2, 2), cordoned = Node(2, "b", 2);
  cordoned.state = v1::Node::CORDONED;
  const Feasibility busy = JudgeFeasibility(JobNeeds(Spec(2)), {full});
  EXPECT_EQ(busy.never, "");
  EXPECT_TRUE(busy.fits_when_idle) << "its slots free up as its jobs end";
  const Feasibility needs_cordoned = JudgeFeasibility(JobNeeds(Spec(4)), {full, cordoned});
  EXPECT_EQ(needs_cordoned.never, "") << "a cordoned node may be uncordoned";
  EXPECT_FALSE(needs_cordoned.fits_when_idle) << "but ready nodes alone cannot hold it";
}

TEST(JudgeFeasibility, TheWorldSizeMustFitTheSlotsOfTheCapableNodesInAll) {
  const std::vector<NodeRecord> nodes = {Node(1, "a", 2), Node(2, "b", 4)};
  EXPECT_EQ(JudgeFeasibility(JobNeeds(Spec(6)), nodes).never, "");
  EXPECT_EQ(JudgeFeasibility(JobNeeds(Spec(7)), nodes).never,
            "needs 7 slots; the registered nodes that could run it have 6 in all");
  EXPECT_EQ(JudgeFeasibility(JobNeeds(Spec(5, 2)), nodes).never,
            "needs 5 slots (at most 2 per node); the registered nodes that could run it have 4 "
            "in all");
}

TEST(JudgeFeasibility, SlotsOfDifferentDeviceKindsDoNotAddUp) {
  const std::vector<NodeRecord> nodes = {Node(1, "cpu", 2), Node(2, "gpu", 2, v1::Node::CUDA)};
  EXPECT_EQ(JudgeFeasibility(JobNeeds(Spec(2)), nodes).never, "");
  EXPECT_THAT(JudgeFeasibility(JobNeeds(Spec(3)), nodes).never, HasSubstr("have 2 in all"));
}

TEST(JudgeFeasibility, AFilterNoNodePassesGivesItsReason) {
  v1::JobSpec spec = Spec(1);
  spec.set_memory_per_rank_mib(4096);
  NodeRecord small = Node(1, "a", 8);
  small.memory_per_slot_bytes = int64_t{1024} << 20;
  EXPECT_THAT(JudgeFeasibility(JobNeeds(spec), {small}).never, HasSubstr("memoryPerRankMib 4096"));
  v1::JobSpec labelled = Spec(1);
  (*labelled.mutable_node_selector())["zone"] = "b";
  EXPECT_EQ(JudgeFeasibility(JobNeeds(labelled), {small}).never, "no node with label zone=b");
}

TEST(PlacementShape, DropsOnlyWhatPlacementNeverReads) {
  v1::JobSpec spec = Spec(2);
  spec.mutable_dataset()->mutable_csv()->set_path("/data/a.csv");
  const std::string shape = PlacementShape(spec);
  v1::JobSpec other = spec;  // differs in what placement never reads
  other.set_display_name("other");
  other.set_seed(7);
  other.set_priority(3);
  other.set_max_steps(100);
  other.mutable_optimizer()->mutable_sgd()->set_lr(0.1);
  other.mutable_distributed()->set_collective_timeout_seconds(5);
  EXPECT_EQ(PlacementShape(other), shape);
  // What any filter or the packing reads makes another shape.
  const auto differs = [&](auto change) {
    v1::JobSpec changed = spec;
    change(changed);
    return PlacementShape(changed) != shape;
  };
  EXPECT_TRUE(differs([](v1::JobSpec& s) { s.set_precision(v1::JobSpec::FP16); }));
  EXPECT_TRUE(differs([](v1::JobSpec& s) { (*s.mutable_node_selector())["zone"] = "a"; }));
  EXPECT_TRUE(differs([](v1::JobSpec& s) { s.mutable_dataset()->mutable_csv()->set_path("/x"); }));
  EXPECT_TRUE(
      differs([](v1::JobSpec& s) { s.mutable_model()->mutable_torchscript()->set_path("/m"); }));
  EXPECT_TRUE(differs([](v1::JobSpec& s) { s.mutable_distributed()->set_world_size(3); }));
  EXPECT_TRUE(differs([](v1::JobSpec& s) { s.mutable_distributed()->set_ranks_per_node(1); }));
  EXPECT_TRUE(differs([](v1::JobSpec& s) { s.set_memory_per_rank_mib(1024); }));
  EXPECT_TRUE(differs(
      [](v1::JobSpec& s) { s.mutable_distributed()->set_backend(v1::DistributedSpec::NCCL); }));
  // Of the parallelism, placement reads the stages only.
  v1::JobSpec pipelined = spec;
  pipelined.mutable_parallelism()->set_pipeline_stages(2);
  v1::JobSpec scheduled_otherwise = pipelined;
  scheduled_otherwise.mutable_parallelism()->set_micro_batches(8);
  scheduled_otherwise.mutable_parallelism()->set_schedule(v1::ParallelismSpec::GPIPE);
  EXPECT_EQ(PlacementShape(scheduled_otherwise), PlacementShape(pipelined));
  EXPECT_NE(PlacementShape(pipelined), shape);
}

// --- placement ---

TEST(PlaceGang, PacksOntoTheNodesWithTheMostFreeSlotsFirst) {
  const GangPlacement placement = PlaceGang(Spec(3), {Node(1, "a", 1), Node(2, "b", 2)});
  EXPECT_EQ(Where(placement), "b:0,b:1,a:0");
  EXPECT_EQ(placement.ranks[2].local_rank, 0);
  EXPECT_EQ(placement.ranks[1].local_rank, 1);
}

// PlaceGangAvoiding, step 2: another node takes the place of one end of the broken link.
TEST(PlaceGangAvoiding, KeepsAPairThatCouldNotReachEachOtherApart) {
  const std::vector<NodeRecord> nodes = {Node(1, "a", 2), Node(2, "b", 2), Node(3, "c", 2)};
  EXPECT_EQ(Where(PlaceGang(Spec(4, 2), nodes)), "a:0,a:1,b:0,b:1");
  const GangPlacement placement =
      PlaceGangAvoiding(Spec(4, 2), nodes, "", {{"nodes/a", "nodes/b"}});
  EXPECT_EQ(Where(placement), "a:0,a:1,c:0,c:1");
  EXPECT_EQ(placement.avoided, (std::vector<NodePair>{{"nodes/a", "nodes/b"}}));
  EXPECT_THAT(PlacementMessage(2, placement),
              HasSubstr("; kept nodes/a and nodes/b apart (they could not reach each other)"));
}

// Step 2: every pair at once, one end of each left out.
TEST(PlaceGangAvoiding, KeepsEveryPairApartWhenItCan) {
  const std::vector<NodeRecord> nodes = {Node(1, "a", 2), Node(2, "b", 2), Node(3, "c", 2),
                                         Node(4, "d", 2)};
  const GangPlacement placement =
      PlaceGangAvoiding(Spec(4, 2), nodes, "", {{"nodes/a", "nodes/b"}, {"nodes/a", "nodes/c"}});
  EXPECT_EQ(Where(placement), "a:0,a:1,d:0,d:1");
  EXPECT_EQ(placement.avoided.size(), 2u);
}

// Step 3: no other capacity, so the pair is used again rather than waiting for nothing.
TEST(PlaceGangAvoiding, UsesThePairWhenNothingElseFits) {
  const std::vector<NodeRecord> nodes = {Node(1, "a", 2), Node(2, "b", 2)};
  const GangPlacement placement =
      PlaceGangAvoiding(Spec(4, 2), nodes, "", {{"nodes/a", "nodes/b"}});
  EXPECT_EQ(Where(placement), "a:0,a:1,b:0,b:1");
  EXPECT_TRUE(placement.avoided.empty());
  // And waits exactly as PlaceGang would.
  EXPECT_EQ(PlaceGangAvoiding(Spec(6, 2), nodes, "", {{"nodes/a", "nodes/b"}}).why,
            PlaceGang(Spec(6, 2), nodes).why);
}

// Step 1: no pairs is PlaceGang.
TEST(PlaceGangAvoiding, WithoutPairsItIsPlaceGang) {
  const std::vector<NodeRecord> nodes = {Node(1, "a", 1), Node(2, "b", 2)};
  EXPECT_EQ(Where(PlaceGangAvoiding(Spec(3), nodes, "", {})), Where(PlaceGang(Spec(3), nodes)));
}

TEST(PlaceGang, RanksPerNodeCapsEachNode) {
  EXPECT_EQ(Where(PlaceGang(Spec(2, 1), {Node(1, "a", 4), Node(2, "b", 4)})), "a:0,b:0");
}

TEST(PlaceGang, AllRanksOrNoneAndTheReasonCountsTheUsableSlots) {
  const GangPlacement placement = PlaceGang(Spec(5, 2), {Node(1, "a", 4), Node(2, "b", 1)});
  EXPECT_FALSE(placement.placed());
  EXPECT_EQ(placement.why,
            "needs 5 slots (at most 2 per node), 3 usable on 2 ready nodes, 4 free on the largest "
            "node");
}

TEST(PlaceGang, ACordonedOrDrainingOrSilentNodeTakesNoRanks) {
  NodeRecord cordoned = Node(1, "a", 2), draining = Node(2, "b", 2), silent = Node(3, "c", 2);
  cordoned.state = v1::Node::CORDONED;
  draining.state = v1::Node::DRAINING;
  silent.heartbeating = false;
  const GangPlacement placement = PlaceGang(Spec(1), {cordoned, draining, silent});
  EXPECT_FALSE(placement.placed());
  EXPECT_EQ(placement.why, "needs 1 slots, no ready node has a free slot");
  EXPECT_EQ(Where(PlaceGang(Spec(1), {cordoned, Node(4, "d", 1)})), "d:0");
}

TEST(PlaceGang, ANodeSelectorWithoutAMatchingNodeSaysSo) {
  v1::JobSpec spec = Spec(1);
  (*spec.mutable_node_selector())["zone"] = "b";
  NodeRecord labelled = Node(1, "a", 1);
  labelled.labels["zone"] = "a";
  EXPECT_EQ(PlaceGang(spec, {labelled}).why, "no node with label zone=b");
  labelled.labels["zone"] = "b";
  EXPECT_EQ(Where(PlaceGang(spec, {labelled})), "a:0");
}

TEST(PlaceGang, OnlyNodesWhoseDataRootsHoldTheFilesServeTheJob) {
  v1::JobSpec spec = Spec(1);
  spec.mutable_dataset()->mutable_csv()->set_path("/data/train.csv");
  NodeRecord without = Node(1, "a", 1), with = Node(2, "b", 1);
  with.data_roots = {"/data"};
  EXPECT_THAT(PlaceGang(spec, {without}).why, HasSubstr("data roots"));
  EXPECT_EQ(Where(PlaceGang(spec, {without, with})), "b:0");
}

TEST(PlaceGang, NcclOnACpuOnlyClusterWaitsSayingWhy) {
  const GangPlacement placement =
      PlaceGang(Spec(2, 0, v1::DistributedSpec::NCCL), {Node(1, "a", 8)});
  EXPECT_FALSE(placement.placed());
  EXPECT_EQ(placement.why, "backend NCCL runs on CUDA nodes; no such node is registered");
}

TEST(PlaceGang, Fp16NeedsCudaNodes) {
  v1::JobSpec spec = Spec(1);
  spec.set_precision(v1::JobSpec::FP16);
  EXPECT_THAT(PlaceGang(spec, {Node(1, "a", 8)}).why, HasSubstr("with precision FP16"));
  EXPECT_EQ(PlaceGang(spec, {Node(1, "a", 8), Node(2, "g", 1, v1::Node::CUDA)}).kind,
            v1::Node::CUDA);
}

// The scheduler's side of the trainer's device rules (contract/job_spec.h CheckRankDevice): a
// spec CreateJob accepts goes only to nodes where its ranks are accepted, with AUTO become
// NCCL on CUDA nodes and GLOO on CPU nodes; a CUDA-only spec never goes to a CPU node.
TEST(DeviceKindsFor, PlacesOnlyWhereTheTrainerAcceptsTheRanks) {
  using Distributed = v1::DistributedSpec;
  for (const auto backend : {Distributed::AUTO, Distributed::NCCL, Distributed::GLOO}) {
    for (const auto precision : {v1::JobSpec::FP32, v1::JobSpec::BF16, v1::JobSpec::FP16}) {
      v1::JobSpec spec = Spec(1, 0, backend);
      spec.set_precision(precision);
      const std::string name =
          Distributed::Backend_Name(backend) + " " + v1::JobSpec::Precision_Name(precision);
      bool refused = false;
      for (const SpecIssue& issue : ValidateJobSpec(spec)) refused |= issue.field == "precision";
      if (refused) continue;  // FP16 with GLOO: CreateJob refuses it
      const std::vector<v1::Node::DeviceKind> kinds = DeviceKindsFor(spec);
      EXPECT_FALSE(kinds.empty()) << name;
      for (const auto kind : {v1::Node::CUDA, v1::Node::CPU}) {
        const bool cuda = kind == v1::Node::CUDA;
        v1::JobSpec as_placed = spec;
        if (backend == Distributed::AUTO) {
          as_placed.mutable_distributed()->set_backend(cuda ? Distributed::NCCL
                                                            : Distributed::GLOO);
        }
        const RankDevice device = cuda ? RankDevice::kCuda : RankDevice::kCpu;
        if (std::find(kinds.begin(), kinds.end(), kind) != kinds.end()) {
          EXPECT_NO_THROW(CheckRankDevice(as_placed, device)) << name << " on " << kind;
        } else if (!cuda) {
          EXPECT_THROW(CheckRankDevice(as_placed, device), UserError) << name << " on CPU";
        }
      }
    }
  }
}

TEST(PlaceGang, AutoPrefersCudaNodesAndNeverMixesDeviceKinds) {
  const std::vector<NodeRecord> nodes = {Node(1, "cpu", 4), Node(2, "gpu", 2, v1::Node::CUDA)};
  const GangPlacement fits_gpus = PlaceGang(Spec(2), nodes);
  EXPECT_EQ(Where(fits_gpus), "gpu:0,gpu:1");
  EXPECT_EQ(fits_gpus.kind, v1::Node::CUDA);
  // Three ranks do not fit the GPUs: all of them go to CPU slots, none split across kinds.
  const GangPlacement too_big = PlaceGang(Spec(3), nodes);
  EXPECT_EQ(Where(too_big), "cpu:0,cpu:1,cpu:2");
  EXPECT_EQ(too_big.kind, v1::Node::CPU);
}

TEST(PlaceGang, GlooRunsOnCpuNodesOnly) {
  const GangPlacement placement =
      PlaceGang(Spec(1, 0, v1::DistributedSpec::GLOO), {Node(1, "gpu", 2, v1::Node::CUDA)});
  EXPECT_EQ(placement.why, "backend GLOO runs on CPU nodes; no such node is registered");
}

TEST(PlaceGang, OnCudaNodesEachRankGetsItsOwnGpuAndNoMoreRanksThanGpus) {
  const GangPlacement placement =
      PlaceGang(Spec(3, 0, v1::DistributedSpec::NCCL),
                {Node(1, "g1", 2, v1::Node::CUDA), Node(2, "g2", 2, v1::Node::CUDA)});
  EXPECT_EQ(Where(placement), "g1:0,g1:1,g2:0");
  EXPECT_EQ(PlacementMessage(4, placement),
            "attempt 4 placed on nodes/g1 (ranks 0-1), nodes/g2 (rank 2), CUDA");
}

// --- placement of a pipeline (stages x replicas) ---

v1::JobSpec PipelineSpec(int32_t stages, int32_t world_size, int32_t ranks_per_node = 0) {
  v1::JobSpec spec = Spec(world_size, ranks_per_node);
  spec.mutable_parallelism()->set_pipeline_stages(stages);
  return spec;
}

TEST(PlaceGang, APipelinesReplicaGoesWholeOnANodeThatHoldsIt) {
  // Packed rank after rank, replica 1 (ranks 2-3) would straddle a and b.
  EXPECT_EQ(Where(PlaceGang(Spec(4), {Node(1, "a", 3), Node(2, "b", 3)})), "a:0,a:1,a:2,b:0");
  const GangPlacement placement = PlaceGang(PipelineSpec(2, 4), {Node(1, "a", 3), Node(2, "b", 3)});
  EXPECT_EQ(Where(placement), "a:0,a:1,b:0,b:1");
  EXPECT_EQ(placement.pipeline_stages, 2);
  EXPECT_EQ(placement.ranks[2].local_rank, 0);
  // A node that holds several replicas takes them in rank order.
  EXPECT_EQ(Where(PlaceGang(PipelineSpec(2, 6), {Node(1, "a", 5), Node(2, "b", 2)})),
            "a:0,a:1,a:2,a:3,b:0,b:1");
}

TEST(PlaceGang, APipelineSplitsOnlyTheReplicasNoPlacementOfTheSlotsKeepsWhole) {
  // 3 replicas of 2 stages on two nodes of 3 slots: one replica must straddle them, and only
  // that one (the last) does.
  const GangPlacement placement = PlaceGang(PipelineSpec(2, 6), {Node(1, "a", 3), Node(2, "b", 3)});
  EXPECT_EQ(Where(placement), "a:0,a:1,b:0,b:1,a:2,b:2");
  EXPECT_EQ(placement.ranks[4].local_rank, 2);
  EXPECT_EQ(placement.ranks[5].local_rank, 2);
  // Slots too few in all: nothing is placed, for the same reason as any job.
  const GangPlacement too_big = PlaceGang(PipelineSpec(2, 8), {Node(1, "a", 3), Node(2, "b", 3)});
  EXPECT_FALSE(too_big.placed());
  EXPECT_THAT(too_big.why, HasSubstr("needs 8 slots"));
}

TEST(PlaceGang, RanksPerNodeCapsTheReplicasANodeTakes) {
  EXPECT_EQ(Where(PlaceGang(PipelineSpec(2, 4, 3), {Node(1, "a", 4), Node(2, "b", 4)})),
            "a:0,a:1,b:0,b:1");
  EXPECT_EQ(Where(PlaceGang(PipelineSpec(2, 4, 1),
                            {Node(1, "a", 4), Node(2, "b", 4), Node(3, "c", 4), Node(4, "d", 4)})),
            "a:0,b:0,c:0,d:0");
}

TEST(PlaceGang, AnInterleavedPipelineOnAutoGoesToCpuNodesWhereAutoIsGloo) {
  v1::JobSpec spec = PipelineSpec(2, 2);
  spec.mutable_parallelism()->set_schedule(v1::ParallelismSpec::INTERLEAVED_ONE_F_ONE_B);
  EXPECT_EQ(DeviceKindsFor(spec), std::vector<v1::Node::DeviceKind>{v1::Node::CPU});
  EXPECT_EQ(PlaceGang(spec, {Node(1, "g", 2, v1::Node::CUDA)}).why,
            "backend AUTO with schedule INTERLEAVED_ONE_F_ONE_B runs on CPU nodes; no such node "
            "is registered");
  EXPECT_EQ(Where(PlaceGang(spec, {Node(1, "g", 2, v1::Node::CUDA), Node(2, "c", 2)})), "c:0,c:1");
  EXPECT_EQ(DeviceKindsFor(PipelineSpec(2, 2)).size(), 2u) << "1F1B runs on NCCL too";
}

TEST(PlacementMessage, APipelinesNamesItsStagesAndReplicasAndWhereEachReplicaIs) {
  const GangPlacement placement = PlaceGang(PipelineSpec(2, 6), {Node(1, "a", 3), Node(2, "b", 3)});
  EXPECT_EQ(PlacementMessage(2, placement),
            "attempt 2 placed 2 stages x 3 replicas: replica 0 on nodes/a (ranks 0-1), replica 1 "
            "on nodes/b (ranks 2-3), replica 2 on nodes/a (rank 4) and nodes/b (rank 5)");
  const GangPlacement on_gpus = PlaceGang(PipelineSpec(4, 4), {Node(1, "g", 4, v1::Node::CUDA)});
  EXPECT_EQ(PlacementMessage(1, on_gpus),
            "attempt 1 placed 4 stages x 1 replica: replica 0 on nodes/g (ranks 0-3), CUDA");
}

// --- the queue ---

QueuedJob Queued(const std::string& name, const v1::JobSpec& spec, double waited_seconds,
                 const std::string& shape = "", const std::string& tenant = "tenants/a") {
  QueuedJob job;
  job.name = name;
  job.tenant = tenant;
  job.spec = &spec;
  job.waited = absl::Seconds(waited_seconds);
  job.shape = shape;
  return job;
}

TEST(QueuePass, InsideItsBackfillWindowABlockedJobLetsSmallerOnesAround) {
  const v1::JobSpec big = Spec(4), small = Spec(1);
  QueuePass pass({BusyNode(1, "a", 4, 2)}, absl::Seconds(60));
  EXPECT_FALSE(pass.Next(Queued("jobs/big", big, 10)).placed());
  EXPECT_TRUE(pass.Next(Queued("jobs/small", small, 0)).placed());
}

TEST(QueuePass, PastItsBackfillWindowNothingBehindTheBlockedJobStarts) {
  const v1::JobSpec big = Spec(4), small = Spec(1);
  QueuePass pass({BusyNode(1, "a", 4, 2)}, absl::Seconds(60));
  EXPECT_FALSE(pass.Next(Queued("jobs/big", big, 61)).placed());
  const GangPlacement behind = pass.Next(Queued("jobs/small", small, 0));
  EXPECT_FALSE(behind.placed());
  EXPECT_THAT(behind.why, HasSubstr("waiting behind jobs/big"));
  EXPECT_THAT(behind.why, HasSubstr("backfill window (1m)"));
  EXPECT_EQ(pass.blocked_by(), "jobs/big");
}

TEST(QueuePass, BehindAnotherTenantsJobTheReasonNamesNoJob) {
  const v1::JobSpec big = Spec(4), small = Spec(1);
  QueuePass pass({BusyNode(1, "a", 4, 2)}, absl::Seconds(60));
  EXPECT_FALSE(pass.Next(Queued("jobs/big", big, 61, "", "tenants/a")).placed());
  const GangPlacement behind = pass.Next(Queued("jobs/small", small, 0, "", "tenants/b"));
  EXPECT_FALSE(behind.placed());
  EXPECT_EQ(behind.why,
            "waiting for 1 slots: those that free up are kept for a job ahead that has waited "
            "longer than the backfill window (1m)");
}

TEST(QueuePass, AnInfeasibleJobWaitsAsideAndHoldsNothing) {
  const v1::JobSpec huge = Spec(8), small = Spec(1);
  QueuePass pass({BusyNode(1, "a", 4, 2)}, absl::Seconds(60));
  const GangPlacement aside = pass.Next(Queued("jobs/huge", huge, 3600));
  EXPECT_FALSE(aside.placed());
  EXPECT_EQ(aside.why, "needs 8 slots; the registered nodes that could run it have 4 in all");
  EXPECT_FALSE(pass.blocked_by()) << "no slots are kept for a job that can never use them";
  EXPECT_TRUE(pass.Next(Queued("jobs/small", small, 0, "", "tenants/b")).placed());
}

TEST(QueuePass, AnInfeasibleJobSaysSoEvenBehindAClosedQueue) {
  const v1::JobSpec big = Spec(4), huge = Spec(8);
  QueuePass pass({BusyNode(1, "a", 4, 2)}, absl::Seconds(60));
  EXPECT_FALSE(pass.Next(Queued("jobs/big", big, 61)).placed());
  EXPECT_THAT(pass.Next(Queued("jobs/huge", huge, 0)).why, HasSubstr("have 4 in all"));
}

TEST(QueuePass, AJobThatOnlyANodeNotReadyCouldHoldDoesNotCloseTheQueue) {
  NodeRecord cordoned = Node(2, "b", 4);
  cordoned.state = v1::Node::CORDONED;
  const v1::JobSpec big = Spec(6), small = Spec(1);
  QueuePass pass({BusyNode(1, "a", 4, 2), cordoned}, absl::Seconds(60));
  const GangPlacement waits = pass.Next(Queued("jobs/big", big, 3600));
  EXPECT_FALSE(waits.placed());
  EXPECT_THAT(waits.why, HasSubstr("needs 6 slots, 2 usable on 1 ready nodes"));
  EXPECT_FALSE(pass.blocked_by());
  EXPECT_TRUE(pass.Next(Queued("jobs/small", small, 0)).placed());
}

TEST(QueuePass, ARestartingJobWaitsForItsLastAttemptsRanksToStop) {
  const v1::JobSpec spec = Spec(1);
  QueuePass pass({Node(1, "a", 2)}, absl::Seconds(60));
  QueuedJob job = Queued("jobs/j", spec, 0);
  job.attempt = 2;
  job.stopping = true;
  EXPECT_EQ(pass.Next(job).why, "waiting for the ranks of attempt 2 to stop");
}

TEST(QueuePass, APlacementTakesItsSlotsForTheRestOfThePass) {
  const v1::JobSpec spec = Spec(2);
  QueuePass pass({Node(1, "a", 3)}, absl::Seconds(60));
  EXPECT_EQ(Where(pass.Next(Queued("jobs/1", spec, 0))), "a:0,a:1");
  const GangPlacement second = pass.Next(Queued("jobs/2", spec, 0));
  EXPECT_FALSE(second.placed());
  EXPECT_THAT(second.why, HasSubstr("1 usable on 1 ready nodes"));
}

TEST(QueuePass, AShapeThatDidNotFitIsNotPackedAgainInThePass) {
  const v1::JobSpec fits = Spec(1), unfit = Spec(3);
  QueuePass pass({BusyNode(1, "a", 4, 2)}, absl::Seconds(60));
  EXPECT_FALSE(pass.Next(Queued("jobs/1", unfit, 0, "shape")).placed());
  // The same shape text: the cached reason, even with a spec that would fit (shapes are the
  // placement-relevant part of the spec, so this cannot happen outside a test).
  const GangPlacement cached = pass.Next(Queued("jobs/2", fits, 0, "shape"));
  EXPECT_FALSE(cached.placed());
  EXPECT_TRUE(pass.Next(Queued("jobs/3", fits, 0, "other")).placed());
}

// Tenant roots make a shape's fate the tenant's: one verdict must not stand for another's job.
TEST(QueuePass, AShapeIsJudgedForEachTenantOnItsOwnRoots) {
  v1::JobSpec spec = Spec(1);
  spec.mutable_dataset()->mutable_csv()->set_path("/tenant-b/train.csv");
  NodeRecord node = Node(1, "a", 2);
  node.tenant_data_roots = {{"tenants/b", "/tenant-b"}};
  QueuePass pass({node}, absl::Seconds(60));
  EXPECT_THAT(pass.Next(Queued("jobs/1", spec, 0, "shape", "tenants/a")).why,
              HasSubstr("data roots"));
  EXPECT_TRUE(pass.Next(Queued("jobs/2", spec, 0, "shape", "tenants/b")).placed());
}

TEST(QueuePass, ConfirmDecidesAgainstTheNodesReadUnderTheLockAndMayBlockTheQueue) {
  const v1::JobSpec spec = Spec(2), small = Spec(1);
  QueuePass pass({Node(1, "a", 2)}, absl::Seconds(60));
  ASSERT_TRUE(pass.Next(Queued("jobs/1", spec, 100)).placed());
  // Meanwhile the slots were taken: the confirmation says so, and the job (past its window)
  // now holds the queue.
  EXPECT_FALSE(pass.Confirm(Queued("jobs/1", spec, 100), {BusyNode(1, "a", 2, 1)}).placed());
  EXPECT_THAT(pass.Next(Queued("jobs/2", small, 0)).why, HasSubstr("waiting behind jobs/1"));
}

TEST(QueuePass, ConfirmSetsAnInfeasibleJobAsideWithoutClosingTheQueue) {
  const v1::JobSpec spec = Spec(2), small = Spec(1);
  QueuePass pass({}, absl::Seconds(60));
  EXPECT_EQ(pass.Confirm(Queued("jobs/1", spec, 100), {Node(1, "a", 1)}).why,
            "needs 2 slots; the registered nodes that could run it have 1 in all");
  EXPECT_FALSE(pass.blocked_by());
}

TEST(QueuePosition, PriorityFirstThenSubmissionThenName) {
  EXPECT_TRUE(QueuePosition({5, 2000, "jobs/b"}).Before({0, 1000, "jobs/a"}));
  EXPECT_TRUE(QueuePosition({0, 1000, "jobs/b"}).Before({0, 2000, "jobs/a"}));
  EXPECT_TRUE(QueuePosition({0, 1000, "jobs/a"}).Before({0, 1000, "jobs/b"}));
  EXPECT_FALSE(QueuePosition({0, 1000, "jobs/a"}).Before({0, 1000, "jobs/a"}));
}

// --- fair share ---

// The names of the jobs in the order served, calling Placed after each in `placed`.
std::string Served(FairShareOrder order, const std::vector<FairShareEntry>& jobs,
                   const std::set<std::string>& placed) {
  std::string out;
  while (const std::optional<size_t> i = order.Next()) {
    if (!out.empty()) out += ",";
    out += jobs[*i].position.name;
    if (placed.count(jobs[*i].position.name)) order.Placed();
  }
  return out;
}

FairShareEntry Waiting(const std::string& name, const std::string& tenant, int64_t submitted,
                       int32_t priority = 0, int32_t slots = 1) {
  return {{priority, submitted, name}, tenant, slots};
}

TEST(FairShareOrder, ATenantFloodingTheQueueTakesTurnsWithTheOthers) {
  const std::vector<FairShareEntry> jobs = {Waiting("a1", "A", 1), Waiting("a2", "A", 2),
                                            Waiting("a3", "A", 3), Waiting("a4", "A", 4),
                                            Waiting("b1", "B", 5), Waiting("b2", "B", 6)};
  const std::set<std::string> all = {"a1", "a2", "a3", "a4", "b1", "b2"};
  EXPECT_EQ(Served(FairShareOrder(jobs, {}), jobs, all), "a1,b1,a2,b2,a3,a4");
  // What was not placed holds nothing: then submission order decides.
  EXPECT_EQ(Served(FairShareOrder(jobs, {}), jobs, {}), "a1,a2,a3,a4,b1,b2");
}

TEST(FairShareOrder, TheTenantHoldingFewerSlotsGoesFirst) {
  const std::vector<FairShareEntry> jobs = {Waiting("a1", "A", 1), Waiting("b1", "B", 2)};
  EXPECT_EQ(Served(FairShareOrder(jobs, {{"A", 4}}), jobs, {}), "b1,a1");
  EXPECT_EQ(Served(FairShareOrder(jobs, {{"A", 4}, {"B", 8}}), jobs, {}), "a1,b1");
}

TEST(FairShareOrder, ABigPlacementCountsItsSlots) {
  const std::vector<FairShareEntry> jobs = {Waiting("a1", "A", 1, 0, 8), Waiting("a2", "A", 2),
                                            Waiting("b1", "B", 3), Waiting("b2", "B", 4),
                                            Waiting("b3", "B", 5)};
  EXPECT_EQ(Served(FairShareOrder(jobs, {}), jobs, {"a1", "a2", "b1", "b2", "b3"}),
            "a1,b1,b2,b3,a2");
}

TEST(FairShareOrder, PriorityComesBeforeFairShare) {
  const std::vector<FairShareEntry> jobs = {Waiting("a1", "A", 1, 0), Waiting("a2", "A", 2, 5),
                                            Waiting("b1", "B", 3, 0), Waiting("b2", "B", 4, 5)};
  EXPECT_EQ(Served(FairShareOrder(jobs, {{"A", 10}}), jobs, {"a1", "a2", "b1", "b2"}),
            "b2,a2,b1,a1");
}

TEST(FairShareOrder, EachTenantsJobsInTheirOwnQueueOrder) {
  const std::vector<FairShareEntry> jobs = {Waiting("a3", "A", 3), Waiting("a1", "A", 1),
                                            Waiting("a2", "A", 2)};
  EXPECT_EQ(Served(FairShareOrder(jobs, {}), jobs, {"a1", "a2", "a3"}), "a1,a2,a3");
  EXPECT_EQ(Served(FairShareOrder({}, {}), {}, {}), "");
}

TEST(FastPathMayPlace, OnlyWhileTheLastPassVerdictsHoldAndNoJobClosedTheQueueAtItsPriority) {
  const QueuePosition blocking{0, 1000, "jobs/b"};
  EXPECT_TRUE(FastPathMayPlace({0, 2000, "jobs/new"}, std::nullopt, false));
  EXPECT_FALSE(FastPathMayPlace({0, 2000, "jobs/new"}, std::nullopt, true))
      << "capacity freed: a job ahead may fit now";
  EXPECT_FALSE(FastPathMayPlace({0, 2000, "jobs/new"}, blocking, false)) << "behind the blocker";
  EXPECT_FALSE(FastPathMayPlace({0, 500, "jobs/old"}, blocking, false))
      << "of equal priority, fair share decides who comes first: the next pass";
  EXPECT_TRUE(FastPathMayPlace({5, 2000, "jobs/urgent"}, blocking, false)) << "higher priority";
}

TEST(QueuePass, AQueueClosedByAnEarlierPassGivesTheReasonThatPassGave) {
  const v1::JobSpec big = Spec(4), small = Spec(1);
  const std::vector<NodeRecord> full = {BusyNode(1, "a", 4, 4)};
  QueuePass earlier(full, absl::Seconds(60));
  EXPECT_FALSE(earlier.Next(Queued("jobs/big", big, 61)).placed());
  ASSERT_EQ(earlier.blocked_by(), "jobs/big");
  EXPECT_EQ(earlier.blocked_tenant(), "tenants/a");
  QueuePass light(full, absl::Seconds(60));
  light.CloseBehind(*earlier.blocked_by(), earlier.blocked_tenant());
  for (const std::string tenant : {"tenants/a", "tenants/b"}) {
    EXPECT_EQ(light.Next(Queued("jobs/new", small, 0, "", tenant)).why,
              earlier.Next(Queued("jobs/new", small, 0, "", tenant)).why)
        << tenant;
  }
}

TEST(QueuePass, ASubmittedJobIsJudgedAsNextWouldButClosesTheQueueForNobody) {
  const v1::JobSpec big = Spec(4);
  const std::vector<NodeRecord> full = {BusyNode(1, "a", 4, 4)};
  QueuePass pass(full, absl::ZeroDuration());  // every job that does not fit is past its window
  const GangPlacement submitted = pass.JudgeSubmitted(Queued("", big, 0));
  EXPECT_FALSE(submitted.placed());
  EXPECT_FALSE(pass.blocked_by()) << "it has waited for nothing, and has no name yet";
  EXPECT_EQ(submitted.why, pass.Next(Queued("jobs/big", big, 0)).why);
  EXPECT_EQ(pass.blocked_by(), "jobs/big") << "Next, for a queued job, does close it";
}

// One test per rule of QueueNeedsFullPass, each from the watch of rule 5 (QuietQueue).
QueueWatch QuietQueue() {
  return {.full_pass_in_term = true,
          .changed = false,
          .some_node_free = false,
          .since_full_pass = absl::Seconds(1)};
}

TEST(QueueNeedsFullPass, Rule5AFullClusterWithNothingChangedGetsTheLightPass) {
  EXPECT_FALSE(QueueNeedsFullPass(QuietQueue(), absl::Seconds(30)));
}

TEST(QueueNeedsFullPass, Rule1TheFirstPassOfATermGoesOverTheQueue) {
  QueueWatch watch = QuietQueue();
  watch.full_pass_in_term = false;
  EXPECT_TRUE(QueueNeedsFullPass(watch, absl::Seconds(30)));
}

TEST(QueueNeedsFullPass, Rule2AChangeSinceTheLastFullPassGoesOverTheQueue) {
  QueueWatch watch = QuietQueue();
  watch.changed = true;
  EXPECT_TRUE(QueueNeedsFullPass(watch, absl::Seconds(30)));
}

TEST(QueueNeedsFullPass, Rule3ANodeThatTakesARankGoesOverTheQueue) {
  QueueWatch watch = QuietQueue();
  watch.some_node_free = true;
  EXPECT_TRUE(QueueNeedsFullPass(watch, absl::Seconds(30)));
}

TEST(QueueNeedsFullPass, Rule4TheQueueIsGoneOverAgainAfterTheRefresh) {
  QueueWatch watch = QuietQueue();
  watch.since_full_pass = absl::Seconds(29);
  EXPECT_FALSE(QueueNeedsFullPass(watch, absl::Seconds(30)));
  watch.since_full_pass = absl::Seconds(30);
  EXPECT_TRUE(QueueNeedsFullPass(watch, absl::Seconds(30)));
}

TEST(AnyNodeTakesARank, OnlyAReadyHeartbeatingNodeWithAFreeSlot) {
  EXPECT_FALSE(AnyNodeTakesARank({})) << "no node";
  EXPECT_FALSE(AnyNodeTakesARank({BusyNode(1, "full", 4, 4)})) << "every slot held";
  NodeRecord silent = Node(2, "silent", 4);
  silent.heartbeating = false;
  NodeRecord cordoned = Node(3, "cordoned", 4);
  cordoned.state = v1::Node::CORDONED;
  EXPECT_FALSE(AnyNodeTakesARank({silent, cordoned}));
  EXPECT_TRUE(AnyNodeTakesARank({BusyNode(1, "full", 4, 4), BusyNode(4, "room", 4, 3)}));
  // Agrees with PlaceGang on the smallest gang.
  EXPECT_TRUE(PlaceGang(Spec(1), {silent, cordoned, BusyNode(1, "full", 4, 4)}, "").ranks.empty());
}

// --- attempts in flight ---

RankReport Rank(int32_t rank, const std::string& state, double seconds_in_state = 0,
                int32_t exit_code = 0, int32_t signal = 0) {
  RankReport report;
  report.rank = rank;
  report.state = state;
  report.node = "n" + std::to_string(rank);
  report.exit_code = exit_code;
  report.signal = signal;
  report.seconds_in_state = seconds_in_state;
  return report;
}

AttemptSnapshot Attempt(std::vector<RankReport> ranks,
                        v1::Job::State job_state = v1::Job::RUNNING) {
  AttemptSnapshot attempt;
  attempt.job_state = job_state;
  attempt.hang_timeout_seconds = 600;
  attempt.ranks = std::move(ranks);
  return attempt;
}

constexpr absl::Duration kGrace = absl::Seconds(3);
constexpr int kPeerLost = trainer::kExitInfrastructure;

TEST(JudgeAttempt, ACrashedRankIsBlamedAtOnce) {
  const AttemptVerdict verdict =
      JudgeAttempt(Attempt({Rank(0, "RUNNING"), Rank(1, "FAILED", 0, 0, 9)}), kGrace);
  ASSERT_TRUE(verdict.failure);
  EXPECT_EQ(verdict.failure->rank, 1);
  EXPECT_EQ(verdict.failure->kind, v1::JobEvent::JOB);
  EXPECT_EQ(verdict.failure->node, "nodes/n1");
  EXPECT_EQ(verdict.failure->message, "rank 1 was killed by signal 9");
}

TEST(JudgeAttempt, WithinThePeerFailureGraceARankThatLostItsPeersIsNotBlamedYet) {
  const AttemptVerdict verdict =
      JudgeAttempt(Attempt({Rank(0, "FAILED", 1, kPeerLost), Rank(1, "RUNNING")}), kGrace);
  EXPECT_FALSE(verdict.failure);
}

TEST(JudgeAttempt, AfterThePeerFailureGraceTheInfrastructureIsBlamed) {
  const AttemptVerdict verdict =
      JudgeAttempt(Attempt({Rank(0, "FAILED", 3, kPeerLost), Rank(1, "RUNNING")}), kGrace);
  ASSERT_TRUE(verdict.failure);
  EXPECT_EQ(verdict.failure->rank, 0);
  EXPECT_EQ(verdict.failure->kind, v1::JobEvent::INFRASTRUCTURE);
}

TEST(JudgeAttempt, APeerLossIsBlamedAtOnceWhenNoRankRunsAnyMore) {
  const AttemptVerdict verdict = JudgeAttempt(
      Attempt({Rank(0, "FAILED", 0, kPeerLost), Rank(1, "FAILED", 0, kPeerLost)}), kGrace);
  ASSERT_TRUE(verdict.failure);
  EXPECT_EQ(verdict.failure->kind, v1::JobEvent::INFRASTRUCTURE);
}

TEST(JudgeAttempt, TheRankThatReallyDiedWinsOverOnesThatLostTheirPeers) {
  // Rank 1's peers noticed first; rank 0's crash was reported a heartbeat later.
  const AttemptVerdict verdict =
      JudgeAttempt(Attempt({Rank(1, "FAILED", 2, kPeerLost), Rank(0, "FAILED", 0, 0, 11)}), kGrace);
  ASSERT_TRUE(verdict.failure);
  EXPECT_EQ(verdict.failure->rank, 0);
  EXPECT_EQ(verdict.failure->kind, v1::JobEvent::JOB);
}

TEST(JudgeAttempt, ARankItsAgentStoppedSaysMoreThanOneThatLostItsPeers) {
  RankReport stopped = Rank(1, "STOPPED", 5);
  stopped.message = "no successful heartbeat for 61 s";
  const AttemptVerdict verdict =
      JudgeAttempt(Attempt({Rank(0, "FAILED", 5, kPeerLost), stopped}), kGrace);
  ASSERT_TRUE(verdict.failure);
  EXPECT_EQ(verdict.failure->rank, 1);
  EXPECT_EQ(verdict.failure->message,
            "rank 1 was stopped by its agent: no successful heartbeat for 61 s");
}

TEST(JudgeAttempt, AUserErrorIsTheUsersFailure) {
  const AttemptVerdict verdict =
      JudgeAttempt(Attempt({Rank(0, "FAILED", 0, trainer::kExitUserError)}), kGrace);
  ASSERT_TRUE(verdict.failure);
  EXPECT_EQ(verdict.failure->kind, v1::JobEvent::USER);
}

TEST(JudgeAttempt, EveryRankStartedMakesAScheduledJobRunning) {
  EXPECT_FALSE(
      JudgeAttempt(Attempt({Rank(0, "STARTING"), Rank(1, "ASSIGNED")}, v1::Job::SCHEDULED), kGrace)
          .now_running);
  const AttemptVerdict verdict =
      JudgeAttempt(Attempt({Rank(0, "STARTING"), Rank(1, "RUNNING")}, v1::Job::SCHEDULED), kGrace);
  EXPECT_TRUE(verdict.now_running);
  EXPECT_EQ(verdict.started_reason, "all 2 ranks started");
  EXPECT_FALSE(verdict.succeeded);
}

TEST(JudgeAttempt, EveryRankExitedZeroMakesItSucceeded) {
  EXPECT_FALSE(JudgeAttempt(Attempt({Rank(0, "SUCCEEDED"), Rank(1, "RUNNING")}), kGrace).succeeded);
  const AttemptVerdict verdict =
      JudgeAttempt(Attempt({Rank(0, "SUCCEEDED"), Rank(1, "SUCCEEDED")}), kGrace);
  EXPECT_TRUE(verdict.succeeded);
  EXPECT_EQ(verdict.succeeded_reason, "all 2 ranks exited 0");
  // Ranks so quick that the job never was seen RUNNING: both at once.
  const AttemptVerdict quick =
      JudgeAttempt(Attempt({Rank(0, "SUCCEEDED")}, v1::Job::SCHEDULED), kGrace);
  EXPECT_TRUE(quick.now_running);
  EXPECT_TRUE(quick.succeeded);
}

// The scheduler writes nothing for an attempt whose verdict changes nothing (its look without
// locks, scheduler.h): every verdict that moves the job must say it changes something.
TEST(JudgeAttempt, OnlyAVerdictThatMovesTheJobChangesSomething) {
  EXPECT_FALSE(
      JudgeAttempt(Attempt({Rank(0, "RUNNING"), Rank(1, "RUNNING")}), kGrace).ChangesSomething());
  EXPECT_FALSE(JudgeAttempt(Attempt({Rank(0, "FAILED", 1, kPeerLost), Rank(1, "RUNNING")}), kGrace)
                   .ChangesSomething())
      << "within the peer failure grace";
  EXPECT_TRUE(
      JudgeAttempt(Attempt({Rank(0, "RUNNING")}, v1::Job::SCHEDULED), kGrace).ChangesSomething());
  EXPECT_TRUE(JudgeAttempt(Attempt({Rank(0, "SUCCEEDED")}), kGrace).ChangesSomething());
  EXPECT_TRUE(JudgeAttempt(Attempt({Rank(0, "FAILED", 0, 0, 9)}), kGrace).ChangesSomething());
}

TEST(JudgeAttempt, TheHangWatchdogFailsAnAttemptWithoutAStepForTheTimeout) {
  AttemptSnapshot attempt = Attempt({Rank(0, "RUNNING"), Rank(1, "RUNNING")});
  attempt.hang_timeout_seconds = 30;
  attempt.seconds_since_start = 500;
  attempt.seconds_since_step = 29;
  EXPECT_FALSE(JudgeAttempt(attempt, kGrace).failure);
  attempt.seconds_since_step = 31;
  const AttemptVerdict verdict = JudgeAttempt(attempt, kGrace);
  ASSERT_TRUE(verdict.failure);
  EXPECT_EQ(verdict.failure->event, v1::JobEvent::HANG_DETECTED);
  EXPECT_EQ(verdict.failure->kind, v1::JobEvent::JOB);
  EXPECT_EQ(verdict.failure->message, "no training step for 31 s (hang_timeout_seconds 30)");
}

// Issue 34: steps the api could not record (its database out of reach, or no api running) are
// not a hang; the watchdog counts only what it could have heard, and says how long it was.
TEST(JudgeAttempt, TheHangWatchdogCountsNoSilenceFromBeforeReportsCouldBeRecorded) {
  AttemptSnapshot attempt = Attempt({Rank(0, "RUNNING"), Rank(1, "RUNNING")});
  attempt.hang_timeout_seconds = 30;
  attempt.seconds_since_start = 500;
  attempt.seconds_since_step = 45;
  attempt.seconds_since_recordable = 10;  // the database came back 10 s ago
  EXPECT_FALSE(JudgeAttempt(attempt, kGrace).failure);
  attempt.seconds_since_recordable = 31;
  const AttemptVerdict verdict = JudgeAttempt(attempt, kGrace);
  ASSERT_TRUE(verdict.failure);
  EXPECT_EQ(verdict.failure->message, "no training step for 45 s (hang_timeout_seconds 30)");
}

TEST(JudgeAttempt, TheHangWatchdogCountsFromTheStartBeforeAnyStep) {
  AttemptSnapshot attempt = Attempt({Rank(0, "STARTING")}, v1::Job::SCHEDULED);
  attempt.ranks.push_back(Rank(1, "ASSIGNED"));
  attempt.hang_timeout_seconds = 30;
  attempt.seconds_since_start = 29;
  EXPECT_FALSE(JudgeAttempt(attempt, kGrace).failure);
  attempt.seconds_since_start = 31;
  EXPECT_TRUE(JudgeAttempt(attempt, kGrace).failure);
}

// --- script jobs ---

AttemptSnapshot ScriptAttempt(std::vector<RankReport> ranks) {
  AttemptSnapshot attempt = Attempt(std::move(ranks));
  attempt.script = true;
  return attempt;
}

TEST(JudgeAttempt, AScriptsNonZeroExitIsTheUsersOnceNoPeerDeathExplainsIt) {
  AttemptSnapshot attempt = ScriptAttempt({Rank(1, "FAILED", 1, 3), Rank(0, "RUNNING")});
  EXPECT_FALSE(JudgeAttempt(attempt, kGrace).failure);  // maybe rank 0's node is being lost
  attempt.ranks[0].seconds_in_state = 4;
  const AttemptVerdict verdict = JudgeAttempt(attempt, kGrace);
  ASSERT_TRUE(verdict.failure);
  EXPECT_EQ(verdict.failure->kind, v1::JobEvent::USER);
  EXPECT_EQ(verdict.failure->rank, 1);
  EXPECT_EQ(verdict.failure->exit_code, 3);
}

TEST(JudgeAttempt, AScriptsNonZeroExitIsBlamedAtOnceWhenNoRankRunsAnyMore) {
  const AttemptSnapshot attempt = ScriptAttempt({Rank(0, "FAILED", 0, 3), Rank(1, "FAILED", 0, 3)});
  const AttemptVerdict verdict = JudgeAttempt(attempt, kGrace);
  ASSERT_TRUE(verdict.failure);
  EXPECT_EQ(verdict.failure->kind, v1::JobEvent::USER);
  EXPECT_EQ(verdict.failure->rank, 0);
}

TEST(JudgeAttempt, AScriptRankKilledBySignalIsTheJobsFailureAndExplainsItsPeersExits) {
  // Rank 1 exited 1 when its peer vanished; rank 0 was killed (SIGKILL, not by its agent).
  const AttemptSnapshot attempt =
      ScriptAttempt({Rank(1, "FAILED", 0, 1), Rank(0, "FAILED", 0, 0, 9)});
  const AttemptVerdict verdict = JudgeAttempt(attempt, kGrace);
  ASSERT_TRUE(verdict.failure);
  EXPECT_EQ(verdict.failure->kind, v1::JobEvent::JOB);
  EXPECT_EQ(verdict.failure->rank, 0);
}

TEST(JudgeAttempt, AScriptOverItsMemoryLimitIsTheUsersFailureAtOnce) {
  const AttemptSnapshot attempt =
      ScriptAttempt({Rank(0, "FAILED", 0, trainer::kExitOutOfMemory, 9), Rank(1, "RUNNING")});
  const AttemptVerdict verdict = JudgeAttempt(attempt, kGrace);
  ASSERT_TRUE(verdict.failure);
  EXPECT_EQ(verdict.failure->kind, v1::JobEvent::USER);
}

TEST(JudgeAttempt, AScriptExitingWithTheTrainersCodesIsStillTheUsers) {
  // Exit 12 means "lost peers" only for gradhub-trainer; a script's codes are its own.
  const AttemptSnapshot attempt = ScriptAttempt({Rank(0, "FAILED", 5, kPeerLost)});
  const AttemptVerdict verdict = JudgeAttempt(attempt, kGrace);
  ASSERT_TRUE(verdict.failure);
  EXPECT_EQ(verdict.failure->kind, v1::JobEvent::USER);
}

TEST(JudgeAttempt, TheHangWatchdogWatchesAScriptOnlyOnceItHasReportedAStep) {
  AttemptSnapshot attempt = ScriptAttempt({Rank(0, "STARTING"), Rank(1, "STARTING")});
  attempt.hang_timeout_seconds = 30;
  attempt.seconds_since_start = 5000;
  EXPECT_FALSE(JudgeAttempt(attempt, kGrace).failure);
  attempt.seconds_since_step = 31;
  const AttemptVerdict verdict = JudgeAttempt(attempt, kGrace);
  ASSERT_TRUE(verdict.failure);
  EXPECT_EQ(verdict.failure->event, v1::JobEvent::HANG_DETECTED);
}

// --- restart budgets ---

v1::Job JobWithBudgets(int32_t infra_used, int32_t infra, int32_t job_used, int32_t job) {
  v1::Job out;
  out.set_infrastructure_restarts(infra_used);
  out.set_job_restarts(job_used);
  out.mutable_spec()->mutable_max_restarts()->set_infrastructure(infra);
  out.mutable_spec()->mutable_max_restarts()->set_job(job);
  return out;
}

TEST(DecideRestart, AnInfrastructureFailureSpendsItsOwnBudgetUntilItRunsOut) {
  const RestartDecision first =
      DecideRestart(JobWithBudgets(0, 2, 5, 5), v1::JobEvent::INFRASTRUCTURE, "lost");
  EXPECT_TRUE(first.restart);
  EXPECT_STREQ(first.counter, "infra_restarts");
  EXPECT_EQ(first.reason, "lost; restart 1 of 2");
  const RestartDecision out =
      DecideRestart(JobWithBudgets(2, 2, 0, 5), v1::JobEvent::INFRASTRUCTURE, "lost");
  EXPECT_FALSE(out.restart);
  EXPECT_EQ(out.counter, nullptr);
  EXPECT_EQ(out.reason, "lost (2 of 2 INFRASTRUCTURE restarts used)");
}

TEST(DecideRestart, AJobFailureSpendsItsOwnBudgetUntilItRunsOut) {
  const RestartDecision first =
      DecideRestart(JobWithBudgets(2, 2, 0, 1), v1::JobEvent::JOB, "crash");
  EXPECT_TRUE(first.restart);
  EXPECT_STREQ(first.counter, "job_restarts");
  const RestartDecision out = DecideRestart(JobWithBudgets(0, 2, 1, 1), v1::JobEvent::JOB, "crash");
  EXPECT_FALSE(out.restart);
  EXPECT_EQ(out.reason, "crash (1 of 1 JOB restarts used)");
}

TEST(DecideRestart, AUserFailureFailsTheJobAtOnce) {
  const RestartDecision decision =
      DecideRestart(JobWithBudgets(0, 9, 0, 9), v1::JobEvent::USER, "bad spec");
  EXPECT_FALSE(decision.restart);
  EXPECT_EQ(decision.reason, "bad spec");
}

// --- nodes ---

TEST(PlanDrains, EachAttemptOnADrainingNodeRestartsOnceNamingItsLowestRank) {
  const DrainPlan plan =
      PlanDrains({{1, "a", "j1", 3, 0}, {1, "a", "j1", 3, 1}, {1, "a", "j2", 1, 4}});
  ASSERT_EQ(plan.restarts.size(), 2u);
  EXPECT_EQ(plan.restarts[0].job_id, "j1");
  EXPECT_EQ(plan.restarts[0].attempt, 3);
  EXPECT_EQ(plan.restarts[0].failure.rank, 0);
  EXPECT_EQ(plan.restarts[0].failure.event, v1::JobEvent::NODE_LOST);
  EXPECT_EQ(plan.restarts[0].failure.kind, v1::JobEvent::INFRASTRUCTURE);
  EXPECT_EQ(plan.restarts[0].failure.message, "nodes/a is being drained");
  EXPECT_EQ(plan.restarts[1].job_id, "j2");
  EXPECT_TRUE(plan.cordon.empty()) << "a node with live ranks stays DRAINING";
}

TEST(PlanDrains, ADrainingNodeWithNoLiveRankLeftIsCordoned) {
  const DrainPlan plan = PlanDrains({{1, "a"}, {2, "b", "j", 1, 0}});
  EXPECT_EQ(plan.cordon, std::vector<int64_t>{1});
  EXPECT_EQ(plan.restarts.size(), 1u);
}

TEST(NodeLease, TheSweepWaitsForTheStartupGrace) {
  const absl::Time start = absl::FromUnixSeconds(1000);
  const absl::Time since = HeartbeatsRecordableSince(start, absl::InfinitePast());
  EXPECT_EQ(since, start) << "a database never out of reach changes nothing";
  EXPECT_FALSE(MayDeclareNodesLost(start + absl::Seconds(1), since, absl::Seconds(6)));
  EXPECT_TRUE(MayDeclareNodesLost(start + absl::Seconds(6), since, absl::Seconds(6)));
  EXPECT_EQ(NodeLostReason("a", 7.6, absl::Seconds(3)),
            "nodes/a lost: no heartbeat for 7 s (lease 3s)");
}

// Issue 34: heartbeats that could not be recorded while the database was out of reach are not
// the nodes' silence. Long after the api started, the grace counts again from the outage's end.
TEST(NodeLease, TheSweepWaitsForTheGraceAgainAfterADatabaseOutage) {
  const absl::Time start = absl::FromUnixSeconds(1000);
  const absl::Time outage_end = start + absl::Minutes(10);
  const absl::Time since = HeartbeatsRecordableSince(start, outage_end);
  EXPECT_EQ(since, outage_end);
  EXPECT_TRUE(MayDeclareNodesLost(outage_end - absl::Seconds(1), start, absl::Seconds(6)))
      << "before the outage, the api had been up long enough";
  EXPECT_FALSE(MayDeclareNodesLost(outage_end + absl::Seconds(5), since, absl::Seconds(6)));
  EXPECT_TRUE(MayDeclareNodesLost(outage_end + absl::Seconds(6), since, absl::Seconds(6)));
  // A failure the pool met before the scheduler started counts for nothing more.
  EXPECT_EQ(HeartbeatsRecordableSince(start, start - absl::Seconds(30)), start);
}

// SilentNodeIsLost, rule 1.
TEST(NodeLease, ANodeSilentForTheOutageGraceIsLostWhateverItsPeers) {
  EXPECT_TRUE(SilentNodeIsLost(absl::Seconds(60), absl::Seconds(60), true));
  EXPECT_TRUE(SilentNodeIsLost(absl::Seconds(61), absl::Seconds(60), false));
}

// Rule 2: a partition from the api alone does not end a job that still trains.
TEST(NodeLease, ANodeWhosePeersStillRunIsGivenTheOutageGrace) {
  EXPECT_FALSE(SilentNodeIsLost(absl::Seconds(4), absl::Seconds(60), true));
  EXPECT_FALSE(SilentNodeIsLost(absl::Seconds(59), absl::Seconds(60), true));
}

// Rule 3.
TEST(NodeLease, ANodeNobodyVouchesForIsLostAtTheLease) {
  EXPECT_TRUE(SilentNodeIsLost(absl::Seconds(4), absl::Seconds(60), false));
}

TEST(RankFailureMessage, KeepsTheCauseApartFromTheLastLogLine) {
  EXPECT_EQ(RankFailureMessage(1, false, 0, 9, "resumed from step 600"),
            "rank 1 was killed by signal 9 (last log line: resumed from step 600)");
  EXPECT_EQ(RankFailureMessage(1, false, 0, 9, "killed by signal 9"),
            "rank 1 was killed by signal 9");
  EXPECT_EQ(RankFailureMessage(0, false, 3, 0, "nan loss"),
            "rank 0 exited with code 3 (last log line: nan loss)");
  EXPECT_EQ(RankFailureMessage(2, true, 0, 0, "stopped by the agent: no successful heartbeat"),
            "rank 2 was stopped by its agent: no successful heartbeat");
  EXPECT_EQ(RankFailureMessage(2, true, 0, 0, ""), "rank 2 was stopped by its agent");
}

// --- the heartbeat's desired set ---

LiveRank Live(const std::string& rank_state, const std::string& job_state = "RUNNING",
              bool running_on_agent = true) {
  return {rank_state, job_state, job_state == "SCHEDULED" ? "SCHEDULED" : "RUNNING", true,
          running_on_agent};
}

TEST(FateOfLiveRank, ARankOfTheCurrentAttemptOfAJobInFlightIsDesired) {
  EXPECT_EQ(FateOfLiveRank(Live("ASSIGNED", "SCHEDULED", false), true), RankFate::kDesired);
  EXPECT_EQ(FateOfLiveRank(Live("RUNNING"), true), RankFate::kDesired);
}

TEST(FateOfLiveRank, AnUndesiredRankStillRunningIsStoppedAndOneGoneIsFreed) {
  EXPECT_EQ(FateOfLiveRank(Live("RUNNING", "CANCELLING"), true), RankFate::kStopping);
  EXPECT_EQ(FateOfLiveRank(Live("STOPPING"), true), RankFate::kStopping);
  EXPECT_EQ(FateOfLiveRank(Live("ASSIGNED", "CANCELLING", false), true), RankFate::kStopped);
  LiveRank old_attempt = Live("RUNNING");
  old_attempt.current_attempt = false;
  EXPECT_EQ(FateOfLiveRank(old_attempt, true), RankFate::kStopping);
  LiveRank failed_attempt = Live("RUNNING", "RESTARTING");
  failed_attempt.attempt_state = "FAILED";
  EXPECT_EQ(FateOfLiveRank(failed_attempt, true), RankFate::kStopping);
}

// Heartbeat step 4a: which failures discard the attempt's ranks (SIGKILL at once).
TEST(FailureDiscardsRanks, ARankThatFailedOrAHangDiscardsTheSurvivors) {
  AttemptFailure failure;
  failure.event = v1::JobEvent::RANK_FAILED;
  failure.kind = v1::JobEvent::JOB;  // killed by a signal
  EXPECT_TRUE(FailureDiscardsRanks(failure));
  failure.kind = v1::JobEvent::INFRASTRUCTURE;  // lost its peers
  EXPECT_TRUE(FailureDiscardsRanks(failure));
  failure.kind = v1::JobEvent::USER;
  EXPECT_TRUE(FailureDiscardsRanks(failure));
  failure.event = v1::JobEvent::HANG_DETECTED;
  failure.kind = v1::JobEvent::JOB;
  EXPECT_TRUE(FailureDiscardsRanks(failure));
}

TEST(FailureDiscardsRanks, ADrainedOrLostNodeKeepsTheGrace) {
  DrainPlan plan = PlanDrains({{1, "a", std::string("job"), 2, 0}});
  ASSERT_EQ(plan.restarts.size(), 1u);
  EXPECT_FALSE(FailureDiscardsRanks(plan.restarts[0].failure));  // rank 0 saves on SIGTERM
  AttemptFailure lost;
  lost.event = v1::JobEvent::NODE_LOST;
  lost.kind = v1::JobEvent::INFRASTRUCTURE;
  EXPECT_FALSE(FailureDiscardsRanks(lost));
}

TEST(StopsAtOnce, OnlyTheRanksOfAFailedAttemptThatDiscardsThem) {
  LiveRank failed = Live("STOPPING", "RESTARTING");
  failed.attempt_state = "FAILED";
  EXPECT_FALSE(StopsAtOnce(failed)) << "a drained attempt: SIGTERM and the grace";
  failed.attempt_discarded = true;
  EXPECT_TRUE(StopsAtOnce(failed));
  failed.job_state = "FAILED";  // the budget is spent: the same
  EXPECT_TRUE(StopsAtOnce(failed));
  failed.job_state = "CANCELLING";  // cancelled while its ranks stop: still discarded
  EXPECT_TRUE(StopsAtOnce(failed));
}

TEST(StopsAtOnce, ACancelledJobsRanksKeepTheGrace) {
  EXPECT_FALSE(StopsAtOnce(Live("RUNNING", "CANCELLING")));
  LiveRank cancelled = Live("STOPPING", "CANCELLED");
  cancelled.attempt_state = "CANCELLED";
  EXPECT_FALSE(StopsAtOnce(cancelled));
}

TEST(StopsAtOnce, NeverADesiredRank) {
  LiveRank running = Live("RUNNING");
  running.attempt_discarded = true;  // cannot be set on an attempt in flight; even so
  ASSERT_EQ(FateOfLiveRank(running, true), RankFate::kDesired);
  EXPECT_FALSE(StopsAtOnce(running));
}

TEST(FateOfLiveRank, AStaleReportRetiresNothing) {
  EXPECT_EQ(FateOfLiveRank(Live("RUNNING", "CANCELLING", false), false), RankFate::kUnchanged);
  EXPECT_EQ(FateOfLiveRank(Live("RUNNING"), false), RankFate::kDesired);
}

}  // namespace
}  // namespace gradhub::api
