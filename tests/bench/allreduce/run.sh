#!/usr/bin/env bash
# Allreduce bus bandwidth, gradhub's GlooProcessGroup against raw Gloo (reference first), same
# machine and run, ranks as processes on loopback. busbw = algbw * 2(n-1)/n. gradhub runs with
# 2 channels (contexts that let buckets reduce concurrently) and with its default 1, which is
# raw Gloo's shape for back-to-back single collectives. Each size is measured
# GRADHUB_BENCH_REPEATS times, the three variants interleaved (reference first each time), and
# each column is the median of its repeats: one run apiece swings by +-30% on a shared machine.
# Usage: run.sh BUILD_DIR
set -euo pipefail
bench="$1/bin/bench_allreduce"
world=${GRADHUB_BENCH_WORLD:-2}
repeats=${GRADHUB_BENCH_REPEATS:-5}
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
printf '%6s %6s %9s %14s %14s %7s\n' MiB world channels gloo_busbw_GBs gradhub_GBs ratio
for mib in 1 8 25 100; do
  iters=$(( 200 / mib + 10 ))
  ref="" mine2="" mine1=""
  for _ in $(seq "$repeats"); do
    ref+="$("$bench" gloo "$mib" "$world" "$iters" | awk '{print $4}') "
    mine2+="$(GRADHUB_BENCH_CHANNELS=2 "$bench" gradhub "$mib" "$world" "$iters" | awk '{print $4}') "
    mine1+="$(GRADHUB_BENCH_CHANNELS=1 "$bench" gradhub "$mib" "$world" "$iters" | awk '{print $4}') "
  done
  r=$(echo $ref | tr ' ' '\n' | median)
  for channels in 2 1; do
    if [ "$channels" = 2 ]; then mine=$mine2; else mine=$mine1; fi
    g=$(echo $mine | tr ' ' '\n' | median)
    awk -v s="$mib" -v n="$world" -v c="$channels" -v r="$r" -v g="$g" 'BEGIN {
      factor = 2 * (n - 1) / n; bytes = s * 1048576
      printf "%6s %6s %9s %14.2f %14.2f %7.2f\n", s, n, c, bytes / r * factor / 1e9, bytes / g * factor / 1e9, r / g }'
  done
done
