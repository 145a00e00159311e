"""MXFP4 weights (the OCP Microscaling Formats spec v1.0, "MXFP4"): dequantization at load.

GPT-OSS checkpoints (``quantization_config.quant_method: "mxfp4"``) store each routed expert matrix as two
tensors beside its name: ``<name>_blocks`` [..., rows, G, 16] uint8, the FP4 (E2M1) elements packed two a
byte, low nibble first, and ``<name>_scales`` [..., rows, G] uint8, one shared power-of-two scale (E8M0,
exponent bias 127) per block of 32 elements. Element ``32 g + 2 b`` of a row is ``FP4[blocks[g, b] & 0xF]
* 2^(scales[g] - 127)`` and element ``32 g + 2 b + 1`` the high nibble's, where FP4 is the 16 E2M1 values
(:data:`FP4_VALUES`). The values are exact in bf16 (at most 2 mantissa bits, and the exponent range of
trained weights is far inside bf16's).

This is transformers' ``convert_moe_packed_tensors`` (``transformers/integrations/mxfp4.py``) as a small
function of ours (the same values: ``tests/integration/test_gpt_oss.py``), so that loading does not depend on where that
private helper lives in the installed transformers. reinforge trains and samples in bf16 / fp32 from the
dequantized weights; an export writes them dequantized (no ``quantization_config``).
"""

from __future__ import annotations

import torch

__all__ = ["FP4_VALUES", "dequantize_mxfp4", "dequantize_mxfp4_state", "is_mxfp4"]

# the 16 E2M1 values, indexed by the 4-bit code (sign bit 3, exponent bits 2-1, mantissa bit 0)
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def is_mxfp4(config: dict | object) -> bool:
    """Whether a ``config.json`` dict or a transformers config declares MXFP4 weights."""
    q = config.get("quantization_config") if isinstance(config, dict) else getattr(config, "quantization_config", None)
    method = q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", None)
    return method == "mxfp4"


def dequantize_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16, chunk_rows: int = 1 << 16
) -> torch.Tensor:
    """The values of MXFP4 ``blocks`` [..., G, 16] uint8 with ``scales`` [..., G] uint8 (module docstring):
    [..., G * 32] in ``dtype``, on ``blocks``' device. Works ``chunk_rows`` rows (of G blocks) at a time, so
    the fp32 transient stays small whatever the tensor.

    Raises:
        ValueError: the shapes do not pair (``blocks.shape[:-1] != scales.shape`` or the last dimension is
            not 16 bytes).
    """
    if blocks.shape[-1] != 16 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ValueError(
            f"MXFP4: blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not pair (blocks must be "
            f"[..., G, 16] bytes and scales [..., G])"
        )
    *lead, G, _ = blocks.shape
    rows = blocks.reshape(-1, G, 16)
    exps = scales.reshape(-1, G).to(torch.int32) - 127
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    out = torch.empty(rows.shape[0], G * 32, dtype=dtype, device=blocks.device)
    for r0 in range(0, rows.shape[0], chunk_rows):
        b = rows[r0 : r0 + chunk_rows].to(torch.uint8)
        vals = torch.stack((lut[(b & 0x0F).long()], lut[(b >> 4).long()]), dim=-1)  # [r, G, 16, 2]
        vals = torch.ldexp(vals.reshape(b.shape[0], G, 32), exps[r0 : r0 + chunk_rows, :, None].float())
        out[r0 : r0 + chunk_rows] = vals.reshape(b.shape[0], G * 32).to(dtype)
    return out.reshape(*lead, G * 32)


def dequantize_mxfp4_state(
    state: dict[str, torch.Tensor], where: str = "the weights", dtype: torch.dtype = torch.bfloat16
) -> dict[str, torch.Tensor]:
    """Replace every ``<name>_blocks`` / ``<name>_scales`` pair of a GPT-OSS state dict by ``<name>``, the
    dequantized matrix in transformers' in-memory layout: the stored [E, rows, cols] (rows: the output
    features) transposed to [E, cols, rows] (``mlp.experts.gate_up_proj`` [E, H, 2I], ``down_proj``
    [E, I, H]). Other tensors pass through; the pairs are released as they are converted.

    Raises:
        KeyError: a ``_blocks`` tensor without its ``_scales`` (or the reverse), naming ``where``.
    """
    for name in sorted(n for n in state if n.endswith(("_blocks", "_scales"))):
        base = name.removesuffix("_blocks").removesuffix("_scales")
        if base in state:
            continue
        if f"{base}_blocks" not in state or f"{base}_scales" not in state:
            raise KeyError(f"{where}: {base}_blocks and {base}_scales must both be present (MXFP4 weights)")
        w = dequantize_mxfp4(state.pop(f"{base}_blocks"), state.pop(f"{base}_scales"), dtype)
        state[base] = w.transpose(-1, -2).contiguous()
    return state


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The MXFP4 encoding of ``w`` [..., C] (C a multiple of 32; rows along the last dimension): (blocks
    [..., C / 32, 16] uint8, scales [..., C / 32] uint8), each block's scale the power of two that brings its
    largest magnitude to at most 6, each element rounded to the nearest E2M1 value. For tests and tools that
    write MXFP4 checkpoints; :func:`dequantize_mxfp4` inverts it up to that rounding."""
    *lead, C = w.shape
    if C % 32:
        raise ValueError(f"MXFP4: the last dimension {C} is not a multiple of 32")
    x = w.float().reshape(*lead, C // 32, 32)
    amax = x.abs().amax(-1, keepdim=True).clamp(min=2.0**-126)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = x / torch.exp2(exp)
    lut = torch.tensor(FP4_VALUES[:8])
    codes = (scaled.abs()[..., None] - lut).abs().argmin(-1) + 8 * (scaled < 0)
    codes = codes.to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exp[..., 0] + 127).to(torch.uint8)
