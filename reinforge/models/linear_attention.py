"""Gated DeltaNet, the linear-attention layer of the hybrid families (Qwen3-Next, Qwen3.5).

The layer (Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks: Improving Mamba2 with Delta Rule", eq. 10;
the layout of ``transformers/models/qwen3_next/modeling_qwen3_next.py``): the input is projected to queries,
keys and values (``num_k_heads`` query/key heads of ``head_k_dim``, ``num_v_heads`` value heads of
``head_v_dim``), a gate ``z`` per value channel, and per value head ``b`` (the write strength
``beta = sigmoid(b)``) and ``a`` (the decay ``g = -exp(A_log) * softplus(a + dt_bias)``, a log factor <= 0).
q, k and v go through a short causal depthwise convolution (kernel ``conv_kernel``, SiLU), q and k are
L2-normalised (q also scaled by ``head_k_dim ** -0.5``), and each value head keeps a state
``S`` [head_k_dim, head_v_dim] updated per token by the gated delta rule:

    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T,      o_t = S_t^T q_t

The output is RMS-normalised per head, multiplied by ``silu(z)`` and projected back.

Two implementations of the rule, one result: :func:`chunk_gated_delta_rule` (pure torch, chunks of 64
tokens in the WY form: within a chunk, a unit lower-triangular solve gives every token's written value
at once; the reference and the CPU path) and flash-linear-attention's Triton kernels (``fla-core``,
``fla.ops.gated_delta_rule``) on a GPU when installed. Packed micro-batches (``cu_seqlens``) restart the
state and the convolution at every sequence boundary.

Shapes: hidden ``[B, T, hidden]``; the rule's q, k ``[B, T, Hv, Dk]`` (key heads repeated to the value
heads), v ``[B, T, Hv, Dv]``, g and beta ``[B, T, Hv]``, states ``[B, Hv, Dk, Dv]`` in fp32.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

CHUNK = 64
log = logging.getLogger(__name__)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dimension (flash-linear-attention's form)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over whole sequences, chunk by chunk (pure torch, differentiable).

    Within a chunk of C tokens with cumulative log decay ``G_i = g_1 + ... + g_i``, the values the tokens
    write, ``u = (I + A)^-1 (beta v - beta exp(G) k S_0)`` with ``A_ij = beta_i exp(G_i - G_j) k_i.k_j``
    (j < i), come from one triangular solve; then ``o_i = exp(G_i) S_0^T q_i + sum_{j<=i} exp(G_i - G_j)
    (q_i.k_j) u_j`` and ``S_C = exp(G_C) S_0 + sum_j exp(G_C - G_j) k_j u_j^T``. The sequence is padded to
    whole chunks with g = beta = 0 (no decay, no write), which leaves the state as it was.

    Args:
        q, k: [B, T, H, Dk] (normalised and scaled by the caller); v: [B, T, H, Dv]; g, beta: [B, T, H].
        initial_state: [B, H, Dk, Dv] or None (zeros).
    Returns:
        (o [B, T, H, Dv] in v's dtype, final state [B, H, Dk, Dv] fp32).
    """
    B, T, H, Dk = k.shape
    Dv = v.shape[-1]
    dtype = v.dtype
    pad = (-T) % chunk
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
    n = (T + pad) // chunk
    # [B, H, n, C, ...]
    q, k, v = (x.view(B, n, chunk, H, -1).permute(0, 3, 1, 2, 4) for x in (q, k, v))
    g, beta = (x.view(B, n, chunk, H).permute(0, 3, 1, 2) for x in (g, beta))
    # the decays in float64: G sums up to 64 log factors (-1e3 for fast-decaying heads), and G_i - G_j of two
    # such sums in fp32 would lose the small differences that matter (a relative error of 1e-4 in the output)
    G64 = g.double().cumsum(-1)
    G = G64.float()
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = (G64[..., :, None] - G64[..., None, :]).masked_fill(~lower, float("-inf")).exp().float()  # i >= j
    kb = k * beta[..., None]
    A = (kb @ k.transpose(-1, -2)) * decay
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    solve = eye + A.masked_fill(~lower.tril(-1), 0.0)
    inv_v = torch.linalg.solve_triangular(solve, v * beta[..., None], upper=False, unitriangular=True)
    inv_k = torch.linalg.solve_triangular(solve, kb * G.exp()[..., None], upper=False, unitriangular=True)
    qk = (q @ k.transpose(-1, -2)) * decay
    S = q.new_zeros(B, H, Dk, Dv) if initial_state is None else initial_state.float()
    outs = []
    for c in range(n):
        u = inv_v[:, :, c] - inv_k[:, :, c] @ S
        Gc = G[:, :, c]
        outs.append((q[:, :, c] * Gc.exp()[..., None]) @ S + qk[:, :, c] @ u)
        tail = (G64[:, :, c, -1:] - G64[:, :, c]).exp().float()  # exp(G_C - G_j)
        S = S * Gc[..., -1, None, None].exp() + (k[:, :, c] * tail[..., None]).transpose(-1, -2) @ u
    o = torch.stack(outs, 2).permute(0, 2, 3, 1, 4).reshape(B, n * chunk, H, Dv)[:, :T]
    return o.to(dtype), S


def recurrent_gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row (decode): the rule's step from ``state``. q, k: [B, H, Dk]; v: [B, H, Dv];
    g, beta: [B, H]; state [B, H, Dk, Dv] fp32 -> (o [B, H, Dv] in v's dtype, new state)."""
    dtype = v.dtype
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    S = state.float() * g.exp()[..., None, None]
    delta = (v - (S * k[..., None]).sum(-2)) * beta[..., None]
    S = S + k[..., None] * delta[..., None, :]
    return (S * q[..., None]).sum(-2).to(dtype), S


FLA_MISSING = (
    "linear attention on a GPU needs flash-linear-attention's kernels: pip install fla-core "
    "(the pure-torch rule is the CPU reference, far too slow for GPU runs)"
)


@functools.cache
def _fla() -> Any:
    """flash-linear-attention's chunked kernel.

    Raises:
        RuntimeError: fla-core is not installed (:data:`FLA_MISSING`: the install command).
    """
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
    except ImportError:
        raise RuntimeError(FLA_MISSING) from None
    return fla_chunk


@functools.cache
def fla_recurrent() -> Any:
    """flash-linear-attention's fused one-token step (``fused_recurrent_gated_delta_rule``: the l2 norms, the
    gate ``-exp(A_log) softplus(a + dt_bias)``, ``sigmoid(b)`` and the state's update in one kernel that reads
    and writes the state once).

    Raises:
        RuntimeError: fla-core is not installed (:data:`FLA_MISSING`).
    """
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except ImportError:
        raise RuntimeError(FLA_MISSING) from None
    return fused_recurrent_gated_delta_rule


@functools.cache
def _fla_backward_ok(device_index: int) -> bool:
    """Whether flash-linear-attention's backward may run here: its gated backward is wrong with Triton 3.4.0 -
    3.7.0 on Hopper GPUs and it refuses to run there (fla issue #640; fixed by Triton >= 3.7.1 or tilelang).
    There the training pass takes :func:`chunk_gated_delta_rule` (one warning); inference keeps the kernel."""
    try:
        import triton
    except ImportError:
        return False
    version = tuple(int(x) for x in triton.__version__.split("+")[0].split(".")[:3] if x.isdigit())
    hopper = torch.cuda.get_device_capability(device_index)[0] == 9
    if hopper and (3, 4, 0) <= version < (3, 7, 1):
        try:
            import tilelang  # noqa: F401  (fla's other backend for that kernel)
        except ImportError:
            log.warning(
                "linear attention: flash-linear-attention's backward is wrong with Triton %s on Hopper (fla #640); "
                "training uses the pure-torch chunked rule (slower). Upgrade triton (>= 3.7.1) or pip install tilelang",
                triton.__version__,
            )
            return False
    return True


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule over [B, T] rows, or over the packed sequences of one row (``cu_seqlens`` [S + 1] int32,
    B = 1: each sequence from a zero state): flash-linear-attention's kernel on CUDA, else
    :func:`chunk_gated_delta_rule` (per sequence when packed).

    Returns:
        (o [B, T, H, Dv], final states [B or S, H, Dk, Dv] fp32).

    Raises:
        RuntimeError: CUDA tensors and fla-core not installed (the message names the install).
    """
    fla = _fla() if q.is_cuda else None
    training = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, g, beta))
    if fla is not None and training and not _fla_backward_ok(q.device.index or 0):
        fla = None
    if fla is not None:
        o, state = fla(
            q,
            k,
            v,
            g,
            beta,
            scale=1.0,  # (q comes scaled)
            initial_state=initial_state,
            output_final_state=True,
            cu_seqlens=cu_seqlens.long() if cu_seqlens is not None else None,
        )
        return o, state.float()
    if cu_seqlens is None:
        return chunk_gated_delta_rule(q, k, v, g, beta, initial_state)
    bounds = cu_seqlens.tolist()
    outs, states = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        o, s = chunk_gated_delta_rule(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b])
        outs.append(o)
        states.append(s)
    tail = q.shape[1] - bounds[-1]  # (positions past the last sequence: padding)
    if tail:
        outs.append(v.new_zeros(1, tail, *v.shape[2:]))
    return torch.cat(outs, 1), torch.cat(states)


def causal_conv1d(
    x: torch.Tensor, weight: torch.Tensor, cu_seqlens: torch.Tensor | None = None, state: torch.Tensor | None = None
) -> torch.Tensor:
    """Depthwise causal convolution and SiLU. x: [B, T, C]; weight: [C, K]; ``cu_seqlens``: B = 1 rows of
    packed sequences, no tap reaches across a sequence start; ``state`` [B, C, K - 1]: the inputs before
    position 0 (a continued sequence), else zeros. Returns [B, T, C]."""
    B, T, C = x.shape
    K = weight.shape[-1]
    xt = x.transpose(1, 2)
    if state is not None:
        xt = torch.cat([state.to(xt.dtype), xt], -1)
    else:
        xt = F.pad(xt, (K - 1, 0))
    if cu_seqlens is None:
        out = F.conv1d(xt, weight[:, None, :].to(xt.dtype), groups=C)
        return F.silu(out).transpose(1, 2)
    # packed: tap s (s tokens back) only where the position is at least s past its sequence's start
    pos = torch.arange(T, device=x.device)
    start = cu_seqlens[torch.searchsorted(cu_seqlens, pos, right=True) - 1].to(pos.device)
    out = x.new_zeros(B, C, T)
    for s in range(K):
        tap = xt[:, :, K - 1 - s : K - 1 - s + T] * (pos - s >= start).to(x.dtype)
        out = out + tap * weight[:, K - 1 - s, None].to(x.dtype)
    return F.silu(out).transpose(1, 2)


class GatedRMSNorm(nn.Module):
    """RMSNorm per value head, then times ``silu(gate)`` (computed in fp32; transformers'
    ``Qwen3NextRMSNormGated``). Weight init 1."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return ((self.weight * x.to(dtype)) * F.silu(gate.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    """The linear-attention token mixer, parameters under ``linear_attn.`` with transformers' names.

    ``layout``: ``"qkvz"`` (Qwen3-Next: ``in_proj_qkvz`` and ``in_proj_ba``, grouped per key head) or
    ``"separate"`` (Qwen3.5: ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``).

    ``forward(x, cos, sin, ctx)`` as the attention modules (RoPE unused): ``ctx`` None (right-padded rows),
    a trainer context with ``cu_seqlens()`` (packed rows), or an engine context with ``linear_state`` (the
    per-sequence conv and recurrent states, :mod:`reinforge.engine.linear_state`).
    """

    def __init__(self, cfg: Any, layer: int, layout: str = "qkvz"):
        super().__init__()
        self.layer, self.layout = layer, layout
        self.num_v_heads, self.num_k_heads = int(cfg.linear_num_value_heads), int(cfg.linear_num_key_heads)
        self.head_k_dim, self.head_v_dim = int(cfg.linear_key_head_dim), int(cfg.linear_value_head_dim)
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"config.json: linear_num_value_heads={self.num_v_heads} must be a multiple of "
                f"linear_num_key_heads={self.num_k_heads}"
            )
        self.key_dim, self.value_dim = self.head_k_dim * self.num_k_heads, self.head_v_dim * self.num_v_heads
        self.conv_kernel = int(cfg.linear_conv_kernel_dim)
        self.conv_dim = 2 * self.key_dim + self.value_dim
        hidden = int(cfg.hidden_size)
        self.conv1d = nn.Conv1d(
            self.conv_dim,
            self.conv_dim,
            self.conv_kernel,
            groups=self.conv_dim,
            bias=False,
            padding=self.conv_kernel - 1,
        )
        if layout == "qkvz":
            self.in_proj_qkvz = nn.Linear(hidden, 2 * self.key_dim + 2 * self.value_dim, bias=False)
            self.in_proj_ba = nn.Linear(hidden, 2 * self.num_v_heads, bias=False)
        else:
            self.in_proj_qkv = nn.Linear(hidden, self.conv_dim, bias=False)
            self.in_proj_z = nn.Linear(hidden, self.value_dim, bias=False)
            self.in_proj_b = nn.Linear(hidden, self.num_v_heads, bias=False)
            self.in_proj_a = nn.Linear(hidden, self.num_v_heads, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.num_v_heads).uniform_(1, 16)))
        self.norm = GatedRMSNorm(self.head_v_dim, float(cfg.rms_norm_eps))
        self.out_proj = nn.Linear(self.value_dim, hidden, bias=False)
        self.fused_in: torch.Tensor | None = None  # the input projections as one matrix (fuse_projection)

    def in_projs(self) -> tuple[nn.Linear, ...]:
        """The input projections in the order of their output rows."""
        if self.layout == "qkvz":
            return self.in_proj_qkvz, self.in_proj_ba
        return self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a

    def fuse_projection(self, on: bool) -> None:
        """Inference: the input projections as one matmul (2 or 4 of them; the b and a projections have one
        output per value head, matmuls far too small to use the GPU alone), their weights views into it
        (:func:`~reinforge.models.transformer.fuse_rows`). ``on=False`` drops the fused matrix."""
        from .transformer import fuse_rows

        if on and self.fused_in is not None:
            return
        self.fused_in = fuse_rows(self.in_projs())[0] if on else None

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, hidden] -> (conv input [B, T, conv_dim] as q | k | v, z [B, T, Hv, Dv], b, a [B, T, Hv])."""
        B, T, _ = x.shape
        projs = self.in_projs()
        if self.fused_in is not None:
            outs = F.linear(x, self.fused_in).split([p.weight.shape[0] for p in projs], -1)
        else:
            outs = tuple(p(x) for p in projs)
        if self.layout != "qkvz":
            qkv, z, b, a = outs
            return qkv, z.reshape(B, T, self.num_v_heads, self.head_v_dim), b, a
        r = self.num_v_heads // self.num_k_heads
        qkvz = outs[0].reshape(B, T, self.num_k_heads, -1)
        q, k, v, z = qkvz.split([self.head_k_dim, self.head_k_dim, r * self.head_v_dim, r * self.head_v_dim], -1)
        b, a = outs[1].reshape(B, T, self.num_k_heads, 2 * r).split([r, r], -1)
        mixed = torch.cat([q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], -1)
        return mixed, z.reshape(B, T, self.num_v_heads, self.head_v_dim), b.reshape(B, T, -1), a.reshape(B, T, -1)

    def gates(self, b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g, beta) [.., Hv] fp32 from the projections' b and a."""
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        return g, b.float().sigmoid()

    def split_heads(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The convolution's output [.., conv_dim] -> q, k [.., Hv, Dk] (normalised, q scaled, key heads
        repeated to the value heads) and v [.., Hv, Dv]."""
        lead = mixed.shape[:-1]
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], -1)
        r = self.num_v_heads // self.num_k_heads
        q = l2norm(q.reshape(*lead, self.num_k_heads, self.head_k_dim).float()) * self.head_k_dim**-0.5
        k = l2norm(k.reshape(*lead, self.num_k_heads, self.head_k_dim).float())
        if r > 1:
            q, k = q.repeat_interleave(r, -2), k.repeat_interleave(r, -2)
        return q, k, v.reshape(*lead, self.num_v_heads, self.head_v_dim)

    def output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """o, z [B, T, Hv, Dv] -> [B, T, hidden]: gated norm per head, then the output projection."""
        B, T = o.shape[:2]
        return self.out_proj(self.norm(o.to(z.dtype), z).reshape(B, T, -1))

    def forward(self, x: torch.Tensor, cos: Any = None, sin: Any = None, ctx: Any = None) -> torch.Tensor:
        state = getattr(ctx, "linear_state", None)
        if state is not None:  # the engine: per-sequence states (prefill chunks, decode steps)
            return state(self, x)
        mixed, z, b, a = self.project(x)
        cu = ctx.cu_seqlens()[0] if ctx is not None and hasattr(ctx, "cu_seqlens") else None
        mixed = causal_conv1d(mixed, self.conv1d.weight[:, 0], cu)
        q, k, v = self.split_heads(mixed)
        g, beta = self.gates(b, a)
        o, _ = gated_delta_rule(q, k, v.float(), g, beta, cu)
        return self.output(o, z)
