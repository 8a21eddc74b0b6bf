#!/usr/bin/env bash
# gradhub-api replicas (issue #35), no agents, in one run on one PostgreSQL:
#   1. CreateJob closed loop against one replica, then the same clients split over two (each
#      replica's scheduler idle but the leader's: jobs stay PENDING, with a node selector no node
#      has); the figure on a 2-core machine shared by client, replicas and PostgreSQL is the
#      cost of a second replica as much as its gain.
#   2. Failover under load: bench_create_jobs at RATE creates/s to both replicas through one
#      gRPC target "ipv4:A,B" (pick_first: a client whose replica dies moves to the other), and
#      KILLS times the leader (the holder of control_plane_leader, found by its pid) SIGKILLed;
#      the time until another replica holds a new term is measured from the database; the
#      killed replica is started again on its ports, and the next kill waits SETTLE seconds.
#      Afterwards every create that was acknowledged must be in the jobs table, and the errors
#      the clients saw are counted by status.
# Usage: tests/bench/control_plane/run.sh [BUILD_DIR]
# Environment: GRADHUB_BENCH_KILLS (20), GRADHUB_BENCH_RATE (500), GRADHUB_BENCH_SETTLE (3),
#   GRADHUB_BENCH_SECONDS (10, each closed-loop phase), GRADHUB_BENCH_CLIENTS (32),
#   GRADHUB_LEADER_LEASE (the replicas' --leader-lease, 1.5s).
set -euo pipefail
build_dir="$(realpath "${1:-build}")"
bin="$build_dir/bin"
kills="${GRADHUB_BENCH_KILLS:-20}"
rate="${GRADHUB_BENCH_RATE:-500}"
settle="${GRADHUB_BENCH_SETTLE:-3}"
seconds="${GRADHUB_BENCH_SECONDS:-10}"
clients="${GRADHUB_BENCH_CLIENTS:-32}"
pg_bin="$(pg_config --bindir 2>/dev/null || true)"
[ -x "$pg_bin/initdb" ] || pg_bin=/usr/lib/postgresql/15/bin
for program in "$bin/gradhub-api" "$bin/bench_create_jobs" "$pg_bin/initdb"; do
  [ -x "$program" ] || { echo "missing $program (build gradhub-api and bench_create_jobs)" >&2; exit 1; }
done

work="$(mktemp -d /tmp/gradhub-bench-control-plane-XXXXXX)"
as_pg=()
declare -A api_pid=()
cleanup() {
  for pid in "${api_pid[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
now() { date +%s.%N; }

# PostgreSQL refuses to run as root: as root, run it as nobody.
if [ "$(id -u)" = 0 ]; then chown nobody "$work"; as_pg=(runuser -u nobody --); fi
pg_port="$(free_port)"
"${as_pg[@]}" "$pg_bin/initdb" -D "$work/pg" -U gradhub -A trust >/dev/null
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pg" -l "$work/pg.log" -w \
  -o "-p $pg_port -k $work -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
export GRADHUB_DATABASE_URL="postgresql://gradhub@127.0.0.1:$pg_port/postgres"
psql() { "$pg_bin/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d "$GRADHUB_DATABASE_URL" -c "$1"; }
"$bin/gradhub-api" migrate >/dev/null
token="$("$bin/gradhub-api" create-tenant bench)"

grpc_port=("$(free_port)" "$(free_port)")
start_replica() {  # replica index; waits until it serves
  local i="$1"
  "$bin/gradhub-api" --grpc-address "127.0.0.1:${grpc_port[$i]}" --http-host 127.0.0.1 \
    --http-port 0 serve >> "$work/api$i.out" 2>> "$work/api$i.err" &
  api_pid[$i]=$!
  for _ in $(seq 100); do
    [ "$(grep -c "serving gRPC" "$work/api$i.out" 2>/dev/null)" -ge "${2:-1}" ] && return 0
    sleep 0.1
  done
  echo "replica $i did not start:" >&2; tail "$work/api$i.err" >&2; exit 1
}
declare -A starts=([0]=0 [1]=0)
start() { starts[$1]=$((starts[$1] + 1)); start_replica "$1" "${starts[$1]}"; }
start 0
start 1

bench=("$bin/bench_create_jobs" --node-selector "gradhub.bench/none=1")
# TRUNCATE jobs CASCADE empties api_tokens too (job tokens reference jobs): a new tenant and
# token after each.
truncate_jobs() {
  psql 'SET client_min_messages = warning; TRUNCATE jobs CASCADE'
  export GRADHUB_TOKEN="$("$bin/gradhub-api" create-tenant "bench-$1")"
}
export GRADHUB_TOKEN="$token"
# 1. Throughput, one replica then two (half the clients on each, run at once).
"${bench[@]}" --server "127.0.0.1:${grpc_port[0]}" --clients "$clients" --seconds "$seconds" \
  --warmup 2 --rate 0 --label one > "$work/one.out"
truncate_jobs two
two_pids=()
for i in 0 1; do
  "${bench[@]}" --server "127.0.0.1:${grpc_port[$i]}" --clients "$((clients / 2))" \
    --seconds "$seconds" --warmup 2 --rate 0 --label "two-$i" > "$work/two$i.out" &
  two_pids+=($!)
done
wait "${two_pids[@]}"
truncate_jobs failover

# 2. Failover: the leader killed KILLS times under RATE creates/s.
duration=$((kills * (settle + 4) + 10))
"${bench[@]}" --server "ipv4:127.0.0.1:${grpc_port[0]},127.0.0.1:${grpc_port[1]}" \
  --clients "$clients" --seconds "$duration" --warmup 2 --rate "$rate" --label failover \
  --acked "$work/acked" > "$work/failover.out" &
bench_pid=$!
sleep 4
: > "$work/takeovers"
for k in $(seq "$kills"); do
  row="$(psql "SELECT term || ' ' || holder FROM control_plane_leader WHERE expires_at > clock_timestamp()")"
  term="${row%% *}"; holder="${row#* }"
  pid="$(echo "$holder" | awk -F: '{print $(NF-1)}')"
  victim=""
  for i in 0 1; do [ "${api_pid[$i]}" = "$pid" ] && victim="$i"; done
  [ -n "$victim" ] || { echo "kill $k: no replica leads ($row)" >&2; exit 1; }
  killed_at="$(now)"
  kill -9 "$pid"
  wait "$pid" 2>/dev/null || true
  while [ -z "$(psql "SELECT term FROM control_plane_leader WHERE term > $term AND expires_at > clock_timestamp()")" ]; do
    sleep 0.02
    awk -v a="$killed_at" -v b="$(now)" 'BEGIN { exit !(b - a > 30) }' && { echo "kill $k: no takeover in 30 s" >&2; exit 1; }
  done
  awk -v a="$killed_at" -v b="$(now)" 'BEGIN { printf "%.3f\n", b - a }' >> "$work/takeovers"
  start "$victim"
  sleep "$settle"
done
wait "$bench_pid"
psql "CREATE TABLE acked (name text)"
"$pg_bin/psql" -X -q -d "$GRADHUB_DATABASE_URL" -c "\\copy acked FROM '$work/acked'"
lost="$(psql "SELECT count(*) FROM acked a WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE 'jobs/' || j.id::text = a.name)")"
acked="$(psql "SELECT count(*) FROM acked")"
rows="$(psql "SELECT count(*) FROM jobs")"

echo "2 replicas of gradhub-api, --leader-lease ${GRADHUB_LEADER_LEASE:-1.5s}; $(nproc) cores shared by clients, replicas and PostgreSQL"
cat "$work/one.out" <(tail -n +2 "$work/two0.out") <(tail -n +2 "$work/two1.out") <(tail -n +2 "$work/failover.out")
sort -g "$work/takeovers" | awk -v one="$(sed -n 2p "$work/one.out" | awk '{print $8}')" \
    -v two="$(cat <(sed -n 2p "$work/two0.out") <(sed -n 2p "$work/two1.out") | awk '{s += $8} END {print s}')" \
    -v acked="$acked" -v lost="$lost" -v rows="$rows" -v rate="$rate" '
  { t[NR] = $1 }
  END {
    printf "%-52s %10s %8s %7s\n", "measure", "value", "target", "verdict"
    printf "%-52s %10.1f %8s %7s\n", "CreateJob closed loop, 1 replica, creates/s", one, "-", "-"
    printf "%-52s %10.1f %8s %7s\n", "CreateJob closed loop, 2 replicas, creates/s", two, "-", "-"
    printf "%-52s %10.2f %8s %7s\n", "  2 replicas / 1", (one > 0 ? two / one : 0), "-", "-"
    printf "%-52s %10d %8s %7s\n", "leader SIGKILLs under " rate " creates/s", NR, "-", "-"
    printf "%-52s %10.2f %8s %7s\n", "  kill to new leader, p50 s", t[int(NR / 2) + 1], "<=2", (t[int(NR / 2) + 1] <= 2 ? "ok" : "MISS")
    printf "%-52s %10.2f %8s %7s\n", "  kill to new leader, max s", t[NR], "<=5", (t[NR] <= 5 ? "ok" : "MISS")
    printf "%-52s %10d %8s %7s\n", "creates acknowledged", acked, "-", "-"
    printf "%-52s %10d %8s %7s\n", "  acknowledged but not in the database", lost, "0", (lost == 0 ? "ok" : "MISS")
    printf "%-52s %10d %8s %7s\n", "  jobs rows (acknowledged + answered with an error)", rows, "-", "-"
  }'
