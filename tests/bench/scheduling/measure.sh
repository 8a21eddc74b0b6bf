#!/usr/bin/env bash
# Runs inside deploy/local/cluster.sh (see run.sh): GRADHUB_SERVER, GRADHUB_TOKEN, GRADHUB_BIN.
set -euo pipefail
jobs="$1"
gradhub="$GRADHUB_BIN/gradhub"
py=/usr/bin/python3
spec="$(mktemp)"
trap 'rm -f "$spec"' EXIT
write_spec() {  # $1 = maxSteps
  cat > "$spec" <<YAML
model: {mlp: {layers: [16, 16, 2]}}
dataset: {synthetic: {numSamples: 256, numFeatures: 16, numClasses: 2}}
optimizer: {sgd: {lr: 0.1}}
batchSizePerRank: 8
maxSteps: $1
logEverySteps: 5
checkpoint: {everySteps: 50}
distributed: {worldSize: 2, ranksPerNode: 2}
maxRestarts: {job: 1}
YAML
}
# Seconds from the event with to_state=$2 (or the job's creation) to the RUNNING event of
# attempt $3, from `describe --output json`.
span() {
  "$gradhub" --output json describe "$1" | "$py" -c '
import json, sys
from datetime import datetime
def t(s): return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
d = json.load(sys.stdin); start, attempt = sys.argv[1], int(sys.argv[2])
ev = d["events"]
begin = t(d["job"]["createTime"]) if start == "CREATE" else \
    min(t(e["time"]) for e in ev if e.get("type") == "RANK_FAILED")
end = min(t(e["time"]) for e in ev if e.get("toState") == "RUNNING" and e.get("attempt", 0) == attempt)
print("%.4f" % (end - begin))' "$2" "$3"
}
await_state() {  # job, state, attempt
  for _ in $(seq 600); do
    out="$("$gradhub" --output json get "$1")"
    if echo "$out" | "$py" -c 'import json,sys; j=json.load(sys.stdin); sys.exit(0 if j.get("state")==sys.argv[1] and j.get("attempt",0)>=int(sys.argv[2]) else 1)' "$2" "$3"; then return 0; fi
    sleep 0.05
  done
  echo "timed out waiting for $1 to be $2" >&2; return 1
}

write_spec 20
starts=()
for i in $(seq "$jobs"); do
  job="$("$gradhub" submit -f "$spec")"
  await_state "$job" SUCCEEDED 1
  starts+=("$(span "$job" CREATE 1)")
done

write_spec 100000
restarts=()
for i in 1 2 3 4 5; do
  job="$("$gradhub" submit -f "$spec")"
  await_state "$job" RUNNING 1
  sleep 1
  pid="$(pgrep -f "jobs/${job#jobs/}/attempt-1/rank-1" -n || true)"
  [ -z "$pid" ] && pid="$(pgrep -n gradhub-traine)"
  kill -9 "$pid"
  await_state "$job" RUNNING 2
  restarts+=("$(span "$job" RANK_FAILED 2)")
  "$gradhub" cancel "$job" > /dev/null
  sleep 1
done

"$py" - "${#starts[@]}" "${starts[@]}" "${restarts[@]}" <<'PY'
import sys, statistics
n = int(sys.argv[1]); a = sorted(map(float, sys.argv[2:2 + n])); b = sorted(map(float, sys.argv[2 + n:]))
def q(v, p): return v[min(len(v) - 1, int(round(p * (len(v) - 1))))]
print("%-44s %8s %8s %8s %6s" % ("measure", "p50 s", "p95 s", "max s", "n"))
print("%-44s %8.3f %8.3f %8.3f %6d" % ("CreateJob -> every rank started (world 2)", q(a, .5), q(a, .95), a[-1], len(a)))
print("%-44s %8.3f %8.3f %8.3f %6d" % ("rank killed -> next attempt's ranks started", q(b, .5), q(b, .95), b[-1], len(b)))
PY
