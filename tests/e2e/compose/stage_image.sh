#!/usr/bin/env bash
# Makes the build context of deploy/Dockerfile.prebuilt from binaries built on the host:
#   tests/e2e/compose/stage_image.sh BUILD_DIR STAGING_DIR
# bin/: the six programs; lib/: the shared libraries they and gradhub._C load that no Debian
# package on this host owns (e.g. /usr/local/cuda's libcudart and libnccl), so the image
# resolves them too; python/: the gradhub package with its engine (BUILD_DIR/python/gradhub,
# _C*.so and _build_info.py required); torch.txt: this host's python3-torch and libtorch1.13
# as package=version, the torch the engine was built against, which the image installs.
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
package="$build_dir/python/gradhub"
engine=("$package"/_C.*.so)
if [ ! -f "${engine[0]}" ] || [ ! -f "$package/_build_info.py" ]; then
  echo "stage_image: $package has no _C*.so or _build_info.py (make build; its configure says why" \
    "the extension was skipped)" >&2
  exit 1
fi
mkdir -p "$staging/python"
cp -r "$package" "$staging/python/"
rm -rf "$staging/python/gradhub/__pycache__"
dpkg-query -W -f='${Package}=${Version}\n' python3-torch libtorch1.13 >"$staging/torch.txt"
for binary in "${programs[@]/#/$build_dir/bin/}" "${engine[0]}"; do
  ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r soname path; do
  real="$(readlink -f "$path")"
  if ! dpkg -S "$real" >/dev/null 2>&1 && ! dpkg -S "$path" >/dev/null 2>&1; then
    cp -L "$path" "$staging/lib/$soname"
  fi
done
cp "$src/deploy/docker-entrypoint.sh" "$src/deploy/check_engine.py" "$staging/"
echo "stage_image: $(ls "$staging/bin" | wc -l) programs, gradhub/$(basename "${engine[0]}") for" \
  "$(tr '\n' ' ' <"$staging/torch.txt"); libraries not from Debian: $(ls "$staging/lib" | tr '\n' ' ')"
