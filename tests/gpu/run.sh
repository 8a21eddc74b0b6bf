#!/usr/bin/env bash
# The GPU check, for a machine with a GPU and a CUDA PyTorch but nothing else: builds the
# engine alone (no gRPC, PostgreSQL, Gloo or gtest) against that PyTorch's libtorch and NCCL,
# runs gpu_check (NCCL collectives at world size 1, DDP training on cuda:0 in FP32, then in BF16
# autocast and in FP16 autocast with dynamic loss scaling, one poisoned step skipped) and times a step
# against PyTorch eager. Never part of CI. Usage: tests/gpu/run.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build-gpu}"
python="${PYTHON:-python3}"
command -v cmake >/dev/null || { echo "tests/gpu/run.sh: cmake is required" >&2; exit 2; }
torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
"$python" -c 'import torch; assert torch.cuda.is_available(), "no CUDA in this PyTorch"'
# PyTorch wheels carry NCCL in the nvidia-nccl package; fall back to the CUDA toolkit's.
nccl_root=$("$python" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null \
  || echo /usr/local/cuda)
nccl_lib=$(ls "$nccl_root"/lib/libnccl.so* "$nccl_root"/lib64/libnccl.so* 2>/dev/null | head -1)
generator=$(command -v ninja >/dev/null && echo Ninja || echo "Unix Makefiles")
cmake -S . -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
  -DGRADHUB_BUILD_SERVICES=OFF -DGRADHUB_BUILD_TESTS=OFF -DGRADHUB_USE_CCACHE=OFF \
  -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DGRADHUB_NCCL_INCLUDE_DIR="$nccl_root/include" -DGRADHUB_NCCL_LIBRARY="$nccl_lib"
cmake --build "$build" --target gpu_check -j "$(nproc)"
set +e
"$build/bin/gpu_check" | tee "$build/gpu_check.out"
status=${PIPESTATUS[0]}
set -e
ours=$(awk '/^step_ms/ {print $2}' "$build/gpu_check.out")
theirs=$("$python" tests/gpu/pytorch_eager.py | awk '/^step_ms/ {print $2}')
echo
printf '%-34s %12s %12s %7s\n' "step, MLP 784-1024-1024-10 b64" "pytorch_ms" "gradhub_ms" ratio
awk -v r="$theirs" -v g="$ours" 'BEGIN { printf "%-34s %12.3f %12.3f %7.2f\n", "cuda:0, SGD momentum", r, g, g/r }'
exit "$status"
