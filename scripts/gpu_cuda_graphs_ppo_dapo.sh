#!/usr/bin/env bash
# One device call: clean before/after timing of the GRPO example (eager engine vs CUDA graphs, alone on
# the GPU), then PPO-with-critic and DAPO on the arithmetic example side by side. Results -> $OUT/*.tgz
set -u
export PYTHONPATH=$PWD
C="-c examples/arith_grpo.yaml train.num_rollout=20 eval.eval_before_train=false data.n_eval_prompts=0 run.save_final=false run.progress=false"
timeout 200 python3 -m reinforge train $C engine.cuda_graph=false run.output_dir=/tmp/runE > /tmp/logE.txt 2>&1; echo "E rc=$?"
timeout 120 python3 -m reinforge train $C engine.cuda_graph=true run.output_dir=/tmp/runG > /tmp/logG.txt 2>&1; echo "G rc=$?"
P="train.num_rollout=40 eval.eval_interval=20 run.save_final=false run.progress=false train.max_tokens_per_gpu=8192"
(timeout 330 python3 -m reinforge train -c examples/arith_ppo.yaml $P run.output_dir=/tmp/runP > /tmp/logP.txt 2>&1; echo "P rc=$?") &
(timeout 330 python3 -m reinforge train -c examples/arith_dapo.yaml $P run.output_dir=/tmp/runD > /tmp/logD.txt 2>&1; echo "D rc=$?") &
wait
for n in E G P D; do
  tar czf $OUT/run$n.tgz -C /tmp run$n/metrics.jsonl run$n/config.yaml log$n.txt $(cd /tmp; ls run$n/eval.jsonl 2>/dev/null)
  python3 - "$n" <<'PY'
import json, statistics as st, sys
n = sys.argv[1]
rows = [json.loads(l) for l in open(f"/tmp/run{n}/metrics.jsonl")]
tr = [r for r in rows if "rollout/reward_mean" in r]
ev = [round(r["eval/greedy_accuracy"], 3) for r in rows if "eval/greedy_accuracy" in r]
print(n, len(tr), "step", round(st.median(r["time/rollout_step"] for r in tr), 3),
      "gen", round(st.median(r["time/generate"] for r in tr), 3),
      "reward", [round(r["rollout/reward_mean"], 2) for r in tr[::5]], "eval", ev)
PY
done
