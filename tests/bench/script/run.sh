#!/usr/bin/env bash
# Script jobs: code upload against dd, and submit to the first reported step against
# `import torch`, on a local cluster (bench_script_start.py says what and how).
# Usage: tests/bench/script/run.sh [BUILD_DIR]
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$(realpath "$0")")/bench_script_start.py" "$(realpath "${1:-build}")"
