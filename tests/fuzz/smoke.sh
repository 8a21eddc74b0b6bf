#!/usr/bin/env bash
# ctest fuzz_smoke, which CI runs through `make test`: every target of tests/fuzz under
# libFuzzer, ASan and UBSan, briefly, from the corpus kept in the tree. It runs `make fuzz`
# (configures and builds build-fuzz/ with clang, incrementally) with FUZZ_SMOKE_RUNS executions
# (default 20000) or FUZZ_SMOKE_SECONDS (default 20) per target, whichever ends first, and
# fails as `make fuzz` does: on a crash, whose input lands in build-fuzz/artifacts/<target>/.
# Skipped (exit 77) where clang cannot link libFuzzer; `make setup` installs clang and
# libclang-rt-14-dev, which has it.
set -euo pipefail
src=${1:?usage: smoke.sh SOURCE_DIR}
probe=$(mktemp -d)
echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' \
  >"$probe/probe.cc"
if ! clang++ -fsanitize=fuzzer "$probe/probe.cc" -o "$probe/probe" >/dev/null 2>&1; then
  rm -rf "$probe"
  echo "fuzz_smoke: skipped: clang++ cannot link libFuzzer (make setup installs clang)"
  exit 77
fi
rm -rf "$probe"
exec make -C "$src" fuzz FUZZ_RUNS="${FUZZ_SMOKE_RUNS:-20000}" \
  FUZZ_FLAGS="-max_total_time=${FUZZ_SMOKE_SECONDS:-20}"
