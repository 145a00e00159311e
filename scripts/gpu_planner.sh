#!/usr/bin/env bash
# Issue 37: the planner's predictions against a GPU's measurements (bench/plan_vs_measured.py) on the 1.39B
# Qwen2-shaped random model of bench/grpo_long.py, GRPO colocated, 128 sequences at $LENGTH (default 8192):
# the hand-tuned settings of docs/benchmarks.md, then the same with the planner's `auto` keys, then the
# issue's OOM case (`reinforge plan`, expected refused). SETTINGS picks ("tuned auto oom"); ROLLOUTS steps each. Carry .device/cache (SmolLM2's tokenizer files).
set -uo pipefail
export PYTHONPATH="$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=${LENGTH:-8192}
source scripts/device_liger.sh
B=$(python - <<PY
from pathlib import Path
import grpo_long
grpo_long.write_model(Path("/tmp/m"), Path(".device/cache/models/smollm2-135m-instruct"), 33000, "qwen2.5-1.5b")
grpo_long.write_prompts(Path("/tmp/p.jsonl"), 1024)
o = grpo_long.workload_overrides(Path("/tmp/m"), Path("/tmp/p.jsonl"), Path("/tmp/run"), length=$L, seqs=128, n=8,
                                 max_num_seqs=128, kv_fraction=0.7, max_tokens=16640, steps=1)
print(" ".join(x for x in o if not x.startswith(("train.max_tokens_per_gpu", "engine.max_num_seqs"))))
PY
)
TUNED="engine.kv_cache_dtype=fp8 cluster.offload_rollout=true model.recompute_num_layers=6 train.max_tokens_per_gpu=16640 engine.max_num_seqs=128"
AUTO="engine.kv_cache_dtype=fp8 cluster.offload_rollout=auto model.recompute_num_layers=auto train.max_tokens_per_gpu=auto engine.max_num_seqs=auto"
R=${ROLLOUTS:-1}; : > "$OUT/planner.txt"  # ROLLOUTS=2: the second step, without the first one's compilation
if [[ ${SETTINGS:-tuned auto oom} == *tuned* ]]; then
  echo "== hand-tuned ($L, last of $R)" | tee -a "$OUT/planner.txt"
  python bench/plan_vs_measured.py --rollouts $R $B $TUNED 2>&1 | grep -v -e Warning -e "Writing model" | tail -14 | tee -a "$OUT/planner.txt"
fi
if [[ ${SETTINGS:-tuned auto oom} == *auto* ]]; then
  echo "== auto ($L, last of $R)" | tee -a "$OUT/planner.txt"
  python bench/plan_vs_measured.py --rollouts $R $B $AUTO 2>&1 | grep -v -e Warning -e "Writing model" | tail -18 | tee -a "$OUT/planner.txt"
fi
[[ ${SETTINGS:-tuned auto oom} == *oom* ]] || exit 0
echo "== the issue's OOM case at 16k (expect refused, exit 1)" | tee -a "$OUT/planner.txt"
python -m reinforge plan ${B//rollout_max_response_len=$L/rollout_max_response_len=16384} train.max_tokens_per_gpu=32768 \
    model.gradient_checkpointing=false engine.max_num_seqs=64 2>&1 | tail -12 | tee -a "$OUT/planner.txt"; echo "rc=${PIPESTATUS[0]}" | tee -a "$OUT/planner.txt"
