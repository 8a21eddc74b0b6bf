#!/usr/bin/env bash
# Allreduce bus bandwidth, gradhub's GlooProcessGroup against raw Gloo (reference first), same
# machine and run, ranks as processes on one host. busbw = algbw * 2(n-1)/n. Columns: raw Gloo
# (ring over loopback TCP), gradhub over the same TCP ring (shared memory off), gradhub's
# default on one host, its shared-memory allreduce, and gradhub over TCP with every message
# sealed (GlooOptions::encrypt_traffic, a job's distributed.encryptTraffic); the ratios are
# gradhub's busbw over raw Gloo's, and the sealed path's over the plain TCP one's (what
# encryption costs). shm/memcpy sets the shared-memory allreduce's busbw against one core's
# memcpy bandwidth (bytes copied per second, one process) measured in the same run: the
# shared-memory path is bounded by memory traffic, not by a network. inplace is the same group
# on a tensor from AllocateCollectiveBuffer (in shared memory every rank maps, as the Reducer's
# gradient buckets are), reduced in place with nothing staged; inplace/memcpy is its busbw
# against the same memcpy. Each size is measured GRADHUB_BENCH_REPEATS times, the variants
# interleaved (reference first each time), and each column is the median of its repeats: one
# run apiece swings by +-30% on a shared machine.
# Then point to point between two ranks (pipeline stages): each sends MIB to the other and
# receives MIB from it at once; GB/s is MIB over the exchange's time, per direction, plain
# and sealed (medians of as many repeats).
# Usage: run.sh BUILD_DIR
set -euo pipefail
bench="$1/bin/bench_allreduce"
world=${GRADHUB_BENCH_WORLD:-2}
repeats=${GRADHUB_BENCH_REPEATS:-5}
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
printf '%6s %6s %14s %10s %10s %10s %9s %9s %12s %11s %11s %11s %14s\n' MiB world gloo_busbw_GBs \
  tcp_GBs shm_GBs sealed_GBs tcp_ratio shm_ratio sealed/tcp memcpy_GBs shm/memcpy inplace_GBs \
  inplace/memcpy
for mib in ${GRADHUB_BENCH_SIZES:-1 8 25 100}; do
  iters=$(( 200 / mib + 10 ))
  ref="" tcp="" shm="" sealed="" copy="" inplace=""
  for _ in $(seq "$repeats"); do
    copy+="$("$bench" memcpy "$mib" 1 "$iters" | awk '{print $4}') "
    ref+="$("$bench" gloo "$mib" "$world" "$iters" | awk '{print $4}') "
    tcp+="$("$bench" tcp "$mib" "$world" "$iters" | awk '{print $4}') "
    shm+="$("$bench" shm "$mib" "$world" "$iters" | awk '{print $4}') "
    inplace+="$("$bench" shm-inplace "$mib" "$world" "$iters" | awk '{print $4}') "
    sealed+="$("$bench" sealed "$mib" "$world" "$iters" | awk '{print $4}') "
  done
  awk -v s="$mib" -v n="$world" -v r="$(echo $ref | median)" -v t="$(echo $tcp | median)" \
    -v m="$(echo $shm | median)" -v e="$(echo $sealed | median)" \
    -v c="$(echo $copy | median)" -v p="$(echo $inplace | median)" 'BEGIN {
      bus = s * 1048576 * 2 * (n - 1) / n / 1e9
      copied = s * 1048576 / 1e9
      printf "%6s %6s %14.2f %10.2f %10.2f %10.2f %9.2f %9.2f %12.2f %11.2f %11.2f %11.2f %14.2f\n",
        s, n, bus / r, bus / t, bus / m, bus / e, r / t, r / m, t / e, copied / c,
        (bus / m) / (copied / c), bus / p, (bus / p) / (copied / c) }'
done
printf '\n%6s %12s %16s %12s\n' MiB p2p_GBs p2p_sealed_GBs sealed/plain
for mib in 1 25; do
  iters=$(( 200 / mib + 10 ))
  plain="" sealed=""
  for _ in $(seq "$repeats"); do
    plain+="$("$bench" p2p "$mib" 2 "$iters" | awk '{print $4}') "
    sealed+="$("$bench" p2p-sealed "$mib" 2 "$iters" | awk '{print $4}') "
  done
  awk -v s="$mib" -v p="$(echo $plain | median)" -v e="$(echo $sealed | median)" 'BEGIN {
      bytes = s * 1048576 / 1e9
      printf "%6s %12.2f %16.2f %12.2f\n", s, bytes / p, bytes / e, p / e }'
done
