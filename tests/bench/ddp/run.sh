#!/usr/bin/env bash
# DDP step time, gradhub against PyTorch DDP (Debian's python3-torch, gloo), same machine and
# run, one thread per rank, PyTorch measured first. gradhub runs as by default on one host,
# allreducing through shared memory (gradhub_ms, ratio); at world size 2 also over loopback TCP
# (tcp_ms, tcp_ratio), which is what PyTorch's gloo backend uses. Each configuration is
# measured GRADHUB_BENCH_REPEATS times, the variants interleaved, and each column is the median
# of its repeats: one run apiece swings by +-30% on a shared machine. Usage: run.sh BUILD_DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bench="$1/bin/bench_ddp"
allreduce="$1/bin/bench_allreduce"
steps=${GRADHUB_BENCH_STEPS:-60}
repeats=${GRADHUB_BENCH_REPEATS:-3}
# One thread per rank means one BLAS thread too: Debian's libtorch uses the pthreads build of
# OpenBLAS, whose pool at::set_num_threads / torch.set_num_threads do not resize, so without
# this each rank runs its GEMMs on every core and spins in sched_yield between them, on both
# sides of the comparison.
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
printf '%-28s %5s %6s %11s %11s %7s %9s %9s\n' model batch world pytorch_ms gradhub_ms ratio tcp_ms tcp_ratio
declare -A ours pairs reduction
# The mean step time of two world-1 runs started together: no communication at all, so what
# one run loses to the other is what sharing this machine's cores, caches and memory costs;
# world-1 alone over it is the scaling efficiency a world-2 job could reach here.
two_at_once() {
  local first second
  first="$(mktemp)" second="$(mktemp)"
  "$bench" "$1" "$2" 1 "$steps" >"$first" &
  "$bench" "$1" "$2" 1 "$steps" >"$second"
  wait
  awk '{sum += $3} END {print sum / NR}' "$first" "$second"
  rm -f "$first" "$second"
}
# GRADHUB_BENCH_MODES_ONLY=1 skips this table (for the efficiency table below alone).
configs=("784-1024-1024-10 64" "784-2048-2048-2048-2048-10 32")
if [ -n "${GRADHUB_BENCH_MODES_ONLY:-}" ]; then configs=(); fi
for config in "${configs[@]}"; do
  set -- $config
  for world in 1 2; do
    refs="" mines="" tcps="" pair="" reductions=""
    for _ in $(seq "$repeats"); do
      if [ "$world" = 1 ]; then pair+="$(two_at_once "$1" "$2") "; fi
      refs+="$(/usr/bin/python3 "$here/pytorch_ddp.py" "$1" "$2" "$world" "$steps" | awk '{print $3}') "
      line="$("$bench" "$1" "$2" "$world" "$steps")"
      mines+="$(echo "$line" | awk '{print $3}') "
      if [ "$world" -gt 1 ]; then
        tcps+="$(GRADHUB_BENCH_SHARED_MEMORY=0 "$bench" "$1" "$2" "$world" "$steps" | awk '{print $3}') "
        # One in-place shared-memory allreduce of the step's gradient bytes (whole MiB), alone:
        # CPU work that world 1 does not have and that no idle core can hide here.
        mib=$(echo "$line" | awk '{m = int($4 / 1048576 + 0.5); print (m < 1) ? 1 : m}')
        reductions+="$("$allreduce" shm-inplace "$mib" 2 50 | awk '{print $4}') "
      fi
    done
    if [ -n "$reductions" ]; then reduction[$1]=$(echo "$reductions" | median); fi
    ref=$(echo "$refs" | median)
    mine=$(echo "$mines" | median)
    ours[$1/$world]=$mine
    if [ "$world" = 1 ]; then pairs[$1]=$(echo "$pair" | median); fi
    if [ -n "$tcps" ]; then tcp=$(echo "$tcps" | median); else tcp=""; fi
    awk -v m="$1" -v b="$2" -v w="$world" -v r="$ref" -v g="$mine" -v t="$tcp" 'BEGIN {
      tcp = (t == "") ? sprintf("%9s %9s", "-", "-") : sprintf("%9.2f %9.2f", t*1000, t/r)
      printf "%-28s %5s %6s %11.2f %11.2f %7.2f %s\n", m, b, w, r*1000, g*1000, g/r, tcp }'
  done
  # Scaling efficiency: world-2 throughput over twice world-1 throughput (same batch per rank),
  # and the machine's ceilings for it: two world-1 runs at once (two_at_once: the cores and
  # memory shared, no communication), and that plus one in-place allreduce of the step's
  # gradients (its CPU work has no idle core to hide on when every core trains).
  awk -v m="$1" -v one="${ours[$1/1]}" -v two="${ours[$1/2]}" -v pair="${pairs[$1]}" \
    -v red="${reduction[$1]}" \
    'BEGIN { printf "  gradhub scaling efficiency %s: %.2f (two world-1 runs at once: %.2f; with one allreduce of the gradients, %.2f ms: %.2f)\n",
             m, one/two, one/pair, red * 1000, one/(pair + red) }'
done

# Engine efficiency modes at world size 2 on the 784-2048x4 MLP, each against PyTorch's own
# (see pytorch_ddp.py), over shared memory (gradhub_ms) and loopback TCP (tcp_ms); bytes is
# what rank 0 hands to collectives per step (gradient allreduces, ZeRO's parameter
# broadcasts, local SGD's averages over 8 steps); vs_plain is gradhub's step time over its
# plain DDP's, same transport. GRADHUB_BENCH_MODES picks the modes.
echo
printf '%-10s %11s %11s %9s %9s %14s %9s\n' mode pytorch_ms gradhub_ms ratio tcp_ms bytes_per_step vs_plain
model=784-2048-2048-2048-2048-10 batch=32
plain_shm="" plain_tcp=""
for mode in ${GRADHUB_BENCH_MODES:-plain bf16 zero localsgd8 powersgd4}; do
  refs="" mines="" tcps="" bytes=""
  for _ in $(seq "$repeats"); do
    refs+="$(/usr/bin/python3 "$here/pytorch_ddp.py" $model $batch 2 "$steps" "$mode" | awk '{print $3}') "
    line=$("$bench" $model $batch 2 "$steps" "$mode")
    mines+="$(echo "$line" | awk '{print $3}') "
    bytes=$(echo "$line" | awk '{print $4}')
    tcps+="$(GRADHUB_BENCH_SHARED_MEMORY=0 "$bench" $model $batch 2 "$steps" "$mode" | awk '{print $3}') "
  done
  ref=$(echo "$refs" | median) mine=$(echo "$mines" | median) tcp=$(echo "$tcps" | median)
  if [ "$mode" = plain ]; then plain_shm=$mine plain_tcp=$tcp; fi
  awk -v m="$mode" -v r="$ref" -v g="$mine" -v t="$tcp" -v b="$bytes" -v ps="$plain_shm" -v pt="$plain_tcp" 'BEGIN {
    vs = (ps == "") ? "-" : sprintf("%.2f/%.2f", g/ps, t/pt)
    printf "%-10s %11.2f %11.2f %9.2f %9.2f %14d %9s\n", m, r*1000, g*1000, g/r, t*1000, b, vs }'
done
