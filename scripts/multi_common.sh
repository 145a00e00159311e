# Sourced by scripts/gpu_multi_*.sh (issue 26's multi-GPU runs). Sets:
#   PY      the Python that runs everything (python3 on the device; $PYTHON overrides)
#   TOK     a folder with SmolLM2's tokenizer files (.device/cache/...; a dry run falls back to the model cache)
#   OUT     where logs and results go (the device sets it; default ./out/multi)
#   DRY     1 when DRY_RUN=1: tiny random models, CPU processes over gloo, seconds per run
# and the functions need_gpus N, mem_start NAME, mem_stop (peak GPU memory from nvidia-smi, sampled every 0.5 s).
set -uo pipefail
export PYTHONPATH="$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/out/multi}
mkdir -p "$OUT"
DRY=${DRY_RUN:-0}
TOK=${TOKENIZER:-.device/cache/models/smollm2-135m-instruct}
if [[ ! -d $TOK ]]; then
  TOK=$($PY -c "from reinforge.models.hub import resolve_model_path as r; print(r('smollm2-135m-instruct'))") || exit 1
fi
if [[ $DRY == 1 ]]; then
  export CUDA_VISIBLE_DEVICES="" RAY_DEDUP_LOGS=0 OMP_NUM_THREADS=1
fi

need_gpus() {  # need_gpus N: stop (exit 3) unless N GPUs are visible; a dry run needs none
  [[ $DRY == 1 ]] && return 0
  local n
  n=$(nvidia-smi -L 2>/dev/null | wc -l)
  if (( n < $1 )); then echo "needs $1 GPUs, this machine has $n: run it on a device kind with >= $1" >&2; exit 3; fi
}

need_ray() {  # Ray must be importable (scripts/device_setup.sh installs it from the offline wheels)
  $PY -c "import ray" 2>/dev/null && return 0
  echo "Ray is not installed: run scripts/offline_wheels.sh here and scripts/device_setup.sh on the device" >&2; exit 4
}

MEM_PID=""
mem_start() {  # mem_start NAME: sample every GPU's used memory into $OUT/mem_NAME.csv until mem_stop
  MEM_FILE="$OUT/mem_$1.csv"
  [[ $DRY == 1 ]] && return 0
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 > "$MEM_FILE" 2>/dev/null &
  MEM_PID=$!
}

mem_stop() {  # prints "peak GPU memory (MiB) per GPU: i=..." for the samples since mem_start
  if [[ -n $MEM_PID ]]; then kill "$MEM_PID" 2>/dev/null; wait "$MEM_PID" 2>/dev/null; MEM_PID=""; fi
  [[ -s ${MEM_FILE:-/nonexistent} ]] || { echo "peak GPU memory: n/a (no GPU sampled)"; return 0; }
  awk -F', ' '{ if ($2 > m[$1]) m[$1] = $2 } END { printf "peak GPU memory (MiB) per GPU:"; for (i in m) printf " %s=%s", i, m[i]; print "" }' "$MEM_FILE"
}
