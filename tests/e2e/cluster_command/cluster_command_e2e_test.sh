#!/usr/bin/env bash
# e2e: `gradhub cluster up | status | logs | down` in a state directory of its own, and every
# example job of deploy/examples/jobs submitted with the bare CLI (no flag, no variable but
# GRADHUB_STATE_DIR: the client config that `up` writes does the rest), each SUCCEEDED.
# `up` runs TLS by default with a CA of its own: the servers refuse plaintext clients, the
# client config trusts the CA, keys are private; `gradhub cluster certs` makes the same files
# for compose and Kubernetes, and keeps its CA when run again.
# Then: flags and variables beat the config; `up` again is harmless; a killed service is
# reported by `status` (and refused by `up`); `down` leaves no process of ours and spares a
# stranger whose pid it recorded; a second `up --insecure` reuses the database (no initdb, the
# earlier jobs are still listed) in plaintext, and the second `down` again leaves nothing.
# Last, `up --api-replicas 2` (bad counts refused): two api processes on the one database, both
# answering /readyz, exactly one saying "leader: this replica" (skipped while the clients take
# one address only).
# ctest sets GRADHUB_BUILD_DIR and GRADHUB_SOURCE_DIR.
set -euo pipefail
build="${GRADHUB_BUILD_DIR:?}"
src="${GRADHUB_SOURCE_DIR:?}"
gradhub="$build/bin/gradhub"
for name in $(env | sed -n 's/^\(GRADHUB_[A-Z_]*\)=.*/\1/p'); do unset "$name"; done
state="$(mktemp -d /tmp/gradhub-cluster-command-XXXXXX)"
# Enterable: as root, PostgreSQL and the ranks run as unprivileged users under it.
chmod 0711 "$state"
export GRADHUB_STATE_DIR="$state"
out="$state/test-output"

fail() {
  echo "FAIL: $*" >&2
  "$gradhub" cluster status >&2 || true
  "$gradhub" cluster logs --tail 20 >&2 || true
  exit 1
}

# The pids of every live process of this cluster: its services carry the state directory in
# their environment, PostgreSQL and the ranks name it on their command lines.
ours() {
  local dir environment command
  for dir in /proc/[0-9]*; do
    [ "${dir#/proc/}" = "$$" ] && continue
    # Matched in bash, not by a grep that would itself carry the pattern on its command line.
    # (Zombies and processes of other namespaces cannot be read: none of them runs for us.)
    environment="$(tr '\0' '\n' 2>/dev/null < "$dir/environ")" || continue
    command="$(tr '\0' ' ' 2>/dev/null < "$dir/cmdline")" || continue
    if [[ $'\n'"$environment"$'\n' == *$'\n'"GRADHUB_CLUSTER_STATE_DIR=$state"$'\n'* ||
          "$command" == *"$state"* ]]; then
      # Not zombies: they are gone, only not yet reaped.
      grep -q '^State:[[:space:]]*Z' "$dir/status" 2>/dev/null || echo "${dir#/proc/}"
    fi
  done
}
# Whatever happened, nothing of this cluster outlives the test: `down`, and if that could not
# run, SIGKILL to what is left.
cleanup() {
  [ -f "$state/cluster.json" ] && "$gradhub" cluster down >/dev/null 2>&1
  local left
  left="$(ours)"
  [ -n "$left" ] && kill -KILL $left 2>/dev/null
  rm -rf "$state"
}
trap cleanup EXIT
pid_of() {  # SERVICE
  python3 -c 'import json,sys; print(next(p["pid"] for p in json.load(open(sys.argv[1]))["processes"] if p["name"] == sys.argv[2]))' \
    "$state/cluster.json" "$1"
}

echo "== cluster up"
"$gradhub" cluster up > "$out" 2> "$out.err" || fail "cluster up: $(cat "$out" "$out.err")"
cat "$out"
for service in postgres api checkpoint metrics node-a node-b; do
  grep -Eq "^$service +[0-9]+ +running" "$out" || fail "cluster up did not list $service running"
done
grep -q "created a database" "$out.err" || fail "the first up made no database: $(cat "$out.err")"

echo "== TLS by default"
ca="$state/tls/ca.pem"
grep -qx "tls-ca=$ca" "$state/config" || fail "the client config does not trust $ca: $(cat "$state/config")"
grep -q "TLS: on" "$out" || fail "cluster up did not say TLS is on: $(cat "$out")"
for key in "$state/tls/server-key.pem" "$state/tls/node-node-a-key.pem" "$state/tls-ca/ca-key.pem"; do
  [ "$(stat -c %a "$key")" = 600 ] || fail "$key has mode $(stat -c %a "$key"), not 600"
done
[ ! -e "$state/tls/ca-key.pem" ] || fail "the CA key lies beside what the services read"
"$gradhub" list > "$out" 2>&1 || fail "the CLI over TLS (client config): $(cat "$out")"
set +e
"$gradhub" --tls-ca= list > "$out" 2>&1
code=$?
set -e
[ "$code" = 6 ] || fail "a plaintext client of the api exited $code, not 6 (UNAVAILABLE): $(cat "$out")"
rest="$("$gradhub" cluster status | sed -n 's/^api .*REST \(https:[^ ]*\).*/\1/p')"
[ -n "$rest" ] || fail "the api's REST endpoint is not https: $("$gradhub" cluster status)"
curl -fsS --max-time 10 --cacert "$ca" "$rest/healthz" > /dev/null || fail "https $rest/healthz with the CA"
if curl -fsS --max-time 10 "http://${rest#https://}/healthz" > "$out" 2>&1; then
  fail "plaintext HTTP to the api's REST port was answered: $(cat "$out")"
fi
if curl -fsS --max-time 10 "$rest/healthz" > "$out" 2>&1; then
  fail "curl trusted the api's certificate without the cluster CA"
fi

echo "== gradhub cluster certs"
"$gradhub" cluster certs --out "$state/certs" --ca-dir "$state/certs-ca" \
  --hosts gradhub-api,10.0.0.7 --nodes agent-a > "$out" 2>&1 || fail "cluster certs: $(cat "$out")"
grep -q "made a CA" "$out" || fail "cluster certs made no CA: $(cat "$out")"
for file in ca.pem server.pem server-key.pem node-agent-a.pem node-agent-a-key.pem; do
  [ -s "$state/certs/$file" ] || fail "cluster certs wrote no $file"
done
openssl verify -CAfile "$state/certs/ca.pem" "$state/certs/server.pem" > /dev/null ||
  fail "the server certificate does not verify"
openssl x509 -in "$state/certs/server.pem" -noout -ext subjectAltName |
  grep -q "DNS:gradhub-api" || fail "the server certificate lacks DNS:gradhub-api"
"$gradhub" cluster certs --out "$state/certs" --ca-dir "$state/certs-ca" > "$out" 2>&1 ||
  fail "cluster certs again: $(cat "$out")"
grep -q "kept the CA" "$out" || fail "a second cluster certs did not keep the CA: $(cat "$out")"
set +e
"$gradhub" cluster certs --out "$state/certs" --hosts "bad host" > "$out" 2>&1
code=$?
set -e
[ "$code" = 2 ] || fail "a host name with a space exited $code, not 2: $(cat "$out")"

echo "== the examples, with the bare CLI"
# The TorchScript model is exported by its own script beside a copy of the examples under
# <state>/data (a data root of the cluster), so that the test writes nothing into the source
# tree; the spec's relative path then names the exported file.
mkdir -p "$state/data/examples"
cp -r "$src/deploy/examples/jobs" "$src/deploy/examples/models" "$state/data/examples/"
rm -f "$state/data/examples/models/"*.pt
chmod -R a+rX "$state/data"
/usr/bin/python3 "$state/data/examples/models/export_digits_mlp.py" >/dev/null ||
  fail "export_digits_mlp.py failed"
chmod a+r "$state/data/examples/models/digits-mlp.pt"
declare -A jobs
for spec in "$src"/deploy/examples/jobs/*.yaml; do
  name="$(basename "$spec" .yaml)"
  [ "$name" = torchscript-mlp ] && spec="$state/data/examples/jobs/$name.yaml"
  jobs[$name]="$("$gradhub" submit -f "$spec")" || fail "submit $spec"
  echo "$name: ${jobs[$name]}"
done
[ "${#jobs[@]}" -ge 5 ] || fail "expected at least 5 examples, found ${#jobs[@]}"
for name in "${!jobs[@]}"; do
  start=$SECONDS
  "$gradhub" watch "${jobs[$name]}" > "$out" 2>&1 ||
    fail "$name (${jobs[$name]}) did not succeed: $(tail -n 5 "$out"
      "$gradhub" describe "${jobs[$name]}" | tail -n 15; "$gradhub" logs "${jobs[$name]}" | tail -n 30)"
  echo "$name SUCCEEDED (waited $((SECONDS - start)) s)"
done
"$gradhub" checkpoints list "${jobs[digits-mlp]}" > "$out" || fail "checkpoints list"
grep -q COMMITTED "$out" || fail "digits-mlp has no committed checkpoint: $(cat "$out")"

echo "== flags and variables beat the client config"
if GRADHUB_SERVER=127.0.0.1:1 "$gradhub" list > "$out" 2>&1; then fail "GRADHUB_SERVER was ignored"; fi
if "$gradhub" --token ghk_wrong list > "$out" 2>&1; then fail "--token was ignored"; fi
GRADHUB_SERVER=127.0.0.1:1 "$gradhub" --server "$(sed -n 's/^server=//p' "$state/config")" list \
  > "$out" 2>&1 || fail "--server did not beat GRADHUB_SERVER: $(cat "$out")"

echo "== up again, status, logs"
"$gradhub" cluster up > "$out" 2>&1 || fail "a second up failed: $(cat "$out")"
grep -q "already up" "$out" || fail "a second up did not say it is already up: $(cat "$out")"
"$gradhub" cluster status > "$out" 2>&1 || fail "status of a healthy cluster: $(cat "$out")"
"$gradhub" cluster logs api | grep -q "serving gRPC on port" || fail "cluster logs api"

echo "== a killed service"
metrics="$(pid_of metrics)"
kill -KILL "$metrics"
for _ in $(seq 50); do kill -0 "$metrics" 2>/dev/null || break; sleep 0.1; done
set +e
"$gradhub" cluster status > "$out" 2> "$out.err"
code=$?
set -e
[ "$code" = 6 ] || fail "status with metrics killed exited $code, not 6: $(cat "$out" "$out.err")"
grep -Eq "^metrics +$metrics +STOPPED" "$out" || fail "status did not report metrics: $(cat "$out")"
grep -Eq "^api +[0-9]+ +running" "$out" || fail "status lost the api: $(cat "$out")"
grep -q "metrics stopped" "$out.err" || fail "status did not name metrics: $(cat "$out.err")"
if "$gradhub" cluster up > "$out" 2>&1; then fail "up over a partly stopped cluster succeeded"; fi

echo "== down, which spares a stranger that has a recorded pid"
# As if a recorded pid had been reused by another program: `down` must see that it is not ours.
sleep 600 &
stranger=$!
python3 - "$state/cluster.json" "$stranger" <<'PY'
import json, sys
path, pid = sys.argv[1], int(sys.argv[2])
record = json.load(open(path))
record["processes"].append({"name": "stranger", "pid": pid, "binary": "/usr/bin/sleep",
                            "log": "/dev/null", "endpoints": []})
json.dump(record, open(path, "w"))
PY
"$gradhub" cluster down > "$out" 2>&1 || fail "cluster down: $(cat "$out")"
kill -0 "$stranger" 2>/dev/null || fail "down killed a process that was not its own"
kill "$stranger"
wait "$stranger" 2>/dev/null || true
left="$(ours)"
[ -z "$left" ] || fail "left running after down: $(for p in $left; do tr '\0' ' ' < /proc/$p/cmdline; echo; done)"
[ ! -e "$state/config" ] || fail "down left the client config"
if "$gradhub" cluster status > "$out" 2>&1; then fail "status after down succeeded"; fi

echo "== up again, --insecure: the same database, in plaintext"
"$gradhub" cluster up --insecure > "$out" 2> "$out.err" || fail "up after down: $(cat "$out" "$out.err")"
if grep -q "created a database" "$out.err"; then fail "the second up ran initdb again"; fi
grep -qx "tls-ca=" "$state/config" || fail "--insecure left a CA in the client config: $(cat "$state/config")"
"$gradhub" cluster status | grep -Eq "^api .*REST http://" || fail "--insecure REST is not http"
"$gradhub" list --all > "$out" || fail "list after the second up"
grep -q "${jobs[digits-mlp]}" "$out" || fail "the earlier jobs are gone: $(cat "$out")"
"$gradhub" cluster down > "$out" 2>&1 || fail "second down: $(cat "$out")"
left="$(ours)"
[ -z "$left" ] || fail "left running after the second down: $left"

echo "== --api-replicas: out of 1..16 refused, naming the flag"
for n in 0 17; do
  if "$gradhub" cluster up --api-replicas "$n" > "$out" 2>&1; then fail "--api-replicas $n was taken"; fi
  grep -q -- "--api-replicas: $n" "$out" || fail "--api-replicas $n: $(cat "$out")"
done
[ ! -e "$state/cluster.json" ] || fail "a refused --api-replicas started something"

# Agents and the CLI given every replica's address need the clients' comma lists (issue 35).
if ! "$gradhub" --help 2>&1 | grep -q "HOST:PORT,HOST:PORT"; then
  echo "SKIP up --api-replicas 2: this build's clients take one --server address"
else
  echo "== up --insecure --api-replicas 2: both replicas ready, exactly one leads"
  "$gradhub" cluster up --insecure --api-replicas 2 > "$out" 2> "$out.err" ||
    fail "up --api-replicas 2: $(cat "$out" "$out.err")"
  for service in api api-2 node-a node-b; do
    grep -Eq "^$service +[0-9]+ +running" "$out" || fail "up did not list $service: $(cat "$out")"
  done
  grep -Eq "^server=127\.0\.0\.1:[0-9]+,127\.0\.0\.1:[0-9]+$" "$state/config" ||
    fail "the client config does not name both replicas: $(cat "$state/config")"
  mapfile -t rests < <("$gradhub" cluster status | sed -n 's/^api[-0-9]* .*REST \(http:[^ ]*\).*/\1/p')
  [ "${#rests[@]}" = 2 ] || fail "status lists ${#rests[@]} api REST endpoints: $("$gradhub" cluster status)"
  # The lease is taken within a term (1.5 s) of the first start; the standby sees it as soon.
  for _ in $(seq 50); do
    leaders=0
    for rest in "${rests[@]}"; do
      body="$(curl -fsS "$rest/readyz")" || fail "$rest/readyz did not answer 200"
      grep -q "^leader: this replica" <<< "$body" && leaders=$((leaders + 1))
    done
    [ "$leaders" = 1 ] && break
    sleep 0.2
  done
  [ "$leaders" = 1 ] || fail "$leaders replicas say 'leader: this replica'"
  "$gradhub" list --all > /dev/null || fail "the CLI with both replicas' addresses"
  "$gradhub" cluster down > "$out" 2>&1 || fail "down of two replicas: $(cat "$out")"
  left="$(ours)"
  [ -z "$left" ] || fail "left running after down of two replicas: $left"
fi
echo "PASS"
