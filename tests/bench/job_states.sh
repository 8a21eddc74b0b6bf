# Sourced by the benches that run jobs on the local cluster (deploy/local/cluster.sh). Needs
# $gradhub (the CLI) and $py (/usr/bin/python3) set by the caller.

# Waits (up to 60 s, polling every 50 ms) until job $1 is in state $2 at attempt $3 or later.
await_state() {  # job, state, attempt
  for _ in $(seq 1200); do
    out="$("$gradhub" --output json get "$1")"
    if echo "$out" | "$py" -c 'import json,sys; j=json.load(sys.stdin); sys.exit(0 if j.get("state")==sys.argv[1] and j.get("attempt",0)>=int(sys.argv[2]) else 1)' "$2" "$3"; then return 0; fi
    sleep 0.05
  done
  echo "timed out waiting for $1 to be $2 at attempt $3" >&2; return 1
}
