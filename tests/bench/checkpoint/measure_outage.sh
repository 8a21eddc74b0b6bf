#!/usr/bin/env bash
# Runs inside deploy/local/cluster.sh (see outage_stall.sh): GRADHUB_SERVER, GRADHUB_TOKEN,
# GRADHUB_BIN, GRADHUB_CHECKPOINT_SERVER, GRADHUB_CHECKPOINT_PID, GRADHUB_CHECKPOINT_HTTP_PORT,
# GRADHUB_CHECKPOINT_DATA_DIR and GRADHUB_DATABASE_URL are set.
set -euo pipefail
steps="$1"
every="$2"
outage="$3"
gradhub="$GRADHUB_BIN/gradhub"
py=/usr/bin/python3
work="$(mktemp -d)"
store_pid="$GRADHUB_CHECKPOINT_PID"  # cluster.sh's until the first restart, then ours
ours=""
cleanup() {
  if [ -n "$ours" ]; then kill "$ours" 2>/dev/null || true; wait "$ours" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
now() { date +%s.%N; }

# 256x1024 + 1024x1024 + 1024x10 floats, twice (momentum): ~10 MiB of state: an upload takes
# well under a checkpoint interval, so that only the outage makes the loop wait or skip.
cat > "$work/spec.yaml" <<YAML
model: {mlp: {layers: [256, 1024, 1024, 10]}}
dataset: {synthetic: {numSamples: 4096, numFeatures: 256, numClasses: 10}}
optimizer: {sgd: {lr: 0.01, momentum: 0.9}}
batchSizePerRank: 32
maxSteps: $steps
logEverySteps: 10
checkpoint: {everySteps: $every, keepLast: 2}
distributed: {worldSize: 1}
YAML

# The job's step as the api has it (rank 0's progress lines).
progress_step() {
  "$gradhub" --output json get "$1" |
    "$py" -c 'import json,sys; print(json.load(sys.stdin).get("progress",{}).get("step","0"))'
}

# Whether process $1 has exited (gone, or a zombie its parent, cluster.sh, has not reaped).
gone() { [ ! -e "/proc/$1" ] || grep -q '^[0-9]* (.*) Z' "/proc/$1/stat"; }

# Once the job is past its second checkpoint, SIGKILLs the store as soon as an upload's file
# appears in its data directory (the store SIGSTOPped first, so that it is cut in the middle of
# that upload), starts it again on the same ports and data $outage s later, and sets `back` to
# the time it was (seconds since the epoch). Only cheap waits run beside the job: the api's
# progress every 0.5 s, then a glob every 2 ms for at most one checkpoint interval. Runs in
# this shell, not a subshell: it sets store_pid and ours.
cut_store() {
  local job="$1" files=()
  until [ "$(progress_step "$job")" -ge $((2 * every)) ]; do sleep 0.5; done
  shopt -s nullglob
  until [ ${#files[@]} -gt 0 ]; do
    files=("$GRADHUB_CHECKPOINT_DATA_DIR"/uploads/*.part)
    sleep 0.002
  done
  kill -STOP "$store_pid"
  kill -KILL "$store_pid"
  until gone "$store_pid"; do sleep 0.01; done
  if [ -n "$ours" ]; then wait "$ours" 2>/dev/null || true; fi
  sleep "$outage"
  "$GRADHUB_BIN/gradhub-checkpoint" --grpc-port "${GRADHUB_CHECKPOINT_SERVER##*:}" \
    --http-port "$GRADHUB_CHECKPOINT_HTTP_PORT" --data-dir "$GRADHUB_CHECKPOINT_DATA_DIR" \
    > "$work/store.out" 2> "$work/store.err" &
  ours=$!
  store_pid=$ours
  until grep -q "serving gRPC on port" "$work/store.out"; do sleep 0.01; done
  back="$(now)"
}

# Seconds from $2 (the store back) to the commit of the upload the cut interrupted: the first
# step rank 0 retried a save of, and its CHECKPOINT_COMMITTED event's time.
commit_after() {
  local step
  step="$("$gradhub" logs "$1" --rank 0 | sed -n 's/.*checkpoint store: save step \([0-9]*\): .*/\1/p' |
    head -n 1)"
  "$gradhub" --output json describe "$1" | "$py" -c '
import datetime, json, re, sys
step, back = sys.argv[1], float(sys.argv[2])
for e in json.load(sys.stdin)["events"]:
    if e["type"] == "CHECKPOINT_COMMITTED" and e.get("checkpointStep") == step:
        t = re.sub(r"(\.\d{6})\d*", r"\1", e["time"]).replace("Z", "+00:00")
        t = datetime.datetime.fromisoformat(t).timestamp()
        print("%.2f" % (t - back)); break
else:
    print("nan")' "$step" "$2"
}

# The done line of rank 0 of a finished job.
done_line() {
  "$gradhub" watch "$1" >/dev/null 2>&1 || true
  for _ in $(seq 50); do
    line="$("$gradhub" logs "$1" --rank 0 | grep '"event":"done"' | sed 's/^[^{]*//' || true)"
    [ -n "$line" ] && { echo "$line"; return 0; }
    sleep 0.2
  done
  echo "no done line for $1" >&2; return 1
}

# Appends "<seconds from the store back to the commit, 0 without a cut> <done line>" to $2.
run_job() {  # $1 = cut: 1 to cut the store off mid-run
  local job line after=0
  job="$("$gradhub" submit -f "$work/spec.yaml")"
  [ "$1" = 1 ] && cut_store "$job"
  line="$(done_line "$job")"
  [ "$1" = 1 ] && after="$(commit_after "$job" "$back")"
  echo "$after $line" >> "$2"
}

rounds="${GRADHUB_BENCH_ROUNDS:-4}"
back=""
for round in $(seq "$rounds"); do
  if [ $((round % 2)) = 1 ]; then
    run_job 1 "$work/cut"; run_job 0 "$work/plain"
  else
    run_job 0 "$work/plain"; run_job 1 "$work/cut"
  fi
done
runs=()
while IFS= read -r cut <&3 && IFS= read -r plain <&4; do runs+=("$cut" "$plain"); done \
  3< "$work/cut" 4< "$work/plain"
"$py" - "$outage" "${runs[@]}" <<'PY'
import json, statistics, sys
outage = float(sys.argv[1])
def parse(arg):
    after, line = arg.split(" ", 1)
    return float(after), json.loads(line)
runs = [parse(a) for a in sys.argv[2:]]
pairs = list(zip(runs[0::2], runs[1::2]))
# The stall: the time the loop waited for uploads (checkpointWaitSeconds), cut run less plain
# run; the difference in loop time says the same with the machine's noise in it.
waits = [c[1]["checkpointWaitSeconds"] - p[1]["checkpointWaitSeconds"] for c, p in pairs]
loops = [c[1]["trainSeconds"] - p[1]["trainSeconds"] for c, p in pairs]
afters = [c[0] for c, _ in pairs]
skipped = [c[1].get("checkpointsSkipped", 0) for c, _ in pairs]
print("| outage s | rounds | stall s (waited, median) | loop time difference s (median) | commit after the store is back s (median) | skipped |")
print("|---|---|---|---|---|---|")
print("| %.0f | %d | %.2f | %.2f | %.2f | %s |" % (
    outage, len(pairs), statistics.median(waits), statistics.median(loops),
    statistics.median(afters), "/".join(str(s) for s in skipped)))
print("rounds: waited s cut / plain: " + ", ".join(
    "%.2f / %.2f" % (c[1]["checkpointWaitSeconds"], p[1]["checkpointWaitSeconds"]) for c, p in pairs) +
    "; loop s cut / plain: " + ", ".join(
    "%.2f / %.2f" % (c[1]["trainSeconds"], p[1]["trainSeconds"]) for c, p in pairs) +
    "; commit after back s: " + ", ".join("%.2f" % a for a in afters))
PY
