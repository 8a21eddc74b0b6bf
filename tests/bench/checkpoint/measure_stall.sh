#!/usr/bin/env bash
# Runs inside deploy/local/cluster.sh (see training_stall.sh): GRADHUB_SERVER, GRADHUB_TOKEN,
# GRADHUB_BIN are set.
set -euo pipefail
steps="$1"
every="$2"
gradhub="$GRADHUB_BIN/gradhub"
py=/usr/bin/python3
spec="$(mktemp)"
trap 'rm -f "$spec"' EXIT
# 1024x4096 + 4096x4096 + 4096x10 floats, twice (momentum): ~200 MiB of state.
write_spec() {  # $1 = checkpoint.everySteps (0 = only at the end)
  cat > "$spec" <<YAML
model: {mlp: {layers: [1024, 4096, 4096, 10]}}
dataset: {synthetic: {numSamples: 4096, numFeatures: 1024, numClasses: 10}}
optimizer: {sgd: {lr: 0.01, momentum: 0.9}}
batchSizePerRank: 32
maxSteps: $steps
logEverySteps: 10
checkpoint: {everySteps: $1, keepLast: 2}
distributed: {worldSize: 1}
YAML
}
# The done line of rank 0 of a finished job.
run_job() {
  write_spec "$1"
  job="$("$gradhub" submit -f "$spec")"
  "$gradhub" watch "$job" >/dev/null 2>&1 || true
  for _ in $(seq 50); do
    line="$("$gradhub" logs "$job" --rank 0 | grep '"event":"done"' | sed 's/^[^{]*//' || true)"
    [ -n "$line" ] && { echo "$line"; return 0; }
    sleep 0.2
  done
  echo "no done line for $job" >&2; return 1
}
# Rounds of both runs, in alternating order, so that drift in the machine's speed (this VM's
# loop time wanders by 5-10% between runs) hits both alike; the stall is the median of the
# rounds' differences.
rounds="${GRADHUB_BENCH_ROUNDS:-3}"
runs=()
for round in $(seq "$rounds"); do
  if [ $((round % 2)) = 1 ]; then
    with="$(run_job "$every")"; without="$(run_job 0)"
  else
    without="$(run_job 0)"; with="$(run_job "$every")"
  fi
  runs+=("$with" "$without")
done
"$py" - "$steps" "$every" "${runs[@]}" <<'PY'
import json, statistics, sys, time, torch
torch.set_num_threads(1)
steps, every = int(sys.argv[1]), int(sys.argv[2])
runs = [json.loads(a) for a in sys.argv[3:]]
pairs = list(zip(runs[0::2], runs[1::2]))
size = pairs[0][0]["checkpointBytes"]
src = torch.empty(size, dtype=torch.uint8).fill_(1)
copies = []
for _ in range(5):
    t = time.perf_counter(); dst = src.clone(); copies.append(time.perf_counter() - t)
copy = sorted(copies)[2]
stalls, snapshots, waits = [], [], []
for w, wo in pairs:
    extra = w["checkpoints"] - wo["checkpoints"]
    stalls.append((w["trainSeconds"] - wo["trainSeconds"]) / extra)
    snapshots.append(w["checkpointSnapshotSeconds"] / w["checkpoints"])
    waits.append(w["checkpointWaitSeconds"] / w["checkpoints"])
stall, snapshot, wait = (statistics.median(x) for x in (stalls, snapshots, waits))
w, wo = pairs[0]
print("| checkpoint MiB | checkpoints | rounds | stall per ckpt s (median) | snapshot s | waited s | plain copy s (ref) | stall / snapshot | stall / copy |")
print("|---|---|---|---|---|---|---|---|---|")
print("| %.0f | %d / %d | %d | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f |" % (
    size / 2**20, w["checkpoints"], wo["checkpoints"], len(pairs), stall, snapshot, wait, copy,
    stall / snapshot, stall / copy))
# The slowdown, the issue's row (a checkpoint every 100 steps, target under 1%, TorchTitan's
# async save): the loop time with checkpoints every EVERY steps over the loop time with only
# the final one; both runs save the final checkpoint, so the row is what the periodic ones
# add. Per round (the median and range), and fastest run over fastest run: other work on the
# machine only ever adds time to a run, so the fastest of each is the least disturbed (on this
# shared 2-core VM one run in a few takes 20-60% longer).
slowdowns = [100 * (w["trainSeconds"] / wo["trainSeconds"] - 1) for w, wo in pairs]
fastest = 100 * (min(w["trainSeconds"] for w, _ in pairs) /
                 min(wo["trainSeconds"] for _, wo in pairs) - 1)
skipped = max(w.get("checkpointsSkipped", 0) for w, _ in pairs)
print()
print("| slowdown, checkpoint every %d steps vs only at the end | loop s with / without (fastest) | slowdown %%, fastest / fastest | per round: median (range) | skipped | target | verdict |" % every)
print("|---|---|---|---|---|---|---|")
print("| %d steps, %.0f MiB | %.2f / %.2f | %.2f | %.2f (%.2f to %.2f) | %d | < 1%% | %s |" % (
    steps, size / 2**20, min(w["trainSeconds"] for w, _ in pairs),
    min(wo["trainSeconds"] for _, wo in pairs), fastest, statistics.median(slowdowns),
    min(slowdowns), max(slowdowns), skipped, "ok" if fastest < 1 else "MISS"))
print("rounds: loop s with / without: " + ", ".join(
    "%.2f / %.2f" % (w["trainSeconds"], wo["trainSeconds"]) for w, wo in pairs) +
    "; stall per ckpt s: " + ", ".join("%.3f" % s for s in stalls))
PY
