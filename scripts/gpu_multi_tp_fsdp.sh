#!/usr/bin/env bash
# Issue 26, run 4: tensor parallelism x FSDP2 on 4 GPUs against FSDP2 alone (bench/tp_fsdp.py): one process,
# FSDP2 over 4, 2 data x 2 tensor, 4 tensor; loss, gradient norm and the weights after 4 actor steps (random
# Qwen3-dense-0.5B weights, 256 synthetic samples, bf16, NCCL). Device kind: nvidia-h200-x4 (no Ray, no
# .device needed), with train.adam_eps 1e-8 and 1e-3. Output: $OUT/tp_fsdp_eps*.log. DRY_RUN=1: the same on CPU, 4 gloo ranks, a tiny qwen3, 2 steps.
source "$(dirname "$0")/multi_common.sh"
need_gpus 4
if [[ $DRY == 1 ]]; then
  $PY bench/tp_fsdp.py --world 4 --tp 2 4 --steps 2 --samples 8 --max-tokens 2048 --tiny --device cpu --adam-eps 1e-3 2>&1 \
      | grep -v Warning | tail -9 | tee "$OUT/tp_fsdp_dry.log"
  exit "${PIPESTATUS[0]}"
fi
rc=0
for eps in 1e-8 1e-3; do  # the training default, then Adam updates proportional to the gradient (bench/tp_fsdp.py)
  $PY bench/tp_fsdp.py --world 4 --tp 2 4 --steps "${STEPS:-4}" --adam-eps $eps 2>&1 | grep -v Warning \
      | tee "$OUT/tp_fsdp_eps$eps.log" | tail -9
  rc=$(( rc | PIPESTATUS[0] ))
done
exit $rc
