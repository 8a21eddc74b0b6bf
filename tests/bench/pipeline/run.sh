#!/usr/bin/env bash
# Pipeline model parallelism (issue 33): three tables from bench_pipeline (see its header for
# the model and what one run measures). Ranks are processes on this host, one thread each.
#   1. Bubble: balanced stages, S = 2 and 4 stages, M = 1..16 micro-batches, GPipe, 1F1B and
#      1F1B with the deep warm-up (1f1b-deep: what the trainer runs for 1F1B on CPU ranks,
#      gpu_worker/ddp/pipeline/schedule.h);
#      ideal: (S - 1) / (M + S - 1); measured: the share of the step each stage did not spend
#      in its forwards and backwards (StageStepReport::bubble_fraction), mean over the stages;
#      ratio: measured / ideal (the acceptance: within 10%).
#      Two kinds of balanced stages: gemm, each stage 2 identical Linear(1024, 1024) + ReLU
#      layers on micro-batches of 32 rows (a micro-batch's forward and backward take ~10 ms on
#      one core, a message well under 1 ms); sleep, each stage 2 Linear(256, 256) layers that
#      each also sleep 2.5 ms in forward and 5 ms in backward (GRADHUB_BENCH_SLEEP_MS), the
#      same ~15 ms a micro-batch without needing a core, so that S = 4 on 2 cores measures the
#      schedule and the engine rather than the sharing of cores.
#      The ideal takes messages as free. They are not: each micro-batch's activation and
#      gradient cross between stages on the step's critical path, so every message's latency
#      (and its wake-up of a waiting rank) adds to the bubble, more so as M grows. empty_ms is
#      the step time of the same pipeline with no compute (Linear(8, 8), no sleep): what the
#      messages and the engine alone cost a step. The line above the table gives what one
#      message costs at the time: the round trip of 8 floats through gradhub's
#      ProcessGroup::Send/Recv (bench_pipeline pingpong) and through PyTorch's gloo
#      (pytorch_pingpong.py), median and mean of 500.
#   2. Memory, from the M = 8 runs of table 1: the most activation bytes stage 0 (which holds
#      the most) and the last stage held at once, GPipe against 1F1B and its deep warm-up.
#   3. Step time of 2 stages x 2 replicas (1F1B, deep warm-up) against 4-way data parallelism
#      (DistributedDataParallel over the same 4 ranks), same 4-layer model, same global batch.
# Each configuration runs GRADHUB_BENCH_REPEATS times (default 3); each column is the median
# of its repeats. With fewer cores than ranks (S = 4 or 4 ranks on a 2-core VM) ranks share
# cores: compute slows whenever more stages than cores are busy at once, which is more often in
# 1F1B's steady phase than in its warm-up and drain, so the measured bubble drifts from the
# ideal there; the table says how many cores it had.
# bubble.sh runs table 1 alone, short (sleep-balanced stages, 1F1B), for checking a change to the
# messages or the engine.
# Usage: run.sh BUILD_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
micro_rows=${GRADHUB_BENCH_MICRO_ROWS:-32}
cores=$(nproc)

echo "bubble: balanced stages, $micro_rows rows per micro-batch, $cores cores"
read -r ours_median ours_mean < <("$bench" pingpong 500)
read -r torch_median torch_mean < <(/usr/bin/python3 "$(dirname "$0")/pytorch_pingpong.py" 8 500)
awk -v m="$ours_median" -v a="$ours_mean" -v tm="$torch_median" -v ta="$torch_mean" 'BEGIN {
  printf "p2p round trip of 8 floats (median/mean ms): gradhub Send/Recv %.3f/%.3f, PyTorch gloo %.3f/%.3f\n",
    m * 1000, a * 1000, tm * 1000, ta * 1000 }'
printf '%-9s %3s %3s %7s %7s %6s %8s %7s %6s %8s %8s\n' sched S M ideal gemm ratio gemm_ms \
  sleep ratio sleep_ms empty_ms
declare -A peaks
for stages in 2 4; do
  for schedule in gpipe 1f1b 1f1b-deep; do
    for m in 1 2 4 8 16; do
      gemm="" gemm_times="" sleep="" sleep_times="" empty_times="" ideal=""
      for _ in $(seq "$repeats"); do
        read -r step ideal bubbles stage_peaks < <("$bench" "$schedule" "$stages" 1 "$m" \
          $((2 * stages)) $((m * micro_rows)) "$steps")
        gemm+="$(mean_of "$bubbles") " gemm_times+="$step "
        peaks[$schedule/$stages/$m]=$stage_peaks
        read -r step ideal bubbles _ < <(GRADHUB_BENCH_WIDTH=256 GRADHUB_BENCH_SLEEP_MS=2.5 \
          "$bench" "$schedule" "$stages" 1 "$m" $((2 * stages)) $((m * micro_rows)) "$steps")
        sleep+="$(mean_of "$bubbles") " sleep_times+="$step "
        empty_times+="$(GRADHUB_BENCH_WIDTH=8 "$bench" "$schedule" "$stages" 1 "$m" \
          $((2 * stages)) $((m * 4)) "$steps" | awk '{print $1}') "
      done
      awk -v sc="$schedule" -v s="$stages" -v m="$m" -v i="$ideal" \
        -v g="$(echo $gemm | median)" -v gt="$(echo $gemm_times | median)" \
        -v z="$(echo $sleep | median)" -v zt="$(echo $sleep_times | median)" \
        -v e="$(echo $empty_times | median)" 'BEGIN {
          printf "%-9s %3d %3d %7.4f %7.4f %6.3f %8.1f %7.4f %6.3f %8.1f %8.1f\n",
            sc, s, m, i, g, g / i, gt * 1000, z, z / i, zt * 1000, e * 1000 }'
    done
  done
done

echo
echo "activation memory at M = 8 (MiB held at once): 1F1B and its deep warm-up against GPipe"
printf '%3s %13s %12s %12s %11s %11s %10s %10s\n' S gpipe_stage0 1f1b_stage0 deep_stage0 \
  gpipe_last 1f1b/gpipe deep/gpipe deep_last
for stages in 2 4; do
  gpipe=${peaks[gpipe/$stages/8]} onefoneb=${peaks[1f1b/$stages/8]} deep=${peaks[1f1b-deep/$stages/8]}
  awk -v s="$stages" -v g="$gpipe" -v o="$onefoneb" -v d="$deep" 'BEGIN {
    n = split(g, gp, ","); split(o, op, ","); split(d, dp, ",")
    printf "%3d %13.2f %12.2f %12.2f %11.2f %11.3f %10.3f %10.2f\n", s, gp[1] / 1048576,
      op[1] / 1048576, dp[1] / 1048576, gp[n] / 1048576, op[1] / gp[1], dp[1] / gp[1],
      dp[n] / 1048576 }'
done

echo
batch=${GRADHUB_BENCH_BATCH:-256}
echo "step time on 4 ranks, 4 x Linear(1024, 1024), global batch $batch, $cores cores"
printf '%-26s %9s %12s\n' config step_ms vs_data_par
reference=""
for config in "1f1b-deep 1 4 1" "1f1b-deep 2 2 4" "1f1b-deep 2 2 8" "1f1b-deep 4 1 8"; do
  set -- $config
  times=""
  for _ in $(seq "$repeats"); do
    times+="$("$bench" "$1" "$2" "$3" "$4" 4 "$batch" "$steps" | awk '{print $1}') "
  done
  time=$(echo $times | median)
  if [ "$2" = 1 ]; then name="D=4 data parallel"; reference=$time; else name="S=$2 x D=$3 1F1B-deep M=$4"; fi
  awk -v n="$name" -v t="$time" -v r="$reference" 'BEGIN { printf "%-26s %9.1f %12.2f\n", n, t * 1000, t / r }'
done
