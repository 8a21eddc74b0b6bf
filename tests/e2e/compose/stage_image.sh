#!/usr/bin/env bash
# Makes the build context of deploy/Dockerfile.prebuilt from binaries built on the host:
#   tests/e2e/compose/stage_image.sh BUILD_DIR STAGING_DIR
# bin/: the six programs; lib/: the shared libraries they load that no Debian package on this
# host owns (e.g. /usr/local/cuda's libcudart and libnccl), so the image resolves them too.
set -euo pipefail
build_dir="$(realpath "$1")"
staging="$2"
src="$(cd "$(dirname "$0")/../../.." && pwd)"
programs=(gradhub gradhub-api gradhub-checkpoint gradhub-metrics gradhub-agent gradhub-trainer)
rm -rf "$staging"
mkdir -p "$staging/bin" "$staging/lib"
for p in "${programs[@]}"; do
  [ -x "$build_dir/bin/$p" ] || { echo "stage_image: $build_dir/bin/$p is missing (make build)" >&2; exit 1; }
  cp "$build_dir/bin/$p" "$staging/bin/"
done
for p in "${programs[@]}"; do
  ldd "$build_dir/bin/$p" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r soname path; do
  real="$(readlink -f "$path")"
  if ! dpkg -S "$real" >/dev/null 2>&1 && ! dpkg -S "$path" >/dev/null 2>&1; then
    cp -L "$path" "$staging/lib/$soname"
  fi
done
cp "$src/deploy/docker-entrypoint.sh" "$staging/"
echo "stage_image: $(ls "$staging/bin" | wc -l) programs, libraries not from Debian: $(ls "$staging/lib" | tr '\n' ' ')"
