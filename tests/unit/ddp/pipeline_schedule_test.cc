// The pipeline schedules' rules, one test each, and a discrete-event simulation of all stages
// of a pipeline together: blocking receives, asynchronous sends. No torch, no communication.
#include "gpu_worker/ddp/pipeline/schedule.h"

#include "gpu_worker/ddp/pipeline/layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace gradhub::ddp::pipeline {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using Kind = StageAction::Kind;

constexpr StageAction F(int mb, int chunk = 0) { return {Kind::kForward, mb, chunk}; }
constexpr StageAction B(int mb, int chunk = 0) { return {Kind::kBackward, mb, chunk}; }

struct Shape {
  PipelineSchedule schedule;
  int stages, micro_batches, chunks;
};

// Every shape the simulation covers: S in 1..8, M in 1..16, each schedule where it applies
// (interleaved with 2 and 3 chunks where M is a multiple of S).
std::vector<Shape> AllShapes() {
  std::vector<Shape> shapes;
  for (int s = 1; s <= 8; ++s) {
    for (int m = 1; m <= 16; ++m) {
      shapes.push_back({PipelineSchedule::kGPipe, s, m, 1});
      shapes.push_back({PipelineSchedule::kOneFOneB, s, m, 1});
      shapes.push_back({PipelineSchedule::kOneFOneBDeepWarmup, s, m, 1});
      for (int v : {2, 3}) {
        if (s >= 2 && m % s == 0)
          shapes.push_back({PipelineSchedule::kInterleavedOneFOneB, s, m, v});
      }
    }
  }
  return shapes;
}

std::string Describe(const Shape& shape) {
  return std::string(PipelineScheduleName(shape.schedule)) + " S=" + std::to_string(shape.stages) +
         " M=" + std::to_string(shape.micro_batches) + " v=" + std::to_string(shape.chunks);
}

// When each action of each stage finished, in a simulation where a forward takes
// `forward_time` and a backward `backward_time` (per chunk), a message arrives `latency` after
// it was sent, sends never block and a receive blocks until its message arrived. Empty if the
// stages deadlock.
struct Simulation {
  using Key = std::tuple<Kind, int, int>;  // kind, micro-batch, virtual stage
  std::map<Key, double> start, finish;
  std::vector<double> busy, end;  // per stage
  double makespan = 0;
  bool deadlocked = false;
};

// What action `action` of stage `stage` waits for: the previous virtual stage's forward, or
// the next virtual stage's backward (and its own forward, which runs on the same stage).
std::optional<Simulation::Key> Dependency(const Shape& shape, int stage,
                                          const StageAction& action) {
  const int virtual_stage = VirtualStage(shape.stages, stage, action.chunk);
  if (action.kind == Kind::kForward) {
    if (virtual_stage == 0) return std::nullopt;
    return Simulation::Key{Kind::kForward, action.micro_batch, virtual_stage - 1};
  }
  if (virtual_stage == shape.stages * shape.chunks - 1) {
    return Simulation::Key{Kind::kForward, action.micro_batch, virtual_stage};
  }
  return Simulation::Key{Kind::kBackward, action.micro_batch, virtual_stage + 1};
}

using StageLists = std::vector<std::vector<StageAction>>;

Simulation Simulate(const Shape& shape, const StageLists& lists, double forward_time = 1,
                    double backward_time = 1, double latency = 0) {
  const int S = shape.stages;
  Simulation sim;
  sim.busy.assign(S, 0);
  sim.end.assign(S, 0);
  std::vector<size_t> next(S, 0);
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int s = 0; s < S; ++s) {
      while (next[s] < lists[s].size()) {
        const StageAction& action = lists[s][next[s]];
        const auto dependency = Dependency(shape, s, action);
        double ready = sim.end[s];
        if (dependency) {
          const auto it = sim.finish.find(*dependency);
          if (it == sim.finish.end()) break;  // blocked in a receive
          // The last virtual stage's backward waits for its own forward: no message.
          const bool own =
              std::get<0>(*dependency) == Kind::kForward && action.kind == Kind::kBackward;
          ready = std::max(ready, it->second + (own ? 0 : latency));
        }
        const double duration =
            (action.kind == Kind::kForward ? forward_time : backward_time) / shape.chunks;
        const Simulation::Key key{action.kind, action.micro_batch,
                                  VirtualStage(S, s, action.chunk)};
        sim.start[key] = ready;
        sim.end[s] = sim.finish[key] = ready + duration;
        sim.busy[s] += duration;
        ++next[s];
        progressed = true;
      }
    }
  }
  for (int s = 0; s < S; ++s) sim.deadlocked |= next[s] < lists[s].size();
  sim.makespan = *std::max_element(sim.end.begin(), sim.end.end());
  return sim;
}

Simulation Simulate(const Shape& shape, double forward_time = 1, double backward_time = 1,
                    double latency = 0) {
  StageLists lists;
  for (int s = 0; s < shape.stages; ++s) {
    lists.push_back(
        StageActions(shape.schedule, shape.stages, s, shape.micro_batches, shape.chunks));
  }
  return Simulate(shape, lists, forward_time, backward_time, latency);
}

TEST(PipelineScheduleTest, GPipeRunsEveryForwardThenEveryBackwardInOrder) {
  EXPECT_THAT(StageActions(PipelineSchedule::kGPipe, 4, 1, 3),
              ElementsAreArray({F(0), F(1), F(2), B(0), B(1), B(2)}));
}

TEST(PipelineScheduleTest, OneFOneBWarmsUpWithStagesAfterThisOne) {
  // S=4, stage 1: two warm-up forwards, then F/B in turn, then the last two backwards.
  EXPECT_THAT(StageActions(PipelineSchedule::kOneFOneB, 4, 1, 5),
              ElementsAreArray({F(0), F(1), F(2), B(0), F(3), B(1), F(4), B(2), B(3), B(4)}));
  // The last stage has no warm-up.
  EXPECT_THAT(StageActions(PipelineSchedule::kOneFOneB, 4, 3, 2),
              ElementsAreArray({F(0), B(0), F(1), B(1)}));
}

TEST(PipelineScheduleTest, OneFOneBDeepWarmupWarmsUpWithTwiceTheStagesAfterThisOne) {
  // Stage 0 of 3 leads stage 1 by two micro-batches: four forwards, then 1F1B.
  EXPECT_THAT(
      StageActions(PipelineSchedule::kOneFOneBDeepWarmup, 3, 0, 6),
      ElementsAreArray({F(0), F(1), F(2), F(3), F(4), B(0), F(5), B(1), B(2), B(3), B(4), B(5)}));
  // The last stage has no stage after it: as 1F1B.
  EXPECT_EQ(StageActions(PipelineSchedule::kOneFOneBDeepWarmup, 3, 2, 6),
            StageActions(PipelineSchedule::kOneFOneB, 3, 2, 6));
}

TEST(PipelineScheduleTest, OneFOneBWithFewerMicroBatchesThanStagesIsGPipeOnEarlyStages) {
  // Stage 0 of 4 would warm up with 3 forwards; with M = 2 it runs both, then both backwards.
  EXPECT_EQ(StageActions(PipelineSchedule::kOneFOneB, 4, 0, 2),
            StageActions(PipelineSchedule::kGPipe, 4, 0, 2));
  EXPECT_THAT(StageActions(PipelineSchedule::kOneFOneB, 4, 3, 2),
              ElementsAreArray({F(0), B(0), F(1), B(1)}));
}

TEST(PipelineScheduleTest, InterleavedFollowsMegatronRounds) {
  // S=2, v=2, M=4, stage 0: warm-up 2 * 1 + 1 * 2 = 4 forwards, round by round through the
  // chunks; backwards go through the chunks the other way.
  EXPECT_THAT(StageActions(PipelineSchedule::kInterleavedOneFOneB, 2, 0, 4, 2),
              ElementsAreArray({F(0), F(1), F(0, 1), F(1, 1), F(2), B(0, 1), F(3), B(1, 1), F(2, 1),
                                B(0), F(3, 1), B(1), B(2, 1), B(3, 1), B(2), B(3)}));
}

TEST(PipelineScheduleTest, EveryForwardPrecedesItsBackwardOnceEach) {
  for (const Shape& shape : AllShapes()) {
    for (int s = 0; s < shape.stages; ++s) {
      std::map<std::pair<int, int>, int> forward_at, backward_at;
      const auto actions =
          StageActions(shape.schedule, shape.stages, s, shape.micro_batches, shape.chunks);
      ASSERT_EQ(actions.size(), 2u * shape.micro_batches * shape.chunks) << Describe(shape);
      for (size_t i = 0; i < actions.size(); ++i) {
        auto& seen = actions[i].kind == Kind::kForward ? forward_at : backward_at;
        ASSERT_TRUE(seen.emplace(std::pair(actions[i].micro_batch, actions[i].chunk), i).second)
            << Describe(shape) << " stage " << s << ": " << ToString(actions[i]) << " twice";
      }
      for (const auto& [key, at] : backward_at) {
        ASSERT_TRUE(forward_at.count(key)) << Describe(shape);
        EXPECT_LT(forward_at[key], at) << Describe(shape) << " stage " << s;
      }
    }
  }
}

TEST(PipelineScheduleTest, BackwardsOfEachChunkRunInMicroBatchOrderEndingWithTheLast) {
  for (const Shape& shape : AllShapes()) {
    for (int s = 0; s < shape.stages; ++s) {
      const auto actions =
          StageActions(shape.schedule, shape.stages, s, shape.micro_batches, shape.chunks);
      std::vector<int> last(shape.chunks, -1);
      for (const StageAction& action : actions) {
        if (action.kind != Kind::kBackward) continue;
        EXPECT_EQ(action.micro_batch, last[action.chunk] + 1) << Describe(shape);
        last[action.chunk] = action.micro_batch;
      }
      EXPECT_EQ(actions.back(), B(shape.micro_batches - 1)) << Describe(shape);
    }
  }
}

TEST(PipelineScheduleTest, SimulationFindsADeadlock) {
  // Stage 0 waits for B0 before sending F1; stage 1 waits for F1 before running B0.
  const Shape shape{PipelineSchedule::kOneFOneB, 2, 2, 1};
  EXPECT_TRUE(Simulate(shape, {{F(0), B(0), F(1), B(1)}, {F(0), F(1), B(0), B(1)}}).deadlocked);
  EXPECT_FALSE(Simulate(shape, {{F(0), F(1), B(0), B(1)}, {F(0), B(0), F(1), B(1)}}).deadlocked);
}

TEST(PipelineScheduleTest, AllStagesCompleteWithoutDeadlock) {
  for (const Shape& shape : AllShapes()) {
    EXPECT_FALSE(Simulate(shape).deadlocked) << Describe(shape);
  }
}

TEST(PipelineScheduleTest, ForwardsFollowThePreviousStageAndBackwardsTheNext) {
  for (const Shape& shape : AllShapes()) {
    const Simulation sim = Simulate(shape);
    const int last = shape.stages * shape.chunks - 1;
    for (const auto& [key, finish] : sim.finish) {
      EXPECT_LT(sim.start.at(key), finish);
      const auto [kind, mb, virtual_stage] = key;
      const double start = sim.start.at(key);
      if (kind == Kind::kForward && virtual_stage > 0) {
        EXPECT_GE(start, sim.finish.at({kind, mb, virtual_stage - 1})) << Describe(shape);
      }
      if (kind == Kind::kBackward && virtual_stage < last) {
        EXPECT_GE(start, sim.finish.at({kind, mb, virtual_stage + 1})) << Describe(shape);
      }
      if (kind == Kind::kBackward) {
        EXPECT_GE(start, sim.finish.at({Kind::kForward, mb, virtual_stage})) << Describe(shape);
      }
    }
  }
}

TEST(PipelineScheduleTest, BalancedStagesIdleForTheIdealBubble) {
  for (const Shape& shape : AllShapes()) {
    if (shape.schedule == PipelineSchedule::kInterleavedOneFOneB) continue;
    const Simulation sim = Simulate(shape);
    const double ideal = IdealBubbleFraction(shape.schedule, shape.stages, shape.micro_batches);
    for (int s = 0; s < shape.stages; ++s) {
      EXPECT_NEAR(1 - sim.busy[s] / sim.makespan, ideal, 1e-9) << Describe(shape);
    }
  }
}

TEST(PipelineScheduleTest, InterleavingShrinksTheBubble) {
  const Shape plain{PipelineSchedule::kOneFOneB, 4, 8, 1};
  const Shape interleaved{PipelineSchedule::kInterleavedOneFOneB, 4, 8, 2};
  EXPECT_LT(Simulate(interleaved).makespan, Simulate(plain).makespan);
  EXPECT_NEAR(IdealBubbleFraction(interleaved.schedule, 4, 8, 2), 3.0 / 19, 1e-12);
}

TEST(PipelineScheduleTest, PeakInFlightIsAllMicroBatchesForGPipe) {
  for (int s = 0; s < 4; ++s)
    EXPECT_EQ(PeakInFlightMicroBatches(PipelineSchedule::kGPipe, 4, s, 8), 8);
}

TEST(PipelineScheduleTest, PeakInFlightIsStagesFromHereForOneFOneB) {
  for (int stages = 1; stages <= 8; ++stages) {
    for (int m = 1; m <= 16; ++m) {
      for (int s = 0; s < stages; ++s) {
        EXPECT_EQ(PeakInFlightMicroBatches(PipelineSchedule::kOneFOneB, stages, s, m),
                  std::min(stages - s, m))
            << "S=" << stages << " s=" << s << " M=" << m;
      }
    }
  }
}

TEST(PipelineScheduleTest, PeakInFlightIsTwiceTheStagesFromHereLessOneForTheDeepWarmup) {
  for (int stages = 1; stages <= 8; ++stages) {
    for (int m = 1; m <= 16; ++m) {
      for (int s = 0; s < stages; ++s) {
        EXPECT_EQ(PeakInFlightMicroBatches(PipelineSchedule::kOneFOneBDeepWarmup, stages, s, m),
                  std::min(2 * (stages - s) - 1, m))
            << "S=" << stages << " s=" << s << " M=" << m;
      }
    }
  }
  // Still fewer than GPipe's M at M = 8 for S = 4 (the bench's memory table).
  EXPECT_LT(PeakInFlightMicroBatches(PipelineSchedule::kOneFOneBDeepWarmup, 4, 0, 8), 8);
}

// Why the deep warm-up exists (schedule.h): with messages that take L, 1F1B's steady state
// pays L per micro-batch, the deep warm-up only the fill's and the drain's latencies.
TEST(PipelineScheduleTest, MessageLatencyCostsOneFOneBEveryMicroBatchAndTheDeepWarmupOnlyItsEnds) {
  const double f = 1, b = 2, latency = 0.1;
  for (int stages : {2, 3, 4, 8}) {
    for (int m : {8, 16}) {
      const Shape plain{PipelineSchedule::kOneFOneB, stages, m, 1};
      const Shape deep{PipelineSchedule::kOneFOneBDeepWarmup, stages, m, 1};
      const double ideal = (m + stages - 1) * (f + b);
      const double plain_excess = Simulate(plain, f, b, latency).makespan - ideal;
      const double deep_excess = Simulate(deep, f, b, latency).makespan - ideal;
      EXPECT_NEAR(Simulate(deep, f, b, 0).makespan, ideal, 1e-9);
      // 1F1B: L for every micro-batch after the first, at least.
      EXPECT_GE(plain_excess, latency * (m - 1) - 1e-9) << Describe(plain);
      // Deep warm-up: one message per boundary on the way in and one on the way out.
      EXPECT_LE(deep_excess, 2 * latency * (stages - 1) + 1e-9) << Describe(deep);
    }
  }
}

TEST(PipelineScheduleTest, IdealBubble) {
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(PipelineSchedule::kGPipe, 1, 4), 0);
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(PipelineSchedule::kOneFOneB, 4, 8), 3.0 / 11);
}

void ExpectRefused(const std::function<void()>& call, const std::string& names) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected an error naming " << names;
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr(names));
  }
}

TEST(PipelineScheduleTest, BadShapesAreRefusedNamingTheParameter) {
  using P = PipelineSchedule;
  ExpectRefused([] { StageActions(P::kGPipe, 0, 0, 4); }, "stages is 0");
  ExpectRefused([] { StageActions(P::kOneFOneB, 2, 2, 4); }, "stage is 2");
  ExpectRefused([] { StageActions(P::kOneFOneB, 2, -1, 4); }, "stage is -1");
  ExpectRefused([] { StageActions(P::kOneFOneB, 2, 0, 0); }, "micro_batches is 0");
  ExpectRefused([] { StageActions(P::kGPipe, 2, 0, 4, 2); }, "chunks_per_stage is 2");
  ExpectRefused([] { StageActions(P::kInterleavedOneFOneB, 2, 0, 4, 1); }, "chunks_per_stage is 1");
  ExpectRefused([] { StageActions(P::kInterleavedOneFOneB, 1, 0, 4, 2); }, "stages is 1");
  ExpectRefused([] { StageActions(P::kInterleavedOneFOneB, 4, 0, 6, 2); }, "micro_batches is 6");
  ExpectRefused([] { IdealBubbleFraction(P::kGPipe, 2, 0); }, "micro_batches is 0");
}

// --- transfers on one stream (NCCL) ---

// One transfer of a stage, as the stage runner issues it (pipeline_stage.h).
struct Transfer {
  enum Message { kActivation, kGradient, kLoss };
  bool send = false;
  int peer = 0;
  Message message = kActivation;
  int micro_batch = 0;
};

// A stage's host: issues transfers and waits for some of them (by index into `issued`).
struct HostProgram {
  struct Step {
    bool wait = false;
    int transfer = 0;
  };
  std::vector<Transfer> issued;
  std::vector<Step> steps;

  int Issue(const Transfer& transfer) {
    issued.push_back(transfer);
    steps.push_back({false, static_cast<int>(issued.size()) - 1});
    return steps.back().transfer;
  }
  void Wait(int transfer) { steps.push_back({true, transfer}); }
};

// What stage s's host does in a step: receive each activation and wait for it, post the
// gradient receives ahead where GradientReceivesAhead says (when `ahead`), send each
// activation, then (when `inputs_ahead`, as the runner does on Gloo) post the next
// micro-batch's activation receive; wait for each gradient at its backward and send the
// input's back; at the end wait for every send, then the loss goes from the last stage to
// stage 0.
HostProgram StageProgram(PipelineSchedule schedule, int S, int s, int M, bool ahead,
                         bool inputs_ahead) {
  using T = Transfer;
  HostProgram host;
  const auto early =
      ahead ? GradientReceivesAhead(schedule, S, s, M) : std::vector<std::vector<int>>(M);
  std::vector<int> gradient(M, -1), activation(M, -1);
  for (const StageAction& a : StageActions(schedule, S, s, M)) {
    const int mb = a.micro_batch;
    if (a.kind == Kind::kForward) {
      if (s > 0) {
        if (activation[mb] < 0) activation[mb] = host.Issue({false, s - 1, T::kActivation, mb});
        host.Wait(activation[mb]);
      }
      if (s < S - 1) {
        for (int i : early[mb]) gradient[i] = host.Issue({false, s + 1, T::kGradient, i});
        host.Issue({true, s + 1, T::kActivation, mb});
      }
      if (inputs_ahead && s > 0 && mb + 1 < M) {
        activation[mb + 1] = host.Issue({false, s - 1, T::kActivation, mb + 1});
      }
    } else {
      if (s < S - 1) {
        if (gradient[mb] < 0) gradient[mb] = host.Issue({false, s + 1, T::kGradient, mb});
        host.Wait(gradient[mb]);
      }
      if (s > 0) host.Issue({true, s - 1, T::kGradient, mb});
    }
  }
  for (size_t i = 0; i < host.issued.size(); ++i) {
    if (host.issued[i].send) host.Wait(static_cast<int>(i));
  }
  if (S > 1 && s == S - 1) host.Issue({true, 0, T::kLoss, 0});
  if (S > 1 && s == 0) host.Wait(host.Issue({false, S - 1, T::kLoss, 0}));
  return host;
}

// Runs every stage's host with one stream per rank: transfers run in issue order, and one
// completes only together with its peer's matching transfer, both at the head of their streams
// (the strictest reading of NCCL: no message is buffered). True if every host finished.
bool CompletesOnOneStream(PipelineSchedule schedule, int S, int M, bool ahead,
                          bool inputs_ahead = false) {
  std::vector<HostProgram> hosts;
  for (int s = 0; s < S; ++s) {
    hosts.push_back(StageProgram(schedule, S, s, M, ahead, inputs_ahead));
  }
  std::vector<size_t> pc(S, 0), head(S, 0);  // head: first transfer not completed
  std::vector<size_t> issued(S, 0);
  const auto matches = [&](int r) {
    if (head[r] >= issued[r]) return false;
    const Transfer& mine = hosts[r].issued[head[r]];
    const int p = mine.peer;
    if (head[p] >= issued[p]) return false;
    const Transfer& theirs = hosts[p].issued[head[p]];
    return mine.send != theirs.send && theirs.peer == r && mine.message == theirs.message &&
           mine.micro_batch == theirs.micro_batch;
  };
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int r = 0; r < S; ++r) {
      for (; pc[r] < hosts[r].steps.size(); ++pc[r], progressed = true) {
        const HostProgram::Step& step = hosts[r].steps[pc[r]];
        if (step.wait && static_cast<size_t>(step.transfer) >= head[r]) break;
        if (!step.wait) ++issued[r];
      }
    }
    for (int r = 0; r < S; ++r) {
      if (!matches(r)) continue;
      ++head[hosts[r].issued[head[r]].peer];
      ++head[r];
      progressed = true;
    }
  }
  for (int r = 0; r < S; ++r) {
    if (pc[r] < hosts[r].steps.size() || head[r] < issued[r]) return false;
  }
  return true;
}

TEST(PipelineScheduleTest, GradientsAreReceivedAheadWhereTheNextStageSendsThem) {
  // Stage 1 of 2 runs F0 B0 F1 B1 F2 B2: stage 0 posts g0 before sending a1, g1 before a2.
  EXPECT_THAT(GradientReceivesAhead(PipelineSchedule::kOneFOneB, 2, 0, 3),
              ElementsAreArray({std::vector<int>{}, std::vector<int>{0}, std::vector<int>{1}}));
  for (const auto& early : GradientReceivesAhead(PipelineSchedule::kGPipe, 4, 1, 5)) {
    EXPECT_TRUE(early.empty());
  }
  for (const auto& early : GradientReceivesAhead(PipelineSchedule::kOneFOneB, 4, 3, 5)) {
    EXPECT_TRUE(early.empty());
  }
  ExpectRefused([] { GradientReceivesAhead(PipelineSchedule::kInterleavedOneFOneB, 2, 0, 4); },
                "no transfer order");
  ExpectRefused([] { GradientReceivesAhead(PipelineSchedule::kOneFOneB, 2, 2, 4); }, "stage is 2");
}

TEST(PipelineScheduleTest, OneStreamPerRankCompletesWithGradientsReceivedAhead) {
  for (const Shape& shape : AllShapes()) {
    if (shape.schedule == PipelineSchedule::kInterleavedOneFOneB) continue;
    EXPECT_TRUE(CompletesOnOneStream(shape.schedule, shape.stages, shape.micro_batches, true))
        << Describe(shape);
  }
}

TEST(PipelineScheduleTest, OneStreamPerRankDeadlocksOneFOneBWithoutReceivingAhead) {
  // Stage 0 sends a1 before it waits for g0; stage 1 sends g0 before it receives a1.
  EXPECT_FALSE(CompletesOnOneStream(PipelineSchedule::kOneFOneB, 2, 4, false));
  // GPipe needs nothing ahead: every stage's transfers come in the same order.
  EXPECT_TRUE(CompletesOnOneStream(PipelineSchedule::kGPipe, 4, 4, false));
}

TEST(PipelineScheduleTest, OneStreamPerRankDeadlocksOneFOneBWithInputsPostedAhead) {
  // Why the runner posts the next input's receive early only where transfers may come in any
  // order: stage 1 posts a1 before it sends g0 back; stage 0 posts g0 before it sends a1.
  EXPECT_FALSE(CompletesOnOneStream(PipelineSchedule::kOneFOneB, 2, 4, true, true));
}

TEST(PipelineLayoutTest, AReplicasStagesAreConsecutiveRanks) {
  const PipelineLayout layout(8, 4);  // 4 stages x 2 replicas
  EXPECT_EQ(layout.replicas(), 2);
  EXPECT_EQ(layout.RankOf(1, 2), 6);
  EXPECT_EQ(layout.StageOf(6), 2);
  EXPECT_EQ(layout.ReplicaOf(6), 1);
  EXPECT_EQ(layout.FirstStageRank(6), 4);
  EXPECT_EQ(layout.LastStageRank(1), 3);
}

TEST(PipelineLayoutTest, NeighboursGoAroundTheReplicasRing) {
  const PipelineLayout layout(8, 4);
  EXPECT_EQ(layout.NextRank(5), 6);
  EXPECT_EQ(layout.PreviousRank(5), 4);
  EXPECT_EQ(layout.NextRank(7), 4);  // the last stage's chunk c feeds stage 0's chunk c + 1
  EXPECT_EQ(layout.PreviousRank(4), 7);
  EXPECT_EQ(PipelineLayout(3, 1).NextRank(2), 2);
}

TEST(PipelineLayoutTest, AStagesDataParallelGroupHoldsItInEveryReplica) {
  EXPECT_THAT(PipelineLayout(8, 4).DataParallelRanks(1), ElementsAreArray({1, 5}));
  EXPECT_THAT(PipelineLayout(3, 1).DataParallelRanks(0), ElementsAreArray({0, 1, 2}));
}

TEST(PipelineLayoutTest, StagesMustDivideTheWorld) {
  ExpectRefused([] { PipelineLayout(6, 4); }, "parallelism.pipelineStages is 4");
  ExpectRefused([] { PipelineLayout(6, 0); }, "parallelism.pipelineStages is 0");
  ExpectRefused([] { PipelineLayout(0, 1); }, "world size is 0");
}

}  // namespace
}  // namespace gradhub::ddp::pipeline
