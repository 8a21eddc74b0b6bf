#!/usr/bin/env bash
# The compose e2e test (`make compose-test`; not in `make test`: a few minutes, needs root):
# docker-compose.yml brought up for real on Debian's Docker engine, as ../shared/CONTAINERS.md
# describes:
#   1. docker.io, docker-compose, debootstrap installed if missing; dockerd started if it is not
#      running (and stopped again at the end);
#   2. the debian:12 base image made with debootstrap if it is missing;
#   3. images: gradhub from the host's binaries (deploy/Dockerfile.prebuilt), PostgreSQL and
#      Prometheus from Debian's packages (docker-compose.test.yml);
#   4. `docker-compose up` of everything but Grafana and the GPU agent, waiting on health checks;
#   5. from the host, through the published ports, over TLS with the cluster CA copied out of
#      the tls volume (a plaintext client must be refused): a tenant, the digits example (or,
#      without python3-sklearn's digits, the synthetic ResNet) submitted with build/bin/gradhub
#      and watched to SUCCEEDED; its checkpoints listed (gRPC via the CLI, and REST); its
#      telemetry at gradhub-metrics' /metrics and every gradhub target up in Prometheus;
#   6. `docker-compose down -v`, whatever happened.
# Usage: tests/e2e/compose/run.sh [BUILD_DIR]   (KEEP_UP=1 leaves the topology up)
set -euo pipefail
build_dir="$(realpath "${1:-build}")"
here="$(cd "$(dirname "$0")" && pwd)"
src="$(cd "$here/../../.." && pwd)"
gradhub="$build_dir/bin/gradhub"
project="${COMPOSE_PROJECT:-gradhub-e2e}"
start_time=$(date +%s)
log() { echo "== [$(( $(date +%s) - start_time ))s] $*"; }
fail() { echo "compose e2e: FAILED: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "run as root (it installs packages and starts dockerd)"
for p in gradhub gradhub-api gradhub-checkpoint gradhub-metrics gradhub-agent gradhub-trainer; do
  [ -x "$build_dir/bin/$p" ] || fail "$build_dir/bin/$p is missing: make build first"
done

# Host ports, away from the defaults so that a local cluster or another test does not collide.
export GRADHUB_API_GRPC_PORT=${GRADHUB_API_GRPC_PORT:-27070}
export GRADHUB_API_HTTP_PORT=${GRADHUB_API_HTTP_PORT:-28080}
export GRADHUB_API_2_GRPC_PORT=${GRADHUB_API_2_GRPC_PORT:-27170}
export GRADHUB_API_2_HTTP_PORT=${GRADHUB_API_2_HTTP_PORT:-28180}
export GRADHUB_CHECKPOINT_GRPC_PORT=${GRADHUB_CHECKPOINT_GRPC_PORT:-27071}
export GRADHUB_CHECKPOINT_HTTP_PORT=${GRADHUB_CHECKPOINT_HTTP_PORT:-28081}
export GRADHUB_METRICS_GRPC_PORT=${GRADHUB_METRICS_GRPC_PORT:-27072}
export GRADHUB_METRICS_HTTP_PORT=${GRADHUB_METRICS_HTTP_PORT:-29464}
export GRADHUB_PROMETHEUS_PORT=${GRADHUB_PROMETHEUS_PORT:-29090}
export GRADHUB_IMAGE=gradhub:local
export GRADHUB_ADMIN_TOKEN="e2e-admin-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')"
export POSTGRES_PASSWORD="e2e-$(od -An -N6 -tx8 /dev/urandom | tr -d ' ')"
services=(certs postgres gradhub-api gradhub-api-2 node-token gradhub-checkpoint gradhub-metrics agent-a agent-b prometheus)
compose=(docker-compose -p "$project" -f "$src/docker-compose.yml" -f "$here/docker-compose.test.yml")

# --- 1. the engine ------------------------------------------------------------------------
missing=""
for p in docker.io docker-compose debootstrap; do
  dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || missing="$missing $p"
done
if [ -n "$missing" ]; then
  log "apt-get install$missing"
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null
fi
docker=/usr/bin/docker
[ -x "$docker" ] || docker="$(command -v docker)"
dockerd_pid=""
workdir="$(mktemp -d /tmp/gradhub-compose-e2e.XXXXXX)"
# The CLI talks to the compose topology only: no client config of a local cluster; its CA is
# the topology's (step 5).
export GRADHUB_CONFIG="$workdir/no-client-config"
unset GRADHUB_TLS_CA GRADHUB_SERVER GRADHUB_CHECKPOINT_SERVER GRADHUB_TOKEN
cleanup() {
  local rc=$?
  set +e
  if [ "$rc" != 0 ] && [ -n "${compose_up:-}" ]; then
    echo "---- docker-compose ps / logs (tail) ----"
    "${compose[@]}" ps
    "${compose[@]}" logs --no-color --tail=40
  fi
  if [ -n "${compose_up:-}" ] && [ "${KEEP_UP:-0}" != 1 ]; then
    log "docker-compose down -v"
    "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1
  fi
  if [ -n "$dockerd_pid" ] && [ "${KEEP_UP:-0}" != 1 ]; then
    log "stopping the dockerd this test started (pid $dockerd_pid)"
    kill "$dockerd_pid"
    for _ in $(seq 1 40); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.5; done
  fi
  rm -rf "$workdir"
  log "done, exit $rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

if ! "$docker" info >/dev/null 2>&1; then
  log "starting dockerd (log: $workdir/dockerd.log)"
  dockerd >"$workdir/dockerd.log" 2>&1 &
  dockerd_pid=$!
  for _ in $(seq 1 60); do "$docker" info >/dev/null 2>&1 && break; sleep 0.5; done
  "$docker" info >/dev/null 2>&1 || { cat "$workdir/dockerd.log" >&2; fail "dockerd did not start"; }
fi

# --- 2. the base image --------------------------------------------------------------------
if ! "$docker" image inspect debian:12 >/dev/null 2>&1; then
  mirror="$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)"
  mirror="${mirror:-http://deb.debian.org/debian}"
  log "debootstrap bookworm from $mirror -> debian:12"
  debootstrap --variant=minbase bookworm "$workdir/rootfs" "$mirror" >"$workdir/debootstrap.log" 2>&1 ||
    { tail -n 20 "$workdir/debootstrap.log" >&2; fail "debootstrap"; }
  tar -C "$workdir/rootfs" -c . | "$docker" import - localhost/debian:12 >/dev/null
  "$docker" tag localhost/debian:12 debian:12
  rm -rf "$workdir/rootfs"
fi

# --- 3. images ----------------------------------------------------------------------------
log "images: gradhub:local from $build_dir/bin (deploy/Dockerfile.prebuilt), postgres, prometheus"
"$here/stage_image.sh" "$build_dir" "$workdir/stage"
"$docker" build -q -f "$src/deploy/Dockerfile.prebuilt" -t gradhub:local "$workdir/stage" >/dev/null
"$docker" build -q -f "$here/postgres.Dockerfile" -t gradhub-test/postgres:15 "$here" >/dev/null
"$docker" build -q -f "$here/prometheus.Dockerfile" -t gradhub-test/prometheus:local "$here" >/dev/null
rm -rf "$workdir/stage"

# --- 4. up ----------------------------------------------------------------------------------
"${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
log "docker-compose up -d --no-build ${services[*]}"
compose_up=1
"${compose[@]}" up -d --no-build "${services[@]}"
"${compose[@]}" ps

# The cluster CA, which every client of the topology trusts (the certs service made it).
"${compose[@]}" exec -T gradhub-api cat /etc/gradhub/tls/ca.pem > "$workdir/ca.pem" ||
  fail "no CA in the tls volume"
grep -q "BEGIN CERTIFICATE" "$workdir/ca.pem" || fail "the tls volume's ca.pem is no certificate"
curl=(curl --cacert "$workdir/ca.pem")
cli=("$gradhub" --server "127.0.0.1:$GRADHUB_API_GRPC_PORT"
     --checkpoint-server "127.0.0.1:$GRADHUB_CHECKPOINT_GRPC_PORT" --tls-ca "$workdir/ca.pem")
log "waiting for both agents to register"
for _ in $(seq 1 120); do
  ready="$("${cli[@]}" --token "$GRADHUB_ADMIN_TOKEN" nodes list 2>/dev/null | grep -c 'READY' || true)"
  [ "$ready" -ge 2 ] && break
  sleep 0.5
done
"${cli[@]}" --token "$GRADHUB_ADMIN_TOKEN" nodes list || true
[ "$ready" -ge 2 ] || fail "the agents did not register"
log "TLS: a plaintext client is refused, gRPC and REST"
set +e
"$gradhub" --server "127.0.0.1:$GRADHUB_API_GRPC_PORT" --tls-ca= --token "$GRADHUB_ADMIN_TOKEN" \
  nodes list >/dev/null 2>&1
plain=$?
set -e
[ "$plain" = 6 ] || fail "a plaintext gRPC client exited $plain, not 6 (UNAVAILABLE)"
if curl -fsS --max-time 10 "http://127.0.0.1:$GRADHUB_API_HTTP_PORT/healthz" >/dev/null 2>&1; then
  fail "plaintext HTTP to the api's REST port was answered"
fi
"${curl[@]}" -fsS --max-time 10 "https://127.0.0.1:$GRADHUB_API_HTTP_PORT/healthz" >/dev/null ||
  fail "https /healthz with the cluster CA"

# --- 5. a job from the host -----------------------------------------------------------------
token="$("${compose[@]}" exec -T gradhub-api gradhub-api create-tenant e2e | tail -n 1 | tr -d '\r')"
[ -n "$token" ] || fail "no tenant token"
digits=/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
if [ -f "$digits" ]; then spec="$src/deploy/examples/jobs/digits-mlp.yaml"
else spec="$src/deploy/examples/jobs/resnet-synthetic.yaml"; fi
log "gradhub submit -f ${spec#$src/}"
job="$("${cli[@]}" --token "$token" submit -f "$spec")"
echo "$job"
id="${job#jobs/}"
set +e
timeout 600 "${cli[@]}" --token "$token" watch "$job" </dev/null
watched=$?
set -e
"${cli[@]}" --token "$token" get "$job"
[ "$watched" = 0 ] || { "${cli[@]}" --token "$token" logs "$job" | tail -n 40; fail "the job did not succeed (watch exit $watched)"; }
state_json="$("${cli[@]}" --token "$token" get "$job" --output json)"
grep -q '"state": *"SUCCEEDED"' <<<"$state_json" || fail "the job is not SUCCEEDED"
accuracy="$("${cli[@]}" --token "$token" logs "$job" --rank 0 |
  sed -n 's/.*"event":"done".*"eval.accuracy":\([0-9.]*\).*/\1/p' | tail -n 1)"
log "SUCCEEDED; validation accuracy ${accuracy:-n/a}"

log "checkpoints (gradhub checkpoints list, gRPC at :$GRADHUB_CHECKPOINT_GRPC_PORT)"
checkpoints="$("${cli[@]}" --token "$token" checkpoints list "$job")"
echo "$checkpoints"
grep -q 'COMMITTED' <<<"$checkpoints" || fail "no committed checkpoint"
rest="$("${curl[@]}" -fsS -H "Authorization: Bearer $token" \
  "https://127.0.0.1:$GRADHUB_CHECKPOINT_HTTP_PORT/v1/jobs/$id/checkpoints")" ||
  fail "checkpoint REST list"
echo "REST /v1/jobs/$id/checkpoints: ${rest:0:300}"
grep -q '"step"' <<<"$rest" || fail "the REST checkpoint list is empty"

log "metrics: gradhub-metrics /metrics at :$GRADHUB_METRICS_HTTP_PORT"
scrape="$("${curl[@]}" -fsS "https://127.0.0.1:$GRADHUB_METRICS_HTTP_PORT/metrics")" || fail "gradhub-metrics /metrics"
series="$(grep "job_id=\"$id\"" <<<"$scrape" || true)"
sed -n 1,8p <<<"$series"
[ -n "$series" ] || fail "no series of job $id at gradhub-metrics"
log "Prometheus at :$GRADHUB_PROMETHEUS_PORT: every gradhub target up, the job's series scraped"
n=0; step=""
for _ in $(seq 1 60); do
  up="$(curl -fsS "http://127.0.0.1:$GRADHUB_PROMETHEUS_PORT/api/v1/query?query=up" || true)"
  # No target up yet is grep's exit 1, which pipefail would make the script's.
  n="$( (grep -o '"job":"gradhub-[a-z]*"},"value":\[[0-9.]*,"1"\]' <<<"$up" || true) | wc -l)"
  step="$(curl -fsS "http://127.0.0.1:$GRADHUB_PROMETHEUS_PORT/api/v1/query" \
    --data-urlencode "query=max(gradhub_training_step{job_id=\"$id\"})" || true)"
  [ "$n" -ge 3 ] && grep -q '"value"' <<<"$step" && break
  sleep 1
done
echo "up: ${up:0:1200}"
echo "max(gradhub_training_step{job_id=\"$id\"}): $step"
[ "$n" -ge 3 ] || fail "Prometheus does not see api, checkpoint and metrics up"
grep -q '"value"' <<<"$step" || fail "Prometheus has not scraped the job's series"
log "compose e2e: PASSED"
