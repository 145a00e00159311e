#!/usr/bin/env bash
# Issue 37: the planner's predictions against a GPU's measurements (bench/plan_vs_measured.py) on the 1.39B
# Qwen2-shaped random model of bench/grpo_long.py, GRPO colocated, 128 sequences (128 / N prompts x N samples, N=16 by
# default: issue 56's 8 x 16) at $LENGTH (default 8192). SETTINGS picks, in this order (default "tuned auto oom"):
#   none   no performance key written (issue 56: every one `auto` by default; bf16 KV cache)
#   bf16   the best bf16-cache hand tuning (offload_rollout, kv_cache_memory_fraction 0.6, packing sequences,
#          128 slots, max_tokens_per_gpu and recompute auto)
#   fp8    no performance key but engine.kv_cache_dtype=fp8
#   tuned  the fp8 hand tuning of docs/benchmarks.md (fp8, 0.55, recompute 6, 16640 tokens, sequences, 128 slots)
#   auto   the four `auto` keys of issue 37 written out, fp8 (as recorded before issue 56)
#   oom    the issue's OOM case (`reinforge plan`, expected refused)
# ROLLOUTS steps each (2: the second step, without the first one's compilation). Carry .device/cache (SmolLM2's
# tokenizer files). Issue 56's comparison, side by side in one device call per pair:
#   LENGTH=8192 ROLLOUTS=2 SETTINGS="none bf16" bash scripts/gpu_planner.sh; ... SETTINGS="fp8 tuned" ...
set -uo pipefail
export PYTHONPATH="$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=${LENGTH:-8192}; N=${N:-16}
source scripts/device_liger.sh
B=$(python - <<PY
from pathlib import Path
import grpo_long
grpo_long.write_model(Path("/tmp/m"), Path(".device/cache/models/smollm2-135m-instruct"), 33000, "qwen2.5-1.5b")
grpo_long.write_prompts(Path("/tmp/p.jsonl"), 1024)
o = grpo_long.workload_overrides(Path("/tmp/m"), Path("/tmp/p.jsonl"), Path("/tmp/run"), length=$L, seqs=128, n=$N,
                                 max_num_seqs=128, kv_fraction=0.7, max_tokens=16640, steps=1)
perf = ("train.max_tokens_per_gpu", "engine.max_num_seqs", "engine.kv_cache_memory_fraction", "train.packing",
        "model.gradient_checkpointing")  # the performance keys: none written, each setting writes its own
print(" ".join(x for x in o if not x.startswith(perf)))
PY
)
TUNED="engine.kv_cache_dtype=fp8 engine.kv_cache_memory_fraction=0.55 cluster.offload_rollout=true model.gradient_checkpointing=true model.recompute_num_layers=6 train.max_tokens_per_gpu=16640 train.packing=sequences engine.max_num_seqs=128"
BF16="cluster.offload_rollout=true engine.kv_cache_memory_fraction=0.6 train.packing=sequences engine.max_num_seqs=128 model.gradient_checkpointing=true model.recompute_num_layers=auto train.max_tokens_per_gpu=auto"
AUTO="engine.kv_cache_dtype=fp8 engine.kv_cache_memory_fraction=0.7 train.packing=sequences model.gradient_checkpointing=true cluster.offload_rollout=auto model.recompute_num_layers=auto train.max_tokens_per_gpu=auto engine.max_num_seqs=auto"
R=${ROLLOUTS:-1}; : > "$OUT/planner.txt"  # ROLLOUTS=2: the second step, without the first one's compilation
S=${SETTINGS:-tuned auto oom}
for name in none bf16 fp8 tuned auto; do
  [[ " $S " == *" $name "* ]] || continue
  case $name in none) KEYS="";; bf16) KEYS=$BF16;; fp8) KEYS="engine.kv_cache_dtype=fp8";; tuned) KEYS=$TUNED;; auto) KEYS=$AUTO;; esac
  echo "== $name ($L, last of $R): ${KEYS:-no performance key}" | tee -a "$OUT/planner.txt"
  python bench/plan_vs_measured.py --rollouts $R $B $KEYS 2>&1 | grep -v -e Warning -e "Writing model" | tail -22 | tee -a "$OUT/planner.txt"
done
[[ " $S " == *" oom "* ]] || exit 0
echo "== the issue's OOM case at 16k (expect refused, exit 1)" | tee -a "$OUT/planner.txt"
python -m reinforge plan ${B//rollout_max_response_len=$L/rollout_max_response_len=16384} train.max_tokens_per_gpu=32768 \
    model.gradient_checkpointing=false model.recompute_num_layers=null engine.max_num_seqs=64 engine.kv_cache_memory_fraction=0.7 \
    train.packing=sequences cluster.offload_rollout=false 2>&1 | tail -12 | tee -a "$OUT/planner.txt"; echo "rc=${PIPESTATUS[0]}" | tee -a "$OUT/planner.txt"
