#!/usr/bin/env bash
# Scheduling latency on the local cluster (deploy/local/cluster.sh: api + 2 agents x 2 slots):
#   - CreateJob to every rank started (the job's RUNNING event), over small world-2 jobs;
#   - a rank's death (SIGKILL) to the next attempt's ranks all started;
#   - the first again with BACKLOG jobs PENDING in the queue (unplaceable: a node label no node
#     has), which every scheduler pass has to look at.
# Times come from the api's own event timestamps. Prints a table.
# Usage: tests/bench/scheduling/run.sh [BUILD_DIR] [JOBS] [BACKLOG (20000; 0 = skip)]
set -euo pipefail
build_dir="$(realpath "${1:-build}")"
jobs="${2:-50}"
backlog="${3:-20000}"
here="$(dirname "$(realpath "$0")")"
exec "$here/../../../deploy/local/cluster.sh" "$build_dir" -- "$here/measure.sh" "$jobs" "$backlog"
