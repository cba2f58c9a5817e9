#!/usr/bin/env bash
# The GPU checks as one prepared command, for a CUDA machine (about 6 minutes on an H100/H200):
#   bash bench/gpu_check.sh [RESULTS_DIR]        (default: $OUT if set, else runs/gpu_check)
# 1. throughput and MFU of the crammed-BERT base model: bf16, torch.compile, batch 256 x 128 (bench_model.py);
#    the issue's target is >= 45% MFU on an H200;
# 2. the data loader's cost next to a training step on the GPU, with pinned memory and prefetching (bench_data.py;
#    needs `tokenizers` for its tokenizer comparison);
# 3. a 3-minute train.py run of the base model on the bundled sample with --compile (bf16, fused AdamW).
# Results land in RESULTS_DIR as a few small files; the caches and the trained model stay in /tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-runs/gpu_check}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python bench/bench_model.py --compile --skip-hf --out "$out/bench_model.json" 2>&1 | tee "$out/bench_model.txt"
python bench/bench_data.py --device cuda --batch-size 256 --out "$out/bench_data.json" 2>&1 | tail -20 \
    | tee "$out/bench_data.txt" || echo "bench_data.py failed (is tokenizers installed?)" | tee -a "$out/bench_data.txt"
rm -rf /tmp/gpu_check_run
python train.py --data sample --vocab-size 8192 --model base --minutes 3 --compile --micro-batch 256 \
    --batch-tokens 262144 --cache /tmp/gpu_check_cache --out /tmp/gpu_check_run 2>&1 | tail -25 | tee "$out/train.txt"
cp /tmp/gpu_check_run/summary.json "$out/train_summary.json"
