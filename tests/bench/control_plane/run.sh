#!/usr/bin/env bash
# gradhub-api replicas (issue #35) in one run on one PostgreSQL:
#   1. CreateJob closed loop against one replica, then the same clients split over two (each
#      replica's scheduler idle but the leader's: jobs stay PENDING, with a node selector no node
#      has); the figure on a 2-core machine shared by client, replicas and PostgreSQL is the
#      cost of a second replica as much as its gain.
#   2. Failover under load: bench_create_jobs at RATE creates/s to both replicas through one
#      gRPC target "ipv4:A,B" (pick_first: a client whose replica dies moves to the other), and
#      KILLS times the leader (the holder of control_plane_leader, found by its pid) SIGKILLed;
#      the time until another replica holds a new term is measured from the database; the
#      killed replica is started again on its ports, and the next kill waits SETTLE seconds.
#      Meanwhile two agents (2 CPU slots each, given both replicas' addresses) train: a job of
#      world 2 that runs through every kill, and a job of world 1 submitted (by the CLI, both
#      addresses) every SHORT_EVERY seconds, so that jobs are placed while leaders die.
#   3. Afterwards:
#      - every create that was acknowledged must be in the jobs table, and the errors the
#        clients saw are counted by status;
#      - the long job is still RUNNING in attempt 1 and trained through the kills;
#      - no job was placed twice, by three witnesses: rows (job_attempts: attempt 1 only;
#        rank_assignments: world_size rows per attempt), events (one PENDING -> SCHEDULED each,
#        none of a later attempt) and the agents' own logs (each job's rank started once);
#      - every short job that ended SUCCEEDED in attempt 1.
# Usage: tests/bench/control_plane/run.sh [BUILD_DIR]
# Environment: GRADHUB_BENCH_KILLS (20), GRADHUB_BENCH_RATE (500), GRADHUB_BENCH_SETTLE (3),
#   GRADHUB_BENCH_SECONDS (10, each closed-loop phase), GRADHUB_BENCH_CLIENTS (32),
#   GRADHUB_BENCH_SHORT_EVERY (4), GRADHUB_LEADER_LEASE (the replicas' --leader-lease, 1.5s),
#   GRADHUB_BENCH_KEEP (set: keep the work directory, with every process's log).
# Root: the agents run ranks as make setup's gradhub-rank.
set -euo pipefail
build_dir="$(realpath "${1:-build}")"
bin="$build_dir/bin"
kills="${GRADHUB_BENCH_KILLS:-20}"
rate="${GRADHUB_BENCH_RATE:-500}"
settle="${GRADHUB_BENCH_SETTLE:-3}"
seconds="${GRADHUB_BENCH_SECONDS:-10}"
clients="${GRADHUB_BENCH_CLIENTS:-32}"
short_every="${GRADHUB_BENCH_SHORT_EVERY:-4}"
pg_bin="$(pg_config --bindir 2>/dev/null || true)"
[ -x "$pg_bin/initdb" ] || pg_bin=/usr/lib/postgresql/15/bin
for program in "$bin/gradhub-api" "$bin/bench_create_jobs" "$bin/gradhub-agent" \
  "$bin/gradhub-trainer" "$bin/gradhub" "$pg_bin/initdb"; do
  [ -x "$program" ] || { echo "missing $program (make build)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "run as root: the agents start ranks as gradhub-rank" >&2; exit 1; }

work="$(mktemp -d /tmp/gradhub-bench-control-plane-XXXXXX)"
chmod 711 "$work"  # the agents' ranks (gradhub-rank) enter their work dirs below it
as_pg=()
declare -A api_pid=() agent_pid=()
cleanup() {
  for pid in "${agent_pid[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${agent_pid[@]}"; do wait "$pid" 2>/dev/null || true; done
  for pid in "${api_pid[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true
  if [ -n "${GRADHUB_BENCH_KEEP:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
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
load_names() {  # table file: a table of one column, name, holding the file's lines
  psql "CREATE TABLE $1 (name text)"
  "$pg_bin/psql" -X -q -d "$GRADHUB_DATABASE_URL" -c "\\copy $1 FROM '$2'"
}
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

# 2. Failover: agents and training jobs, then the leader killed KILLS times under RATE
#    creates/s.
addresses="127.0.0.1:${grpc_port[0]},127.0.0.1:${grpc_port[1]}"
cli=("$bin/gradhub" --server "$addresses")
start_agents() {
  local node_token
  node_token="$("$bin/gradhub-api" create-node-token)"
  for n in 0 1; do
    # At the lowest CPU priority, as their ranks inherit it: training takes what the control
    # plane leaves (in production the api runs on machines of its own), so the creates keep
    # their rate on this machine's few cores.
    nice -n 19 "$bin/gradhub-agent" --server "$addresses" --token "$node_token" --name "bench-$n" \
      --slots 2 --work-dir "$work/agent-$n" --checkpoint-root "$work/agent-$n/checkpoints" \
      --master-port-base "$((21000 + 64 * n))" > "$work/agent-$n.log" 2>&1 &
    agent_pid[$n]=$!
  done
  for n in 0 1; do
    for _ in $(seq 100); do
      grep -q "registered as nodes/bench-$n" "$work/agent-$n.log" && continue 2
      sleep 0.1
    done
    echo "agent bench-$n did not register:" >&2; tail "$work/agent-$n.log" >&2; exit 1
  done
}
training_spec() {  # world steps
  printf '%s\n' "model: {mlp: {layers: [32, 64, 4]}}" \
    "dataset: {synthetic: {numSamples: 8192, numFeatures: 32, numClasses: 4}}" \
    "optimizer: {sgd: {lr: 0.01}}" "batchSizePerRank: 16" "maxSteps: $2" \
    "logEverySteps: 50" "distributed: {worldSize: $1, ranksPerNode: 1}"
}
submit_short_jobs() {  # until $work/stop-short exists
  training_spec 1 300 > "$work/short.yaml"
  : > "$work/short.names"
  : > "$work/short.failed"
  while [ ! -e "$work/stop-short" ]; do
    "${cli[@]}" submit -f "$work/short.yaml" >> "$work/short.names" 2>> "$work/short.err" ||
      echo failed >> "$work/short.failed"
    sleep "$short_every"
  done
}
job_field() {  # job column
  psql "SELECT $2 FROM jobs WHERE 'jobs/' || id::text = '$1'"
}
start_agents
training_spec 2 1000000000 > "$work/long.yaml"
long_job="$("${cli[@]}" submit -f "$work/long.yaml")"
for _ in $(seq 300); do
  [ "$(job_field "$long_job" "state = 'RUNNING' AND progress_step > 0")" = t ] && break
  sleep 0.1
done
[ "$(job_field "$long_job" state)" = RUNNING ] || { echo "$long_job never ran" >&2; exit 1; }

duration=$((kills * (settle + 4) + 10))
"${bench[@]}" --server "ipv4:127.0.0.1:${grpc_port[0]},127.0.0.1:${grpc_port[1]}" \
  --clients "$clients" --seconds "$duration" --warmup 2 --rate "$rate" --label failover \
  --acked "$work/acked" > "$work/failover.out" &
bench_pid=$!
submit_short_jobs &
short_pid=$!
sleep 4
long_step_before="$(job_field "$long_job" progress_step)"
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
long_step_after="$(job_field "$long_job" progress_step)"
long_state="$(job_field "$long_job" "state || ' attempt ' || current_attempt")"
touch "$work/stop-short"
wait "$short_pid"
# The load is over: the agents and their ranks back at the normal priority, so that what
# still runs finishes even while something else keeps this machine busy.
descendants() {  # pids of the processes below $@, and $@
  ps -eo pid=,ppid= | awk -v roots=" $* " '
    { parent[$1] = $2 }
    END {
      n = split(roots, queue, " ")
      for (i = 1; i <= n; i++) found[queue[i]] = 1
      do { grown = 0; for (p in parent) if (!(p in found) && (parent[p] in found)) { found[p] = 1; grown = 1 } } while (grown)
      for (p in found) print p
    }'
}
renice -n 0 -p $(descendants "${agent_pid[@]}") > /dev/null
# The short jobs not ended yet run out (300 steps take seconds once the load is gone).
load_names short_jobs "$work/short.names"
short_job_rows="FROM short_jobs s JOIN jobs j ON 'jobs/' || j.id::text = s.name"
for _ in $(seq 120); do
  [ "$(psql "SELECT count(*) $short_job_rows WHERE j.end_time IS NULL")" = 0 ] && break
  sleep 1
done
short_states="$(psql "SELECT string_agg(state || ' ' || n, ', ') FROM (SELECT j.state, count(*) AS n
  $short_job_rows WHERE NOT (j.state = 'SUCCEEDED' AND j.current_attempt = 1) GROUP BY 1) x")"
load_names acked "$work/acked"
lost="$(psql "SELECT count(*) FROM acked a WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE 'jobs/' || j.id::text = a.name)")"
acked="$(psql "SELECT count(*) FROM acked")"
rows="$(psql "SELECT count(*) FROM jobs WHERE spec->'nodeSelector' ? 'gradhub.bench/none'")"
# 3. Placed once: rows, events, and what the agents started.
short_jobs="$(psql "SELECT count(*) FROM short_jobs")"
short_submit_errors="$(wc -l < "$work/short.failed")"
short_ok="$(psql "SELECT count(*) $short_job_rows WHERE j.state = 'SUCCEEDED' AND j.current_attempt = 1")"
placed="$(psql "SELECT count(*) FROM job_attempts")"
later_attempts="$(psql "SELECT count(*) FROM job_attempts WHERE attempt > 1")"
wrong_rank_rows="$(psql "SELECT count(*) FROM (SELECT 1 FROM job_attempts a JOIN jobs j ON j.id = a.job_id
  LEFT JOIN rank_assignments r USING (job_id, attempt)
  GROUP BY a.job_id, a.attempt, j.world_size HAVING count(r.rank) <> j.world_size) x")"
scheduled_twice="$(psql "SELECT count(*) FROM (SELECT 1 FROM job_events
  WHERE type = 'STATE_CHANGED' AND to_state = 'SCHEDULED' GROUP BY job_id HAVING count(*) > 1) x")"
later_events="$(psql "SELECT count(*) FROM job_events WHERE attempt > 1")"
ranks_placed="$(psql "SELECT coalesce(sum(j.world_size), 0) FROM job_attempts a JOIN jobs j ON j.id = a.job_id")"
grep -ho 'started jobs/[^ ]* attempt [0-9]* rank [0-9]*' "$work"/agent-*.log | sort > "$work/rank-starts"
rank_starts="$(wc -l < "$work/rank-starts")"
ranks_started_twice="$(uniq -d "$work/rank-starts" | wc -l)"

echo "2 replicas of gradhub-api, --leader-lease ${GRADHUB_LEADER_LEASE:-1.5s}; $(nproc) cores shared by clients, replicas and PostgreSQL"
cat "$work/one.out" <(tail -n +2 "$work/two0.out") <(tail -n +2 "$work/two1.out") <(tail -n +2 "$work/failover.out")
if [ -n "$short_states" ]; then
  echo "world-1 jobs not SUCCEEDED in attempt 1: $short_states; their events:"
  psql "SELECT s.name || ' ' || e.attempt || ' ' || e.type || ' ' || coalesce(e.to_state, '') || ': ' || e.message
    $short_job_rows JOIN job_events e ON e.job_id = j.id
    WHERE NOT (j.state = 'SUCCEEDED' AND j.current_attempt = 1) ORDER BY e.id"
fi
sort -g "$work/takeovers" | awk -v one="$(sed -n 2p "$work/one.out" | awk '{print $8}')" \
    -v two="$(cat <(sed -n 2p "$work/two0.out") <(sed -n 2p "$work/two1.out") | awk '{s += $8} END {print s}')" \
    -v acked="$acked" -v lost="$lost" -v rows="$rows" -v rate="$rate" \
    -v long_state="$long_state" -v long_steps="$((long_step_after - long_step_before))" \
    -v short_jobs="$short_jobs" -v short_submit_errors="$short_submit_errors" -v short_ok="$short_ok" \
    -v placed="$placed" -v later_attempts="$later_attempts" -v wrong_rank_rows="$wrong_rank_rows" \
    -v scheduled_twice="$scheduled_twice" -v later_events="$later_events" \
    -v ranks_placed="$ranks_placed" -v rank_starts="$rank_starts" -v ranks_started_twice="$ranks_started_twice" '
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
    printf "%-52s %10s %8s %7s\n", "world-2 job through the kills: state", long_state, "RUNNING attempt 1", (long_state == "RUNNING attempt 1" ? "ok" : "MISS")
    printf "%-52s %10d %8s %7s\n", "  its steps trained during the kills", long_steps, ">0", (long_steps > 0 ? "ok" : "MISS")
    printf "%-52s %10d %8s %7s\n", "world-1 jobs submitted during the kills (CLI)", short_jobs, "-", "-"
    printf "%-52s %10d %8s %7s\n", "  submits that failed", short_submit_errors, "-", "-"
    printf "%-52s %10d %8s %7s\n", "  SUCCEEDED in attempt 1", short_ok, short_jobs, (short_ok == short_jobs ? "ok" : "MISS")
    printf "%-52s %10d %8s %7s\n", "jobs placed (job_attempts rows)", placed, "-", "-"
    printf "%-52s %10d %8s %7s\n", "  attempts after the first (rows)", later_attempts, "0", (later_attempts == 0 ? "ok" : "MISS")
    printf "%-52s %10d %8s %7s\n", "  attempts without world_size rank rows", wrong_rank_rows, "0", (wrong_rank_rows == 0 ? "ok" : "MISS")
    printf "%-52s %10d %8s %7s\n", "  jobs with two PENDING->SCHEDULED events", scheduled_twice, "0", (scheduled_twice == 0 ? "ok" : "MISS")
    printf "%-52s %10d %8s %7s\n", "  events of a later attempt", later_events, "0", (later_events == 0 ? "ok" : "MISS")
    printf "%-52s %10d %8s %7s\n", "  ranks started by the agents", rank_starts, ranks_placed, (rank_starts == ranks_placed ? "ok" : "MISS")
    printf "%-52s %10d %8s %7s\n", "  ranks started twice", ranks_started_twice, "0", (ranks_started_twice == 0 ? "ok" : "MISS")
  }'
