#!/usr/bin/env bash
# Device run (issue 24): GRPO end to end at long responses on one GPU (bench/grpo_long.py), for the response
# limits in $LENGTHS (default 8192 16384); further arguments go to the script. Carry .device (SmolLM2's tokenizer files). Output under $OUT.
set -uo pipefail
export PYTHONPATH="$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
lengths=${LENGTHS:-8192 16384}
python bench/grpo_long.py --lengths $lengths "$@" --tokenizer .device/cache/models/smollm2-135m-instruct 2>&1 \
    | grep -v -e Warning -e "Writing model" | tee "${OUT:-.}/grpo_long_${lengths// /_}.log" | tail -12
