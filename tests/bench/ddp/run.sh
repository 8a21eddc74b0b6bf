#!/usr/bin/env bash
# DDP step time, gradhub against PyTorch DDP (Debian's python3-torch, gloo), same machine and
# run, one thread per rank, PyTorch measured first. Usage: run.sh BUILD_DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bench="$1/bin/bench_ddp"
steps=${GRADHUB_BENCH_STEPS:-60}
median() { awk '{print $3}'; }
printf '%-22s %5s %6s %12s %12s %7s\n' model batch world pytorch_ms gradhub_ms ratio
declare -A ours
for config in "784-1024-1024-10 64" "784-2048-2048-2048-2048-10 32"; do
  set -- $config
  for world in 1 2; do
    ref=$(/usr/bin/python3 "$here/pytorch_ddp.py" "$1" "$2" "$world" "$steps" | median)
    mine=$("$bench" "$1" "$2" "$world" "$steps" | median)
    ours[$1/$world]=$mine
    awk -v m="$1" -v b="$2" -v w="$world" -v r="$ref" -v g="$mine" \
      'BEGIN { printf "%-22s %5s %6s %12.2f %12.2f %7.2f\n", m, b, w, r*1000, g*1000, g/r }'
  done
  # Scaling efficiency: world-2 throughput over twice world-1 throughput (same batch per rank).
  awk -v m="$1" -v one="${ours[$1/1]}" -v two="${ours[$1/2]}" \
    'BEGIN { printf "  gradhub scaling efficiency %s: %.2f\n", m, one/two }'
done
