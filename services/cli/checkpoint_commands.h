// `gradhub checkpoints ...`: the commands that talk to gradhub-checkpoint
// (--checkpoint-server) rather than gradhub-api. Listed in AllCommands (commands.cc).
#pragma once

#include <string>

#include "services/cli/invocation.h"

namespace gradhub::cli {

// `checkpoints list JOB`: a job's checkpoints, newest step first.
int CheckpointsList(Invocation& inv);

// `checkpoints download NAME -o FILE`:
//   1. stream the checkpoint into FILE.tmp, checking it as it arrives (services/common/
//      blob_check.h: against the crc32c the server announces where the checkpoint has one,
//      else the sha256);
//   2. when the stream breaks (UNAVAILABLE, a reset connection), ask once more from the offset
//      already written, so a large download does not start over;
//   3. compare that check with the bytes written; after a mismatch, do
//      1.-3. once more from the start with verify_sha256, so that the server hashes the bytes
//      it holds too (it checks only their CRC-32C otherwise) and marks the checkpoint BAD if
//      they are the ones that differ; a second mismatch, or the server's DATA_LOSS, removes
//      FILE.tmp and fails;
//   4. rename FILE.tmp to FILE, so FILE is either absent or a whole, verified checkpoint.
int CheckpointsDownload(Invocation& inv);

// NAME as users type it: `jobs/<id>/checkpoints/<step>`. Empty for anything else.
std::string CheckpointName(const std::string& arg);

}  // namespace gradhub::cli
