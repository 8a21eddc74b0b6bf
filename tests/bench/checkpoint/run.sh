#!/usr/bin/env bash
# Upload and download of one 256 MiB checkpoint through gradhub-checkpoint, against dd on the
# same disk in the same run:
#   write reference: dd if=/dev/zero of=FILE bs=1M count=256 conv=fsync (data in page cache,
#                    then one fsync: what any durable write of 256 MiB costs on this disk);
#                    FILE is removed first, so dd writes into the pages it just freed: its best
#                    case (on this VM a buffered write into fresh memory runs at 90-170 MB/s);
#   also shown:      the same dd with oflag=direct (how the store writes: no page cache), and
#                    sha256 of the same 256 MiB on one core (openssl), the verification the
#                    store must do besides writing;
#   upload:          StartUpload + UploadChunks (one gRPC stream) + CommitCheckpoint, timed
#                    to the commit's answer, i.e. durable (fsync, rename, fsync of the directory)
#                    and recorded in PostgreSQL (bench_checkpoint.cc);
#   read reference:  dd if=FILE of=/dev/null bs=1M;
#   download:        DownloadCheckpoint of that checkpoint, the client checking it as trainers
#                    and the CLI do (services/common/blob_check.h): against the crc32c that the
#                    upload's commit made cover the sha256;
#   also shown:      the same download checking the sha256 instead, as clients did before
#                    (and still do for a checkpoint whose crc32c does not cover its sha256);
#                    and a download's two floors on this machine: the store's read of the
#                    blob from the device (dd iflag=direct of the blob just uploaded, as the
#                    store reads it: around the page cache), and the CPU the store and the
#                    client spent on it over the cores they share.
# The server's data directory and the dd file sit in one directory, so on one filesystem. Reads
# are from the page cache for both unless GRADHUB_BENCH_DROP_CACHES=1 (root only: drops the
# page cache before each read, which slows everything else on the machine for a moment).
# Each measure runs GRADHUB_BENCH_ROUNDS times (default 3), the phases interleaved so that
# background load hits both sides alike. Seconds are medians over the rounds; "vs ref" is the
# median over the rounds of each round's reference / measure (the reference is dd write unless
# the row says otherwise), "range" their lowest and highest, "rounds" how many met the target.
# Targets: upload >= 0.8x the dd write reference; download >= 0.9x (issue 37). A download that
# checks the sha256 cannot beat one sha256 of the blob on one core: that row is its floor.
# Usage: tests/bench/checkpoint/run.sh [BUILD_DIR]
# Environment: GRADHUB_BENCH_ROUNDS (3), GRADHUB_BENCH_MIB (256), GRADHUB_BENCH_DIR (parent of
#   the work directory, /tmp), GRADHUB_BENCH_DROP_CACHES (0), GRADHUB_CHECKPOINT_CHUNK_BYTES
#   etc. reach gradhub-checkpoint as usual.
set -euo pipefail
build_dir="$(realpath "${1:-build}")"
bin="$build_dir/bin"
rounds="${GRADHUB_BENCH_ROUNDS:-3}"
mib="${GRADHUB_BENCH_MIB:-256}"
drop_caches="${GRADHUB_BENCH_DROP_CACHES:-0}"
pg_bin="$(pg_config --bindir 2>/dev/null || true)"
[ -x "$pg_bin/initdb" ] || pg_bin=/usr/lib/postgresql/15/bin
for program in "$bin/gradhub-checkpoint" "$bin/bench_checkpoint" "$pg_bin/initdb"; do
  [ -x "$program" ] || { echo "missing $program (build gradhub-checkpoint and bench_checkpoint)" >&2; exit 1; }
done

work="$(mktemp -d "${GRADHUB_BENCH_DIR:-/tmp}/gradhub-bench-checkpoint-XXXXXX")"
server_pid=""
as_pg=()
cleanup() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
drop() {
  if [ "$drop_caches" = 1 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi
}

# PostgreSQL refuses to run as root: as deploy/local/cluster.sh, use the nobody account then.
mkdir -p "$work/pg"
if [ "$(id -u)" = 0 ]; then chmod 755 "$work"; chown nobody "$work/pg"; as_pg=(runuser -u nobody --); fi
pg_port="$(free_port)"
"${as_pg[@]}" "$pg_bin/initdb" -D "$work/pg" -U gradhub -A trust >/dev/null
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pg" -l "$work/pg/server.log" -w \
  -o "-p $pg_port -k $work/pg -c listen_addresses=127.0.0.1" start >/dev/null
export GRADHUB_DATABASE_URL="postgresql://gradhub@127.0.0.1:$pg_port/postgres"
psql=("$pg_bin/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d "$GRADHUB_DATABASE_URL")

token="bench-admin-$RANDOM$RANDOM"
"$bin/gradhub-checkpoint" --grpc-host 127.0.0.1 --grpc-port 0 --http-host 127.0.0.1 \
  --http-port 0 --data-dir "$work/data" --admin-token "$token" serve \
  > "$work/server.out" 2> "$work/server.err" &
server_pid=$!
for _ in $(seq 100); do grep -q "serving gRPC" "$work/server.out" && break; sleep 0.1; done
grpc_port="$(sed -n 's/.*serving gRPC on port \([0-9]*\).*/\1/p' "$work/server.out")"
[ -n "$grpc_port" ] || { echo "gradhub-checkpoint did not start:" >&2; cat "$work/server.err" >&2; exit 1; }
chunk="$("$bin/gradhub-checkpoint" --help | grep -A1 -- '--chunk-bytes ' | sed -n 's/.*(default \([0-9]*\)).*/\1/p')"
chunk="${GRADHUB_CHECKPOINT_CHUNK_BYTES:-$chunk}"

# A tenant and a RUNNING job at attempt 1 for the checkpoints (keepLast 2: old rounds go).
job="$("${psql[@]}" -c "
  INSERT INTO tenants (name) VALUES ('bench');
  INSERT INTO jobs (tenant_id, spec, world_size, state, current_attempt)
    SELECT id, '{\"checkpoint\": {\"keepLast\": 2}}', 1, 'RUNNING', 1 FROM tenants
    RETURNING id")"
job="$(echo "$job" | tail -1)"
"${psql[@]}" -c "INSERT INTO job_attempts (job_id, attempt, rendezvous_prefix, state)
  VALUES ('$job', 1, 'bench/$job/1/', 'RUNNING')"

bench=("$bin/bench_checkpoint" --server "127.0.0.1:$grpc_port" --token "$token")
# CPU seconds (user + system) a process has used, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
seconds_of() { awk '/copied/ { for (i = 1; i <= NF; i++) if ($i == "s,") print $(i - 1) }'; }
: > "$work/times"
for round in $(seq "$rounds"); do
  rm -f "$work/dd.bin"
  echo "dd_write $(dd if=/dev/zero of="$work/dd.bin" bs=1M count="$mib" conv=fsync 2>&1 | seconds_of)" >> "$work/times"
  rm -f "$work/dd-direct.bin"
  echo "dd_direct $(dd if=/dev/zero of="$work/dd-direct.bin" bs=1M count="$mib" oflag=direct conv=fsync 2>&1 | seconds_of)" >> "$work/times"
  rm -f "$work/dd-direct.bin"
  sha_start="$(date +%s.%N)"
  openssl dgst -sha256 "$work/dd.bin" > /dev/null
  echo "sha256 $(awk -v a="$sha_start" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')" >> "$work/times"
  ticks0="$(cpu_ticks "$server_pid")"
  read -r _ seconds _ name commit client_cpu < <("${bench[@]}" --mode upload --job "jobs/$job" --step "$round" --mib "$mib")
  echo "upload $seconds" >> "$work/times"
  echo "commit $commit" >> "$work/times"
  echo "client_cpu $client_cpu" >> "$work/times"
  echo "upload_cpu $(awk -v a="$ticks0" -v b="$(cpu_ticks "$server_pid")" -v hz="$(getconf CLK_TCK)" 'BEGIN {print (b - a) / hz}')" >> "$work/times"
  drop
  echo "dd_read $(dd if="$work/dd.bin" of=/dev/null bs=1M 2>&1 | seconds_of)" >> "$work/times"
  # The store reads a blob around the page cache, from the device, one record (1 MiB) at a
  # time: the same read of the blob just uploaded is a download's floor on this disk.
  blob="$(find "$work/data" -type f -size +"$((mib / 2))"M -newer "$work/dd.bin" | head -1)"
  echo "blob_read $(dd if="$blob" of=/dev/null bs=1M iflag=direct 2>&1 | seconds_of)" >> "$work/times"
  drop
  ticks0="$(cpu_ticks "$server_pid")"
  read -r _ seconds _ _ client_cpu < <("${bench[@]}" --mode download --name "$name")
  echo "download $seconds" >> "$work/times"
  echo "download_client_cpu $client_cpu" >> "$work/times"
  echo "download_cpu $(awk -v a="$ticks0" -v b="$(cpu_ticks "$server_pid")" -v hz="$(getconf CLK_TCK)" 'BEGIN {print (b - a) / hz}')" >> "$work/times"
  drop
  read -r _ seconds _ _ client_cpu < <("${bench[@]}" --mode download --name "$name" --check sha256)
  echo "download_sha $seconds" >> "$work/times"
  echo "download_sha_client_cpu $client_cpu" >> "$work/times"
done
if ! kill -0 "$server_pid" 2>/dev/null; then echo "gradhub-checkpoint exited:" >&2; tail "$work/server.err" >&2; exit 1; fi

echo "$mib MiB, $rounds rounds (medians), chunk $chunk bytes, one gRPC stream on loopback;" \
  "fs=$(findmnt -n -o FSTYPE -T "$work" 2>/dev/null || echo '?') at $work;" \
  "reads $([ "$drop_caches" = 1 ] && echo 'after dropping the page cache' || echo 'from the page cache');" \
  "$(nproc) cores shared by client, server, PostgreSQL and whatever else runs"
awk -v mib="$mib" -v cores="$(nproc)" '
  { n[$1]++; v[$1, n[$1]] = $2; t[$1] = t[$1] " " $2 }
  function median(list,   n, v, i, j, x) {
    n = split(list, v, " ")
    for (i = 2; i <= n; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  # Each round sets a measure against its own round'"'"'s reference: "median min-max k/n", k the
  # rounds at or above the target.
  function paired(measure, reference, target,   i, r, list, lo, hi, k) {
    lo = 1e9; hi = 0; k = 0; list = ""
    for (i = 1; i <= n[measure]; i++) {
      r = v[reference, i] / v[measure, i]; list = list " " r
      if (r < lo) lo = r; if (r > hi) hi = r; if (r >= target) k++
    }
    return sprintf("%.2f %.2f-%.2f %d/%d", median(list), lo, hi, k, n[measure])
  }
  function row(label, seconds, ratio, target,   f) {
    split(ratio, f, " ")
    printf "%-44s %8.3f %8.1f %6s %10s %7s %7s %6s\n", label, seconds, mib / seconds, f[1], f[2],
      target, (target == "-" ? "-" : f[3]), (target == "-" ? "-" : (f[1] >= target ? "ok" : "MISS"))
  }
  function info(label, seconds) { printf "%-44s %8.3f\n", label, seconds }
  END {
    printf "%-44s %8s %8s %6s %10s %7s %7s %6s\n", "measure", "seconds", "MiB/s", "vs ref", "range",
      "target", "rounds", "verdict"
    row("dd write + fsync (reference)", median(t["dd_write"]), "1.00 - -", "-")
    row("dd write oflag=direct + fsync", median(t["dd_direct"]), paired("dd_direct", "dd_write", 0), "-")
    row("sha256 of the bytes (openssl, one core)", median(t["sha256"]), paired("sha256", "dd_write", 0), "-")
    row("upload: start + chunks + commit (durable)", median(t["upload"]), paired("upload", "dd_write", 0.8), 0.8)
    row("  upload against dd oflag=direct", median(t["upload"]), paired("upload", "dd_direct", 0), "-")
    info("  of which CommitCheckpoint", median(t["commit"]))
    info("  gradhub-checkpoint CPU seconds per upload", median(t["upload_cpu"]))
    info("  client CPU seconds per upload", median(t["client_cpu"]))
    row("download, checked against the crc32c", median(t["download"]), paired("download", "dd_write", 0.9), 0.9)
    row("dd read (read reference)", median(t["dd_read"]), paired("dd_read", "dd_write", 0), "-")
    row("  download against dd read", median(t["download"]), paired("download", "dd_read", 0), "-")
    row("store'"'"'s disk read (the blob, iflag=direct)", median(t["blob_read"]), paired("blob_read", "dd_write", 0), "-")
    row("  download against that read", median(t["download"]), paired("download", "blob_read", 0), "-")
    info("  gradhub-checkpoint CPU seconds per download", median(t["download_cpu"]))
    info("  client CPU seconds per download", median(t["download_client_cpu"]))
    # Client and store share this machine'"'"'s cores: their CPU over the cores is the least a
    # download can take here, were every core busy with it from start to end.
    n["cpu_floor"] = n["download_cpu"]
    for (i = 1; i <= n["download_cpu"]; i++) {
      v["cpu_floor", i] = (v["download_cpu", i] + v["download_client_cpu", i]) / cores
      t["cpu_floor"] = t["cpu_floor"] " " v["cpu_floor", i]
    }
    row("  (store + client CPU) / cores: floor here", median(t["cpu_floor"]), paired("cpu_floor", "dd_write", 0), "-")
    row("download, checked against the sha256", median(t["download_sha"]), paired("download_sha", "dd_write", 0), "-")
    row("  against sha256 alone (its floor)", median(t["download_sha"]), paired("download_sha", "sha256", 0), "-")
    info("  client CPU seconds per download", median(t["download_sha_client_cpu"]))
    printf "all rounds (s): dd write%s | dd direct%s | sha256%s | upload%s | dd read%s | blob read%s | download%s | download sha256%s\n", t["dd_write"], t["dd_direct"], t["sha256"], t["upload"], t["dd_read"], t["blob_read"], t["download"], t["download_sha"]
  }' "$work/times"
