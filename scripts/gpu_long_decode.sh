#!/usr/bin/env bash
# Device run (issues 23, 24): decode at long context, 16 and 64 sequences of a Qwen2.5-1.5B-shaped model, the
# first decode steps at each context untimed (CUDA graph capture); then the engine benchmark again (the same command as docs/benchmarks.md's engine rows: within noise?).
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out=${OUT:-.}
(cd bench && for seqs in 16 64; do
  timeout $([ "$seqs" = 16 ] && echo 150 || echo 260) python long_responses.py --archs qwen2.5-1.5b --seqs "$seqs" \
      --lengths 4096 16384 32000 --parts generation --window 64 2>&1 | grep -v Warning \
      | tee "$out/long_decode_$seqs.log" | tail -6
done)
timeout 150 python bench/rollout.py --skip-baselines --json "$out/bench_rollout.json" 2>&1 | grep -v Warning \
    | tee "$out/bench_rollout.log" | tail -4
