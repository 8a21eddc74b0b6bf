// Running gradhub-trainer jobs as users and agents run them: one process per rank, a file
// store for the rendezvous, and reading what they printed. Shared by the trainer's e2e tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/subprocess.h"

namespace gradhub::testing {

inline std::string WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

// The value of `key` in the trainer's final {"event":"done",...} line.
// The step of the newest ckpt-<step>.gh in `dir` (a --checkpoint-dir), 0 while there is none.
// Tests that kill a run once it has saved wait for a step this far rather than for one file:
// saves run at idle priority where the trainer may raise them back (async_checkpoint_writer.h),
// and on cores other tests keep busy a save can outlast the interval, so the next periodic
// checkpoint is skipped and its file never written.
inline int64_t NewestCheckpointStep(const std::string& dir) {
  int64_t newest = 0;
  std::error_code error;
  static const std::regex kCheckpoint("ckpt-([0-9]+)\\.gh");
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, match, kCheckpoint)) {
      newest = std::max<int64_t>(newest, std::stoll(match[1]));
    }
  }
  return newest;
}

inline std::string DoneField(const std::string& out, const std::string& key) {
  std::smatch match;
  std::regex done(R"(\{"event":"done".*\})");
  if (!std::regex_search(out, match, done)) return "";
  std::string line = match.str();
  std::regex field("\"" + key + "\":\"?([^,\"}]*)");
  return std::regex_search(line, match, field) ? match[1].str() : "";
}

// The argv of rank `rank` of `world`, with one intra-op thread, rendezvous under `scratch`.
inline std::vector<std::string> RankArgv(const std::string& spec, int rank, int world,
                                         const std::string& scratch,
                                         const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {BinaryPath("gradhub-trainer"),
                                   "--spec",
                                   spec,
                                   "--rank",
                                   std::to_string(rank),
                                   "--world-size",
                                   std::to_string(world),
                                   "--threads",
                                   "1"};
  if (world > 1) {
    argv.push_back("--store");
    argv.push_back("file:" + scratch + "/rdzv");
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// Starts `world` trainer processes of one job.
inline std::vector<std::unique_ptr<Subprocess>> StartJob(
    const std::string& spec, int world, const std::string& scratch,
    const std::vector<std::string>& extra = {}) {
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.push_back(std::make_unique<Subprocess>(RankArgv(spec, rank, world, scratch, extra)));
  }
  return ranks;
}

// Runs `world` trainer processes of one job and returns each rank's result.
inline std::vector<RunResult> RunJob(const std::string& spec, int world, const std::string& scratch,
                                     const std::vector<std::string>& extra = {}) {
  std::vector<std::unique_ptr<Subprocess>> ranks = StartJob(spec, world, scratch, extra);
  std::vector<RunResult> results;
  for (auto& rank : ranks) {
    RunResult result;
    result.exit_code = rank->Wait(std::chrono::minutes(5));
    result.out = rank->out();
    result.err = rank->err();
    results.push_back(result);
  }
  std::filesystem::remove_all(scratch + "/rdzv");
  return results;
}

}  // namespace gradhub::testing
