"""FP8 rollout weights (``engine.quantization: fp8``): the engine's linear layers in float8 e4m3.

**Format** (DeepSeek-V3's and Qwen3-FP8's checkpoints, vLLM's ``weight_block_size: [128, 128]``): a
weight ``W`` [N, K] is cut into 128 x 128 blocks; block ``(i, j)`` is stored as
``q = round(W_ij / s_ij)`` in ``torch.float8_e4m3fn`` (round to nearest even, saturated at 448) with
``s_ij = amax(|W_ij|) / 448`` in fp32, so ``W ~ q * s`` (``s`` is the checkpoints' ``weight_scale_inv``:
the multiplier that dequantizes). A zero block gets a tiny scale (amax floored at 1e-12), never 0/0.
Rows and columns are padded with zeros to multiples of 128 (the fused q/k/v and gate/up matrices pad
each member on its own, so that every block belongs to one projection and a weight sync can quantize
a member without the others).

**What is quantized**: every decoder layer's attention projections (q/k/v, fused or not, and o) and
dense SwiGLU MLP projections (gate/up, down; also Qwen2-MoE's shared expert and GLM's shared experts).
Not: embeddings, the LM head, norms, routers, and the routed experts of a mixture-of-experts layer
(``torch._scaled_grouped_mm`` takes no 128 x 128 block scales on Hopper; they stay in the engine's dtype).

**Matmul** (:class:`Fp8Linear`, chosen once per device and dtype by :func:`select_kernel`):

* ``scaled_mm`` (CUDA, compute capability 9.0, where a probe of ``torch._scaled_mm`` with block-wise
  scales runs and agrees with its emulation): the activations are quantized per token and 128-column
  group (1 x 128, scale ``amax / 448``; one Triton kernel, :func:`quantize_act`) and multiplied with
  cuBLASLt's block-scaled FP8 GEMM, the DeepGEMM / vLLM convention: ``scale_a`` [M, K/128]
  outer-dim-major, ``scale_b`` the weight's [N/128, K/128] scales transposed. W8A8.
* ``dequant`` (CPU, where torch has tensor-wise and row-wise ``_scaled_mm`` only; CUDA GPUs where the
  probe fails, e.g. Ada): the weight is dequantized to the activations' dtype for each matmul and
  multiplied in that dtype. W8A16: correct, but slower than the plain engine on a GPU.

**Hooking in without touching the model code**: :class:`Fp8Linear` is a *tensor-like* object (it
defines ``__torch_function__``, PyTorch's protocol for types that are not tensors), put where the
model keeps a weight: ``F.linear(x, w, b)`` on it runs :meth:`Fp8Linear.linear`. The fused q/k/v
(``Attention.qkv``) and gate/up (``MLP.gate_up``) matrices and the ``weight`` of o/down become such
objects; the bf16 parameters are dropped (no full-precision copy is kept).

**Weight sync** (:meth:`Fp8Weights.load`): the trainer's tensors arrive under their Hugging Face names
(``model.layers.0.self_attn.q_proj.weight``...); those of quantized layers are quantized on the engine's
device into the preallocated fp8 and scale buffers (in place: CUDA graphs see them), a bias is copied;
every other name goes on to the ordinary in-place copy.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..models.transformer import MLP, Attention, CausalLM
from ..utils.triton import tl, triton, triton_available

log = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
BLOCK = 128
EPS = 1e-12  # floor of a block's amax: an all-zero block gets a tiny scale, not 0 / 0
QUANTIZATIONS = ("fp8",)
_ROW_CHUNK = 32 * BLOCK  # rows quantized at once (bounds the fp32 temporary of a weight sync)


def _up(n: int, m: int) -> int:
    return -(-n // m) * m


def check_quantization(name: str | None, device: torch.device) -> None:
    """``engine.quantization`` on ``device``.

    Raises:
        ValueError: an unknown name, or fp8 on a CUDA GPU before compute capability 8.9 (no FP8
            conversion or matmul there), in one line naming the key.
    """
    if name is None:
        return
    if name not in QUANTIZATIONS:
        raise ValueError(f"engine.quantization={name!r}: choose null or fp8")
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        cap = ".".join(map(str, torch.cuda.get_device_capability(device)))
        raise ValueError(
            f"engine.quantization=fp8 needs a GPU of compute capability 8.9 or later (Ada, Hopper); "
            f"{torch.cuda.get_device_name(device)} is {cap}: set engine.quantization=null"
        )


# ------------------------------------------------------------------------------------ quantizers
@torch.no_grad()
def quantize_into(w: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
    """Quantize ``w`` [n, K] into ``q`` [round_up(n, 128), Kp] (float8 e4m3) and ``s``
    [round_up(n, 128) / 128, Kp / 128] (fp32), 128 x 128 blocks, zero padding (see the module
    docstring). ``w`` may be on another device or of any float dtype; ``q`` and ``s`` are written
    in place, 4096 rows at a time.

    Raises:
        ValueError: the shapes do not fit.
    """
    n, K = w.shape
    rows, Kp = q.shape
    if rows != _up(n, BLOCK) or Kp < K or Kp % BLOCK or tuple(s.shape) != (rows // BLOCK, Kp // BLOCK):
        raise ValueError(f"quantize_into: weight {tuple(w.shape)} does not fit {tuple(q.shape)} / {tuple(s.shape)}")
    for a in range(0, rows, _ROW_CHUNK):
        b = min(rows, a + _ROW_CHUNK)
        part = torch.zeros(b - a, Kp, dtype=torch.float32, device=q.device)
        if a < n:
            part[: min(n, b) - a, :K] = w[a : min(n, b)].to(device=q.device, dtype=torch.float32)
        blocks = part.view((b - a) // BLOCK, BLOCK, Kp // BLOCK, BLOCK)
        scale = blocks.abs().amax(dim=(1, 3)).clamp(min=EPS) / FP8_MAX
        s[a // BLOCK : b // BLOCK] = scale
        q[a:b] = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(b - a, Kp)


def quantize_blocks(w: torch.Tensor, k_align: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [n, K] -> (q [round_up(n, 128), round_up(K, k_align)] float8 e4m3, s [rows / 128,
    columns / 128] fp32) on ``w``'s device (:func:`quantize_into`)."""
    n, K = w.shape
    rows, Kp = _up(n, BLOCK), _up(K, k_align)
    q = torch.empty(rows, Kp, dtype=FP8, device=w.device)
    s = torch.empty(rows // BLOCK, Kp // BLOCK, dtype=torch.float32, device=w.device)
    quantize_into(w, q, s)
    return q, s


def dequantize_blocks(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q * s`` per 128 x 128 block (multiplied in fp32, then cast to ``dtype``): q [R, C] float8,
    s [R / 128, C / 128] fp32 -> [R, C]."""
    R, C = q.shape
    blocks = q.float().view(R // BLOCK, BLOCK, C // BLOCK, BLOCK) * s[:, None, :, None]
    return blocks.view(R, C).to(dtype)


if triton is not None:

    @triton.jit
    def _act_quant_kernel(X, Q, S, M, K, Mp, Kp, stride_xm, FP8_MAX: tl.constexpr, EPS: tl.constexpr):
        # one program per (row, 128-column group): Q[row, group] = x / s, S[group, row] = s (Mp rows, zeros past M / K)
        row = tl.program_id(0)
        grp = tl.program_id(1)
        cols = grp * 128 + tl.arange(0, 128)
        ok = (cols < K) & (row < M)
        x = tl.load(X + row.to(tl.int64) * stride_xm + cols, mask=ok, other=0.0).to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(x), axis=0), EPS)
        s = tl.div_rn(amax, tl.zeros_like(amax) + FP8_MAX)  # IEEE divisions, as torch's (`/` is approximate)
        q = tl.minimum(tl.maximum(tl.div_rn(x, tl.zeros_like(x) + s), -FP8_MAX), FP8_MAX)
        tl.store(Q + row.to(tl.int64) * Kp + cols, q.to(Q.dtype.element_ty))
        tl.store(S + grp.to(tl.int64) * Mp + row, s)


def _quantize_act_eager(x2: torch.Tensor, Mp: int, Kp: int) -> tuple[torch.Tensor, torch.Tensor]:
    M, K = x2.shape
    xp = F.pad(x2.float(), (0, Kp - K, 0, Mp - M)).view(Mp, Kp // BLOCK, BLOCK)
    s = xp.abs().amax(-1).clamp(min=EPS) / FP8_MAX
    q = (xp / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(Mp, Kp)
    return q, s.t().contiguous().t()


def _quantize_act_triton(x2: torch.Tensor, Mp: int, Kp: int) -> tuple[torch.Tensor, torch.Tensor]:
    M, K = x2.shape
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    q = torch.empty(Mp, Kp, dtype=FP8, device=x2.device)
    s = torch.empty(Kp // BLOCK, Mp, dtype=torch.float32, device=x2.device)
    _act_quant_kernel[(Mp, Kp // BLOCK)](x2, q, s, M, K, Mp, Kp, x2.stride(0), FP8_MAX=FP8_MAX, EPS=EPS)
    return q, s.t()


def quantize_act(
    x2: torch.Tensor, Mp: int, Kp: int, triton_kernel: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations per token and 128-column group (DeepSeek-V3's ``act_quant``): x2 [M, K] ->
    (q [Mp, Kp] float8 e4m3, s [Mp, Kp / 128] fp32, outer-dim-major: strides (1, Mp), as
    ``torch._scaled_mm`` wants 1 x 128 scales), zeros past row M and column K, ``s = amax / 448``.
    ``triton_kernel``: one Triton kernel (default where Triton runs), else eager torch."""
    use = triton_available(x2.device.type) if triton_kernel is None else triton_kernel
    return (_quantize_act_triton if use else _quantize_act_eager)(x2, Mp, Kp)


def same_quantization(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """Whether two (q, s) activation quantizations agree: scales to 1e-6, values to one e4m3 step (a
    division rounded otherwise may move a value across a rounding boundary)."""
    (qa, sa), (qb, sb) = a, b
    if not torch.allclose(sa, sb, rtol=1e-6, atol=0):
        return False
    da, db = qa.float(), qb.float()
    return bool(((da - db).abs() <= db.abs() / 8 + 2.0**-9).all())


def scaled_mm_reference(
    xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """What the block-scaled ``torch._scaled_mm`` computes, in fp32: (xq * xs per 1 x 128 group) @
    (wq * ws per 128 x 128 block).T, cast to ``dtype``: [Mp, Kp] x [Np, Kp] -> [Mp, Np]."""
    Mp, Kp = xq.shape
    x = (xq.float().view(Mp, Kp // BLOCK, BLOCK) * xs[..., None]).view(Mp, Kp)
    return (x @ dequantize_blocks(wq, ws).t()).to(dtype)


def _scaled_mm(xq, xs, wq, ws, dtype):
    return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(), out_dtype=dtype)


# -------------------------------------------------------------------------- kernel choice (probe)
@functools.cache
def select_kernel(device: torch.device, dtype: torch.dtype) -> tuple[str, int, bool]:
    """(matmul kernel, column padding of the weights, Triton activation quantizer) for fp8 weights
    computing in ``dtype`` on ``device``: ``("scaled_mm", 128 or 512, ...)`` where a probe of the
    block-scaled ``torch._scaled_mm`` runs and matches :func:`scaled_mm_reference` (CUDA, compute
    capability 9.0; the padding that works: cuBLASLt may want the scales' rows 16-byte aligned),
    else ``("dequant", 128, False)`` with a warning on a GPU. Probed once per (device, dtype),
    before any CUDA graph is captured."""
    if device.type != "cuda":
        return "dequant", BLOCK, False
    why = "needs compute capability 9.0 (Hopper)"
    if torch.cuda.get_device_capability(device) >= (9, 0):
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(5, 512, device=device, generator=g).to(dtype)
        use_triton = triton_available("cuda")
        if use_triton:
            try:
                use_triton = same_quantization(quantize_act(x, 16, 512, True), quantize_act(x, 16, 512, False))
            except Exception as e:  # noqa: BLE001 - any failure of the kernel: the eager quantizer instead
                log.warning("engine.quantization=fp8: the Triton activation quantizer failed (%s); eager", e)
                use_triton = False
        for k_align, K in ((BLOCK, 3 * BLOCK), (4 * BLOCK, 4 * BLOCK)):
            try:
                w = torch.randn(256, K, device=device, generator=g) * 0.05
                wq, ws = quantize_blocks(w, k_align)
                xq, xs = quantize_act(x[:, :K], 16, K, use_triton)
                got = _scaled_mm(xq, xs, wq, ws, dtype).float()
                want = scaled_mm_reference(xq, xs, wq, ws, torch.float32)
                err = ((got - want).norm() / want.norm()).item()
                if err < 2e-2:
                    return "scaled_mm", k_align, use_triton
                why = f"block-wise torch._scaled_mm disagrees with its emulation ({err:.3g} relative)"
            except RuntimeError as e:
                why = f"block-wise torch._scaled_mm failed: {str(e).splitlines()[0]}"
    log.warning(
        "engine.quantization=fp8 on %s: %s; the fp8 weights are dequantized for each matmul (correct, "
        "but slower than engine.quantization=null on this GPU)",
        torch.cuda.get_device_name(device),
        why,
    )
    return "dequant", BLOCK, False


# ---------------------------------------------------------------------------------- the layer
class Fp8Linear:
    """One linear layer's fp8 weights (a tensor-like object: ``F.linear(x, self, bias)`` runs
    :meth:`linear`), possibly several projections fused along the output (q/k/v, gate/up).

    Args:
        rows: output rows of each member projection (one entry: a plain linear layer).
        in_features: K.
        device, dtype: where the buffers live; the bias' and the output's dtype.
        bias: keep an output bias [sum(rows)] in ``dtype``.
        kernel, k_align, triton_act: :func:`select_kernel`'s choice.

    Attributes:
        qweight: [Np, Kp] float8 e4m3, each member's rows padded to a multiple of 128, K to ``k_align``.
        scale_inv: [Np / 128, Kp / 128] fp32 (``weight_scale_inv``).
        bias: [N] or None.
    """

    kernel_override: ClassVar[str | None] = None
    """Force ``"dequant"`` (tests, benchmarks); None: :func:`select_kernel`'s choice."""

    def __init__(
        self,
        rows: list[int],
        in_features: int,
        device: torch.device,
        dtype: torch.dtype,
        bias: bool,
        kernel: str = "dequant",
        k_align: int = BLOCK,
        triton_act: bool = False,
    ):
        self.rows, self.in_features, self.out_features = list(rows), in_features, sum(rows)
        self.padded = [_up(r, BLOCK) for r in rows]
        self.offsets = [sum(self.padded[:i]) for i in range(len(rows))]  # of each member in qweight's rows
        self.out_offsets = [sum(rows[:i]) for i in range(len(rows))]  # ... in the output
        self.kernel, self.triton_act, self.dtype = kernel, triton_act, dtype
        Np, Kp = sum(self.padded), _up(in_features, k_align)
        self.qweight = torch.zeros(Np, Kp, dtype=FP8, device=device)
        self.scale_inv = torch.ones(Np // BLOCK, Kp // BLOCK, dtype=torch.float32, device=device)
        self.bias = torch.zeros(self.out_features, dtype=dtype, device=device) if bias else None
        # output columns of qweight's real rows: a slice when padding is only at the end, else an index
        self.columns: torch.Tensor | None = None
        if any(p != r for p, r in zip(self.padded[:-1], rows[:-1])):
            self.columns = torch.cat([torch.arange(o, o + r) for o, r in zip(self.offsets, rows)]).to(device)

    def __repr__(self) -> str:
        return (
            f"Fp8Linear(in={self.in_features}, out={self.rows}, blocks={tuple(self.scale_inv.shape)}, "
            f"kernel={self.kernel})"
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the fp8 weights and scales (what a decode step reads), bias included."""
        b = self.bias.numel() * self.bias.element_size() if self.bias is not None else 0
        return self.qweight.numel() + self.scale_inv.numel() * 4 + b

    @torch.no_grad()
    def load_weight(self, member: int, w: torch.Tensor, name: str = "weight") -> None:
        """Quantize member ``member``'s new weight [rows[member], K] in place (any device, float dtype).

        Raises:
            ValueError: ``w`` has another shape (naming ``name``).
        """
        if tuple(w.shape) != (self.rows[member], self.in_features):
            raise ValueError(
                f"weight sync: {name} has shape {tuple(w.shape)}, the engine's fp8 layer expects "
                f"{(self.rows[member], self.in_features)}"
            )
        a, p = self.offsets[member], self.padded[member]
        quantize_into(w, self.qweight[a : a + p], self.scale_inv[a // BLOCK : (a + p) // BLOCK])

    @torch.no_grad()
    def load_bias(self, member: int, b: torch.Tensor, name: str = "bias") -> None:
        """Copy member ``member``'s bias [rows[member]] in place.

        Raises:
            ValueError: no bias here, or another shape (naming ``name``).
        """
        if self.bias is None or tuple(b.shape) != (self.rows[member],):
            raise ValueError(f"weight sync: {name} of shape {tuple(b.shape)} does not fit the engine's fp8 layer")
        o = self.out_offsets[member]
        self.bias[o : o + self.rows[member]].copy_(b)

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weight the layer multiplies with, [N, K] in ``dtype`` (default the layer's)."""
        w = dequantize_blocks(self.qweight, self.scale_inv, dtype or self.dtype)[:, : self.in_features]
        return w[self.columns] if self.columns is not None else w[: self.out_features]

    def to(self, device: torch.device | str) -> Fp8Linear:
        """Move the buffers (engine sleep with weight offload); returns self."""
        for name in ("qweight", "scale_inv", "bias", "columns"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.to(device))
        return self

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T (+ bias)``: x [..., K] -> [..., N] in x's dtype, contiguous."""
        shape, K = x.shape, self.in_features
        x2 = x.reshape(-1, K)
        M, (Np, Kp) = x2.shape[0], self.qweight.shape
        if (self.kernel_override or self.kernel) == "scaled_mm":
            Mp = _up(max(M, 1), 16)
            xq, xs = quantize_act(x2, Mp, Kp, self.triton_act)
            y = _scaled_mm(xq, xs, self.qweight, self.scale_inv, x.dtype)[:M]
        else:
            y = F.linear(x2, dequantize_blocks(self.qweight, self.scale_inv, x.dtype)[:, :K])
        if self.columns is not None:
            y = y.index_select(1, self.columns)
        elif Np != self.out_features:
            y = y[:, : self.out_features].contiguous()
        if self.bias is not None:
            y = y + self.bias
        if bias is not None:
            y = y + bias
        return y.view(*shape[:-1], self.out_features)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is F.linear:
            kwargs = kwargs or {}
            x, w = args[0], args[1]
            return w.linear(x, args[2] if len(args) > 2 else kwargs.get("bias"))
        return NotImplemented


# ------------------------------------------------------------------------------- the registry
class Fp8Weights:
    """Every :class:`Fp8Linear` of one model and the Hugging Face names that load into them.

    Built by :func:`quantize_model`; the engine keeps it for weight sync (:meth:`load`) and sleep
    with weight offload (:meth:`to`)."""

    def __init__(self, kernel: str, k_align: int, triton_act: bool):
        self.kernel, self.k_align, self.triton_act = kernel, k_align, triton_act
        self.layers: list[Fp8Linear] = []
        self.targets: dict[str, tuple[Fp8Linear, int, str]] = {}  # name -> (layer, member, weight / bias)
        self.replaced_bytes = 0  # bytes of the weights they replaced

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    def load(self, named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """Quantize (or copy, a bias) the tensors of quantized layers in place; yield every other pair."""
        for name, t in named:
            hit = self.targets.get(name)
            if hit is None:
                yield name, t
            elif hit[2] == "weight":
                hit[0].load_weight(hit[1], t, name)
            else:
                hit[0].load_bias(hit[1], t, name)

    def to(self, device: torch.device | str) -> None:
        for layer in self.layers:
            layer.to(device)

    def _quantize(self, prefix: str, owner: nn.Module, attr: str, projs: list[tuple[str, nn.Linear]]) -> None:
        """Replace ``projs`` (name, nn.Linear), fused along the output, by one :class:`Fp8Linear` set as
        ``owner.<attr>``: the fused matrix attribute (a tuple ``(w, None)`` for ``qkv``) or a module's
        ``weight``. The projections' parameters are dropped (their bf16 storage is freed)."""
        first = projs[0][1]
        ref = first.weight
        has_bias = first.bias is not None
        layer = Fp8Linear(
            [p.weight.shape[0] for _, p in projs],
            ref.shape[1],
            ref.device,
            ref.dtype,
            has_bias,
            self.kernel,
            self.k_align,
            self.triton_act,
        )
        for i, (name, p) in enumerate(projs):
            self.replaced_bytes += p.weight.numel() * p.weight.element_size()
            layer.load_weight(i, p.weight.detach(), f"{prefix}.{name}.weight")
            self.targets[f"{prefix}.{name}.weight"] = (layer, i, "weight")
            if has_bias:
                layer.load_bias(i, p.bias.detach(), f"{prefix}.{name}.bias")
                self.targets[f"{prefix}.{name}.bias"] = (layer, i, "bias")
            del p._parameters["weight"]
            if has_bias:
                del p._parameters["bias"]
                p.bias = None
        if attr == "weight":
            first.weight = layer  # nn.Linear.forward's F.linear dispatches to it
        elif attr == "qkv":
            setattr(owner, attr, (layer, None))
        else:
            setattr(owner, attr, layer)
        self.layers.append(layer)


def quantize_model(model: CausalLM, quantization: str | None) -> Fp8Weights | None:
    """Quantize ``model``'s linear layers in place for ``engine.quantization`` (see the module
    docstring); None for ``null``. A model quantized already (an engine built on it before) keeps
    its fp8 layers. Call after ``CausalLM.set_variant`` (the fused matrices exist then).

    Raises:
        ValueError: an unusable ``quantization`` (:func:`check_quantization`); ``null`` for a model whose
            layers are fp8 already (another engine quantized it: build this one from its own copy).
    """
    done: Fp8Weights | None = getattr(model, "fp8_weights", None)
    if quantization is None:
        if done is not None:
            raise ValueError(
                "engine.quantization=null, but this model's linear layers are fp8 already (an engine with "
                "engine.quantization=fp8 was built on it): build this engine from its own copy of the model"
            )
        return None
    device = model.model.embed_tokens.weight.device
    check_quantization(quantization, device)
    if done is not None:
        return done
    dtype = model.model.embed_tokens.weight.dtype
    reg = Fp8Weights(*select_kernel(device, dtype))
    for prefix, m in model.named_modules():
        if isinstance(m, Attention):
            qkv = [("q_proj", m.q_proj), ("k_proj", m.k_proj), ("v_proj", m.v_proj)]
            if m.qkv is not None:
                reg._quantize(prefix, m, "qkv", qkv)
            else:
                for proj in qkv:
                    reg._quantize(prefix, proj[1], "weight", [proj])
            reg._quantize(prefix, m.o_proj, "weight", [("o_proj", m.o_proj)])
        elif isinstance(m, MLP):
            gu = [("gate_proj", m.gate_proj), ("up_proj", m.up_proj)]
            if m.gate_up is not None:
                reg._quantize(prefix, m, "gate_up", gu)
            else:
                for proj in gu:
                    reg._quantize(prefix, proj[1], "weight", [proj])
            reg._quantize(prefix, m.down_proj, "weight", [("down_proj", m.down_proj)])
    model.fp8_weights = reg
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the dropped bf16 weights' memory becomes free for the KV cache
    log.info(
        "embedded engine: fp8 weights (128x128 blocks) in %d linear layers, %.2f GiB -> %.2f GiB; matmul: %s",
        len(reg.layers),
        reg.replaced_bytes / 2**30,
        reg.nbytes / 2**30,
        "torch._scaled_mm, block-wise (activations 1x128)" if reg.kernel == "scaled_mm" else "dequantized per matmul",
    )
    return reg


def fp8_summary(model: Any) -> dict[str, Any]:
    """What :func:`quantize_model` did to ``model`` (benchmarks): layers, kernel, bytes before and after;
    empty when its layers are not fp8."""
    reg: Fp8Weights | None = getattr(model, "fp8_weights", None)
    if reg is None:
        return {}
    return {"layers": len(reg.layers), "kernel": reg.kernel, "replaced_bytes": reg.replaced_bytes, "bytes": reg.nbytes}
