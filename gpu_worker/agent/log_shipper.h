// Ships rank output to the server with NodeService.ReportLogs (nodes.proto).
//
// ReportLogs is client-streaming: the server's acked_seq arrives only when a stream is
// finished. So the shipper works in rounds: for one rank, open a stream, write the oldest
// unacknowledged lines (at most kRoundBytes, in messages of at most max_batch_lines /
// max_batch_bytes whose lines have consecutive seqs and one stream, as ReportLogsRequest
// requires), finish it and forget every line up to acked_seq. A broken stream forgets nothing,
// so the next round resends everything not acknowledged; the server drops seqs it already
// has. At most one stream per rank is open at a time; one shipping thread serves all ranks
// in turn.
//
// Memory is bounded (max_buffer_bytes over all ranks): beyond it, the oldest lines of the rank
// holding the most are replaced by one marker line on STDERR, "gradhub-agent: dropped N lines
// ...", which takes the seq of the last line it replaces, so seqs stay unique and the reader
// sees where output is missing.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gpu_worker/agent/rank_process.h"
#include "gpu_worker/agent/reconcile.h"
#include "gradhub/v1/nodes.grpc.pb.h"
#include "services/common/grpc_retry.h"

namespace gradhub::agent {

inline constexpr size_t kRoundBytes = 4 << 20;
// Accounted per buffered line on top of its text.
inline constexpr size_t kLineOverheadBytes = 48;

struct LogShipperOptions {
  std::string token;  // node token, sent as `authorization: Bearer <token>`
  int max_batch_lines = 500;
  size_t max_batch_bytes = 256 << 10;
  size_t max_buffer_bytes = 64 << 20;
  // Lines are collected this long before a round, so a chatty rank is not one RPC per line.
  absl::Duration flush_delay = absl::Milliseconds(200);
  absl::Duration rpc_timeout = absl::Seconds(30);
  // After a retryable failure (IsRetryable: server unreachable, token refused), the wait
  // before the next round.
  BackoffPolicy backoff = kGrpcBackoff;
};

// One rank's unacknowledged output, oldest first. Not thread-safe (LogShipper locks it).
class LogBuffer {
 public:
  explicit LogBuffer(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Lines of one rank must come in seq order. Evicts (see above) when over the budget.
  void Append(const RankKey& key, OutputLine line);
  // No more lines will come for `key`: it is forgotten once everything is acknowledged.
  void Close(const RankKey& key);
  // The oldest lines of `key`, at most `max_bytes` of text (but at least one line).
  std::vector<OutputLine> Peek(const RankKey& key, size_t max_bytes) const;
  // Forgets every line of `key` with seq <= `seq` (acknowledged, or given up on).
  void Release(const RankKey& key, int64_t seq);
  // Ranks with lines to ship, in key order.
  std::vector<RankKey> Pending() const;
  bool empty() const { return ranks_.empty(); }
  size_t bytes() const { return bytes_; }
  int64_t dropped_lines() const { return dropped_lines_; }
  bool Knows(const RankKey& key) const { return ranks_.count(key) != 0; }

 private:
  struct Rank {
    std::deque<OutputLine> lines;
    size_t bytes = 0;
    bool closed = false;
    int64_t front_dropped = 0;  // > 0: lines.front() is a marker for this many lines
  };
  static size_t Cost(const OutputLine& line) { return line.text.size() + kLineOverheadBytes; }
  // Replaces the oldest line of `rank` (and the marker before it) with a marker. False when
  // there is nothing left to evict there.
  bool EvictOldest(Rank& rank);
  void ForgetIfDone(std::map<RankKey, Rank>::iterator it);

  size_t max_bytes_;
  size_t bytes_ = 0;
  int64_t dropped_lines_ = 0;
  std::map<RankKey, Rank> ranks_;
};

// Lines (consecutive, oldest first) as ReportLogs messages: each message has one stream and
// consecutive seqs, at most `max_lines` lines and (unless one line is larger) `max_bytes`.
std::vector<v1::ReportLogsRequest> BuildReportLogsRequests(const RankKey& key,
                                                           const std::vector<OutputLine>& lines,
                                                           int max_lines, size_t max_bytes);

// Thread-safe. Append never blocks on the network.
class LogShipper {
 public:
  LogShipper(v1::NodeService::StubInterface* stub, LogShipperOptions options);
  // Stops the shipping thread; what was not shipped is lost (call Flush first).
  ~LogShipper();

  void Append(const RankKey& key, const OutputLine& line);
  // The rank has exited and every line of it was appended: ship the rest, then forget it.
  void Close(const RankKey& key);
  // Ships now and waits until every buffered line is acknowledged or given up on; false
  // after `timeout` with lines left.
  bool Flush(absl::Duration timeout);

  struct Stats {
    size_t buffered_bytes = 0;
    int64_t dropped_lines = 0;  // evicted for memory, or refused by the server
    int64_t shipped_lines = 0;  // acknowledged
  };
  Stats stats() const;

 private:
  void Loop();
  // One round for `key`. False when the server is unreachable (back off, stop this pass).
  bool ShipRound(const RankKey& key);

  v1::NodeService::StubInterface* stub_;
  const LogShipperOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // lines appended, flush asked, stop
  LogBuffer buffer_;
  bool stop_ = false;
  int flush_waiters_ = 0;
  std::condition_variable flushed_cv_;
  int64_t refused_lines_ = 0;
  int64_t shipped_lines_ = 0;
  std::map<RankKey, int> rounds_without_progress_;
  grpc::ClientContext* active_ = nullptr;  // the round in flight, cancelled on destruction
  absl::Time last_drop_warning_ = absl::InfinitePast();
  int64_t warned_dropped_ = 0;
  std::thread thread_;
};

}  // namespace gradhub::agent
