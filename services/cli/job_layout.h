// `gradhub describe`'s layout of a pipelined job (JobSpec.parallelism): which rank holds which
// stage of which replica (rank = replica * stages + stage), and the node each rank is on. Pure
// functions of the job and its events, so tests need no server.
//
// Thread-compatible: plain functions of their arguments.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gradhub/v1/jobs.pb.h"

namespace gradhub::cli {

// The node of each rank a placement event's message names (services/api/scheduling_rules.h
// PlacementMessage: "nodes/NAME (rank R)" or "nodes/NAME (ranks R-S)", wherever they appear),
// by rank, as "nodes/NAME"; ranks it does not name are absent.
std::map<int32_t, std::string> NodesOfRanks(const std::string& placement_message);

// The event that placed the job's current attempt: the last STATE_CHANGED to SCHEDULED of
// job.attempt(); nullptr when there is none (the job waits to be placed).
const v1::JobEvent* CurrentPlacement(const v1::Job& job,
                                     const std::vector<const v1::JobEvent*>& events);

// `describe`'s `layout:` block for a job of pipelineStages above 1, "" for any other: a line of
// the pipeline's shape, then one row per rank, replica by replica, stage by stage:
//   layout: 2 stages x 2 replicas, schedule ONE_F_ONE_B, 4 micro-batches, 4 layers (split by
//   parameter count)
//     REPLICA  STAGE  RANK  NODE
//     0        0      0     nodes/a
// The nodes come from the current attempt's placement (CurrentPlacement); "-" while it has
// none. Which layers each stage holds is decided by the trainer (by parameter count or measured
// time, README "Model or data parallelism"), so only the model's count is shown, for the zoo.
std::string PipelineLayout(const v1::Job& job, const std::vector<const v1::JobEvent*>& events);

}  // namespace gradhub::cli
