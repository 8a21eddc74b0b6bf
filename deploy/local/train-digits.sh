#!/usr/bin/env bash
# Trains an MLP on the digits dataset (Debian's python3-sklearn) with 2 ranks on this machine,
# as the node agents will: one gradhub-trainer process per rank, rendezvous through a file
# store, checkpoints in a local directory. Prints each rank's final line.
# Usage: deploy/local/train-digits.sh [BUILD_DIR]
set -euo pipefail
build_dir="$(realpath "${1:-build}")"
digits=/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
[ -f "$digits" ] || { echo "missing $digits: run make setup" >&2; exit 1; }
work="$(mktemp -d /tmp/gradhub-digits-XXXXXX)"
trap 'rm -rf "$work"' EXIT
cat > "$work/job.yaml" <<YAML
displayName: digits-mlp
model: {mlp: {layers: [64, 128, 10]}}
dataset: {csv: {path: $digits, normalize: standard}, validationFraction: 0.2}
optimizer: {sgd: {lr: 0.05, momentum: 0.9}}
batchSizePerRank: 32
maxEpochs: 25
evalEverySteps: 200
logEverySteps: 100
checkpoint: {everySteps: 500}
seed: 1
YAML
for rank in 0 1; do
  "$build_dir/bin/gradhub-trainer" --spec "$work/job.yaml" --rank "$rank" --world-size 2 \
    --store "file:$work/rdzv" --checkpoint-dir "$work/ckpt" > "$work/rank$rank.out" &
done
wait
grep '"event":"done"' "$work"/rank*.out
