# Sourced by the GPU scripts: Liger-Kernel (the trainer's fused kernels, model.fused_kernels) from the carried wheel
# .device/whl/liger_kernel-*.whl (scripts/offline_wheels.sh puts it there); without it the trainer's norms run eager.
if ! python -c "import liger_kernel" 2>/dev/null; then
  if ls .device/whl/liger_kernel-*.whl >/dev/null 2>&1; then
    python -m pip install -q --no-deps --no-index --root-user-action=ignore .device/whl/liger_kernel-*.whl
  else
    echo "no Liger-Kernel wheel in .device/whl: the trainer's norms run eager (scripts/offline_wheels.sh)"
  fi
fi
