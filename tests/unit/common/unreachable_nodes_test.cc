#include "services/common/contract/unreachable_nodes.h"

#include <gtest/gtest.h>

namespace gradhub {
namespace {

using Pairs = std::vector<std::pair<std::string, std::string>>;

TEST(UnreachableNodesTest, TheStatementReadsBackAsItsPairs) {
  const std::string statement = UnreachableNodesStatement("nodes/a", {"nodes/b", "nodes/c-2"});
  EXPECT_EQ(statement, "nodes/a cannot reach nodes/b, nodes/c-2");
  EXPECT_EQ(UnreachablePairs(statement), (Pairs{{"nodes/a", "nodes/b"}, {"nodes/a", "nodes/c-2"}}));
}

// The api reads it inside a failure message that quotes the rank's last log line.
TEST(UnreachableNodesTest, PairsAreFoundInsideAFailureMessage) {
  const std::string message =
      "rank 2 exited with code 12 (last log line: gradhub-trainer rank 2: lost its peers: "
      "allreduce timed out after 5000 ms; nodes/b cannot reach nodes/a.)";
  EXPECT_EQ(UnreachablePairs(message), (Pairs{{"nodes/b", "nodes/a"}}));
}

TEST(UnreachableNodesTest, NothingStatedIsNoPairs) {
  EXPECT_TRUE(UnreachablePairs("").empty());
  EXPECT_TRUE(UnreachablePairs("rank 0 exited with code 12").empty());
  EXPECT_TRUE(UnreachablePairs("nodes/a cannot reach the store").empty());
  EXPECT_TRUE(UnreachablePairs("a cannot reach nodes/b").empty());  // no subject node
  EXPECT_TRUE(UnreachablePairs("nodes/ cannot reach nodes/b").empty());
  EXPECT_TRUE(UnreachablePairs("nodes/a cannot reach nodes/a").empty());  // never itself
}

TEST(UnreachableNodesTest, RepeatedStatementsGiveEachPairOnce) {
  EXPECT_EQ(UnreachablePairs("nodes/a cannot reach nodes/b; nodes/a cannot reach nodes/b, "
                             "nodes/c"),
            (Pairs{{"nodes/a", "nodes/b"}, {"nodes/a", "nodes/c"}}));
}

}  // namespace
}  // namespace gradhub
