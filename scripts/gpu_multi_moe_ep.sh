#!/usr/bin/env bash
# Issue 26, run 3: mixture-of-experts with expert parallelism on $GPUS GPUs (default 8; 4 works): a random
# Qwen3-MoE-shaped model ($ARCH, default qwen3-moe-30b-a3b on 8 GPUs, qwen3-moe-15b-a1.8b on 4), GRPO end to
# end in Ray mode, colocated (engine weights offloaded while training), rows: FSDP2 alone, EP x FSDP2
# (train.expert_model_parallel_size=$EP, default GPUS/2), each without and with routing replay
# (algo.use_rollout_routing_replay): generated tokens/s per GPU, mean |engine - trainer log-prob|, weight
# sync, peak GPU memory (bench/grpo_ray.py). Device kind: nvidia-h200-x8 (or -x4 with GPUS=4); Ray installed
# (scripts/device_setup.sh), carry .device. One or two ROWS per device call (default "fsdp fsdp-rr ep ep-rr").
# Output: $OUT/moe/results.jsonl, $OUT/moe_ROW.log. DRY_RUN=1: CPU, a tiny qwen3_moe (8 experts, top-2),
# 2 trainer ranks over gloo, EP 2, rows "fsdp ep-rr".
source "$(dirname "$0")/multi_common.sh"
G=${GPUS:-8}
need_gpus "$G"; need_ray
EP=${EP:-$(( G / 2 ))}
ARCH=${ARCH:-$([[ $G -ge 8 ]] && echo qwen3-moe-30b-a3b || echo qwen3-moe-15b-a1.8b)}
COMMON="--colocate --trainers $G --engines $G --length ${LENGTH:-4096} --seqs $(( 32 * G ))"
# --random-init: the ranks draw the weights (one seed) and the first weight sync hands them to the engines;
# writing the 30-60 GB checkpoint would take minutes of a 10-minute call
EXTRA=(--steps "${STEPS:-2}" --random-init --model-dir "$PWD/out/models" cluster.offload_engine_weights=true)
if [[ $DRY == 1 ]]; then
  G=2 EP=2 COMMON="--colocate --trainers 2 --engines 2 --length 16 --seqs 4 --n 2"
  ARCH=qwen3-moe-30b-a3b
  EXTRA=(--steps 2 --tiny --random-init --model-dir "$OUT/models" train.device=cpu cluster.num_cpus_per_worker=0.5)
  ROWS=${ROWS:-fsdp ep-rr}
fi
declare -A KEYS=(
  [fsdp]="train.expert_model_parallel_size=1 algo.use_rollout_routing_replay=false"
  [fsdp-rr]="train.expert_model_parallel_size=1 algo.use_rollout_routing_replay=true"
  [ep]="train.expert_model_parallel_size=$EP algo.use_rollout_routing_replay=false"
  [ep-rr]="train.expert_model_parallel_size=$EP algo.use_rollout_routing_replay=true"
)
rc=0
for r in ${ROWS:-fsdp fsdp-rr ep ep-rr}; do
  [[ -n ${KEYS[$r]:-} ]] || { echo "unknown row $r (rows: ${!KEYS[*]})" >&2; exit 2; }
  mem_start "moe_$r"
  $PY bench/grpo_ray.py --arch "$ARCH" --name "$r" $COMMON --tokenizer "$TOK" --output-dir "$OUT/moe" \
      "${EXTRA[@]}" ${KEYS[$r]} > "$OUT/moe_$r.full.log" 2>&1
  rc=$(( rc | $? ))
  { grep -E "^\| |Error|error" "$OUT/moe_$r.full.log" | tail -4; mem_stop; } | tee "$OUT/moe_$r.log"
done
exit $rc
