#!/usr/bin/env bash
# Issue 35 item 6: the SWE environment (docs/agents.md#the-swe-environment) on one GPU with SmolLM2-135M-Instruct,
# held-out accuracy (256 repos, greedy) before and after $ROLLOUTS GRPO rollouts, plus the run's plan/* metrics
# and end line (issue 37). Run as $EXTRA of scripts/gpu_agent_products.sh (which installs, converts the model
# and checks the sandbox; it sets $SANDBOX), with SFT_SIZES=" " so that no products pipeline runs:
#   call 1: bash scripts/gpu_agent_products.sh stage                   (carry .device/smollm2.part-aa)
#   call 2: SFT_SIZES=" " EXTRA="bash scripts/gpu_agent_swe.sh" bash scripts/gpu_agent_products.sh run
#           (carry .device/smollm2.part-ab .device/wheels .device/debs)
set -u
OUT=${OUT:-/tmp/out}; R=${ROLLOUTS:-6}
python3 -m reinforge make-data swe --out /tmp/swe_train.jsonl --num-prompts 2000 --seed 0 > /dev/null
python3 -m reinforge make-data swe --out /tmp/swe_eval.jsonl --num-prompts 256 --seed 1 > /dev/null
timeout ${SWE_SECONDS:-430} python3 -m reinforge train -c examples/agent_swe.yaml ${SANDBOX:-} \
    data.prompt_data=/tmp/swe_train.jsonl data.eval_prompt_data=/tmp/swe_eval.jsonl data.n_eval_prompts=256 \
    train.num_rollout=$R eval.eval_interval=$R run.output_dir=/tmp/swe run.progress=false run.save_final=false \
    run.save_interval=null > "$OUT/swe.txt" 2>&1; echo "rc=$?" >> "$OUT/swe.txt"
cp /tmp/swe/metrics.jsonl "$OUT/swe_metrics.jsonl" 2>/dev/null
echo "== swe"; grep -v Warning "$OUT/swe.txt" | tail -25
python3 - <<'PY'
import json
rows = [json.loads(l) for l in open("/tmp/swe/metrics.jsonl")]
for r in rows:
    keys = {k: round(v, 3) for k, v in r.items() if isinstance(v, (int, float)) and k.split("/")[0] in ("eval", "agent", "rollout", "plan") and not k.startswith("eval/pass")}
    print(json.dumps(keys)[:1500])
PY
