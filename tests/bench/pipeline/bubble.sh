#!/usr/bin/env bash
# The bubble table of run.sh, short: for checking a change to the messages or the engine in a
# few minutes rather than run.sh's half hour. Sleep-balanced stages only (see run.sh, table 1:
# each layer sleeps 2.5 ms in forward and 5 ms in backward, so the ranks need no cores to
# "compute"; GRADHUB_BENCH_SLEEP_MS scales them, default 2.5), the schedules in
# GRADHUB_BENCH_SCHEDULES (default "1f1b 1f1b-deep"), S = 2 and 4, M = 1..16,
# each the median of GRADHUB_BENCH_REPEATS runs (default 3); empty_ms is the step time of the
# same pipeline with no compute. The line above the table alternates gradhub's and PyTorch's
# p2p round trip of 8 floats GRADHUB_BENCH_PINGPONGS times (default 3) and gives the median of
# each side's medians, so that both see the same load.
# Usage: bubble.sh BUILD_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
pingpongs=${GRADHUB_BENCH_PINGPONGS:-3}
schedules=${GRADHUB_BENCH_SCHEDULES:-1f1b 1f1b-deep}
sleep_ms=${GRADHUB_BENCH_SLEEP_MS:-2.5}

ours="" torch=""
for _ in $(seq "$pingpongs"); do
  ours+="$("$bench" pingpong 500 | awk '{print $1}') "
  torch+="$(/usr/bin/python3 "$(dirname "$0")/pytorch_pingpong.py" 8 500 | awk '{print $1}') "
done
awk -v o="$(echo $ours | median)" -v t="$(echo $torch | median)" -v n="$pingpongs" 'BEGIN {
  printf "p2p round trip of 8 floats, median of %d medians (ms): gradhub %.3f, PyTorch gloo %.3f (%.2fx)\n",
    n, o * 1000, t * 1000, o / t }'
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
printf '%-9s %3s %3s %7s %8s %6s %8s %8s\n' sched S M ideal measured ratio step_ms empty_ms
for stages in 2 4; do
  for schedule in $schedules; do
    for m in 1 2 4 8 16; do
      bubbles="" times="" empty_times="" ideal=""
      for _ in $(seq "$repeats"); do
        read -r step ideal stage_bubbles _ < <(GRADHUB_BENCH_WIDTH=256 GRADHUB_BENCH_SLEEP_MS=$sleep_ms \
          "$bench" "$schedule" "$stages" 1 "$m" $((2 * stages)) $((m * 32)) "$steps")
        bubbles+="$(mean_of "$stage_bubbles") " times+="$step "
        empty_times+="$(GRADHUB_BENCH_WIDTH=8 "$bench" "$schedule" "$stages" 1 "$m" \
          $((2 * stages)) $((m * 4)) "$steps" | awk '{print $1}') "
      done
      awk -v sc="$schedule" -v s="$stages" -v m="$m" -v i="$ideal" -v b="$(echo $bubbles | median)" \
        -v t="$(echo $times | median)" -v e="$(echo $empty_times | median)" 'BEGIN {
          printf "%-9s %3d %3d %7.4f %8.4f %6.3f %8.1f %8.1f\n", sc, s, m, i, b, b / i, t * 1000,
            e * 1000 }'
    done
  done
done
