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
"$py" - "${runs[@]}" <<'PY'
import json, statistics, sys, time, torch
torch.set_num_threads(1)
runs = [json.loads(a) for a in sys.argv[1:]]
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
print("rounds: loop s with / without: " + ", ".join(
    "%.2f / %.2f" % (w["trainSeconds"], wo["trainSeconds"]) for w, wo in pairs) +
    "; stall per ckpt s: " + ", ".join("%.3f" % s for s in stalls))
PY
