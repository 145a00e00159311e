#!/usr/bin/env bash
# One device call on 2 GPUs: the arithmetic example in Ray mode, colocated (2 trainer ranks + 2 engines
# sharing the GPUs) and disaggregated (1 trainer GPU + 1 engine GPU). Results -> $OUT/*.tgz
set -u
export PYTHONPATH=$PWD
C="-c examples/arith_grpo.yaml cluster.mode=ray train.num_rollout=15 eval.eval_before_train=false data.n_eval_prompts=0 run.save_final=false run.progress=false"
timeout 220 python3 -m reinforge train $C cluster.colocate=true cluster.actor_num_gpus_per_node=2 cluster.rollout_num_gpus=2 run.output_dir=/tmp/runCo > /tmp/logCo.txt 2>&1; echo "Co rc=$?"
timeout 220 python3 -m reinforge train $C cluster.colocate=false cluster.actor_num_gpus_per_node=1 cluster.rollout_num_gpus=1 run.output_dir=/tmp/runDi > /tmp/logDi.txt 2>&1; echo "Di rc=$?"
for n in Co Di; do
  tar czf $OUT/run$n.tgz -C /tmp log$n.txt $(cd /tmp; ls run$n/metrics.jsonl run$n/config.yaml 2>/dev/null)
  grep -E "Error|error" /tmp/log$n.txt | tail -3
  python3 - "$n" <<'PY'
import json, statistics as st, sys
n = sys.argv[1]
try:
    rows = [json.loads(l) for l in open(f"/tmp/run{n}/metrics.jsonl")]
except OSError:
    sys.exit(0)
tr = [r for r in rows if "train/loss" in r]
med = lambda k: round(st.median(r[k] for r in tr), 3) if tr else None
print(n, len(tr), "step", med("time/rollout_step"), "gen", med("time/generate"), "train", med("time/train"),
      "sync", med("time/sync"), "logprob", med("time/logprob"), "reward", [round(r["rollout/reward_mean"], 2) for r in tr[::3]])
PY
done
