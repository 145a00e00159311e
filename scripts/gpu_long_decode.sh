#!/usr/bin/env bash
# Device run (issues 23, 24): the engine benchmark at 1024 x 256 (the same command as docs/benchmarks.md's
# engine rows, random weights), then decode at long context for 16 and 64 sequences of a Qwen2.5-1.5B-shaped
# model (random weights) with the share of the weights + KV bandwidth limit. Output under $OUT.
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out=${OUT:-.}
timeout 150 python bench/rollout.py --skip-baselines --json "$out/bench_rollout.json" 2>&1 | grep -v Warning \
    | tee "$out/bench_rollout.log" | tail -8
cd bench
for seqs in 16 64; do
  timeout $([ "$seqs" = 16 ] && echo 150 || echo 280) python long_responses.py --archs qwen2.5-1.5b --seqs "$seqs" --lengths 4096 16384 32000 \
      --parts generation --window 64 2>&1 | grep -v Warning | tee "$out/long_decode_$seqs.log" | tail -9
done
