#!/usr/bin/env bash
# The GPU check, for a machine with a GPU and a CUDA PyTorch but nothing else (no network).
# Never part of CI. Usage: tests/gpu/run.sh [BUILD_DIR]
#   1. Configures the node build (-DGRADHUB_BUILD_SERVICES=OFF: no PostgreSQL, no HTTP
#      servers, no tests) against that PyTorch's libtorch (Torch_DIR) and NCCL, and builds
#      gpu_check, plus gradhub-trainer and gradhub-agent when the node's gRPC, protobuf and the
#      rest are there (cmake/GradhubNodeDeps.cmake names what is missing and its Debian
#      packages; without them the trainer rows below say so and are skipped).
#   2. nccl_process_group_test: the ProcessGroup conformance suite (every collective, dtype
#      and error case of tests/unit/ddp/process_group_conformance.h) against NCCL, one GPU
#      per rank: on one GPU the world-of-one cases, the rest skipped with the reason (built
#      when GoogleTest is on the node, else reported as skipped). gpu_check: DDP training on
#      cuda:0 in FP32, BF16 and FP16 autocast (one poisoned step skipped), one step timed
#      against PyTorch eager.
#   3. nccl_pipeline_test, with two or more GPUs visible: a 2-stage pipeline over NCCL
#      send/recv (rank r on cuda:r), a 4-layer MLP with GPipe and 1F1B, M = 4, 20 steps, equal
#      to single-process training on cuda:0 within 1e-5 (FP32, TF32 off), and a send/recv ring
#      of float32 and bfloat16 tensors between the two GPUs (built apart from step 1, so a
#      failure is a row). With one GPU its row says it is skipped and why (two NCCL ranks
#      cannot share one GPU).
#   4. gradhub-trainer as the agent starts it on a GPU node (GRADHUB_DEVICE=cuda,
#      GRADHUB_BACKEND=NCCL, CUDA_VISIBLE_DEVICES=0), world size 1 (two NCCL ranks cannot share
#      one GPU): the same job on cuda:0 and on the CPU (Gloo) end within tolerance; BF16 on the
#      GPU within tolerance of FP32; a checkpoint saved on the GPU at step 100 resumes on the
#      GPU (close to the uninterrupted run) and on the CPU (map_location).
#   5. The Python front end (issue 32): gradhub._C built in this node build for this PyTorch
#      (gradhub_python_module and its gradhub_python_extension; GRADHUB_PYTHON=$PYTHON, and
#      pybind11 from that torch's own include/pybind11, the headers torch itself was built
#      with, not a system copy), then gpu_worker/python/tests/cuda_equivalence_test.py:
#      gradhub's DDP against torch's DDP on NCCL, world 1 on cuda:0 and world 2 when two GPUs
#      are visible, parameters within 1e-6 after 100 steps. Built apart from step 1, so a
#      failure is a row, not the end of the run.
#   6. The script-job example (deploy/examples/script-job/code/train.py) as the agent starts a
#      script rank on a CUDA node (script_launch.h: torchrun's variables, one GPU a rank through
#      CUDA_VISIBLE_DEVICES, the gradhub package on PYTHONPATH: step 5's build; no cluster:
#      this machine has no PostgreSQL), on up to 2 GPUs with NCCL: every rank exits 0 (a job's
#      SUCCEEDED), and a run stopped at step 150 resumes from the module's checkpoint to the
#      same parameters; with --ddp gradhub (gradhub.DistributedDataParallel, its process group
#      from MASTER_ADDR/MASTER_PORT) it trains on NCCL to the end.
#   7. A table last. Exit 0 only if every check passed. Within 10 minutes on one H200 with a
#      cold build (the trainer jobs take seconds each). On two GPUs step 3 adds one test
#      program's build and a run bounded by 300 s (a few NCCL initialisations and 20 steps of a
#      small MLP: seconds); not yet timed on such a machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build-gpu}"
python="${PYTHON:-python3}"
command -v cmake >/dev/null || { echo "tests/gpu/run.sh: cmake is required" >&2; exit 2; }
torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
"$python" -c 'import torch; assert torch.cuda.is_available(), "no CUDA in this PyTorch"'
# GPUs this process may use (CUDA_VISIBLE_DEVICES counts): steps 3 and 6 use two when there.
gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())')
# PyTorch wheels carry NCCL in the nvidia-nccl package; fall back to the CUDA toolkit's.
nccl_root=$("$python" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null \
  || echo /usr/local/cuda)
nccl_lib=$(ls "$nccl_root"/lib/libnccl.so* "$nccl_root"/lib64/libnccl.so* 2>/dev/null | head -1)
generator=$(command -v ninja >/dev/null && echo Ninja || echo "Unix Makefiles")
set +e
cmake -S . -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
  -DGRADHUB_BUILD_SERVICES=OFF -DGRADHUB_BUILD_TESTS=OFF -DGRADHUB_USE_CCACHE=OFF \
  -DCMAKE_PREFIX_PATH="$torch_prefix" -DTorch_DIR="$torch_prefix/Torch" \
  -DGRADHUB_NCCL_INCLUDE_DIR="$nccl_root/include" -DGRADHUB_NCCL_LIBRARY="$nccl_lib" \
  -DGRADHUB_PYTHON="$(command -v "$python")" -DPython3_EXECUTABLE="$(command -v "$python")" \
  -DCMAKE_DISABLE_FIND_PACKAGE_pybind11=ON \
  >"$build.configure.log" 2>&1
configured=$?
set -e
grep -iE "gradhub|error" "$build.configure.log" || true
[ "$configured" -eq 0 ] || { echo "tests/gpu/run.sh: configure failed, see $build.configure.log" >&2; exit 1; }
targets=(gpu_check)
conformance=no
if cmake --build "$build" --target help | grep -q 'nccl_process_group_test'; then
  targets+=(nccl_process_group_test)
  conformance=yes
fi
node_build=no
if cmake --build "$build" --target help | grep -q 'gradhub-trainer'; then
  targets+=(gradhub-trainer gradhub-agent)
  node_build=yes
fi
cmake --build "$build" --target "${targets[@]}" -j "$(nproc)"

failures=0
rows=()  # "check|figures|verdict"
row() { rows+=("$1|$2|$3"); [ "$3" = PASS ] || [ "$3" = SKIP ] || failures=$((failures + 1)); }

# --- 2. the engine alone ---
if [ "$conformance" = yes ]; then
  set +e
  timeout 300 "$build/bin/nccl_process_group_test" --gtest_color=no >"$build/nccl_conformance.out" 2>&1
  conformance_status=$?
  set -e
  grep -E '^\[  (PASSED|SKIPPED|FAILED) ' "$build/nccl_conformance.out" || true
  counts=$(awk '/^\[  PASSED  \]/ {p=$4} /^\[  SKIPPED \]/ && /tests?,/ {s=$4} END {printf "%s passed, %s skipped", p+0, s+0}' "$build/nccl_conformance.out")
  row "ProcessGroup conformance on NCCL" "$counts, exit $conformance_status" \
    "$([ "$conformance_status" -eq 0 ] && echo PASS || echo FAIL)"
else
  row "ProcessGroup conformance on NCCL" "not built: no GoogleTest on this node" SKIP
fi
set +e
"$build/bin/gpu_check" | tee "$build/gpu_check.out"
check_status=${PIPESTATUS[0]}
set -e
ours=$(awk '/^step_ms/ {print $2}' "$build/gpu_check.out")
theirs=$("$python" tests/gpu/pytorch_eager.py | awk '/^step_ms/ {print $2}')
row "gpu_check (NCCL, DDP FP32/BF16/FP16)" "exit $check_status" \
  "$([ "$check_status" -eq 0 ] && echo PASS || echo FAIL)"
row "step ms, MLP 784-1024-1024-10 b64" \
  "$(awk -v r="${theirs:-0}" -v g="${ours:-0}" 'BEGIN { printf "pytorch %.3f gradhub %.3f ratio %.2f", r, g, (r > 0 ? g / r : 0) }')" \
  "$([ -n "$ours" ] && echo PASS || echo FAIL)"

# --- 3. a 2-stage pipeline over NCCL send/recv, one GPU a rank ---
pipeline_check="2-stage NCCL pipeline"
if [ "$gpus" -lt 2 ]; then
  row "$pipeline_check" "skipped: needs 2 GPUs, this machine has $gpus" SKIP
elif ! cmake --build "$build" --target help | grep 'nccl_pipeline_test' >/dev/null; then
  row "$pipeline_check" "not built: no GoogleTest on this node" SKIP
elif ! cmake --build "$build" --target nccl_pipeline_test -j "$(nproc)" >"$build/pipeline.log" 2>&1; then
  row "$pipeline_check" "build failed, see $build/pipeline.log" FAIL
else
  set +e
  timeout 300 "$build/bin/nccl_pipeline_test" --gtest_color=no --gtest_filter='Nccl/*' \
    >"$build/nccl_pipeline.out" 2>&1
  pipeline_status=$?
  set -e
  grep -E '^pipeline nccl|^\[  (PASSED|SKIPPED|FAILED) ' "$build/nccl_pipeline.out" || true
  # Every NCCL case must have run and passed: a skipped one (e.g. a libtorch without CUDA) fails.
  ran=$(awk '/^\[==========\] [0-9]+ tests? from .* ran/ {print $2}' "$build/nccl_pipeline.out")
  passed=$(grep -c '^\[       OK \] Nccl/' "$build/nccl_pipeline.out" || true)
  differences=$(awk '/^pipeline nccl / {sub(":", "", $3); printf "%s%s %s", sep, $3, $9; sep = ", "}' \
    "$build/nccl_pipeline.out")
  if [ -z "$differences" ]; then  # no figures: why the cases were skipped, if they were
    differences=$(grep -m1 -A1 ': Skipped$' "$build/nccl_pipeline.out" | sed -n '2s/^/skipped: /p' | cut -c1-36 || true)
  fi
  row "$pipeline_check" "${differences:-no figures} (1e-5); $passed/${ran:-0} passed, exit $pipeline_status" \
    "$([ "$pipeline_status" -eq 0 ] && [ "${ran:-0}" -gt 0 ] && [ "$passed" -eq "$ran" ] && echo PASS || echo FAIL)"
fi

# --- 4. the trainer as a GPU node runs it ---
work="$build/trainer-check"
rm -rf "$work" && mkdir -p "$work"
# Noisy enough (about 72% accuracy after 200 steps) that the comparisons below mean something.
spec() {  # spec FILE MAX_STEPS [PRECISION]
  cat >"$1" <<EOF
model: {mlp: {layers: [32, 256, 256, 4]}}
dataset: {synthetic: {numSamples: 8192, numFeatures: 32, numClasses: 4, noise: 6.0}, validationFraction: 0.1}
optimizer: {sgd: {lr: 0.05, momentum: 0.9}}
batchSizePerRank: 64
maxSteps: $2
logEverySteps: 50
checkpoint: {everySteps: 100}
precision: ${3:-FP32}
seed: 7
EOF
}
# trainer NAME DEVICE SPEC [CHECKPOINT_DIR]: one rank, as the agent starts it on that device.
trainer() {
  local name=$1 device=$2 spec_file=$3 ckpt=${4:-}
  local backend=GLOO visible=""
  [ "$device" = cuda ] && backend=NCCL && visible=0
  local args=(--spec "$spec_file" --rank 0 --world-size 1 --job-id "$name" --threads 8)
  [ -n "$ckpt" ] && args+=(--checkpoint-dir "$ckpt")
  CUDA_VISIBLE_DEVICES="$visible" GRADHUB_DEVICE="$device" GRADHUB_BACKEND="$backend" \
    timeout 300 "$build/bin/gradhub-trainer" "${args[@]}" >"$work/$name.out" 2>"$work/$name.err"
}
# field NAME KEY: KEY of the run's done line ("" when it has none; never fails).
field() {
  "$python" - "$work/$1.out" "$2" <<'EOF' || true
import json, sys
value = ""
try:
    for line in open(sys.argv[1]):
        if line.startswith('{"event":"done"'):
            value = json.loads(line).get(sys.argv[2], "")
except (OSError, ValueError):
    pass
print(value)
EOF
}
# close A B REL ABS: |A - B| <= REL * |B| + ABS
close() { "$python" -c "import sys; a,b,r,t=map(float,sys.argv[1:]); sys.exit(0 if abs(a-b) <= r*abs(b)+t else 1)" "$@"; }
run_row() {  # run_row LABEL NAME DEVICE SPEC [CKPT]
  local label=$1 name=$2
  shift 2
  if trainer "$name" "$@"; then
    row "$label" "loss $(field "$name" loss) eval.loss $(field "$name" eval.loss) acc $(field "$name" eval.accuracy) in $(field "$name" trainSeconds) s" PASS
  else
    row "$label" "exit $? ($(tail -1 "$work/$name.err"))" FAIL
  fi
}

if [ "$node_build" = yes ]; then
  spec "$work/200.yaml" 200
  spec "$work/100.yaml" 100
  spec "$work/bf16.yaml" 200 BF16
  run_row "trainer cpu, Gloo, 200 steps" cpu cpu "$work/200.yaml"
  run_row "trainer cuda:0, NCCL, 200 steps" gpu cuda "$work/200.yaml"
  grep -q "trains on cuda:0 with NCCL" "$work/gpu.err" \
    && row "trainer placed on cuda:0 with NCCL" "from its log" PASS \
    || row "trainer placed on cuda:0 with NCCL" "$(grep -m1 'trains on' "$work/gpu.err" || echo none)" FAIL
  for key in eval.loss eval.accuracy; do
    gpu=$(field gpu $key) cpu=$(field cpu $key)
    close "${gpu:-nan}" "${cpu:-0}" 0.05 0.02 2>/dev/null \
      && row "cuda:0 vs cpu, $key" "$gpu vs $cpu (5% + 0.02)" PASS \
      || row "cuda:0 vs cpu, $key" "$gpu vs $cpu (5% + 0.02)" FAIL
  done
  run_row "trainer cuda:0, NCCL, BF16 autocast" bf16 cuda "$work/bf16.yaml"
  bf16=$(field bf16 eval.accuracy) fp32=$(field gpu eval.accuracy)
  close "${bf16:-nan}" "${fp32:-0}" 0 0.03 2>/dev/null \
    && row "BF16 vs FP32 accuracy on cuda:0" "$bf16 vs $fp32 (3 points)" PASS \
    || row "BF16 vs FP32 accuracy on cuda:0" "$bf16 vs $fp32 (3 points)" FAIL
  # A checkpoint saved on the GPU at step 100, resumed on the GPU and on the CPU to step 200.
  mkdir -p "$work/ckpt-gpu"
  run_row "cuda:0 to step 100, checkpoint" half cuda "$work/100.yaml" "$work/ckpt-gpu"
  cp -r "$work/ckpt-gpu" "$work/ckpt-cpu"
  run_row "resumed on cuda:0 to 200" resumed-gpu cuda "$work/200.yaml" "$work/ckpt-gpu"
  run_row "resumed on cpu to 200 (map_location)" resumed-cpu cpu "$work/200.yaml" "$work/ckpt-cpu"
  for name in resumed-gpu resumed-cpu; do
    grep -q "resumed from step 100" "$work/$name.err" \
      && row "$name resumed from step 100" "from its log" PASS \
      || row "$name resumed from step 100" "$(tail -1 "$work/$name.err")" FAIL
  done
  resumed=$(field resumed-gpu loss) whole=$(field gpu loss)
  close "${resumed:-nan}" "${whole:-0}" 1e-3 1e-4 2>/dev/null \
    && row "resumed on cuda:0 vs uninterrupted, loss" "$resumed vs $whole (0.1%)" PASS \
    || row "resumed on cuda:0 vs uninterrupted, loss" "$resumed vs $whole (0.1%)" FAIL
  resumed=$(field resumed-cpu eval.accuracy) whole=$(field gpu eval.accuracy)
  close "${resumed:-nan}" "${whole:-0}" 0 0.03 2>/dev/null \
    && row "resumed on cpu vs cuda:0, accuracy" "$resumed vs $whole (3 points)" PASS \
    || row "resumed on cpu vs cuda:0, accuracy" "$resumed vs $whole (3 points)" FAIL
else
  row "gradhub-trainer on cuda:0" \
    "not built: $(grep -o 'missing [^.]*' "$build.configure.log" | head -1 || echo 'node deps missing')" SKIP
fi

# --- 5. the Python front end: gradhub._C for this PyTorch, and DDP equivalence on NCCL ---
extension=no
# The built package (the copy and its extension) once it built, else the sources' (no engine).
python_path="$PWD/gpu_worker/python"
if cmake --build "$build" --target help | grep 'gradhub_python_extension' >/dev/null; then
  set +e
  cmake --build "$build" --target gradhub_python_module -j "$(nproc)" >"$build/extension.log" 2>&1
  extension_status=$?
  set -e
  if [ "$extension_status" -eq 0 ] && ls "$build"/python/gradhub/_C.*.so >/dev/null 2>&1; then
    extension=yes
    python_path="$(cd "$build/python" && pwd)"
    row "gradhub._C for this PyTorch" "$(sed -n 's/^TORCH_VERSION = //p' "$build/python/gradhub/_build_info.py")" PASS
  else
    row "gradhub._C for this PyTorch" "build failed, exit $extension_status, see $build/extension.log" FAIL
  fi
else
  row "gradhub._C for this PyTorch" \
    "not configured: $(grep -o 'is not built: .*' "$build.configure.log" | head -1 | cut -c1-48)" FAIL
fi
if [ "$extension" = yes ]; then
  set +e
  (cd gpu_worker/python/tests && PYTHONPATH="$python_path" OPENBLAS_NUM_THREADS=1 \
    timeout 300 "$python" cuda_equivalence_test.py) >"$build/equivalence.out" 2>&1
  set -e
  cat "$build/equivalence.out"
  for world in 1 2; do
    line=$(grep -E "^(PASS|SKIP|FAIL) test_world_${world}_" "$build/equivalence.out" | head -1)
    verdict=${line%% *} figures=${line#*: }
    [ -n "$line" ] || { verdict=FAIL figures="no result (timed out or crashed)"; }
    row "DDP gradhub vs torch, NCCL, world $world" "$figures" "$verdict"
  done
else
  row "DDP gradhub vs torch, NCCL" "not run: no gradhub._C" FAIL
fi

# --- 6. the script-job example, each rank as the agent starts it on a CUDA node ---
rm -rf "$build/script-check" && mkdir -p "$build/script-check"
script_dir="$(cd "$build/script-check" && pwd)" src="$PWD"
script_world=$(( gpus >= 2 ? 2 : 1 ))
# script_job NAME MAX_STEPS [CHECKPOINTS [ARGS...]]: every rank in $script_dir/NAME, the
# module's checkpoints in $script_dir/CHECKPOINTS (default NAME), ARGS more of the script's
# arguments; 0 if every rank exited 0.
script_job() {
  local port status=0 pids=() r
  port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  mkdir -p "$script_dir/$1"
  for ((r = 0; r < script_world; r++)); do
    (cd "$script_dir/$1" && RANK=$r WORLD_SIZE=$script_world LOCAL_RANK=$r LOCAL_WORLD_SIZE=$script_world \
      GROUP_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port CUDA_VISIBLE_DEVICES=$r GRADHUB_DEVICE=cuda \
      GRADHUB_BACKEND=NCCL PYTHONPATH="$python_path" \
      GRADHUB_CHECKPOINT_DIR="$script_dir/${3:-$1}-checkpoints" timeout 300 "$python" \
      "$src/deploy/examples/script-job/code/train.py" --max-steps "$2" --seed 1 "${@:4}" >"rank$r.log" 2>&1) &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || status=1; done
  return $status
}
digest_of() { sed -n 's/^final parameters sha256 //p' "$script_dir/$1/rank0.log"; }
if script_job whole 300 && grep -q "over nccl" "$script_dir/whole/rank0.log"; then
  row "script example, $script_world rank(s), NCCL" "$(grep -m1 'trains on' "$script_dir/whole/rank0.log")" PASS
else
  row "script example, $script_world rank(s), NCCL" "$(tail -1 "$script_dir/whole/rank0.log")" FAIL
fi
# The same job stopped at step 150, then run again: it resumes from its checkpoint.
if script_job part 150 && script_job resumed 300 part && grep -q "resumed from step 150" "$script_dir/resumed/rank0.log" &&
    [ -n "$(digest_of whole)" ] && [ "$(digest_of resumed)" = "$(digest_of whole)" ]; then
  row "script example resumed at 150, same bits" "sha256 $(digest_of whole | cut -c1-16)" PASS
else
  row "script example resumed at 150, same bits" "$(digest_of resumed | cut -c1-16) vs $(digest_of whole | cut -c1-16)" FAIL
fi

# The example with gradhub's DDP (--ddp gradhub): gradhub.distributed.init() from
# MASTER_ADDR/MASTER_PORT, gradhub.DistributedDataParallel on NCCL.
if [ "$extension" != yes ]; then
  row "script example, --ddp gradhub, NCCL" "not run: no gradhub._C (its row above)" SKIP
elif script_job gradhub 300 gradhub --ddp gradhub &&
    grep -q "with gradhub's DDP over nccl" "$script_dir/gradhub/rank0.log" && [ -n "$(digest_of gradhub)" ]; then
  row "script example, --ddp gradhub, NCCL" "$(grep -m1 'trains on' "$script_dir/gradhub/rank0.log" | cut -c1-64)" PASS
else
  row "script example, --ddp gradhub, NCCL" "$(tail -1 "$script_dir/gradhub/rank0.log" | cut -c1-64)" FAIL
fi

# --- 7. the table ---
echo
printf '%-44s %-64s %s\n' check figures verdict
for entry in "${rows[@]}"; do
  IFS='|' read -r check figures verdict <<<"$entry"
  printf '%-44s %-64s %s\n' "$check" "$figures" "$verdict"
done
echo "failures: $failures"
[ "$failures" -eq 0 ]
