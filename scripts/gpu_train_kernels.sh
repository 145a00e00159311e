#!/usr/bin/env bash
# Device run for the fused training kernels (issue 13): their CUDA tests, the packing tests, then the
# GRPO step against TRL at two micro-batch budgets on each side, with and without the fused kernels. Needs the model set up
# (scripts/device_setup.sh) and TRL installed. Output under $OUT.
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ "${SKIP_TESTS:-0}" = 1 ] || python -m pytest -q tests/unit/test_fused.py tests/unit/test_packing.py 2>&1 | tail -6
python bench/grpo_vs_trl.py --packing shared_prompt --max-tokens-per-gpu 16384 65536 --fused-kernels true false \
    --trl-micro-batch 32 64 \
    2>&1 | grep -v Warning | tee "${OUT:-.}/grpo_vs_trl.log" | tail -16
