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
with="$(run_job "$every")"
without="$(run_job 0)"
"$py" - "$with" "$without" <<'PY'
import json, sys, time, torch
torch.set_num_threads(1)
w, wo = json.loads(sys.argv[1]), json.loads(sys.argv[2])
n_with, n_without = w["checkpoints"], wo["checkpoints"]
size = w["checkpointBytes"]
src = torch.empty(size, dtype=torch.uint8).fill_(1)
copies = []
for _ in range(5):
    t = time.perf_counter(); dst = src.clone(); copies.append(time.perf_counter() - t)
copy = sorted(copies)[2]
extra = n_with - n_without
stall = (w["trainSeconds"] - wo["trainSeconds"]) / extra
snapshot = w["checkpointSnapshotSeconds"] / n_with
wait = w["checkpointWaitSeconds"] / n_with
print("| checkpoint MiB | checkpoints | loop s (with / without) | stall per ckpt s | snapshot s | waited s | plain copy s (ref) | stall / snapshot | stall / copy |")
print("|---|---|---|---|---|---|---|---|---|")
print("| %.0f | %d / %d | %.2f / %.2f | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f |" % (
    size / 2**20, n_with, n_without, w["trainSeconds"], wo["trainSeconds"], stall, snapshot,
    wait, copy, stall / snapshot, stall / copy))
PY
