#!/usr/bin/env bash
# Device run for the engine package and split-K decode attention (issues 23, 24): the CUDA tests of the
# engine, kernels and fused model paths; the decode-attention kernel table (ours single-pass / split-K,
# flex_attention, FlashInfer when importable). Carry .device (tokenizer files of SmolLM2 for the tiny test
# models: REINFORGE_CACHE). Output under $OUT.
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" REINFORGE_CACHE="$PWD/.device/cache" PYTHONUNBUFFERED=1
out=${OUT:-.}
timeout 300 python -m pytest -q -p no:cacheprovider tests/unit/test_paged_attention.py tests/unit/test_kv_cache.py \
    tests/unit/test_fused.py tests/unit/test_engine.py 2>&1 | tee "$out/gpu_tests.log" | tail -25
timeout 240 python bench/decode_attention.py 2>&1 | grep -v Warning | tee "$out/decode_attention.log" | tail -40
