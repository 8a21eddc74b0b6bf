#!/usr/bin/env bash
# `make demo`: the digits example on a local cluster, as a new user meets gradhub.
#   1. `gradhub cluster up` (unless one is up already): PostgreSQL, api, checkpoint, metrics,
#      two agents, Prometheus, in the background, with the CLI's client config;
#   2. `gradhub submit` deploy/examples/jobs/digits-mlp.yaml and `gradhub watch` it to the end
#      (a progress bar on a terminal);
#   3. print its validation accuracy (at least 95%, or this fails), its checkpoints and where
#      its metrics are;
#   4. `gradhub cluster down` if step 1 started the cluster, so that nothing of ours is left
#      running; KEEP_CLUSTER=1 leaves it up for your own jobs (`gradhub submit -f ...`).
# Safe to run twice: the database under the state directory is reused.
# Usage: deploy/local/demo.sh [BUILD_DIR]
set -euo pipefail
build_dir="$(realpath "${1:-build}")"
src="$(cd "$(dirname "$0")/../.." && pwd)"
gradhub="$build_dir/bin/gradhub"

started=0
finish() {
  if [ "$started" = 1 ] && [ "${KEEP_CLUSTER:-0}" != 1 ]; then
    echo "== gradhub cluster down (KEEP_CLUSTER=1 keeps it up)"
    "$gradhub" cluster down >/dev/null
  fi
}
trap finish EXIT
trap 'exit 130' INT TERM HUP

set +e
"$gradhub" cluster status >/dev/null 2>&1
status=$?
set -e
if [ "$status" != 0 ]; then
  # 3: none is up; 6: one is, partly (a service stopped): start afresh.
  [ "$status" = 6 ] && "$gradhub" cluster down >/dev/null 2>&1
  echo "== gradhub cluster up"
  started=1
  "$gradhub" cluster up
else
  echo "== using the local cluster that is up (gradhub cluster status)"
fi

echo "== gradhub submit -f deploy/examples/jobs/digits-mlp.yaml"
job="$("$gradhub" submit -f "$src/deploy/examples/jobs/digits-mlp.yaml")"
echo "$job"
"$gradhub" watch "$job"

accuracy="$("$gradhub" logs "$job" --rank 0 |
  sed -n 's/.*"event":"done".*"eval.accuracy":\([0-9.]*\).*/\1/p' | tail -n 1)"
echo "== validation accuracy: $(awk -v a="$accuracy" 'BEGIN { printf "%.1f%%", 100 * a }')"
echo "== checkpoints (gradhub checkpoints list $job)"
"$gradhub" checkpoints list "$job"
echo "== training history (gradhub metrics $job)"
"$gradhub" metrics "$job" --max-points 8
echo "== metrics: gradhub-metrics at $("$gradhub" cluster status |
  sed -n 's/^metrics .*Prometheus \([^ ]*\).*/\1/p')" \
  "(Prometheus: $("$gradhub" cluster status | sed -n 's/^prometheus .*UI \([^ ]*\).*/\1/p'))" \
  "(dashboards: dashboard/)"
awk -v a="$accuracy" 'BEGIN { exit !(a >= 0.95) }' ||
  { echo "make demo: validation accuracy ${accuracy:-unknown} is below 95%" >&2; exit 1; }
