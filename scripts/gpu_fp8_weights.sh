#!/usr/bin/env bash
# Device run (issue 36 item 5): fp8 rollout weights (engine.quantization=fp8) against the bf16 engine, in the same call.
# PARTS selects (default "tests bench"):
#   tests   tests/unit/test_fp8_weights.py (its CUDA test prints which matmul the probe chose: block-scaled
#           torch._scaled_mm expected on an H100 / H200) and the engine tests beside it
#   bench   bench/fp8_weights.py: decode tok/s at 16 / 64 / 128 / 256 sequences, Qwen2.5-1.5B and -7B shapes with
#           random weights, bf16 vs fp8, with the weights-read limits; trainer-vs-engine log-prob mismatch on random
#           weights, and on SmolLM2's real weights when .device/cache/models/smollm2-135m-instruct has them
#           (ARCHS, SEQS, NEW_TOKENS override the defaults)
# Carry .device (cache/ with SmolLM2's tokenizer files, and its weights for the real-weights row). Output under $OUT.
set -uo pipefail
export PYTHONPATH="$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" REINFORGE_CACHE="$PWD/.device/cache" PYTHONUNBUFFERED=1
parts=${PARTS:-tests bench}
out=${OUT:-.}
real=.device/cache/models/smollm2-135m-instruct
if [[ $parts == *tests* ]]; then
  timeout 300 python -m pytest -q -s -p no:cacheprovider tests/unit/test_fp8_weights.py tests/unit/test_fp8_kv_cache.py \
      tests/unit/test_engine.py 2>&1 | tee "$out/gpu_tests_fp8_weights.log" | grep -e select_kernel -e passed -e failed -e Error | tail -12
fi
if [[ $parts == *bench* ]]; then
  extra=()
  [[ -f $real/model.safetensors ]] && extra+=(--real "$real")
  timeout 540 python bench/fp8_weights.py --archs ${ARCHS:-qwen2.5-1.5b qwen2.5-7b} --seqs ${SEQS:-16 64 128 256} \
      --new-tokens ${NEW_TOKENS:-256} "${extra[@]}" "$@" 2>&1 | grep -v -e Warning -e "Writing model" \
      | tee "$out/fp8_weights.log" | tail -30
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>&1 | tail -1
