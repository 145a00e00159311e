#!/usr/bin/env bash
# Device run for the paged KV cache (issue 13): the CUDA-only tests of the kernel, the fused sampler
# and the paged engine, then the engine benchmark with and without paging. Needs the model set up
# (scripts/device_setup.sh). Output under $OUT.
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python -m pytest -q tests/unit/test_kv_cache.py tests/unit/test_fused.py tests/unit/test_engine.py tests/unit/test_packing.py -k "cuda or triton or fused or varlen" 2>&1 | tail -15
python bench/rollout.py --skip-baselines --one-block-run --json "${OUT:-.}/bench_rollout_paged.json" 2>&1 | grep -v Warning | tail -8
