#!/usr/bin/env bash
# Runs inside deploy/local/cluster.sh (see training_stall.sh): GRADHUB_SERVER, GRADHUB_TOKEN,
# GRADHUB_BIN are set.
set -euo pipefail
steps="$1"
every="$2"
gradhub="$GRADHUB_BIN/gradhub"
py=/usr/bin/python3
spec="$(mktemp)"
logs="$(mktemp -d)"
trap 'rm -rf "$spec" "$logs"' EXIT
# GRADHUB_BENCH_KEEP=DIR keeps each run's log (the progress lines) there.
# 1024x4096 + 4096x4096 + 4096x10 floats, twice (momentum): ~200 MiB of state.
write_spec() {  # $1 = checkpoint.everySteps
  cat > "$spec" <<YAML
model: {mlp: {layers: [1024, 4096, 4096, 10]}}
dataset: {synthetic: {numSamples: 4096, numFeatures: 1024, numClasses: 10}}
optimizer: {sgd: {lr: 0.01, momentum: 0.9}}
batchSizePerRank: 32
maxSteps: $steps
logEverySteps: 1
checkpoint: {everySteps: $1, keepLast: 2}
distributed: {worldSize: 1}
YAML
}
# Writes rank 0's progress lines and done line of a finished job into file $2, its whole log
# into $2.log, and the priority its saves ran at into $2.priority.
run_job() {
  write_spec "$1"
  job="$("$gradhub" submit -f "$spec")"
  "$gradhub" watch "$job" >/dev/null 2>&1 || true
  for _ in $(seq 50); do
    "$gradhub" logs "$job" --rank 0 > "$2.log" || true
    grep '"event":"\(progress\|done\)"' "$2.log" | sed 's/^[^{]*//' > "$2" || true
    if grep -q '"event":"done"' "$2"; then
      # async_checkpoint_writer.h, step 3d: idle only where the rank may raise a save again.
      if grep -q "checkpoints are saved at normal priority" "$2.log"; then
        echo normal > "$2.priority"
      else
        echo idle > "$2.priority"
      fi
      [ -n "${GRADHUB_BENCH_KEEP:-}" ] && cp "$2" "$GRADHUB_BENCH_KEEP/${job##*/}.log"
      return 0
    fi
    sleep 0.2
  done
  echo "no done line for $job" >&2; return 1
}
# One run per round; the figures pool every periodic checkpoint of every round.
rounds="${GRADHUB_BENCH_ROUNDS:-2}"
runs=()
for round in $(seq "$rounds"); do
  run_job "$every" "$logs/$round"
  runs+=("$logs/$round")
done
echo "saves ran at $(sort -u "$logs"/*.priority | paste -sd/) priority (rank 0's log)"
"$py" - "$steps" "$every" "${runs[@]}" <<'PY'
import json, os, statistics, sys, time, torch
torch.set_num_threads(1)
steps, every = int(sys.argv[1]), int(sys.argv[2])

def parse(path):  # a job's progress lines and done line
    records = [json.loads(line) for line in open(path)]
    return {"steps": [r["stepSeconds"] for r in records if r["event"] == "progress"],
            **next(r for r in records if r["event"] == "done")}

runs = [parse(path) for path in sys.argv[3:]]
size = runs[0]["checkpointBytes"]
src = torch.empty(size, dtype=torch.uint8).fill_(1)
copies = []
for _ in range(5):
    t = time.perf_counter(); dst = src.clone(); copies.append(time.perf_counter() - t)
copy = sorted(copies)[2]

# What a checkpoint taken after step c cost the loop: its snapshot, plus what steps c+1..c+W
# took beyond steps c-W+1..c just before it (W = EVERY / 2: the upload runs beside the first
# of them). Within one run, so that the loop's drift between runs on this VM (5-10%, more than
# a checkpoint costs) cancels; paired with the window just before, so that the drift within a
# run does too. A step that other work on the machine slows lands in either window alike:
# that noise shrinks with the number of checkpoints, hence many of them, and the standard
# error beside the mean. Periodic checkpoints only, once W steps of warm-up have passed.
w = every // 2
stalls = []
for run in runs:
    t, snapshot = run["steps"], run["checkpointSnapshotSeconds"] / run["checkpoints"]
    stalls += [snapshot + sum(t[c:c + w]) - sum(t[c - w:c])
               for c in range(every, len(t) - w + 1, every) if c - w >= 10]
mean, error = statistics.mean(stalls), statistics.stdev(stalls) / len(stalls) ** 0.5
snapshot = statistics.median(r["checkpointSnapshotSeconds"] / r["checkpoints"] for r in runs)
wait = statistics.median(r["checkpointWaitSeconds"] / r["checkpoints"] for r in runs)
step = statistics.median(statistics.median(r["steps"][10:]) for r in runs)
skipped = sum(r.get("checkpointsSkipped", 0) for r in runs)
print("| checkpoint MiB | periodic checkpoints | stall per ckpt s: mean +- standard error (median) | snapshot s | waited s | plain copy s (ref) | stall / snapshot | stall / copy | skipped |")
print("|---|---|---|---|---|---|---|---|---|")
print("| %.0f | %d in %d runs | %.3f +- %.3f (%.3f) | %.3f | %.3f | %.3f | %.2f | %.2f | %d |" % (
    size / 2**20, len(stalls), len(runs), mean, error, statistics.median(stalls), snapshot, wait,
    copy, mean / snapshot, mean / copy, skipped))
# The slowdown (issue 37's row: a checkpoint every 100 steps, under 1%, as TorchTitan's async
# save): one stall per interval of that many steps at the loop's median step time. Measured
# this way rather than as two runs' loop times, whose drift on this VM (5-10%) is larger than
# the figure.
print()
print("| slowdown | stall per ckpt s | median step s | every %d steps | every 100 steps | target (every 100) | verdict |" % every)
print("|---|---|---|---|---|---|---|")
# GRADHUB_THREADS (training_stall.sh) below the cores leaves the upload cores of its own.
threads, cores = int(os.environ.get("GRADHUB_THREADS") or 0), os.cpu_count()
training = ("every core training" if threads == 0 or threads >= cores
            else "%d of %d cores training" % (threads, cores))
print("| %.0f MiB, %s | %.3f | %.4f | %.2f%% | %.2f%% | < 1%% | %s |" % (
    size / 2**20, training, mean, step, 100 * mean / (every * step), mean / step,
    "ok" if mean / step < 1 else "MISS"))
print("stall per ckpt s: " + ", ".join("%.3f" % s for s in stalls))
PY
