#!/usr/bin/env bash
# The whole platform as plain local processes, the same topology docker-compose runs: a
# PostgreSQL in a temporary directory, gradhub-api (job API, scheduler, rendezvous store),
# gradhub-checkpoint (the checkpoint store), gradhub-metrics (training telemetry for
# Prometheus), two node agents with 2 CPU slots each and no shared disk (each keeps only a
# cache of checkpoints), and a world-size-4 job on the digits
# dataset (Debian's python3-sklearn, the agents' only data root) submitted and watched with the
# gradhub CLI. Everything stops on exit, PostgreSQL included, and nothing is left running.
# As root, PostgreSQL runs as nobody and the ranks as gradhub-rank (make setup creates it).
# Usage: deploy/local/cluster.sh [BUILD_DIR] [-- COMMAND...]
# With a COMMAND, runs it against the cluster instead of the digits job (GRADHUB_SERVER,
# GRADHUB_CHECKPOINT_SERVER, GRADHUB_TOKEN and GRADHUB_BIN are set for it); the benchmarks
# use that. So that a command can restart gradhub-checkpoint as it was (same ports, data and
# database: tests/bench/checkpoint/measure_outage.sh), it also gets GRADHUB_CHECKPOINT_PID,
# GRADHUB_CHECKPOINT_HTTP_PORT and GRADHUB_CHECKPOINT_DATA_DIR (GRADHUB_DATABASE_URL is
# exported); a process it starts is its own to stop.
set -euo pipefail
build_dir="$(realpath "${1:-build}")"
shift || true
[ "${1:-}" = "--" ] && shift
bin="$build_dir/bin"
pg_bin="$(pg_config --bindir 2>/dev/null || true)"
[ -x "$pg_bin/initdb" ] || pg_bin=/usr/lib/postgresql/15/bin
digits=/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
[ -f "$digits" ] || { echo "missing $digits: run make setup" >&2; exit 1; }

work="$(mktemp -d /tmp/gradhub-cluster-XXXXXX)"
# Root's, but enterable: as root the agents start ranks as gradhub-rank (make setup creates
# it), who must reach its rank directories under $work/node-*.
chmod 0711 "$work"
pg_dir="$work/postgres"
mkdir "$pg_dir"
# PostgreSQL refuses to run as root: then it runs, and is stopped, as nobody, in a directory
# nobody owns.
as_pg=()
if [ "$(id -u)" = 0 ]; then chown nobody "$pg_dir"; as_pg=(runuser -u nobody --); fi
pids=()
cleanup() {
  # Agents first (they stop their ranks on SIGTERM), then the services, then PostgreSQL.
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ -f "$pg_dir/data/postmaster.pid" ]; then
    "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$pg_dir/data" -m fast -w stop >/dev/null 2>&1 ||
      echo "cluster.sh: could not stop PostgreSQL (pg_ctl -D $pg_dir/data)" >&2
  fi
  rm -rf "$work"
}
trap cleanup EXIT
# A signal still ends in cleanup (bash runs the EXIT trap on exit, not on every signal).
trap 'exit 130' INT TERM HUP

# Password authentication, never trust: ranks run on this host and can reach the port.
pg_password="$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
(umask 077 && printf '%s\n' "$pg_password" > "$pg_dir/password")
[ "$(id -u)" = 0 ] && chown nobody "$pg_dir/password"
"${as_pg[@]}" "$pg_bin/initdb" -D "$pg_dir/data" -U gradhub -A scram-sha-256 \
  --pwfile="$pg_dir/password" >/dev/null
rm -f "$pg_dir/password"
# A port below the kernel's ephemeral range (32768-60999 by default), from which every outgoing
# connection on this host takes one: drawn from 20000-39999, one of ctest's parallel tests once
# found it taken ("could not start server"). Another listener may still hold the port drawn, so
# a start that fails draws again, 5 times at most, then shows PostgreSQL's log.
started=0
for _ in 1 2 3 4 5; do
  pg_port=$((20000 + RANDOM % 12000))
  if "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/pg.log" -w \
    -o "-p $pg_port -k $pg_dir -c listen_addresses=127.0.0.1" start >/dev/null 2>&1; then
    started=1
    break
  fi
done
if [ "$started" != 1 ]; then
  echo "cluster.sh: PostgreSQL did not start on 5 ports; the end of its log:" >&2
  tail -n 5 "$pg_dir/pg.log" >&2
  exit 1
fi
export GRADHUB_DATABASE_URL="postgresql://gradhub:$pg_password@127.0.0.1:$pg_port/postgres"

"$bin/gradhub-api" migrate >/dev/null
"$bin/gradhub-api" --grpc-address 127.0.0.1:0 --http-host 127.0.0.1 --http-port 0 serve \
  > "$work/api.out" 2> "$work/api.err" &
pids+=($!)
"$bin/gradhub-checkpoint" --grpc-port 0 --http-port 0 --data-dir "$work/checkpoint-store" \
  > "$work/checkpoint.out" 2> "$work/checkpoint.err" &
pids+=($!)
checkpoint_pid=$!
"$bin/gradhub-metrics" --grpc-port 0 --http-port 0 > "$work/metrics.out" 2> "$work/metrics.err" &
pids+=($!)
# Waits for a service's "serving gRPC on port N" and "serving REST|HTTP on port N" lines.
port_of() {  # FILE KIND
  for _ in $(seq 100); do grep -q "serving $2 on port" "$1" && break; sleep 0.1; done
  sed -n "s/.*serving $2 on port \([0-9]*\).*/\1/p" "$1"
}
export GRADHUB_SERVER="127.0.0.1:$(port_of "$work/api.out" gRPC)"
http_port="$(port_of "$work/api.out" REST)"
export GRADHUB_CHECKPOINT_SERVER="127.0.0.1:$(port_of "$work/checkpoint.out" gRPC)"
checkpoint_http="$(port_of "$work/checkpoint.out" REST)"
metrics_grpc="127.0.0.1:$(port_of "$work/metrics.out" gRPC)"
metrics_http="$(port_of "$work/metrics.out" HTTP)"
export GRADHUB_TOKEN="$("$bin/gradhub-api" create-tenant demo)"
node_token="$("$bin/gradhub-api" create-node-token)"
echo "gradhub-api: gRPC $GRADHUB_SERVER, REST http://127.0.0.1:$http_port"
echo "gradhub-checkpoint: gRPC $GRADHUB_CHECKPOINT_SERVER, REST http://127.0.0.1:$checkpoint_http"
echo "gradhub-metrics: training telemetry at http://127.0.0.1:$metrics_http/metrics" \
  "(Prometheus: deploy/prometheus.yml; dashboards: dashboard/)"

for node in node-a node-b; do
  "$bin/gradhub-agent" --server "$GRADHUB_SERVER" --token "$node_token" --name "$node" \
    --slots 2 --work-dir "$work/$node" --checkpoint-server "$GRADHUB_CHECKPOINT_SERVER" \
    --metrics-server "$metrics_grpc" --data-root "$(dirname "$digits")" \
    > "$work/$node.out" 2> "$work/$node.err" &
  pids+=($!)
done

for _ in $(seq 100); do
  grep -qs "registered" "$work/node-a.out" && grep -qs "registered" "$work/node-b.out" && break
  sleep 0.1
done
if [ $# -gt 0 ]; then
  GRADHUB_BIN="$bin" GRADHUB_CHECKPOINT_PID="$checkpoint_pid" \
    GRADHUB_CHECKPOINT_HTTP_PORT="$checkpoint_http" \
    GRADHUB_CHECKPOINT_DATA_DIR="$work/checkpoint-store" "$@"
  exit $?
fi

cat > "$work/job.yaml" <<YAML
displayName: digits-mlp
labels: {demo: local-cluster}
model: {mlp: {layers: [64, 128, 10]}}
dataset: {csv: {path: $digits, normalize: standard}, validationFraction: 0.2}
optimizer: {sgd: {lr: 0.05, momentum: 0.9}}
batchSizePerRank: 16
maxEpochs: 25
evalEverySteps: 200
logEverySteps: 50
checkpoint: {everySteps: 200}
distributed: {worldSize: 4, ranksPerNode: 2}
maxRestarts: {infrastructure: 2, job: 1}
seed: 1
YAML
job="$("$bin/gradhub" submit -f "$work/job.yaml")"
echo "submitted $job"
status=0
"$bin/gradhub" watch "$job" || status=$?
"$bin/gradhub" describe "$job" | tail -n 12
echo "training history (also: curl http://127.0.0.1:$metrics_http/metrics | grep gradhub_):"
"$bin/gradhub" metrics "$job" --max-points 12
echo "checkpoints in the store:"
"$bin/gradhub" checkpoints list "$job"
echo "validation of rank 0:"
"$bin/gradhub" logs "$job" --rank 0 | grep -E 'validation|"event":"done"' | tail -n 3
exit "$status"
