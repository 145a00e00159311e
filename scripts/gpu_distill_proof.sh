#!/usr/bin/env bash
# Issue 55 item 5 on one GPU: on-policy distillation (OPD) against GRPO from the base SmolLM2-135M-Instruct,
# held-out greedy accuracy on 256 problems, 3 seeds each, compared with `reinforge compare`.
#
#   (a) teacher = the main example's GRPO-trained checkpoint (examples/arith_grpo.yaml), student = the base model.
#       GRPO's seed 0 *is* the main example, so its last checkpoint is the teacher. Goal: OPD reaches 90% of the
#       teacher's accuracy in at most a quarter of the rollouts GRPO needs to reach it. OPD alone (no task reward),
#       discount 0, kl_coef 1.
#   (b) tool use (PRODUCTS=1): teacher = the products agent after SFT + GRPO (PRODUCTS_TEACHER: its model folder),
#       student = the base model, OPD in the products environment, no SFT. Goal: >= 90% held-out and >= 90%
#       well-formed calls (eval/reward_info/* of the agent's reward).
#
# The runs of one stage share the GPU (SmolLM2 leaves an H100 mostly idle: its steps are launch-bound), each with a
# small KV cache, so a stage fits one device call of 10 minutes: STAGE=grpo (3 seeds of GRPO, about 300 rollouts x
# 1.3 s each when alone), then STAGE=opd (the teacher's evaluation and 3 seeds of OPD, 75 rollouts), then
# STAGE=compare (no GPU). $OUT must survive between the calls (a warm machine keeps /tmp).
#
# The teacher's pass costs: `distill/teacher_seconds` per rollout in each OPD run's metrics.jsonl, and the
# teacher's memory in `reinforge plan -c examples/arith_grpo.yaml distill.teacher_path=...` (the `teachers` row).
set -euo pipefail
OUT=${OUT:-runs/issue55}
SEEDS=${SEEDS:-"0 1 2"}
OPD_ROLLOUTS=${OPD_ROLLOUTS:-75}   # a quarter of the GRPO example's 300
KV=${KV:-0.08}                     # each run's engine.kv_cache_memory_fraction (runs side by side)
EVAL="data.n_eval_prompts=256 eval.eval_interval=25 engine.kv_cache_memory_fraction=$KV"
join() { local IFS=,; echo "$*"; }
mkdir -p "$OUT"
teacher() { ls -d "$OUT"/grpo_s0/checkpoints/rollout_*/model | tail -1; }

case ${STAGE:-all} in
grpo | all)
  for s in $SEEDS; do
    reinforge train -c examples/arith_grpo.yaml $EVAL train.seed=$s rollout.seed=$s run.output_dir="$OUT/grpo_s$s" \
      > "$OUT.grpo_s$s.log" 2>&1 &
  done
  wait ;;&
opd | all)
  reinforge eval --model "$(teacher)" --data reasoning_gym:basic_arithmetic -c examples/arith_grpo.yaml \
    data.n_eval_prompts=256 run.output_dir="$OUT/teacher" > "$OUT.teacher.log" 2>&1 &
  for s in $SEEDS; do
    reinforge train -c examples/arith_grpo.yaml $EVAL train.seed=$s rollout.seed=$s run.output_dir="$OUT/opd_s$s" \
      train.num_rollout=$OPD_ROLLOUTS distill.teacher_path="$(teacher)" distill.use_task_reward=false \
      > "$OUT.opd_s$s.log" 2>&1 &
  done
  wait ;;&
compare | all)
  grpo=(); opd=()
  for s in $SEEDS; do grpo+=("$OUT/grpo_s$s"); opd+=("$OUT/opd_s$s"); done
  # the final evaluations, then OPD's last against GRPO's at the same rollout count
  reinforge compare "$(join "${grpo[@]}")" "$(join "${opd[@]}")"
  reinforge compare "$(join "${grpo[@]/%//eval/rollout_$OPD_ROLLOUTS.jsonl}")" "$(join "${opd[@]}")" ;;
esac

if [ "${PRODUCTS:-0}" = 1 ]; then
  : "${PRODUCTS_TEACHER:?set PRODUCTS_TEACHER to the SFT + GRPO products agent model folder}"
  for s in $SEEDS; do
    reinforge train -c examples/agent_products.yaml train.seed=$s rollout.seed=$s run.output_dir="$OUT/products_opd_s$s" \
      distill.teacher_path="$PRODUCTS_TEACHER" distill.use_task_reward=false engine.kv_cache_memory_fraction=$KV &
  done
  wait
fi
