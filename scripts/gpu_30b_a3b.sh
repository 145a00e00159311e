#!/usr/bin/env bash
# Issue 36 item 7(b): a Qwen3-30B-A3B-shaped MoE (48 layers, 128 experts, top-8; random weights drawn on the GPU by
# trainer and engine: model.random_init, config-only folder), GRPO colocated on one H200 with LoRA r=16 on attention,
# the frozen base in bf16, the engine's weights in host memory while training (cluster.offload_engine_weights), fp8
# KV cache, every layer recomputed. Prints bench/grpo_long.py's table per step. Carry .device (the tokenizer).
#   run: bash scripts/gpu_30b_a3b.sh          (LENGTHS, SEQS, STEPS, KV, EXTRA override the workload)
set -uo pipefail
export PYTHONPATH="$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOG="$OUT/gpu_30b_a3b.log"
source scripts/device_liger.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$LOG"
timeout "${T30B:-560}" python bench/grpo_long.py --arch qwen3-moe-30b-a3b --own-vocab --random-init \
    --lengths ${LENGTHS:-4096} --seqs "${SEQS:-64}" --n 8 --steps "${STEPS:-2}" --max-tokens 8192 \
    --kv-fraction "${KV:-0.6}" --kv-cache-dtypes fp8 --tokenizer .device/cache/models/smollm2-135m-instruct \
    --set model.lora_rank=16 "model.lora_target_modules=[q_proj,k_proj,v_proj,o_proj]" cluster.offload_rollout=true \
    cluster.offload_engine_weights=true model.recompute_num_layers=null ${EXTRA:-} \
    2>&1 | grep -v -e Warning -e "Writing model" -e "it/s]" | tee -a "$LOG" | tail -24
echo "rc=${PIPESTATUS[0]}" | tee -a "$LOG"
