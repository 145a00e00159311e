#!/usr/bin/env bash
# Issue 26, run 2: a 7B-class dense model (Qwen2.5-7B's layers, random weights, SmolLM2's vocabulary), GRPO
# end to end in Ray mode with FSDP2 over $GPUS GPUs (default 8; 4 works: the layouts halve), context
# parallelism at 16k and 32k: generated tokens/s per GPU, peak GPU memory, weight-sync seconds colocated and
# disaggregated (bench/grpo_ray.py). Device kind: nvidia-h200-x8 (or -x4 with GPUS=4); Ray installed first
# (scripts/device_setup.sh), carry .device (tokenizer). A row takes ~5-8 minutes (writing the 15 GB model
# once: ~2 more), so run one or two ROWS per device call (default: all of "co4k co16k co32k di16k"); the
# model stays in out/models between calls of one warm machine. Output: $OUT/7b/results.jsonl, $OUT/7b_ROW.log
# (table row + peak memory), $OUT/mem_ROW.csv. DRY_RUN=1: the same rows on CPU (tiny qwen2, 2 trainer ranks
# over gloo, 16-token responses).
source "$(dirname "$0")/multi_common.sh"
G=${GPUS:-8}
need_gpus "$G"; need_ray
H=$(( G / 2 ))
# row -> grpo_ray.py arguments: placement, layout, length, sequences per rollout
declare -A ARGS=(
  [co4k]="--colocate --trainers $G --engines $G --length 4096 --seqs $(( 32 * G ))"
  [co16k]="--colocate --trainers $G --engines $G --cp 2 --length 16384 --seqs $(( 16 * G ))"
  [co32k]="--colocate --trainers $G --engines $G --cp 4 --length 32768 --seqs $(( 8 * G ))"
  [di16k]="--trainers $H --engines $H --cp 2 --length 16384 --seqs $(( 16 * G ))"
)
EXTRA=(--steps "${STEPS:-2}" --model-dir "$PWD/out/models")
if [[ $DRY == 1 ]]; then
  G=2
  ARGS=([co4k]="--colocate --trainers 2 --engines 2 --length 16 --seqs 4 --n 2"
        [co16k]="--colocate --trainers 2 --engines 2 --cp 2 --length 16 --seqs 4 --n 2"
        [di16k]="--trainers 2 --engines 1 --cp 2 --length 16 --seqs 4 --n 2")
  EXTRA=(--steps 2 --tiny --model-dir "$OUT/models" train.device=cpu cluster.num_cpus_per_worker=0.5)
  ROWS=${ROWS:-co16k di16k}
fi
rc=0
for r in ${ROWS:-co4k co16k co32k di16k}; do
  [[ -n ${ARGS[$r]:-} ]] || { echo "unknown row $r (rows: ${!ARGS[*]})" >&2; exit 2; }
  mem_start "7b_$r"
  $PY bench/grpo_ray.py --arch qwen2.5-7b --name "$r" ${ARGS[$r]} --tokenizer "$TOK" --output-dir "$OUT/7b" \
      "${EXTRA[@]}" > "$OUT/7b_$r.full.log" 2>&1
  rc=$(( rc | $? ))
  { grep -E "^\| |Error|error" "$OUT/7b_$r.full.log" | tail -4; mem_stop; } | tee "$OUT/7b_$r.log"
done
exit $rc
