#include "gpu_worker/agent/log_shipper.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"

namespace gradhub::agent {

// ------------------------------------------------------------------------------------------
// LogBuffer

void LogBuffer::Append(const RankKey& key, OutputLine line) {
  Rank& rank = ranks_[key];
  rank.bytes += Cost(line);
  bytes_ += Cost(line);
  rank.lines.push_back(std::move(line));
  while (bytes_ > max_bytes_) {
    Rank* largest = nullptr;
    for (auto& [unused, candidate] : ranks_) {
      const size_t evictable = candidate.lines.size() - (candidate.front_dropped > 0 ? 1 : 0);
      if (evictable > 0 && (largest == nullptr || candidate.bytes > largest->bytes)) {
        largest = &candidate;
      }
    }
    if (largest == nullptr || !EvictOldest(*largest)) break;
  }
}

bool LogBuffer::EvictOldest(Rank& rank) {
  const size_t first_line = rank.front_dropped > 0 ? 1 : 0;
  if (rank.lines.size() <= first_line) return false;
  int64_t count = rank.front_dropped;
  auto pop = [&] {
    rank.bytes -= Cost(rank.lines.front());
    bytes_ -= Cost(rank.lines.front());
    OutputLine line = std::move(rank.lines.front());
    rank.lines.pop_front();
    return line;
  };
  if (first_line == 1) pop();  // the previous marker, merged into the new one
  OutputLine victim = pop();
  ++count;
  ++dropped_lines_;
  OutputLine marker;
  marker.stream = OutputStream::kStderr;
  marker.seq = victim.seq;
  marker.time = victim.time;
  marker.text = absl::StrCat("gradhub-agent: dropped ", count,
                             " lines of output here (the agent's log buffer was full)");
  rank.bytes += Cost(marker);
  bytes_ += Cost(marker);
  rank.lines.push_front(std::move(marker));
  rank.front_dropped = count;
  return true;
}

void LogBuffer::ForgetIfDone(std::map<RankKey, Rank>::iterator it) {
  if (it->second.closed && it->second.lines.empty()) ranks_.erase(it);
}

void LogBuffer::Close(const RankKey& key) {
  auto it = ranks_.find(key);
  if (it == ranks_.end()) return;
  it->second.closed = true;
  ForgetIfDone(it);
}

std::vector<OutputLine> LogBuffer::Peek(const RankKey& key, size_t max_bytes) const {
  std::vector<OutputLine> lines;
  auto it = ranks_.find(key);
  if (it == ranks_.end()) return lines;
  size_t bytes = 0;
  for (const OutputLine& line : it->second.lines) {
    if (!lines.empty() && bytes + line.text.size() > max_bytes) break;
    bytes += line.text.size();
    lines.push_back(line);
  }
  return lines;
}

void LogBuffer::Release(const RankKey& key, int64_t seq) {
  auto it = ranks_.find(key);
  if (it == ranks_.end()) return;
  Rank& rank = it->second;
  while (!rank.lines.empty() && rank.lines.front().seq <= seq) {
    rank.bytes -= Cost(rank.lines.front());
    bytes_ -= Cost(rank.lines.front());
    rank.lines.pop_front();
    rank.front_dropped = 0;  // only the front can be a marker
  }
  ForgetIfDone(it);
}

std::vector<RankKey> LogBuffer::Pending() const {
  std::vector<RankKey> keys;
  for (const auto& [key, rank] : ranks_) {
    if (!rank.lines.empty()) keys.push_back(key);
  }
  return keys;
}

std::vector<v1::ReportLogsRequest> BuildReportLogsRequests(const RankKey& key,
                                                           const std::vector<OutputLine>& lines,
                                                           int max_lines, size_t max_bytes) {
  std::vector<v1::ReportLogsRequest> requests;
  size_t bytes = 0;
  int64_t next_seq = 0;
  for (const OutputLine& line : lines) {
    const auto stream =
        line.stream == OutputStream::kStdout ? v1::LogEntry::STDOUT : v1::LogEntry::STDERR;
    const size_t cost = line.text.size() + 4;  // field tag and length
    v1::ReportLogsRequest* current = requests.empty() ? nullptr : &requests.back();
    if (current == nullptr || current->stream() != stream || line.seq != next_seq ||
        current->lines_size() >= max_lines || bytes + cost > max_bytes) {
      current = &requests.emplace_back();
      current->set_job(key.job);
      current->set_attempt(key.attempt);
      current->set_rank(key.rank);
      current->set_stream(stream);
      current->set_first_seq(line.seq);
      bytes = 0;
    }
    current->add_lines(line.text);
    bytes += cost;
    next_seq = line.seq + 1;
  }
  return requests;
}

// ------------------------------------------------------------------------------------------
// LogShipper

namespace {

// A server that answers OK without acknowledging anything this many times in a row does not
// keep these lines (an unknown or purged attempt, nodes.proto): they are given up on.
constexpr int kMaxRoundsWithoutProgress = 3;

}  // namespace

LogShipper::LogShipper(v1::NodeService::StubInterface* stub, LogShipperOptions options)
    : stub_(stub), options_(std::move(options)), buffer_(options_.max_buffer_bytes) {
  thread_ = std::thread([this] { Loop(); });
}

LogShipper::~LogShipper() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    if (active_ != nullptr) active_->TryCancel();
  }
  cv_.notify_all();
  thread_.join();
}

void LogShipper::Append(const RankKey& key, const OutputLine& line) {
  bool warn = false;
  int64_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    buffer_.Append(key, line);
    dropped = buffer_.dropped_lines();
    const absl::Time now = absl::Now();
    if (dropped > warned_dropped_ && now - last_drop_warning_ > absl::Seconds(30)) {
      warn = true;
      warned_dropped_ = dropped;
      last_drop_warning_ = now;
    }
  }
  if (warn) {
    std::cerr << "gradhub-agent: log buffer full (" << options_.max_buffer_bytes
              << " bytes); dropped the oldest output, " << dropped << " lines so far\n";
  }
  cv_.notify_all();
}

void LogShipper::Close(const RankKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  buffer_.Close(key);
}

bool LogShipper::Flush(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  ++flush_waiters_;
  cv_.notify_all();
  const bool done = flushed_cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                                         [&] { return buffer_.Pending().empty(); });
  --flush_waiters_;
  return done;
}

LogShipper::Stats LogShipper::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {buffer_.bytes(), buffer_.dropped_lines() + refused_lines_, shipped_lines_};
}

void LogShipper::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  Backoff backoff(options_.backoff);
  while (!stop_) {
    cv_.wait(lock, [&] { return stop_ || !buffer_.Pending().empty(); });
    if (stop_) break;
    if (flush_waiters_ == 0) {
      cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.flush_delay),
                   [&] { return stop_ || flush_waiters_ > 0; });
      if (stop_) break;
    }
    bool reachable = true;
    for (const RankKey& key : buffer_.Pending()) {
      lock.unlock();
      reachable = ShipRound(key);
      lock.lock();
      if (!reachable || stop_) break;
    }
    flushed_cv_.notify_all();
    if (reachable) {
      backoff.Reset();
    } else {
      cv_.wait_for(lock, backoff.Next(), [&] { return stop_; });
    }
  }
  flushed_cv_.notify_all();
}

bool LogShipper::ShipRound(const RankKey& key) {
  std::vector<OutputLine> lines;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lines = buffer_.Peek(key, kRoundBytes);
  }
  if (lines.empty()) return true;
  const auto requests =
      BuildReportLogsRequests(key, lines, options_.max_batch_lines, options_.max_batch_bytes);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  context.AddMetadata("authorization", "Bearer " + options_.token);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return false;
    active_ = &context;
  }
  v1::ReportLogsResponse response;
  grpc::Status status;
  {
    auto writer = stub_->ReportLogs(&context, &response);
    for (const auto& request : requests) {
      if (!writer->Write(request)) break;
    }
    writer->WritesDone();
    status = writer->Finish();
  }
  std::lock_guard<std::mutex> lock(mu_);
  active_ = nullptr;
  const int64_t first = lines.front().seq, last = lines.back().seq;
  if (status.ok()) {
    const int64_t acked = response.acked_seq();
    if (acked >= first) {
      shipped_lines_ += std::min(acked, last) - first + 1;
      buffer_.Release(key, acked);
      rounds_without_progress_.erase(key);
    } else if (++rounds_without_progress_[key] >= kMaxRoundsWithoutProgress) {
      refused_lines_ += static_cast<int64_t>(lines.size());
      buffer_.Release(key, last);
      rounds_without_progress_.erase(key);
      std::cerr << "gradhub-agent: the server acknowledges no output of " << key.ToString()
                << " (acked_seq " << acked << "); dropped " << lines.size() << " lines\n";
    }
    return true;
  }
  if (IsRetryable(status)) return false;
  refused_lines_ += static_cast<int64_t>(lines.size());
  buffer_.Release(key, last);
  rounds_without_progress_.erase(key);
  std::cerr << "gradhub-agent: ReportLogs refused " << lines.size() << " lines of "
            << key.ToString() << ": " << status.error_code() << " " << status.error_message()
            << "\n";
  return true;
}

}  // namespace gradhub::agent
