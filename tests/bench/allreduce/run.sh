#!/usr/bin/env bash
# Allreduce bus bandwidth, gradhub's GlooProcessGroup against raw Gloo (reference first), same
# machine and run, ranks as processes on loopback. busbw = algbw * 2(n-1)/n. gradhub runs with
# its default 2 channels (contexts that let buckets reduce concurrently) and with 1, which is
# raw Gloo's shape for back-to-back single collectives.
# Usage: run.sh BUILD_DIR
set -euo pipefail
bench="$1/bin/bench_allreduce"
world=${GRADHUB_BENCH_WORLD:-2}
printf '%6s %6s %9s %14s %14s %7s\n' MiB world channels gloo_busbw_GBs gradhub_GBs ratio
for mib in 1 8 25 100; do
  iters=$(( 200 / mib + 10 ))
  ref=$("$bench" gloo "$mib" "$world" "$iters" | awk '{print $4}')
  for channels in 2 1; do
    mine=$(GRADHUB_BENCH_CHANNELS=$channels "$bench" gradhub "$mib" "$world" "$iters" | awk '{print $4}')
    awk -v s="$mib" -v n="$world" -v c="$channels" -v r="$ref" -v g="$mine" 'BEGIN {
      factor = 2 * (n - 1) / n; bytes = s * 1048576
      printf "%6s %6s %9s %14.2f %14.2f %7.2f\n", s, n, c, bytes / r * factor / 1e9, bytes / g * factor / 1e9, r / g }'
  done
done
