#!/usr/bin/env bash
# Issue 35's tool-use proof on one GPU: base -> SFT on program-written traces -> GRPO with the python tool
# (bench/agent_pipeline.py), side by side for each SFT size in $SFT_SIZES (default "2000 16": a full SFT and a
# light one, so that RL has something left to add). $EXTRA, if set, is run afterwards (more GPU checks). Needs .device/ from scripts/offline_wheels.sh plus .device/debs (bubblewrap,
# libseccomp2: `apt-get download bubblewrap libseccomp2`) and the pyseccomp wheel in .device/wheels.
#   call 1 (carry .device/smollm2.part-aa): bash scripts/gpu_agent_products.sh stage
#   call 2 (carry .device/smollm2.part-ab .device/wheels .device/debs): bash scripts/gpu_agent_products.sh run
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/dev
case "$1" in
stage) cp .device/smollm2.part-aa /tmp/dev/ && ls -la /tmp/dev ;;
run)  # arguments after `run` are overrides for every pipeline step
  shift; EXTRA_OVERRIDES="$*"
  cp -r .device/smollm2.part-ab .device/wheels /tmp/dev/ && bash scripts/device_setup.sh /tmp/dev > "$OUT/setup.txt" 2>&1 \
      || { tail -20 "$OUT/setup.txt"; exit 1; }
  for f in .device/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
  SANDBOX=""
  if ! python3 -c "from reinforge.tools.sandbox import check_sandbox; check_sandbox()" >> "$OUT/setup.txt" 2>&1; then
    SANDBOX="sandbox.backend=none"   # this throwaway GPU box cannot make the sandbox (said in the results)
    echo "sandbox unavailable here: running with $SANDBOX" | tee -a "$OUT/setup.txt"
  fi
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/setup.txt"
  run_pipeline() {  # name sft_examples
    python3 bench/agent_pipeline.py --out /tmp/agent_$1 --sft-examples $2 --rollouts ${ROLLOUTS:-30} --eval-prompts 256 \
        -- $SANDBOX $EXTRA_OVERRIDES > "$OUT/agent_$1.txt" 2>&1; echo "rc=$?" >> "$OUT/agent_$1.txt"
    cp /tmp/agent_$1/rl/metrics.jsonl "$OUT/agent_$1_rl_metrics.jsonl" 2>/dev/null
  }
  SIZES=${SFT_SIZES:-"2000 16"}
  for n in $SIZES; do run_pipeline sft$n $n & done; wait
  for n in $SIZES; do echo "== sft$n"; tail -16 "$OUT/agent_sft$n.txt"; done
  if [ -n "${EXTRA:-}" ]; then eval "$EXTRA"; fi
  ;;
esac
