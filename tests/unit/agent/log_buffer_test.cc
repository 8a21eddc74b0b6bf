// The parts of the LogShipper that need no server: batching into ReportLogs messages, and the
// bounded buffer. Shipping itself is tested end to end against gradhub-api.
#include <gtest/gtest.h>

#include "gpu_worker/agent/log_shipper.h"

namespace gradhub::agent {
namespace {

const RankKey kKey{"jobs/j", 2, 1};

OutputLine Line(int64_t seq, std::string text, OutputStream stream = OutputStream::kStdout) {
  return {stream, seq, absl::FromUnixSeconds(1000 + seq), std::move(text)};
}

TEST(BuildReportLogsRequestsTest, OneMessagePerRunOfOneStream) {
  const std::vector<OutputLine> lines = {Line(5, "a"), Line(6, "b"),
                                         Line(7, "err", OutputStream::kStderr), Line(8, "c"),
                                         Line(10, "after a gap")};
  const auto requests = BuildReportLogsRequests(kKey, lines, 500, 256 << 10);
  ASSERT_EQ(requests.size(), 4u);
  for (const auto& request : requests) {
    EXPECT_EQ(request.job(), "jobs/j");
    EXPECT_EQ(request.attempt(), 2);
    EXPECT_EQ(request.rank(), 1);
  }
  EXPECT_EQ(requests[0].first_seq(), 5);
  EXPECT_EQ(requests[0].stream(), v1::LogEntry::STDOUT);
  EXPECT_EQ(std::vector<std::string>(requests[0].lines().begin(), requests[0].lines().end()),
            (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(requests[1].first_seq(), 7);
  EXPECT_EQ(requests[1].stream(), v1::LogEntry::STDERR);
  EXPECT_EQ(requests[2].first_seq(), 8);
  EXPECT_EQ(requests[3].first_seq(), 10);
}

TEST(BuildReportLogsRequestsTest, RespectsLineAndByteLimits) {
  std::vector<OutputLine> lines;
  for (int i = 1; i <= 1200; ++i) lines.push_back(Line(i, "x"));
  auto requests = BuildReportLogsRequests(kKey, lines, 500, 256 << 10);
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[0].lines_size(), 500);
  EXPECT_EQ(requests[1].first_seq(), 501);
  EXPECT_EQ(requests[2].lines_size(), 200);

  lines.clear();
  for (int i = 1; i <= 10; ++i) lines.push_back(Line(i, std::string(60 << 10, 'y')));
  requests = BuildReportLogsRequests(kKey, lines, 500, 256 << 10);
  int64_t next = 1;
  for (const auto& request : requests) {
    EXPECT_EQ(request.first_seq(), next);
    EXPECT_LE(request.ByteSizeLong(), (256u << 10) + 100);
    next += request.lines_size();
  }
  EXPECT_EQ(next, 11);
  EXPECT_EQ(requests.size(), 3u);  // 4 + 4 + 2 lines of 60 KiB
  // A single line above the byte limit still goes, alone.
  requests = BuildReportLogsRequests(kKey, {Line(1, std::string(300 << 10, 'z'))}, 500, 256 << 10);
  ASSERT_EQ(requests.size(), 1u);
}

TEST(LogBufferTest, PeekReleaseAndClose) {
  LogBuffer buffer(1 << 20);
  for (int i = 1; i <= 5; ++i) buffer.Append(kKey, Line(i, "line" + std::to_string(i)));
  EXPECT_EQ(buffer.Pending(), std::vector<RankKey>{kKey});
  auto lines = buffer.Peek(kKey, 1 << 20);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(buffer.Peek(kKey, 10).size(), 2u);  // "line1" + "line2" = 10 bytes
  EXPECT_EQ(buffer.Peek(kKey, 1).size(), 1u);   // at least one line
  buffer.Release(kKey, 3);
  lines = buffer.Peek(kKey, 1 << 20);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].seq, 4);
  buffer.Close(kKey);
  EXPECT_TRUE(buffer.Knows(kKey)) << "closed, but lines are left to ship";
  buffer.Release(kKey, 5);
  EXPECT_FALSE(buffer.Knows(kKey));
  EXPECT_TRUE(buffer.empty());
  EXPECT_EQ(buffer.bytes(), 0u);
}

TEST(LogBufferTest, DropsTheOldestBeyondTheBudgetBehindACountedMarker) {
  const size_t line_cost = 100 + kLineOverheadBytes;
  LogBuffer buffer(20 * line_cost);
  for (int i = 1; i <= 100; ++i) buffer.Append(kKey, Line(i, std::string(100, 'a')));
  EXPECT_LE(buffer.bytes(), 20 * line_cost);
  const auto lines = buffer.Peek(kKey, 1 << 30);
  ASSERT_GE(lines.size(), 2u);
  const OutputLine& marker = lines[0];
  EXPECT_EQ(marker.stream, OutputStream::kStderr);
  const int64_t dropped = buffer.dropped_lines();
  EXPECT_EQ(marker.seq, dropped) << "the marker takes the seq of the last line it replaces";
  EXPECT_EQ(marker.text, "gradhub-agent: dropped " + std::to_string(dropped) +
                             " lines of output here (the agent's log buffer was full)");
  // What is kept is the newest, with no gap after the marker.
  EXPECT_EQ(lines.back().seq, 100);
  for (size_t i = 1; i < lines.size(); ++i) EXPECT_EQ(lines[i].seq, lines[i - 1].seq + 1);
  EXPECT_EQ(static_cast<int64_t>(lines.size()) - 1 + dropped, 100);
  buffer.Release(kKey, 100);
  EXPECT_EQ(buffer.bytes(), 0u);
}

TEST(LogBufferTest, EvictsFromTheRankHoldingTheMost) {
  const RankKey quiet{"jobs/j", 2, 0};
  const size_t line_cost = 100 + kLineOverheadBytes;
  LogBuffer buffer(30 * line_cost);
  for (int i = 1; i <= 5; ++i) buffer.Append(quiet, Line(i, std::string(100, 'q')));
  for (int i = 1; i <= 100; ++i) buffer.Append(kKey, Line(i, std::string(100, 'n')));
  const auto quiet_lines = buffer.Peek(quiet, 1 << 30);
  ASSERT_EQ(quiet_lines.size(), 5u);
  EXPECT_EQ(quiet_lines[0].text, std::string(100, 'q'));
  EXPECT_EQ(buffer.Peek(kKey, 1 << 30)[0].stream, OutputStream::kStderr);
}

}  // namespace
}  // namespace gradhub::agent
