#!/usr/bin/env bash
# Issue 36 item 7(a): a Qwen3-8B-shaped dense model (random weights, its own 151,936-entry vocabulary; SmolLM2's
# tokenizer for the prompts), full-parameter GRPO colocated on one H200 with train.optimizer_offload (AdamW's moments
# in page-locked host memory: 8 B of 16 per parameter off the GPU), fp8 KV cache, cluster.offload_rollout, every
# layer recomputed: bench/grpo_long.py's table (generated and trained tok/s, weight sync seconds, peak GPU memory).
# First the offload optimizer's GPU test (side-stream copies = fused AdamW bit for bit). Carry .device (the tokenizer).
#   run: bash scripts/gpu_8b_offload.sh          (LENGTHS, SEQS, STEPS override the workload)
set -uo pipefail
export PYTHONPATH="$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOG="$OUT/gpu_8b_offload.log"
source scripts/device_liger.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$LOG"
timeout 60 python -m pytest -q -p no:cacheprovider tests/unit/test_offload.py -k "adamw" 2>&1 | tail -2 | tee -a "$LOG"
timeout "${T8B:-420}" python bench/grpo_long.py --arch qwen3-8b --own-vocab --lengths ${LENGTHS:-4096} \
    --seqs "${SEQS:-64}" --n 8 --steps "${STEPS:-2}" --max-tokens 8192 --kv-fraction 0.6 --kv-cache-dtypes fp8 \
    --tokenizer .device/cache/models/smollm2-135m-instruct \
    --set train.optimizer_offload=true cluster.offload_rollout=true model.recompute_num_layers=null \
    2>&1 | grep -v -e Warning -e "Writing model" -e "it/s]" | tee -a "$LOG" | tail -14
echo "rc=${PIPESTATUS[0]}" | tee -a "$LOG"
