#pragma once

#include <string>

#include "gpu_worker/trainer/sinks.h"

namespace gradhub::trainer {

// Checkpoints as files in a directory: ckpt-<step>.gh, each the payload followed by a footer
// with its length and SHA-256, written to a temp file, fsynced and renamed, so a crash leaves
// the previous checkpoint intact and a torn or edited file is detected. Keeps the newest
// `keep_last`.
class LocalCheckpointSink : public CheckpointSink {
 public:
  LocalCheckpointSink(std::string directory, int keep_last);
  void Save(const Checkpoint& checkpoint) override;
  std::optional<Checkpoint> LoadLatest() override;

 private:
  std::string directory_;
  int keep_last_;
};

}  // namespace gradhub::trainer
