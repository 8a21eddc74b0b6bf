#!/bin/sh
# The entrypoint of the gradhub image: its first argument chooses the program.
#   api | checkpoint | metrics | agent | trainer | cli   -> gradhub-api, gradhub-checkpoint, ...
#   gradhub | gradhub-<name>                              -> that binary
#   node-token FILE                                       -> a new node token (gradhub-api
#                                                            create-node-token) written to FILE
#   certs DIR CA_DIR [--hosts H,...] [--nodes N,...]      -> `gradhub cluster certs --out DIR
#                                                            --ca-dir CA_DIR ...`; as root, the
#                                                            files then go to the gradhub user
#   anything else                                         -> run as given (sh, ls, ...)
# GRADHUB_NODE_TOKEN_FILE: when GRADHUB_NODE_TOKEN is unset, the node token is read from this
# file (docker-compose.yml's node-token service writes it; Kubernetes mounts a Secret there).
# e.g. `docker run gradhub api --help`, `docker run gradhub cli --server api:7070 list`.
set -e
if [ $# -eq 0 ]; then set -- api; fi
cmd="$1"
if [ -z "${GRADHUB_NODE_TOKEN:-}" ] && [ -n "${GRADHUB_NODE_TOKEN_FILE:-}" ]; then
  GRADHUB_NODE_TOKEN="$(cat "$GRADHUB_NODE_TOKEN_FILE")"
  export GRADHUB_NODE_TOKEN
fi
case "$cmd" in
  api|checkpoint|metrics|agent|trainer) shift; exec "/usr/local/bin/gradhub-$cmd" "$@" ;;
  node-token)
    shift
    file="${1:?node-token FILE}"
    shift
    umask 077
    /usr/local/bin/gradhub-api "$@" create-node-token > "$file.tmp"
    mv "$file.tmp" "$file"
    echo "node token written to $file"
    exit 0 ;;
  certs)
    shift
    out="${1:?certs DIR CA_DIR [flags]}"
    ca_dir="${2:?certs DIR CA_DIR [flags]}"
    shift 2
    /usr/local/bin/gradhub cluster certs --out "$out" --ca-dir "$ca_dir" "$@"
    # Run as root (a fresh volume is root's): the servers run as gradhub and read their key.
    if [ "$(id -u)" = 0 ]; then chown -R gradhub:gradhub "$out" "$ca_dir"; fi
    exit 0 ;;
  cli) shift; exec /usr/local/bin/gradhub "$@" ;;
  gradhub|gradhub-*) shift; exec "/usr/local/bin/$cmd" "$@" ;;
  *) exec "$@" ;;
esac
