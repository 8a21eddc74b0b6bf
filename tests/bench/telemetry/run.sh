#!/usr/bin/env bash
# What per-step telemetry costs training: a world-2 job (two gradhub-trainer processes on this
# machine, rendezvous through a file store) trained with telemetry off and on, in the same run,
# the two interleaved GRADHUB_BENCH_REPEATS times; each column is the median of its repeats.
# "on" means every rank sends every step to a real gradhub-metrics (which reads a throwaway
# PostgreSQL for the job, as in production); "off" means no --metrics-server.
#   1. PostgreSQL (throwaway, as tests/bench/create_jobs), the schema, a tenant and one RUNNING
#      world-2 job row for the trainers to report as;
#   2. gradhub-metrics on free ports;
#   3. per repeat: an "off" run, then an "on" run as a new attempt of the job (the service
#      drops resent steps of an attempt it has, so each "on" run gets an attempt of its own);
#   4. throughput = steps x batch x world / rank 0's trainSeconds (its "done" line); the CPU
#      time of both ranks per step (steadier than throughput on a shared machine); what the
#      service accepted and what was dropped, from its /metrics.
# Target (issue #16): overhead under 1%.
# Usage: tests/bench/telemetry/run.sh BUILD_DIR
# Environment: GRADHUB_BENCH_STEPS (2000), GRADHUB_BENCH_REPEATS (5), GRADHUB_BENCH_BATCH (64).
set -euo pipefail
build_dir="$(realpath "${1:-build}")"
bin="$build_dir/bin"
steps="${GRADHUB_BENCH_STEPS:-2000}"
repeats="${GRADHUB_BENCH_REPEATS:-5}"
batch="${GRADHUB_BENCH_BATCH:-64}"
pg_bin="$(pg_config --bindir 2>/dev/null || true)"
[ -x "$pg_bin/initdb" ] || pg_bin=/usr/lib/postgresql/15/bin
for program in "$bin/gradhub-api" "$bin/gradhub-metrics" "$bin/gradhub-trainer" "$pg_bin/initdb"; do
  [ -x "$program" ] || { echo "missing $program (build gradhub-api, gradhub-metrics, gradhub-trainer)" >&2; exit 1; }
done
# One thread per rank, BLAS included (see tests/bench/ddp/run.sh).
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}

work="$(mktemp -d /tmp/gradhub-bench-telemetry-XXXXXX)"
metrics_pid=""
as_pg=()
cleanup() {
  [ -n "$metrics_pid" ] && { kill "$metrics_pid" 2>/dev/null || true; wait "$metrics_pid" 2>/dev/null || true; }
  "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

# 1. PostgreSQL refuses to run as root: as root, run it as nobody.
if [ "$(id -u)" = 0 ]; then chown nobody "$work"; as_pg=(runuser -u nobody --); fi
pg_port="$(free_port)"
"${as_pg[@]}" "$pg_bin/initdb" -D "$work/pg" -U gradhub -A trust >/dev/null
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pg" -l "$work/pg.log" -w \
  -o "-p $pg_port -k $work -c listen_addresses=127.0.0.1" start >/dev/null
"$pg_bin/createdb" -h 127.0.0.1 -p "$pg_port" -U gradhub gradhub
url="postgresql://gradhub@127.0.0.1:$pg_port/gradhub"
"$bin/gradhub-api" --database-url "$url" migrate >/dev/null
psql() { "$pg_bin/psql" -h 127.0.0.1 -p "$pg_port" -U gradhub -d gradhub -qAtX -v ON_ERROR_STOP=1 -c "$1"; }
tenant="$(psql "INSERT INTO tenants (name) VALUES ('bench') RETURNING id")"
job="$(psql "INSERT INTO jobs (tenant_id, spec, world_size, current_attempt, state)
             VALUES ($tenant, '{}', 2, 1, 'RUNNING') RETURNING id")"

# 2.
token=bench-admin
grpc_port="$(free_port)"
http_port="$(free_port)"
"$bin/gradhub-metrics" --database-url "$url" --host 127.0.0.1 --grpc-port "$grpc_port" \
  --http-port "$http_port" --admin-token "$token" >"$work/metrics.out" 2>"$work/metrics.err" &
metrics_pid=$!
for _ in $(seq 100); do grep -q "serving gRPC" "$work/metrics.out" 2>/dev/null && break; sleep 0.1; done
grep -q "serving gRPC" "$work/metrics.out" || { cat "$work/metrics.err" >&2; exit 1; }

cat >"$work/spec.yaml" <<EOF
model: {mlp: {layers: [256, 512, 512, 10]}}
dataset: {synthetic: {numSamples: 16384, numFeatures: 256, numClasses: 10, noise: 0.5}}
optimizer: {sgd: {lr: 0.05, momentum: 0.9}}
batchSizePerRank: $batch
maxSteps: $steps
logEverySteps: 100
distributed: {worldSize: 2}
EOF

# One world-2 run; prints rank 0's samples/s. $1 = off|on, $2 = the attempt to report as.
train() {
  local mode="$1" attempt="$2" store="$work/store-$1-$2"
  mkdir -p "$store"
  local extra=()
  if [ "$mode" = on ]; then
    psql "UPDATE jobs SET current_attempt = $attempt WHERE id = '$job'"
    extra=(--metrics-server "127.0.0.1:$grpc_port")
  fi
  for rank in 1 0; do
    cpu_seconds "$work/cpu$rank" "$bin/gradhub-trainer" --spec "$work/spec.yaml" --rank "$rank" \
      --world-size 2 --store "file:$store" --job-id "$job" --attempt "$attempt" --token "$token" \
      --threads 1 "${extra[@]}" >"$work/rank$rank.out" 2>"$work/rank$rank.err" &
    eval "pid$rank=\$!"
  done
  wait "$pid0" && wait "$pid1" || { tail -20 "$work"/rank*.err >&2; exit 1; }
  /usr/bin/python3 - "$work/rank0.out" "$batch" "$work/cpu0" "$work/cpu1" <<'PY'
import json, sys
done = [json.loads(l) for l in open(sys.argv[1]) if '"done"' in l][-1]
cpu = sum(float(open(f).read()) for f in sys.argv[3:5])
print(done["step"] * int(sys.argv[2]) * 2 / done["trainSeconds"], cpu / done["step"] * 1000)
PY
}
# Runs a command; writes the CPU seconds (user + system) it used to $1. CPU time is what
# telemetry costs the trainer whatever else the machine runs, where throughput swings with it.
cpu_seconds() {
  local out="$1"
  shift
  /usr/bin/python3 -c 'import resource, subprocess, sys
code = subprocess.call(sys.argv[2:])
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1], "w").write(str(usage.ru_utime + usage.ru_stime))
sys.exit(code)' "$out" "$@"
}

# 3.
# Each repeat's on run against its own off run too: the machine's load drifts between repeats
# by more than telemetry costs, and a pair run back to back shares most of it.
offs="" ons="" off_cpus="" on_cpus="" pair_costs="" pair_cpu_costs=""
# How much more (percent_more) or less (percent_less) $2 is than $1, in % of $1.
percent_more() { awk -v base="$1" -v other="$2" 'BEGIN {printf "%.2f", (other - base) / base * 100}'; }
percent_less() { awk -v base="$1" -v other="$2" 'BEGIN {printf "%.2f", (base - other) / base * 100}'; }
for repeat in $(seq "$repeats"); do
  read -r off_rate off_cpu < <(train off "$repeat")
  offs+="$off_rate " off_cpus+="$off_cpu "
  read -r rate cpu < <(train on "$repeat")
  ons+="$rate " on_cpus+="$cpu "
  pair_costs+="$(percent_less "$off_rate" "$rate") "
  pair_cpu_costs+="$(percent_more "$off_cpu" "$cpu") "
done
# 4.
off="$(echo "$offs" | median)"
on="$(echo "$ons" | median)"
off_cpu="$(echo "$off_cpus" | median)"
on_cpu="$(echo "$on_cpus" | median)"
exposition="$(/usr/bin/python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$http_port/metrics').read().decode())")"
accepted="$(echo "$exposition" | awk '/^gradhub_telemetry_steps_total /{print $2}')"
dropped="$(echo "$exposition" | awk '/^gradhub_telemetry_dropped_total/{s += $2} END {print s + 0}')"
printf '%-6s %6s %6s %14s %14s %9s %12s %12s %9s %9s %8s\n' world steps batch off_samples_s \
  on_samples_s overhead off_cpu_ms on_cpu_ms cpu_cost accepted dropped
awk -v o="$off" -v n="$on" -v oc="$off_cpu" -v nc="$on_cpu" -v s="$steps" -v b="$batch" \
  -v a="$accepted" -v d="$dropped" 'BEGIN {
  printf "%-6s %6s %6s %14.0f %14.0f %8.2f%% %12.3f %12.3f %8.2f%% %9s %8s\n",
    2, s, b, o, n, (o - n) / o * 100, oc, nc, (nc - oc) / oc * 100, a, d }'
echo "  (cpu_ms: CPU of both ranks per step; accepted should be $((repeats * steps * 2)))"
echo "  runs, samples/s off: $offs"
echo "  runs, samples/s on:  $ons"
echo "  paired (median over repeats of on vs the off run just before it): overhead" \
  "$(echo "$pair_costs" | median)%, cpu_cost $(echo "$pair_cpu_costs" | median)%"
