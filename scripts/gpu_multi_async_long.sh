#!/usr/bin/env bash
# Issue 26, run 1 (throughput): synchronous vs asynchronous RL at long responses on 2 GPUs, Ray
# disaggregated (1 trainer GPU, 1 engine GPU): max_staleness 0 (sync), 1, 2, 4 with partial rollouts, a
# random Qwen2.5-1.5B-shaped model, responses up to $LENGTHS (default "8192 16384"): samples/s, tokens/s
# (bench/async_long.py -> bench/async_vs_sync.py); NUM_SEQS overrides the sequences per rollout. Device kind:
# nvidia-h200-x2; carry .device (tokenizer) and install Ray first (scripts/device_setup.sh). Output: $OUT/async_long_L/{table.md,results.json}, logs.
# DRY_RUN=1: the same path on CPU (tiny model, 16-token responses, 2 rollouts, staleness 0 and 2).
source "$(dirname "$0")/multi_common.sh"
need_gpus 2; need_ray
if [[ $DRY == 1 ]]; then
  $PY bench/async_long.py --tiny --length 16 --seqs 4 --n 2 --num-rollout 2 --staleness 0 2 --partial-rollout \
      --tokenizer "$TOK" --output-dir "$OUT/async_long_dry" train.device=cpu 2>&1 | tail -40 | tee "$OUT/async_long_dry.log"
  exit "${PIPESTATUS[0]}"
fi
declare -A SEQS=([8192]=128 [16384]=64 [32768]=16)
rc=0
for L in ${LENGTHS:-8192 16384}; do
  $PY bench/async_long.py --length "$L" --seqs "${NUM_SEQS:-${SEQS[$L]:-64}}" --num-rollout "${NUM_ROLLOUT:-8}" \
      --staleness ${STALENESS:-0 1 2 4} --partial-rollout --tokenizer "$TOK" --output-dir "$OUT/async_long_$L" \
      2>&1 | grep -v -e Warning -e "Writing model" > "$OUT/async_long_$L.log"
  rc=$(( rc | PIPESTATUS[0] ))
  tail -8 "$OUT/async_long_$L.log"
done
exit $rc
