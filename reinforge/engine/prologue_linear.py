"""A decode step's weight matmuls with the norm before them and SiLU-and-multiply after folded in.

A dense decoder layer in the engine is eight kernels: the residual add and RMSNorm, the q/k/v matmul,
attention, the output projection, the add and norm again, the gate/up matmul, SiLU-and-multiply and the
down projection. For a small model at decode (a few hundred rows of a 576-wide hidden state) each is a
few microseconds of latency, not of bytes, so a step costs about its number of kernels. Here the add
and norm run inside the q/k/v and gate/up matmuls, and SiLU-and-multiply is the gate/up matmul's
epilogue: five kernels a layer.

:func:`prologue_linear` computes ``y = prologue(x) @ W^T (+ bias)`` as a Triton GEMM whose programs each
hold a block of rows whole (K up to :data:`MAX_K`, a small model's hidden size):

* ``"none"``: ``x``;
* ``"rms_norm"``: RMSNorm of ``x`` (Llama's, ``norm_weight * x * rsqrt(mean(x^2) + eps)``, with
  :func:`reinforge.models.fused.rms_norm`'s rounding);
* ``"add_rms_norm"``: the same of ``h = (x + residual)`` rounded to the stream's dtype, and ``h`` is
  returned (the new residual stream; :func:`reinforge.models.fused.add_rms_norm` without the in-place
  update, whose write would race with the other column blocks' reads).

With ``gated`` the weight is the packed ``[gate; up]`` matrix and the program keeps both halves' tiles of
its columns, returning ``silu(gate) * up`` (the gate/up outputs rounded to the weight's dtype first, as
the packed matmul's output would be).

The matmul sums in another order than cuBLAS, so results differ from the unfused kernels in bf16's last
bits (``tests/test_prologue_linear.py``).
Inference only (no backward). Measured against cuBLAS and the separate kernels: ``bench/decode_gemm.py``,
docs/benchmarks.md.
"""

from __future__ import annotations

import torch

from ..utils.triton import tl, triton

PROLOGUES = {"none": 0, "rms_norm": 1, "add_rms_norm": 2}

if triton is not None:

    @triton.jit
    def _prologue_linear_kernel(
        X,
        R,
        ROUT,
        NW,
        W,
        BIAS,
        Y,
        M,
        N,
        s_x,
        s_r,
        s_w,
        s_y,
        eps,
        K: tl.constexpr,
        K_PAD: tl.constexpr,
        PROLOGUE: tl.constexpr,
        GATED: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
    ):
        # program (m, n): rows [m*BM, +BM) x output columns [n*BN, +BN) (GATED: those of the gate rows of W
        # and the same of its up rows, N further). The whole of K at once: every load is issued before the
        # first product, so the program waits for memory once (a loop over K whose A tiles pass through
        # the norm's arithmetic is not pipelined and waits once per step: 3x slower at K = 576)
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        kk = tl.arange(0, K_PAD)
        m_ok = rm < M
        n_ok = rn < N
        k_ok = kk < K
        rows = rm.to(tl.int64)[:, None]
        mask = m_ok[:, None] & k_ok[None, :]
        wmask = n_ok[:, None] & k_ok[None, :]
        wrow = rn.to(tl.int64)[:, None] * s_w + kk[None, :]
        dtype = W.dtype.element_ty
        h = tl.load(X + rows * s_x + kk[None, :], mask=mask, other=0.0)
        w = tl.load(W + wrow, mask=wmask, other=0.0)
        if GATED:
            wu = tl.load(W + wrow + N * s_w, mask=wmask, other=0.0)
        if PROLOGUE == 2:  # the residual add, rounded to the stream's dtype as eager's; column block 0 keeps it
            r = tl.load(R + rows * s_r + kk[None, :], mask=mask, other=0.0)
            h = (h.to(tl.float32) + r.to(tl.float32)).to(ROUT.dtype.element_ty)
            if pid_n == 0:
                tl.store(ROUT + rows * K + kk[None, :], h, mask=mask)
        if PROLOGUE == 0:
            a = h.to(dtype)
        else:  # fused.rms_norm's arithmetic: (x * rstd) rounded to x's dtype, times the weight, rounded
            hf = h.to(tl.float32)
            rstd = tl.rsqrt(tl.sum(hf * hf, 1) / K + eps)
            y = (hf * rstd[:, None]).to(h.dtype).to(tl.float32)
            a = (tl.load(NW + kk, mask=k_ok, other=0.0).to(tl.float32)[None, :] * y).to(dtype)
        acc = tl.dot(a, tl.trans(w))
        if HAS_BIAS:
            acc += tl.load(BIAS + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if GATED:  # silu(gate) * up of the outputs rounded as the packed matmul's would be
            g = acc.to(dtype).to(tl.float32)
            acc = g * tl.sigmoid(g) * tl.dot(a, tl.trans(wu)).to(dtype).to(tl.float32)
        out = Y + rows * s_y + rn[None, :]
        tl.store(out, acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


MAX_K = 1024  # the widest K (padded to a power of two) one program takes at once


# (BM, BN, num_warps): the best of bench/decode_gemm.py's tiles at 16-256 rows and K = 576 on an H200
# (docs/benchmarks.md)
TILE = (16, 32, 4)


def prologue_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    prologue: str = "none",
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    gated: bool = False,
    config: tuple[int, int, int] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``prologue(x) @ weight.T + bias`` in one kernel (the prologues: the module docstring); with ``gated``,
    ``silu(gate) * up`` of that product's two halves.

    Args:
        x: [M, K], rows contiguous, on CUDA (or under Triton's interpreter).
        weight: [N, K] (``nn.Linear``'s layout; ``gated``: [2N, K], the gate rows then the up rows), rows
            contiguous, x's dtype.
        bias: [N] or None (not with ``gated``).
        prologue: one of :data:`PROLOGUES`.
        norm_weight: [K], the RMSNorm's weight (the norm prologues).
        eps: added to the mean square.
        residual: [M, K] (``"add_rms_norm"``): the residual stream, added to ``x`` first; left unchanged.
        gated: the packed gate/up matmul with SiLU-and-multiply as its epilogue: the result is [M, N].
        config: (BM, BN, num_warps); None: :data:`TILE`.

    Returns:
        y [M, N] in weight's dtype; with ``"add_rms_norm"`` the pair (y, x + residual).

    Raises:
        ValueError: an unknown prologue, a missing ``norm_weight`` / ``residual``, mismatched shapes, K over
            :data:`MAX_K`.
    """
    if prologue not in PROLOGUES:
        raise ValueError(f"prologue_linear: prologue {prologue!r} is not one of {sorted(PROLOGUES)}")
    M, K = x.shape
    N = weight.shape[0] // 2 if gated else weight.shape[0]
    if weight.shape[1] != K or (gated and weight.shape[0] % 2) or (gated and bias is not None):
        raise ValueError(
            f"prologue_linear: x {tuple(x.shape)} does not fit weight {tuple(weight.shape)}"
            + (" (gated: an even number of rows, no bias)" if gated else "")
        )
    if prologue != "none" and norm_weight is None:
        raise ValueError(f"prologue_linear: prologue {prologue!r} needs norm_weight")
    if prologue == "add_rms_norm" and (residual is None or residual.shape != x.shape):
        raise ValueError(f"prologue_linear: add_rms_norm needs a residual of x's shape {tuple(x.shape)}")
    if K > MAX_K:
        raise ValueError(f"prologue_linear: K = {K} is over MAX_K = {MAX_K} (one program holds a row block's K)")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("prologue_linear: x and weight need contiguous rows")
    y = torch.empty(M, N, dtype=weight.dtype, device=x.device)
    new_res = torch.empty(M, K, dtype=residual.dtype, device=x.device) if prologue == "add_rms_norm" else None
    r = residual if residual is not None else x
    if r.stride(1) != 1:
        r = r.contiguous()
    bm, bn, warps = config or TILE
    _prologue_linear_kernel[(triton.cdiv(M, bm), triton.cdiv(N, bn))](
        x,
        r,
        new_res if new_res is not None else y,
        norm_weight if norm_weight is not None else weight,
        weight,
        bias if bias is not None else weight,
        y,
        M,
        N,
        x.stride(0),
        r.stride(0),
        weight.stride(0),
        y.stride(0),
        eps,
        K=K,
        K_PAD=triton.next_power_of_2(K),
        PROLOGUE=PROLOGUES[prologue],
        GATED=gated,
        HAS_BIAS=bias is not None,
        BM=bm,
        BN=bn,
        num_warps=warps,
    )
    return (y, new_res) if new_res is not None else y
