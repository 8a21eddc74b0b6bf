#!/usr/bin/env bash
# Runs inside deploy/local/cluster.sh (see run.sh): GRADHUB_SERVER, GRADHUB_TOKEN, GRADHUB_BIN.
set -euo pipefail
jobs="$1"
backlog="${2:-20000}"       # jobs left PENDING for the third measure; 0 = skip it
backlog_jobs="${3:-20}"     # jobs measured behind that backlog
gradhub="$GRADHUB_BIN/gradhub"
py=/usr/bin/python3
. "$(dirname "$(realpath "$0")")/../job_states.sh"
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
  # Rank 1 of attempt 1: the trainer whose working directory is that rank's (its command line
  # does not name the job).
  pid=""
  for p in $(pgrep gradhub-traine || true); do
    case "$(readlink "/proc/$p/cwd" 2>/dev/null)" in
      */jobs/"${job#jobs/}"/attempt-1/rank-1) pid="$p" ;;
    esac
  done
  [ -n "$pid" ] || { echo "no trainer for rank 1 of $job" >&2; exit 1; }
  kill -9 "$pid"
  await_state "$job" RUNNING 2
  restarts+=("$(span "$job" RANK_FAILED 2)")
  "$gradhub" cancel "$job" > /dev/null
  sleep 1
done

# The same first measure behind a backlog: BACKLOG jobs PENDING for good (a node label no node
# has), created at 4,000/s by bench_create_jobs, then world-2 jobs as above.
write_spec 20
backlogged=()
if [ "$backlog" -gt 0 ]; then
  "$GRADHUB_BIN/bench_create_jobs" --clients 16 --warmup 0 --rate 4000 \
    --seconds $(( (backlog + 3999) / 4000 )) --node-selector gradhub.bench/backlog=none \
    --label backlog > /dev/null
  for i in $(seq "$backlog_jobs"); do
    job="$("$gradhub" submit -f "$spec")"
    await_state "$job" SUCCEEDED 1
    backlogged+=("$(span "$job" CREATE 1)")
  done
fi

"$py" - "${#starts[@]}" "${#restarts[@]}" "$backlog" "${starts[@]}" "${restarts[@]}" "${backlogged[@]}" <<'PY'
import sys
n, m, backlog = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
v = list(map(float, sys.argv[4:]))
a, b, c = sorted(v[:n]), sorted(v[n:n + m]), sorted(v[n + m:])
def q(v, p): return v[min(len(v) - 1, int(round(p * (len(v) - 1))))]
print("%-52s %8s %8s %8s %6s" % ("measure", "p50 s", "p95 s", "max s", "n"))
def row(name, v):
    if v: print("%-52s %8.3f %8.3f %8.3f %6d" % (name, q(v, .5), q(v, .95), v[-1], len(v)))
row("CreateJob -> every rank started (world 2)", a)
row("rank killed -> next attempt's ranks started", b)
row("the same as the first, %d jobs PENDING" % backlog, c)
PY
