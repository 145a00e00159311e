#!/usr/bin/env bash
# Issue 36 item 2: pipeline parallelism on 4 GPUs against FSDP2 alone (bench/pipeline.py): FSDP2 over 4,
# 2 pipeline x 2 data, 2 pipeline x 2 virtual stages (interleaved 1F1B) x 2 data, 4 pipeline, 2 pipeline x
# 2 tensor; loss, gradient norm, weights after the steps, s/step, tokens/s, peak memory (random
# Qwen3-dense-0.5B weights, 24 layers, 256 synthetic samples, bf16, NCCL). Device kind: nvidia-h100-x4 (no
# Ray, no .device needed). Output: $OUT/pipeline.log. DRY_RUN=1: the same on CPU, 4 gloo ranks, a tiny
# 4-layer qwen3, 2 steps. LAYOUTS / STEPS override the rows (10 minutes a command: take them a few at a time);
# LAYOUTS="fsdp tp2 tp2-sp tp4 tp4-sp": tensor parallelism without and with train.sequence_parallel (peak memory).
source "$(dirname "$0")/multi_common.sh"
need_gpus 4
if [[ $DRY == 1 ]]; then
  $PY bench/pipeline.py --world 4 --layouts fsdp pp2 pp2-vpp2 pp4 pp2-tp2 --steps 2 --samples 8 --max-tokens 2048 \
      --tiny --device cpu 2>&1 | grep -v Warning | tail -9 | tee "$OUT/pipeline_dry.log"
  exit "${PIPESTATUS[0]}"
fi
# shellcheck disable=SC2086
$PY bench/pipeline.py --world 4 --layouts ${LAYOUTS:-fsdp pp2 pp2-vpp2 pp4 pp2-tp2} --steps "${STEPS:-4}" 2>&1 \
    | grep -v Warning | tee "$OUT/pipeline.log" | tail -9
exit "${PIPESTATUS[0]}"
