#!/usr/bin/env bash
# Device run (issue 24): the fp8 KV cache (engine.kv_cache_dtype=fp8) against the bf16 one, in the same call.
# PARTS selects (default "tests kernel decode16"):
#   tests     the CUDA tests of the decode kernel and the engine over fp8 (and the bf16 ones beside them)
#   kernel    the decode-attention kernel table, bf16 cache vs fp8 cache (bench/decode_attention.py, no flex;
#             TUNE=64x8,128x4 adds rows with other keys-per-iteration x warps; BASELINE=FILE rows of another
#             kernel file, e.g. `git show REV:reinforge/engine/paged_attention.py` with its imports made absolute)
#   decode16  engine decode at 4k / 16k / 32k context, 16 sequences, auto vs fp8 (bench/long_responses.py)
#   decode64  the same, 64 sequences, 16k / 32k
#   profile   what a decode step is made of (bench/decode_profile.py): 16 x 4k and 64 x 16k, auto and fp8
#   grpo      GRPO end to end (bench/grpo_long.py) at $LENGTHS (default 16384), auto vs fp8; extra arguments
#             go to the script (e.g. --kv-fraction 0.55); KV_DTYPES="fp8" runs only that one
# Carry .device (whl/ with liger-kernel; cache/ with SmolLM2's tokenizer files). Output under $OUT.
set -uo pipefail
export PYTHONPATH="$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" REINFORGE_CACHE="$PWD/.device/cache" PYTHONUNBUFFERED=1
parts=${PARTS:-tests kernel decode16}
out=${OUT:-.}
source scripts/device_liger.sh
if [[ $parts == *tests* ]]; then
  timeout 300 python -m pytest -q -p no:cacheprovider tests/unit/test_paged_attention.py tests/unit/test_fp8_kv_cache.py \
      tests/unit/test_kv_cache.py tests/unit/test_engine.py 2>&1 | tee "$out/gpu_tests.log" | tail -8
fi
if [[ $parts == *kernel* ]]; then
  timeout 240 python bench/decode_attention.py --no-flex --no-flashinfer ${TUNE:+--tune $TUNE} ${BASELINE:+--baseline $BASELINE} 2>&1 | grep -v Warning \
      | tee "$out/decode_attention_fp8.log" | tail -${TAIL:-16}
fi
for seqs in 16 64; do
  [[ $parts == *decode$seqs* ]] || continue
  lengths=$([ "$seqs" = 16 ] && echo "4096 16384 32000" || echo "16384 32000")
  (cd bench && timeout 400 python long_responses.py --archs qwen2.5-1.5b --seqs "$seqs" --lengths $lengths \
      --parts generation --window 64 --kv-cache-dtypes auto fp8 2>&1 | grep -v Warning \
      | tee "$out/long_decode_fp8_$seqs.log" | tail -9)
done
if [[ $parts == *profile* ]]; then
  for shape in "16 4096" "64 16384"; do
    read -r seqs ctx <<< "$shape"
    for kvd in auto fp8; do
      timeout 150 python bench/decode_profile.py --seqs "$seqs" --context "$ctx" --kv-cache-dtype $kvd 2>&1 \
          | grep -v -e Warning -e "Writing model" -e USDT | tee -a "$out/decode_profile.log" | tail -9
    done
  done
fi
if [[ $parts == *grpo* ]]; then
  lengths=${LENGTHS:-16384}
  python bench/grpo_long.py --lengths $lengths --kv-cache-dtypes ${KV_DTYPES:-auto fp8} "$@" \
      --tokenizer .device/cache/models/smollm2-135m-instruct 2>&1 | grep -v -e Warning -e "Writing model" \
      | tee "$out/grpo_long_fp8_${lengths// /_}.log" | tail -12
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>&1 | tail -1
