#!/usr/bin/env bash
# Runs inside deploy/local/cluster.sh (see run.sh): GRADHUB_SERVER, GRADHUB_TOKEN, GRADHUB_BIN,
# GRADHUB_CHECKPOINT_DATA_DIR (its parent is the cluster's work directory, with every log).
set -euo pipefail
kills="$1"
world="$2"
kill_rank="$3"
out_dir="$4"
gradhub="$GRADHUB_BIN/gradhub"
py=/usr/bin/python3
. "$(dirname "$(realpath "$0")")/../job_states.sh"
work="$(dirname "$GRADHUB_CHECKPOINT_DATA_DIR")"
spec="$out_dir/job.yaml"
cat > "$spec" <<YAML
model: {mlp: {layers: [16, 16, 2]}}
dataset: {synthetic: {numSamples: 256, numFeatures: 16, numClasses: 2}}
optimizer: {sgd: {lr: 0.1}}
batchSizePerRank: 8
maxSteps: 10000000
logEverySteps: 5
checkpoint: {everySteps: 50}
distributed: {worldSize: $world, ranksPerNode: 2}
maxRestarts: {job: $((kills + 5))}
YAML
now() { date +%s.%N; }
# pid of each trainer of attempt $2 of job $1, as "rank pid" lines: the trainer whose working
# directory is that rank's (its command line does not name the job).
trainers_of() {
  for p in $(pgrep gradhub-traine || true); do
    case "$(readlink "/proc/$p/cwd" 2>/dev/null)" in
      */jobs/"${1#jobs/}"/attempt-"$2"/rank-*) echo "$(readlink "/proc/$p/cwd" | sed 's/.*rank-//') $p" ;;
    esac
  done
}
# "failed placed running" seconds after $3 (the kill): attempt $2's RANK_FAILED, attempt $2+1's
# SCHEDULED and RUNNING events, from `describe --output json`.
spans() {
  "$gradhub" --output json describe "$1" | "$py" -c '
import json, sys
from datetime import datetime
def t(s): return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
d = json.load(sys.stdin); a, killed = int(sys.argv[1]), float(sys.argv[2])
ev = d["events"]
def first(pred): return min(t(e["time"]) for e in ev if pred(e)) - killed
print("%.4f %.4f %.4f" % (
    first(lambda e: e.get("type") == "RANK_FAILED" and e.get("attempt", 0) == a),
    first(lambda e: e.get("toState") == "SCHEDULED" and e.get("attempt", 0) == a + 1),
    first(lambda e: e.get("toState") == "RUNNING" and e.get("attempt", 0) == a + 1)))' "$2" "$3"
}

job="$("$gradhub" submit -f "$spec")"
echo "job $job: world $world, rank $kill_rank SIGKILLed $kills times; logs in $out_dir"
printf "%-4s %9s %9s %9s %9s  %s\n" kill failed gone placed running "survivors' last line"
rows="$out_dir/rows"
: > "$rows"
for attempt in $(seq "$kills"); do
  await_state "$job" RUNNING "$attempt"
  sleep "1.$((RANDOM % 10))"
  pid=""
  survivors=()
  while read -r rank p; do
    if [ "$rank" = "$kill_rank" ]; then pid="$p"; else survivors+=("$p"); fi
  done < <(trainers_of "$job" "$attempt")
  [ -n "$pid" ] || { echo "no trainer for rank $kill_rank of attempt $attempt" >&2; exit 1; }
  killed="$(now)"
  kill -9 "$pid"
  # Every survivor of the attempt gone (the agent stops them once the api says so).
  while :; do
    alive=0
    for p in "${survivors[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.01
  done
  gone="$("$py" -c 'import sys; print("%.4f" % (float(sys.argv[1]) - float(sys.argv[2])))' "$(now)" "$killed")"
  await_state "$job" RUNNING "$((attempt + 1))"
  read -r failed placed running < <(spans "$job" "$attempt" "$killed")
  survivor_rank=$(( kill_rank == 0 ? 1 : 0 ))
  "$gradhub" --output json logs "$job" --attempt "$attempt" > "$out_dir/attempt-$attempt.jsonl" || true
  last="$("$gradhub" logs "$job" --attempt "$attempt" --rank "$survivor_rank" 2>/dev/null |
          grep -v '"event":"progress"' | tail -n 1 | cut -c1-100 || true)"
  printf "%-4s %9s %9s %9s %9s  %s\n" "$attempt" "$failed" "$gone" "$placed" "$running" "$last"
  echo "$attempt $failed $gone $placed $running" >> "$rows"
done
"$gradhub" cancel "$job" > /dev/null || true
cp "$work"/*.err "$work"/*.out "$out_dir"/ 2>/dev/null || true

"$py" - "$rows" <<'PY'
import sys
rows = [list(map(float, l.split()[1:])) for l in open(sys.argv[1]) if l.strip()]
def q(v, p): return v[min(len(v) - 1, int(round(p * (len(v) - 1))))]
print("%-52s %8s %8s %8s %6s" % ("from the SIGKILL to", "p50 s", "p95 s", "max s", "n"))
for i, name in enumerate(["the attempt's RANK_FAILED event",
                          "every survivor of the attempt exited",
                          "the next attempt placed (SCHEDULED)",
                          "the next attempt's ranks all started (RUNNING)"]):
    v = sorted(r[i] for r in rows)
    print("%-52s %8.3f %8.3f %8.3f %6d" % (name, q(v, .5), q(v, .95), v[-1], len(v)))
PY
