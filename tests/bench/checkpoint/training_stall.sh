#!/usr/bin/env bash
# What a checkpoint costs the training loop, on the local cluster (deploy/local/cluster.sh):
# the same world-1 job (an MLP whose state is ~TARGET_MB) trained twice, checkpointing every
# EVERY steps into gradhub-checkpoint, and only at the end. The stall per checkpoint is the
# difference in loop time divided by the checkpoints taken; it is set against the snapshot
# (serializing the state into host memory, measured by the trainer) and against a plain copy
# of the same number of bytes (torch clone, Debian's python3-torch) in the same run.
# The upload (client hash and crc32c, gRPC, and here also the server's receive, crc32c check,
# write and fsync) runs beside training; with every core training (the default) it slows the
# loop by taking CPU, not by blocking it. GRADHUB_THREADS=1 (inherited by the trainer through
# the agent) leaves a core to it, as a GPU node's host CPUs would.
# A second row is the training slowdown: loop time with a checkpoint every EVERY steps over
# loop time with only the final one (the issue's row: every 100 steps, target under 1%, as
# TorchTitan's async save). For it: training_stall.sh build 400 100 (3 checkpoints more than
# the final one; about 5 minutes for 2 rounds).
# Usage: [GRADHUB_THREADS=N] [GRADHUB_BENCH_ROUNDS=3] tests/bench/checkpoint/training_stall.sh
#          [BUILD_DIR] [STEPS] [EVERY]
set -euo pipefail
build_dir="$(realpath "${1:-build}")"
here="$(dirname "$(realpath "$0")")"
exec "$here/../../../deploy/local/cluster.sh" "$build_dir" -- "$here/measure_stall.sh" \
  "${2:-120}" "${3:-20}"
