#!/usr/bin/env bash
# Device run for issue 28's kernel-library item: Liger-Kernel against reinforge's kernels on a training
# micro-batch (bench/liger_train.py), then the DPO step against TRL (bench/dpo_vs_trl.py) on a random-weight
# SmolLM2-shaped model with the real tokenizer. Carry `.device` (whl/: liger-kernel, trl and the datasets
# stack; cache/models/smollm2-135m-instruct: the tokenizer files). Output under $OUT.
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python - <<'PY' 2>&1 | tee "$OUT/versions.log"
import importlib, torch
print("torch", torch.__version__, torch.cuda.get_device_name())
for m in ("transformers", "triton", "liger_kernel", "trl", "accelerate", "datasets", "pyarrow", "pandas"):
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as e:
        print(m, "MISSING", type(e).__name__)
PY
for w in .device/whl/*.whl; do
  mod=$(basename "$w" | cut -d- -f1)
  python -c "import $mod" 2>/dev/null || python -m pip install -q --no-deps --no-index --root-user-action=ignore "$w" 2>&1 | tail -2
done
python bench/liger_train.py --tokens 8192 16384 2>&1 | grep -v Warning | tee "$OUT/liger.log"
model=/tmp/smollm2-random
python -c "import sys; sys.path.insert(0, 'bench'); from archs import write_random_model; from pathlib import Path; write_random_model('smollm2', Path('$model'))"
cp .device/cache/models/smollm2-135m-instruct/{tokenizer.json,tokenizer_config.json,chat_template.jinja} "$model"/
python bench/dpo_vs_trl.py --model "$model" --steps 8 2>&1 | grep -v Warning | tail -8 | tee "$OUT/dpo.log"
