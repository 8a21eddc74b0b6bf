#!/usr/bin/env bash
# What a checkpoint costs the training loop, on the local cluster (deploy/local/cluster.sh):
# the same world-1 job (an MLP whose state is ~160 MiB) trained twice, checkpointing every
# EVERY steps into gradhub-checkpoint, and only at the end.
# - The stall per checkpoint: its snapshot (serializing the state into host memory, measured by
#   the trainer) plus what the EVERY/2 steps after it took beyond the EVERY/2 steps before it,
#   in the same run (measure_stall.sh says why); also the loop time difference between the two
#   runs per checkpoint, which this VM's drift between runs makes noisy. Set against the
#   snapshot and against a plain copy of the same number of bytes (torch clone, Debian's
#   python3-torch) in the same run.
# - The slowdown (issue 37's row: a checkpoint every 100 steps, under 1%, as TorchTitan's async
#   save): what the periodic checkpoints add, over the loop without them.
# The upload (client hash and crc32c, gRPC, and here also the server's receive, crc32c check,
# seal, write) runs beside training, the trainer's side at idle priority
# (async_checkpoint_writer.h). With every core training (the default) it slows the loop only
# by the CPU it still takes. GRADHUB_THREADS=1 (inherited by the trainer through the agent)
# leaves a core to it, as a GPU node's host CPUs would. About 4 minutes for the 2 rounds.
# Usage: [GRADHUB_THREADS=N] [GRADHUB_BENCH_ROUNDS=2] tests/bench/checkpoint/training_stall.sh
#          [BUILD_DIR] [STEPS=600] [EVERY=30]
set -euo pipefail
build_dir="$(realpath "${1:-build}")"
here="$(dirname "$(realpath "$0")")"
exec "$here/../../../deploy/local/cluster.sh" "$build_dir" -- "$here/measure_stall.sh" \
  "${2:-600}" "${3:-30}"
