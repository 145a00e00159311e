#!/usr/bin/env bash
# Issue 26, run 1 (learning parity): the arithmetic task (examples/arith_grpo.yaml, SmolLM2-135M-Instruct)
# synchronous vs max_staleness 1, 2, 4 with partial rollouts, 2 seeds each, on 2 GPUs, Ray disaggregated
# (1 trainer GPU, 1 engine GPU): held-out greedy accuracy on 256 problems after the same number of samples,
# the mean and spread over the seeds (bench/async_vs_sync.py --seeds). Device kind: nvidia-h200-x2; first
# scripts/device_setup.sh (reasoning-gym, Ray and the SmolLM2 weights). NUM_ROLLOUT (default 40),
# STALENESS (default "0 1 2 4"), SEEDS (default "1 2"). Output: $OUT/async_parity/{table.md,results.json}.
# DRY_RUN=1: the same path on CPU (a tiny random model, 2 rollouts, 4 held-out problems, staleness 2, 2 seeds).
source "$(dirname "$0")/multi_common.sh"
need_gpus 2; need_ray
O=(cluster.mode=ray cluster.colocate=false cluster.actor_num_gpus_per_node=1 cluster.rollout_num_gpus=1
   eval.n_samples_per_eval_prompt=0 "eval.pass_k=[]")
if [[ $DRY == 1 ]]; then
  $PY -c "import sys; from pathlib import Path; from async_long import build_model
build_model(Path(sys.argv[1]), 'smollm2', Path(sys.argv[2]), 1024, tiny=True)" "$OUT/parity_dry_model" "$TOK" || exit 1
  $PY bench/async_vs_sync.py --config examples/arith_grpo.yaml --num-rollout 2 --staleness 2 --seeds 1 2 \
      --partial-rollout --output-dir "$OUT/async_parity_dry" "${O[@]}" model.path="$OUT/parity_dry_model" \
      data.n_eval_prompts=4 rollout.rollout_batch_size=2 rollout.n_samples_per_prompt=2 \
      rollout.rollout_max_response_len=8 engine.max_num_seqs=8 train.device=cpu train.max_tokens_per_gpu=512 \
      2>&1 | tail -12 | tee "$OUT/async_parity_dry.log"
  exit "${PIPESTATUS[0]}"
fi
$PY bench/async_vs_sync.py --config examples/arith_grpo.yaml --num-rollout "${NUM_ROLLOUT:-40}" \
    --staleness ${STALENESS:-0 1 2 4} --seeds ${SEEDS:-1 2} --partial-rollout --output-dir "$OUT/async_parity" \
    "${O[@]}" data.n_eval_prompts=256 2>&1 | grep -v Warning > "$OUT/async_parity.log"
rc=${PIPESTATUS[0]}
tail -16 "$OUT/async_parity.log"
exit "$rc"
