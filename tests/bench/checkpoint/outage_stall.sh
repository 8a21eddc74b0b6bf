#!/usr/bin/env bash
# What an outage of the checkpoint store costs the training loop, on the local cluster
# (deploy/local/cluster.sh): the same world-1 job trained twice per round, checkpointing every
# EVERY steps into gradhub-checkpoint; in one of the two runs the store is SIGKILLed while an
# upload is in flight and started again on the same port and data OUTAGE seconds later (as a
# restarted deployment would be). It reports the stall (the time the loop waited for uploads,
# checkpointWaitSeconds of rank 0's done line, cut run less plain run; and the difference in
# loop time, trainSeconds, which says the same with the machine's noise in it), how long after
# the store was back the interrupted upload was committed (its CHECKPOINT_COMMITTED event), and
# the checkpoints the trainer skipped meanwhile. Rounds alternate which run goes first, so that
# drift in the machine's speed hits both alike.
# Usage: [GRADHUB_BENCH_ROUNDS=4] tests/bench/checkpoint/outage_stall.sh [BUILD_DIR] [STEPS=800]
#          [EVERY=25] [OUTAGE=2]
set -euo pipefail
build_dir="$(realpath "${1:-build}")"
here="$(dirname "$(realpath "$0")")"
exec "$here/../../../deploy/local/cluster.sh" "$build_dir" -- "$here/measure_outage.sh" \
  "${2:-800}" "${3:-25}" "${4:-2}"
