#!/usr/bin/env bash
# Device run for issue 25 on one GPU: the MoE and fused-kernel tests on CUDA, then a Qwen3-MoE-shaped model
# (2.6B total / 0.53B active, random weights) next to a dense Qwen3 of the same active size: engine tokens/s
# (bench/rollout.py), training tokens/s (bench/liger_train.py), GRPO end to end (bench/grpo_long.py).
# Carry `.device` (whl/ with liger-kernel; cache/ with SmolLM2's tokenizer files). PARTS selects the parts
# (default: "tests engine train grpo"; "replay": the train-vs-rollout log-prob difference with and without
# algo.use_rollout_routing_replay, bf16 engine, against the dense model). Output under $OUT.
set -uo pipefail
export PYTHONPATH="$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
parts=${PARTS:-tests engine train grpo}
moe=qwen3-moe-2.6b-a0.5b dense=qwen3-dense-0.5b
source scripts/device_liger.sh
if [[ $parts == *tests* ]]; then
  REINFORGE_CACHE=$PWD/.device/cache python -m pytest -q tests/integration/test_moe.py tests/unit/test_fused.py \
      tests/integration/test_routing_replay.py -k "not grpo" 2>&1 | tail -4 | tee "$OUT/tests.log"
fi
if [[ $parts == *engine* ]]; then
  python bench/rollout.py --models $moe,$dense --num-prompts 32 --n 8 --max-new-tokens 512 --skip-baselines \
      2>&1 | grep -v Warning | tail -4 | tee "$OUT/engine.log"
fi
if [[ $parts == *train* ]]; then
  for a in $moe $dense; do
    python bench/liger_train.py --arch $a --variants eager fused --tokens 8192 16384 2>&1 | grep "^|\|^qwen" \
        | tee "$OUT/train_$a.log"
  done
fi
if [[ $parts == *grpo* ]]; then
  for a in $moe $dense; do
    python bench/grpo_long.py --arch $a --lengths ${LENGTHS:-2048} --seqs 128 --kv-fraction 0.25 \
        --tokenizer .device/cache/models/smollm2-135m-instruct 2>&1 | grep -v -e Warning -e "Writing model" \
        | tail -5 | tee "$OUT/grpo_$a.log"
  done
fi
if [[ $parts == *replay* ]]; then
  for run in "$moe false" "$moe true" "$dense false"; do
    set -- $run
    python bench/grpo_long.py --arch $1 --lengths ${LENGTHS:-1024} --seqs 64 --kv-fraction 0.25 \
        --set algo.use_rollout_routing_replay=$2 --tokenizer .device/cache/models/smollm2-135m-instruct 2>&1 \
        | grep -v -e Warning -e "Writing model" | tail -8 | tee "$OUT/replay_$1_$2.log"
  done
fi
