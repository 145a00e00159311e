#!/usr/bin/env bash
# Device run for issue 37 item 3 (one GPU): the training-side kernels against the PyTorch paths they replace.
# The kernel tests on CUDA; the log-prob kernels alone against the chunked path and Liger's cross-entropy
# (bench/logprobs.py); the MoE block alone with the PyTorch and the fused token permutation (bench/moe_block.py);
# the training micro-batch of the dense 1.5B and 8B shapes and the MoE 2.6B shape (bench/liger_train.py:
# `fused` = every kernel, `fused+torch_paths` = the log-probs and the MoE permutation in PyTorch, as before).
# PARTS=grpo: the MoE GRPO step end to end with and without model.fused_kernels; PARTS=planner: the planner's
# 8k two-step run. Carry `.device` (whl/ with liger-kernel, cache/ with SmolLM2's tokenizer). PARTS selects
# (default "tests logprobs block dense moe"). Logs under $OUT; the tables are printed at the end.
set -uo pipefail
export PYTHONPATH="$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
parts=${PARTS:-tests logprobs block dense moe}
moe=qwen3-moe-2.6b-a0.5b
source scripts/device_liger.sh
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
if [[ $parts == *tests* ]]; then
  REINFORGE_CACHE=$PWD/.device/cache python -m pytest -q -p no:cacheprovider tests/unit/test_algo.py tests/integration/test_moe.py \
      tests/unit/test_fused.py -k "log_probs or permutation or grouped or engine or fused" 2>&1 | tail -5 > "$OUT/tests.log"
fi
if [[ $parts == *logprobs* ]]; then
  python bench/logprobs.py --tokens 8192 16384 > "$OUT/logprobs.log" 2>&1
  python bench/logprobs.py --tokens 16384 --entropy >> "$OUT/logprobs.log" 2>&1
fi
if [[ $parts == *block* ]]; then
  python bench/moe_block.py --arch $moe --tokens 16384 65536 > "$OUT/moe_block.log" 2>&1
  python bench/moe_block.py --arch qwen3-moe-30b-a3b --tokens 16384 >> "$OUT/moe_block.log" 2>&1
fi
if [[ $parts == *dense* ]]; then
  python bench/liger_train.py --arch qwen2.5-1.5b --tokens 8192 --steps 4 \
      --variants fused fused+torch_paths fused+no_checkpointing > "$OUT/train_dense.log" 2>&1
  python bench/liger_train.py --arch qwen3-8b --tokens 8192 --row-len 8192 --steps 3 \
      --variants fused fused+torch_paths > "$OUT/train_8b.log" 2>&1
fi
if [[ $parts == *moe* ]]; then
  python bench/liger_train.py --arch $moe --tokens 16384 --steps 4 --profile \
      --variants fused fused+torch_paths fused+no_checkpointing > "$OUT/train_moe.log" 2>&1
fi
if [[ $parts == *grpo* ]]; then  # end to end: the MoE GRPO step of issue 25, every kernel against model.fused_kernels=false
  for fk in true false; do
    python bench/grpo_long.py --arch $moe --lengths 2048 --seqs 128 --kv-fraction 0.25 --set model.fused_kernels=$fk \
        --tokenizer .device/cache/models/smollm2-135m-instruct 2>&1 | grep -v -e Warning -e "Writing model" \
        | tail -5 > "$OUT/grpo_moe_fused_$fk.log"
  done
fi
if [[ $parts == *planner* ]]; then  # the planner's 8k run (two steps, auto keys) with the fused kernels
  OUT=$OUT LENGTH=8192 SETTINGS=auto ROLLOUTS=2 bash scripts/gpu_planner.sh > "$OUT/planner_8k.log" 2>&1
fi
for f in "$OUT"/*.log; do echo "== $f"; grep "^|\|^qwen\|^log-probs\|^GPU\|Error\|error\|passed\|failed" "$f" | head -14; done
