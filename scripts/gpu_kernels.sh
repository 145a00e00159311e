#!/usr/bin/env bash
# Device run for issue 37 item 3 (one GPU): where the training and MoE time goes, kernel by kernel.
# The MoE block alone with its dispatch variants (bench/moe_block.py), the training micro-batch of the dense
# 1.5B and 8B shapes and the MoE 2.6B shape with the variants of bench/liger_train.py and their kernel tables,
# and the MoE engine's decode kernels (bench/profile_decode.py). Carry `.device` (whl/ with liger-kernel).
# PARTS selects (default "block dense moe decode"). Logs under $OUT; the tables are printed at the end.
set -uo pipefail
export PYTHONPATH="$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
parts=${PARTS:-block dense moe decode}
moe=qwen3-moe-2.6b-a0.5b
source scripts/device_liger.sh
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
if [[ $parts == *block* ]]; then
  python bench/moe_block.py --arch $moe --tokens 16384 65536 --profile > "$OUT/moe_block.log" 2>&1
  python bench/moe_block.py --arch qwen3-moe-30b-a3b --tokens 16384 >> "$OUT/moe_block.log" 2>&1
fi
if [[ $parts == *dense* ]]; then
  python bench/liger_train.py --arch qwen2.5-1.5b --tokens 8192 --steps 4 --profile \
      --variants fused fused+no_checkpointing fused+compile > "$OUT/train_dense.log" 2>&1
  python bench/liger_train.py --arch qwen3-8b --tokens 8192 --row-len 8192 --steps 3 --profile \
      --variants fused > "$OUT/train_8b.log" 2>&1
fi
if [[ $parts == *moe* ]]; then
  python bench/liger_train.py --arch $moe --tokens 16384 --steps 4 --profile --variants fused fused+compile \
      > "$OUT/train_moe.log" 2>&1
fi
if [[ $parts == *decode* ]]; then
  python bench/profile_decode.py $moe > "$OUT/decode_moe.log" 2>&1
fi
for f in "$OUT"/*.log; do echo "== $f"; grep "^|\|^qwen\|Error\|error" "$f" | head -12; done
