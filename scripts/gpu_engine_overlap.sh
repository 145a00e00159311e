#!/usr/bin/env bash
# Device run for the engine's overlap scheduler, fused residual-add norms and fused projections (issue 13): the engine
# benchmark at 1024 x 256 with each of them turned off in the same process (random weights, no model
# needed). Output under $OUT.
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python bench/rollout.py --skip-baselines --no-overlap-run --no-fused-residual-run --no-fused-projections-run \
    --json "${OUT:-.}/bench_rollout_overlap_h100.json" 2>&1 | grep -v Warning | tail -8
