// Rank 0 cut off from the checkpoint store while it uploads (issue #34, fault 5), end to end:
// real PostgreSQL, api, gradhub-checkpoint, one agent, a real trainer. Two outages:
//   - the store's gRPC port dropped by a packet filter (nftables, both directions silent, as a
//     partition drops them), then let through again;
//   - the store SIGKILLed and started again on the same port and data a few seconds later.
// In both, training goes on through the outage (the job's step advances, and the periodic
// checkpoints that come due are skipped with a CHECKPOINT_SKIPPED event naming the upload in
// flight), that upload is committed once the store is reachable again (after the restart:
// resumed at the byte the store held, and within seconds), nothing partial is ever listed as
// committed or served as the latest, and the job SUCCEEDS in its first attempt with the
// parameters of an uninterrupted run, bit for bit.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <thread>

#include "services/common/contract/job_spec.h"
#include "services/common/db/connection.h"
#include "services/common/sha256.h"
#include "tests/e2e/checkpoint/checkpoint_checks.h"
#include "tests/support/local_cluster.h"
#include "tests/support/packet_filter.h"

namespace gradhub {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::LocalCluster;
using Clock = std::chrono::steady_clock;

constexpr int64_t kSteps = 600;
constexpr int64_t kCheckpointEvery = 50;
// The shortest outage; it lasts until rank 0 has skipped a checkpoint (AwaitSkipBehind).
constexpr seconds kOutage(3);
// The store seals uploads in chunks of 1 MiB after a 4 KiB header (sealed_format.h): an upload
// file larger than this holds at least one, which a restarted store resumes after.
constexpr int64_t kSealedChunk = (1 << 20) + 4096 + 16;

// World 1; 32-768-768-4 with momentum: checkpoints of ~4.9 MB (several sealed chunks, so an
// upload can be frozen in the middle), steps of a few ms, so that many checkpoints come due in
// an outage of seconds.
v1::JobSpec Spec() {
  return ParseJobSpec(
      "model: {mlp: {layers: [32, 768, 768, 4]}}\n"
      "dataset: {synthetic: {numSamples: 65536, numFeatures: 32, numClasses: 4, noise: 5}}\n"
      "optimizer: {sgd: {lr: 0.01, momentum: 0.9}}\n"
      "batchSizePerRank: 16\n"
      "maxSteps: " +
      std::to_string(kSteps) +
      "\n"
      "logEverySteps: 20\n"
      "checkpoint: {everySteps: " +
      std::to_string(kCheckpointEvery) +
      ", keepLast: 2}\n"
      "distributed: {worldSize: 1}\n");
}

// A CHECKPOINT_SKIPPED event's message, as the api writes it (trainer_events.h).
struct Skip {
  int64_t step = 0, in_flight_step = 0;
};
std::optional<Skip> ParseSkip(const v1::JobEvent& event) {
  static const std::regex kMessage(
      "checkpoint at step ([0-9]+) skipped: the upload of step ([0-9]+) has been going out for "
      "[0-9.]+ s");
  std::smatch match;
  if (event.type() != v1::JobEvent::CHECKPOINT_SKIPPED ||
      !std::regex_match(event.message(), match, kMessage)) {
    return std::nullopt;
  }
  return Skip{std::stoll(match[1].str()), std::stoll(match[2].str())};
}

class CheckpointOutageE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::LocalClusterOptions options;
    options.agents = {"a"};
    options.checkpoint_service = true;
    cluster_ = std::make_unique<LocalCluster>(options);
    ASSERT_TRUE(cluster_->Start());
  }

  // The uninterrupted run, once for the whole binary: submitted beside the first outage run
  // (the agent has a slot for each), its parametersSha256 read at the end of that test.
  void StartReference() {
    if (reference_parameters().empty() && reference_job_.empty()) {
      reference_job_ = cluster_->Submit(Spec()).name();
    }
  }
  std::string Reference() {
    std::string& known = reference_parameters();
    if (!known.empty()) return known;
    StartReference();
    const v1::Job job = cluster_->AwaitJob(reference_job_, testing::Ended, seconds(300));
    EXPECT_EQ(job.state(), v1::Job::SUCCEEDED) << job.state_reason();
    EXPECT_EQ(job.attempt(), 1);
    known = FinalParameters(*cluster_, job.name());
    EXPECT_EQ(known.size(), 64u) << "no parametersSha256 in the reference run's done line";
    return known;
  }
  static std::string& reference_parameters() {
    static std::string known;
    return known;
  }

  // Freezes the store (SIGSTOP) in the middle of an upload of the job past its first
  // checkpoint, whatever the machine's speed. The store answers an upload's stream only once
  // it has written every chunk, and it writes a chunk of the stream (4 MiB) in one go, so:
  //   - `bytes` < 0: as soon as the upload's file appears, before its first chunk is written:
  //     the stream is not answered yet;
  //   - else once the file holds more than `bytes`: from the moment it appears the store runs
  //     only in slices of 200 us until then (whole sealed chunks that a restarted store
  //     resumes after; by then the client may be committing, which the store, frozen, has not
  //     done). A file seen larger already is let be: its commit may be under way.
  // Returns the upload's step, read from the store's table (the store, frozen, cannot answer),
  // or 0 after a minute without one.
  int64_t FreezeStoreMidUpload(const std::string& name, int64_t bytes) {
    const v1::Job running = cluster_->AwaitJob(name, [](const v1::Job& j) {
      return testing::Ended(j) || j.progress().step() > kCheckpointEvery + 10;
    });
    if (testing::Ended(running)) return 0;
    const pid_t store = cluster_->checkpoint_process()->pid();
    const fs::path uploads = fs::path(cluster_->checkpoint_data_dir()) / "uploads";
    const auto held = [](const fs::path& path) {  // -1 once gone (committed)
      std::error_code error;
      const uintmax_t n = fs::file_size(path, error);
      return error ? int64_t{-1} : static_cast<int64_t>(n);
    };
    const auto deadline = Clock::now() + seconds(60);
    while (Clock::now() < deadline) {
      std::error_code error;
      for (const auto& entry : fs::directory_iterator(uploads, error)) {
        kill(store, SIGSTOP);
        const bool early =
            held(entry.path()) >= 0 && held(entry.path()) <= std::max<int64_t>(bytes, 0);
        for (int slice = 0; early && bytes >= 0 && slice < 2000 && held(entry.path()) >= 0 &&
                            held(entry.path()) <= bytes;
             ++slice) {
          kill(store, SIGCONT);
          std::this_thread::sleep_for(std::chrono::microseconds(200));
          kill(store, SIGSTOP);
        }
        if (early && held(entry.path()) > bytes) {
          if (const int64_t step = UploadingStep(name); step > 0) return step;
        }
        kill(store, SIGCONT);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    return 0;
  }

  // Waits at least `at_least`, and until rank 0 has skipped a checkpoint behind the upload of
  // `in_flight` (at most a minute: a loop that waits on the upload never skips); returns it.
  std::optional<Skip> AwaitSkipBehind(const std::string& name, int64_t in_flight,
                                      std::chrono::seconds at_least) {
    const auto start = Clock::now();
    while (Clock::now() < start + seconds(60)) {
      std::this_thread::sleep_for(milliseconds(200));
      const std::vector<Skip> skips = SkipsBehind(name, in_flight);
      if (!skips.empty() && Clock::now() >= start + at_least) return skips.front();
    }
    return std::nullopt;
  }

  // The step of the job's upload in progress, as the checkpoints table holds it; 0 if none.
  int64_t UploadingStep(const std::string& name) {
    db::ConnectionOptions options;
    options.url = cluster_->database_url();
    auto connection = db::Connection::Open(options);
    EXPECT_TRUE(connection.ok()) << connection.status();
    if (!connection.ok()) return 0;
    auto rows = (*connection)
                    ->Exec(
                        "SELECT step FROM checkpoints WHERE job_id = $1::uuid"
                        " AND state = 'UPLOADING'",
                        {name.substr(std::string("jobs/").size())});
    EXPECT_TRUE(rows.ok()) << rows.status();
    if (!rows.ok() || rows->empty()) return 0;
    return rows->row(0).Get<int64_t>("step");
  }

  // The job's step as the api has it from rank 0's progress lines.
  int64_t Step(const std::string& name) { return cluster_->Get(name).progress().step(); }

  // When the api recorded the commit of `step` (CHECKPOINT_COMMITTED); nullopt before.
  std::optional<std::chrono::system_clock::time_point> CommitTime(const std::string& name,
                                                                  int64_t step) {
    for (const v1::JobEvent& e : cluster_->Events(name)) {
      if (e.type() == v1::JobEvent::CHECKPOINT_COMMITTED && e.checkpoint_step() == step) {
        return std::chrono::system_clock::time_point(
            std::chrono::seconds(e.time().seconds()) +
            std::chrono::duration_cast<std::chrono::system_clock::duration>(
                std::chrono::nanoseconds(e.time().nanos())));
      }
    }
    return std::nullopt;
  }

  std::optional<std::chrono::system_clock::time_point> AwaitCommit(const std::string& name,
                                                                   int64_t step) {
    const auto deadline = Clock::now() + seconds(60);
    while (Clock::now() < deadline) {
      if (auto time = CommitTime(name, step)) return time;
      std::this_thread::sleep_for(milliseconds(50));
    }
    return std::nullopt;
  }

  // The job's skips whose upload in flight was `in_flight_step`.
  std::vector<Skip> SkipsBehind(const std::string& name, int64_t in_flight_step) {
    std::vector<Skip> skips;
    for (const v1::JobEvent& e : cluster_->Events(name)) {
      const std::optional<Skip> skip = ParseSkip(e);
      EXPECT_TRUE(skip || e.type() != v1::JobEvent::CHECKPOINT_SKIPPED) << e.message();
      if (skip && skip->in_flight_step == in_flight_step) skips.push_back(*skip);
    }
    return skips;
  }

  // Whatever the store lists is either UPLOADING (never served, never resumed from) or whole:
  // a committed checkpoint downloads in full, matching its size and sha256.
  void ExpectNothingPartialListed(const std::string& name) {
    for (const v1::Checkpoint& c : testing::ListedCheckpoints(*cluster_, name)) {
      if (c.state() != v1::Checkpoint::COMMITTED) continue;
      const std::string bytes = testing::DownloadCheckpoint(*cluster_, c.name());
      EXPECT_EQ(static_cast<int64_t>(bytes.size()), c.size_bytes()) << c.name();
      EXPECT_EQ(Sha256Hex(bytes), c.sha256()) << c.name();
    }
  }

  // The end: SUCCEEDED in the first attempt, bit for bit, every committed checkpoint whole,
  // none left UPLOADING, the last step's the latest.
  void ExpectExactEnd(const std::string& name, const std::string& reference) {
    const v1::Job done = cluster_->AwaitJob(name, testing::Ended, seconds(300));
    ASSERT_EQ(done.state(), v1::Job::SUCCEEDED) << done.state_reason() << cluster_->Describe(name);
    EXPECT_EQ(done.attempt(), 1) << "an outage of the store must not fail the attempt";
    EXPECT_EQ(FinalParameters(*cluster_, name), reference);
    for (const v1::Checkpoint& c : testing::ListedCheckpoints(*cluster_, name)) {
      EXPECT_NE(c.state(), v1::Checkpoint::UPLOADING) << c.name() << " left half-written";
    }
    ExpectNothingPartialListed(name);
    EXPECT_EQ(testing::NewestCommittedStep(*cluster_, name), kSteps);
  }

  void PrintRankZeroCheckpointLines(const std::string& name) {
    for (const std::string& line : cluster_->Logs(name, 1, 0)) {
      if (line.find("checkpoint") != std::string::npos) std::cerr << "rank 0: " << line << "\n";
    }
  }

  int checkpoint_port() const {
    const std::string& address = cluster_->checkpoint_address();
    return std::stoi(address.substr(address.rfind(':') + 1));
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::string reference_job_;  // this cluster's, while it runs
};

// The store's port silent from the middle of an upload until a checkpoint behind it was
// skipped (kOutage at least): the loop trains on and skips, the stream goes on where it
// stopped once packets pass again, and the upload commits.
TEST_F(CheckpointOutageE2eTest, CutOffByAPacketFilterTrainingGoesOnAndTheUploadCompletes) {
  std::string why;
  if (!testing::PacketFilter::Available(&why)) GTEST_SKIP() << why;
  StartReference();
  const std::string name = cluster_->Submit(Spec()).name();
  const int64_t in_flight = FreezeStoreMidUpload(name, /*bytes=*/-1);
  ASSERT_GT(in_flight, 0) << "never saw an upload in flight";
  // Both directions silent, as a partition drops them: the connection sees no reset.
  auto cut = std::make_unique<testing::PacketFilter>();
  cut->DropTcpPort(checkpoint_port());
  kill(cluster_->checkpoint_process()->pid(), SIGCONT);  // up, but unreachable
  const int64_t step_at_cut = Step(name);
  const std::optional<Skip> skip = AwaitSkipBehind(name, in_flight, kOutage);
  // The progress lines before the skip came in with it or before.
  EXPECT_GT(Step(name), step_at_cut) << "training did not go on through the cut";
  EXPECT_FALSE(CommitTime(name, in_flight).has_value()) << "the cut came too late";
  cut.reset();
  ASSERT_TRUE(skip.has_value()) << "no checkpoint skipped: the loop waited for the upload";
  ExpectNothingPartialListed(name);
  ASSERT_TRUE(AwaitCommit(name, in_flight).has_value())
      << "the upload of step " << in_flight << " never committed";
  ExpectExactEnd(name, Reference());
  for (const Skip& later : SkipsBehind(name, in_flight)) EXPECT_GT(later.step, in_flight);
  if (HasFailure()) PrintRankZeroCheckpointLines(name);
}

// The store SIGKILLed mid-upload and started again once a checkpoint behind it was skipped
// (kOutage at least): training goes on meanwhile, and within a second or two of the restart
// the upload resumes at the byte the store held and commits.
TEST_F(CheckpointOutageE2eTest, StoreRestartedMidUploadResumesAtItsOffsetWithinSeconds) {
  StartReference();
  const std::string name = cluster_->Submit(Spec()).name();
  const int64_t in_flight = FreezeStoreMidUpload(name, kSealedChunk);
  ASSERT_GT(in_flight, 0) << "never saw an upload in flight";
  cluster_->KillCheckpointService(SIGKILL);
  const int64_t step_at_kill = Step(name);
  const std::optional<Skip> skip = AwaitSkipBehind(name, in_flight, kOutage);
  EXPECT_GT(Step(name), step_at_kill) << "training did not go on while the store was down";
  EXPECT_FALSE(CommitTime(name, in_flight).has_value()) << "the kill came too late";
  ASSERT_TRUE(cluster_->StartCheckpointService());
  const auto back = std::chrono::system_clock::now();
  ASSERT_TRUE(skip.has_value()) << "no checkpoint skipped: the loop waited for the upload";
  ExpectNothingPartialListed(name);
  const auto committed = AwaitCommit(name, in_flight);
  ASSERT_TRUE(committed.has_value()) << "the upload of step " << in_flight << " never committed";
  // About 8 s before the sink watched its channel between tries (grpc_checkpoint_sink.cc,
  // WaitBeforeRetry), well under a second since.
  const double after = std::chrono::duration<double>(*committed - back).count();
  std::printf("upload of step %lld committed %.2f s after the store was back\n",
              static_cast<long long>(in_flight), after);
  EXPECT_LT(after, 5.0) << "the upload went on late after the store came back";
  ExpectExactEnd(name, Reference());
  // Resumed where the store stopped, not from byte 0.
  static const std::regex kResumed("save step ([0-9]+): resuming the upload at byte ([0-9]+) of");
  int64_t resumed_at = 0;
  for (const std::string& line : cluster_->Logs(name, 1, 0)) {
    std::smatch match;
    if (std::regex_search(line, match, kResumed) && std::stoll(match[1].str()) == in_flight) {
      resumed_at = std::stoll(match[2].str());
    }
  }
  EXPECT_GT(resumed_at, 0) << "the upload of step " << in_flight << " started over";
  if (HasFailure()) PrintRankZeroCheckpointLines(name);
}

}  // namespace
}  // namespace gradhub
