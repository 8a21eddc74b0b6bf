#!/usr/bin/env bash
# Runs every benchmark under tests/bench/*/ (each a run.sh that prints a table).
# Usage: tests/bench/run.sh [BUILD_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build_dir="$(realpath "${1:-build}")"
found=0
for bench in "$here"/*/run.sh; do
  [ -e "$bench" ] || continue
  found=1
  echo "== ${bench#$here/}"
  "$bench" "$build_dir"
done
[ "$found" = 1 ] || echo "no benchmarks yet"
