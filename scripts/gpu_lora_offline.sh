#!/usr/bin/env bash
# Device runs for LoRA (#15) and the offline pipeline (#10), after scripts/device_setup.sh.
#   bash scripts/gpu_lora_offline.sh lora      # bench/lora_step.py (Qwen2.5-1.5B arch) + arithmetic GRPO full vs LoRA
#   bash scripts/gpu_lora_offline.sh offline   # make-data pairs -> DPO (eval base vs DPO) -> RM -> GRPO on the RM
# Tables go to $OUT/*.txt.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
EVAL="data.n_eval_prompts=256,eval.n_samples_per_eval_prompt=0,eval.pass_k=[],eval.eval_interval=1000"
case "$1" in
lora)
  (python3 bench/sweep.py -c examples/arith_grpo.yaml --common "train.num_rollout=60,$EVAL" --seeds 1 --jobs 2 \
      --variant full: --variant lora_r32:model.lora_rank=32,model.lora_alpha=64,train.lr=5e-5 \
      --out /tmp/arith_lora > "$OUT/arith_lora.txt" 2>&1; echo "sweep rc=$?" >> "$OUT/arith_lora.txt") &
  python3 bench/lora_step.py --arch qwen2.5-1.5b --samples 256 --prompt-len 64 --response-len 256 \
      --ranks 0 16 64 --max-tokens 8192 > "$OUT/lora_step.txt" 2>&1; echo "bench rc=$?" >> "$OUT/lora_step.txt"
  wait
  for r in full lora_r32; do
    python3 scripts/plot_run.py /tmp/arith_lora/$r-s1 "$OUT/arith_$r.png" --title "arith GRPO $r" || true
    tail -3 /tmp/arith_lora/$r-s1/log.txt >> "$OUT/arith_lora.txt"
  done
  ;;
offline)
  R=/tmp/offline; mkdir -p $R
  python3 -m reinforge make-data pairs -c examples/offline/make_data.yaml --out $R/pairs.jsonl --num-prompts 3000 \
      > "$OUT/offline.txt" 2>&1
  tail -1 "$OUT/offline.txt"
  python3 -m reinforge offline -c examples/offline/dpo.yaml offline.train_data=$R/pairs.jsonl run.output_dir=$R/dpo \
      run.progress=false > $R/dpo.log 2>&1; echo "dpo rc=$?" >> "$OUT/offline.txt"
  python3 -m reinforge offline -c examples/offline/rm.yaml offline.train_data=$R/pairs.jsonl run.output_dir=$R/rm \
      run.progress=false > $R/rm.log 2>&1; echo "rm rc=$?" >> "$OUT/offline.txt"
  E="--config examples/arith_grpo.yaml ${EVAL//,/ }"
  (python3 -m reinforge train -c examples/arith_grpo.yaml reward.type=model reward.model_path=$R/rm \
      train.num_rollout=40 data.n_eval_prompts=0 run.save_final=false run.progress=false run.output_dir=$R/grpo_rm \
      > $R/grpo_rm.log 2>&1; echo "grpo_rm rc=$?" >> "$OUT/offline.txt") &
  python3 -m reinforge eval $E --output-dir $R/eval_base > $R/eval_base.log 2>&1
  python3 -m reinforge eval $E --model $R/dpo/checkpoints/$(cat $R/dpo/checkpoints/latest)/model \
      --output-dir $R/eval_dpo > $R/eval_dpo.log 2>&1
  wait
  { echo "== DPO"; tail -4 $R/dpo.log; echo "== base (256 held-out, greedy)"; tail -4 $R/eval_base.log
    echo "== DPO policy (256 held-out, greedy)"; tail -4 $R/eval_dpo.log; echo "== RM"; tail -4 $R/rm.log
    echo "== GRPO scored by the RM"; python3 - $R/grpo_rm/metrics.jsonl <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "rollout/reward_mean" in l]
r = [round(x["rollout/reward_mean"], 3) for x in rows]
print("rollouts", len(r), "RM reward per 5 rollouts", r[::5], "first5", sum(r[:5]) / 5, "last5", sum(r[-5:]) / 5)
PY
  } >> "$OUT/offline.txt" 2>&1
  cp $R/dpo/curves.png "$OUT/dpo_curves.png" 2>/dev/null; cp $R/rm/curves.png "$OUT/rm_curves.png" 2>/dev/null
  ;;
esac
