#!/usr/bin/env bash
# Restart latency on the local cluster (deploy/local/cluster.sh: api + 2 agents x 2 slots): one
# long world-4 job (2 ranks a node; or world 2, on one node) whose rank KILL_RANK is SIGKILLed
# KILLS times, each time in the job's current attempt, 1-2 s after that attempt is RUNNING. For
# each kill, from the kill (this host's clock, which the api's event times share) to:
#   - the attempt's RANK_FAILED event (the agent reported the exit, the api judged it),
#   - every survivor of the attempt gone (polled here),
#   - the next attempt's placement (SCHEDULED: every rank of the failed attempt had exited),
#   - the next attempt's RUNNING event (every rank started): the measure of issue 37.
# Prints one line per kill (with the survivor's last log line: how it ended) and a table of
# p50/p95/max. Keeps the api's and agents' logs and every failed attempt's logs under OUT_DIR
# (default: a new /tmp/gradhub-restart-bench-XXXXXX).
# Usage: tests/bench/restart/run.sh [BUILD_DIR] [KILLS (20)] [WORLD (4)] [KILL_RANK (1)] [OUT_DIR]
set -euo pipefail
build_dir="$(realpath "${1:-build}")"
kills="${2:-20}"
world="${3:-4}"
kill_rank="${4:-1}"
out_dir="${5:-$(mktemp -d /tmp/gradhub-restart-bench-XXXXXX)}"
here="$(dirname "$(realpath "$0")")"
mkdir -p "$out_dir"
exec "$here/../../../deploy/local/cluster.sh" "$build_dir" -- \
  "$here/measure.sh" "$kills" "$world" "$kill_rank" "$(realpath "$out_dir")"
