#!/usr/bin/env bash
# Issues 52 and 53 on one GPU: the measurements still missing for the 2026 families, cut into device calls of under
# 600 s each (CALL=hybrid | grpo8k | grpo_fallback | moe). Carry .whl (fla-core 0.6.0 and einops wheels) and .device
# (SmolLM2's tokenizer: .device/cache/models/smollm2-135m-instruct). Every step has its own time limit, so one slow
# step leaves the others' logs; results go to $OUT (docs/benchmarks.md records them).
#
#   CALL=hybrid         Qwen3.5-9B decode sweep with the in-place state, fused norm and projections (profile at 64 x 4k),
#                       the fp32 GPU check with our torch rule (is the 1.6e-3 fla chunk kernel's TF32?), bf16 mismatch
#   CALL=grpo8k         the GRPO step at 8k natively for the hybrid and issue 53's three families (bench/archs.py)
#   CALL=grpo_fallback  the same steps on the transformers fallback (1 step each; fla off: its chunk backward refuses
#                       Hopper with Triton < 3.7.1, fla #640), at 2k first, then 8k while time remains
#   CALL=moe            GPT-OSS (sinks' prefill backend, 64 x 4k decode profiled), Gemma 3's decode sweep, and every
#                       family's GPU check (the SDPA change of kernel_args touches windows, sinks and MLA)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T=.device/cache/models/smollm2-135m-instruct
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
WITH_FLA=/tmp/site:$PWD:$PWD/bench
NO_FLA=$PWD:$PWD/bench
ARCHS_53="gpt-oss-20b-2l moonlight-16b-a3b-4l gemma3-12b-6l"
grpo() {  # grpo ARCH LENGTH STEPS LIMIT [--fallback]
  PYTHONPATH=$([ "${5:-}" = --fallback ] && echo "$NO_FLA" || echo "$WITH_FLA") timeout "$4" \
    python bench/grpo_long.py --arch "$1" --lengths "$2" --seqs 16 --n 8 --steps "$3" --tokenizer $T ${5:-} \
    > "$OUT/grpo_$1_$2${5:+_fallback}.log" 2>&1
  echo "grpo $1 $2 ${5:-native}: rc=$?"; grep "^$2 " "$OUT/grpo_$1_$2${5:+_fallback}.log" | cut -c1-300
}
case ${CALL:?set CALL=hybrid, grpo8k, grpo_fallback or moe} in
hybrid)
  PYTHONPATH=$WITH_FLA timeout 260 python bench/hybrid_gpu.py --sweep 16x4096,64x4096,128x4096,32x16384 \
    --no-torch-step --profile-at 64x4096 > "$OUT/hybrid_sweep.log" 2>&1; echo "sweep rc=$?"
  PYTHONPATH=$WITH_FLA timeout 120 python bench/families_gpu_check.py --families qwen3_5 --torch-rule \
    > "$OUT/check_qwen3_5_torch_rule.log" 2>&1; echo "check rc=$?"
  grep -v "^ \|^-\|^void\|^nvjet\|^_\|^Self" "$OUT/hybrid_sweep.log" | tail -15; tail -2 "$OUT/check_qwen3_5_torch_rule.log" ;;
grpo8k)
  grpo qwen3-next-hybrid-2b 8192 2 200
  for a in $ARCHS_53; do grpo "$a" 8192 2 120; done ;;
grpo_fallback)
  for a in qwen3-next-hybrid-2b $ARCHS_53; do grpo "$a" 2048 1 110 --fallback; done
  grpo qwen3-next-hybrid-2b 8192 1 140 --fallback ;;
moe)
  PYTHONPATH=$WITH_FLA timeout 180 python bench/gpt_oss_gpu.py --quick --profile-at 64x4096 > "$OUT/gpt_oss.log" 2>&1
  echo "gpt_oss rc=$?"
  PYTHONPATH=$WITH_FLA timeout 180 python bench/gemma3_gpu.py --quick > "$OUT/gemma3.log" 2>&1; echo "gemma3 rc=$?"
  PYTHONPATH=$WITH_FLA timeout 200 python bench/families_gpu_check.py > "$OUT/families_check.log" 2>&1
  echo "check rc=$?"
  grep -v "^ \|^-\|^void\|^nvjet\|^_\|^Self\|^sm\|^cutlass" "$OUT/gpt_oss.log" | tail -12; tail -6 "$OUT/gemma3.log"
  cat "$OUT/families_check.log" | grep family ;;
esac
