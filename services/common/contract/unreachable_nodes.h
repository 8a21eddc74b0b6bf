// How a rank that lost its peers says which nodes it could no longer reach, and how the api
// reads that back. The trainer ends its last stderr line with the statement; the agent reports
// that line as the rank's message, the api quotes it in the attempt's failure, and the
// scheduler keeps the job's next attempt off each such pair of nodes while other capacity
// exists (scheduling_rules.h PlaceGangAvoiding).
//
//   "nodes/a cannot reach nodes/b, nodes/c"
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gradhub {

// The statement for a rank on node `from` (nodes/NAME) that could not reach the nodes `to`.
std::string UnreachableNodesStatement(const std::string& from, const std::vector<std::string>& to);

// Every (from, to) pair stated anywhere in `text`, in order, each once; empty when none.
std::vector<std::pair<std::string, std::string>> UnreachablePairs(std::string_view text);

}  // namespace gradhub
