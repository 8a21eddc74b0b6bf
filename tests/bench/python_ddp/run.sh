#!/usr/bin/env bash
# gradhub's DDP from Python (import gradhub) against PyTorch's DDP (gloo), one script
# (python_ddp.py) run under each, world size 2, same machine and run, one thread per rank,
# PyTorch measured first. Columns:
#   gradhub_ms, ratio      gradhub.DistributedDataParallel, allreduce through shared memory
#                          (init()'s default on one host), and its step time over PyTorch's
#   tcp_ms, tcp_ratio      the same over loopback TCP (init(shared_memory=False)), which is
#                          what PyTorch's gloo backend uses
#   cxx_ms                 the C++ bench (../ddp/bench_ddp) on the same model, batch, world
#                          and steps, shared memory as gradhub_ms; "-" where it has no such
#                          model (the CNN)
#   python_overhead        gradhub_ms / cxx_ms: what the Python front end costs
# Each configuration is measured GRADHUB_BENCH_REPEATS times, the variants interleaved, and
# each column is the median of its repeats (one run apiece swings by +-30% on a shared
# machine). GRADHUB_BENCH_STEPS steps per run, the first fifth warm-up.
# GRADHUB_BENCH_FIXED_MALLOC=1 runs every variant with glibc's mmap and trim thresholds fixed
# (64 MiB, 256 MiB). By default glibc adapts them to what a process freed so far, and some
# runs (of either side, by chance) end up unmapping and faulting in a freed activation or
# gradient buffer every step: bench_ddp's 784-2048x4 MLP then takes 0.10-0.14 s a step
# instead of 0.075, PyTorch's CNN 0.08-0.11 instead of 0.04, with 2-4x the page faults.
# The default keeps glibc's behaviour (what a user's script gets, and what ../ddp/run.sh
# measures); the fixed thresholds compare the DDP implementations without that lottery.
# Usage: run.sh BUILD_DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build_dir="$(realpath "$1")"
bench="$build_dir/bin/bench_ddp"
steps=${GRADHUB_BENCH_STEPS:-60}
repeats=${GRADHUB_BENCH_REPEATS:-3}
world=2
# One BLAS thread per rank, on both sides (see ../ddp/run.sh: Debian's pthreads OpenBLAS
# ignores torch.set_num_threads).
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
export PYTHONPATH="$build_dir/python${PYTHONPATH:+:$PYTHONPATH}"
case "${GRADHUB_BENCH_FIXED_MALLOC:-0}" in
  0) ;;
  1) export MALLOC_MMAP_THRESHOLD_=67108864 MALLOC_TRIM_THRESHOLD_=268435456
     echo "glibc malloc: mmap threshold 64 MiB, trim threshold 256 MiB (GRADHUB_BENCH_FIXED_MALLOC=1)" ;;
  *) echo "GRADHUB_BENCH_FIXED_MALLOC: '$GRADHUB_BENCH_FIXED_MALLOC' is neither 0 nor 1" >&2
     exit 2 ;;
esac
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
seconds() { awk '{print $3}'; }
python_ddp() { /usr/bin/python3 "$here/python_ddp.py" "$1" "$2" "$3" "$world" "$steps" | seconds; }

printf '%-28s %5s %5s %10s %10s %6s %8s %9s %8s %15s\n' model batch world pytorch_ms gradhub_ms \
  ratio tcp_ms tcp_ratio cxx_ms python_overhead
for config in "784-1024-1024-10 64" "784-2048-2048-2048-2048-10 32" "cnn 32"; do
  # shellcheck disable=SC2086  # splits "MODEL BATCH" on purpose
  set -- $config
  refs="" mines="" tcps="" cxxs=""
  for _ in $(seq "$repeats"); do
    refs+="$(python_ddp pytorch "$1" "$2") "
    mines+="$(python_ddp gradhub "$1" "$2") "
    tcps+="$(python_ddp gradhub_tcp "$1" "$2") "
    if [ "$1" != cnn ]; then cxxs+="$("$bench" "$1" "$2" "$world" "$steps" | seconds) "; fi
  done
  ref=$(echo "$refs" | median) mine=$(echo "$mines" | median) tcp=$(echo "$tcps" | median)
  if [ -n "$cxxs" ]; then cxx=$(echo "$cxxs" | median); else cxx=""; fi
  awk -v m="$1" -v b="$2" -v w="$world" -v r="$ref" -v g="$mine" -v t="$tcp" -v c="$cxx" 'BEGIN {
    cxx = (c == "") ? sprintf("%8s %15s", "-", "-") : sprintf("%8.2f %15.3f", c*1000, g/c)
    printf "%-28s %5s %5s %10.2f %10.2f %6.2f %8.2f %9.2f %s\n", m, b, w, r*1000, g*1000, g/r,
      t*1000, t/r, cxx }'
done
echo "targets: ratio and tcp_ratio <= 0.7, python_overhead < 1.05"
