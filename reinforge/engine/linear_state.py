"""The hybrid state cache's second half: per-sequence states of the linear-attention layers.

A hybrid model (Qwen3-Next, Qwen3.5) keeps paged KV blocks for its full-attention layers, as every model
does here, and for each linear-attention layer (:class:`~reinforge.models.linear_attention.GatedDeltaNet`)
two fixed-size states per sequence, whatever its length:

* the convolution state: the last ``conv_kernel - 1`` inputs of the short causal convolution,
  ``conv[layer]`` [slots, conv_dim, conv_kernel - 1] in the model's dtype;
* the recurrent state: the gated delta rule's ``S``, ``rec[layer]`` [slots, Hv, Dk, Dv] in fp32.

Slot ``s``'s states belong to the sequence in slot ``s``. A prefill computes them from zero for each prompt
(right-padded rows: padding positions neither decay nor write the state, and the convolution state is taken at
each row's own last token), chunk by chunk when the prefill is chunked, and :meth:`LinearStates.commit` copies a
prompt's states into every slot of its entry (its samples). A decode step advances slots ``[0, B)`` by one
token in place (CUDA-graph safe: fixed buffers, no host reads), on CUDA through flash-linear-attention's fused
recurrent kernel (``fla_recurrent``; the torch step :func:`recurrent_gated_delta_rule` elsewhere). Nothing else
needs them: a preempted or continued sequence (``partial_rollout``) is prefilled again from its tokens, which
rebuilds its states, and a released slot's states are overwritten by the next prefill. The memory is per
sequence, not per token (:meth:`LinearStates.nbytes`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..models.linear_attention import (
    GatedDeltaNet,
    causal_conv1d,
    fla_recurrent,
    gated_delta_rule,
    recurrent_gated_delta_rule,
)


@functools.cache
def fla_step_kernels() -> tuple[Any, Any] | None:
    """flash-linear-attention's one-token recurrent kernel (``fused_recurrent_gated_delta_rule_fwd_kernel``) and
    its fused gated RMSNorm (``rms_norm_gated``, what transformers' Qwen3-Next runs), or None where fla-core lacks
    them (then :func:`~reinforge.models.linear_attention.fla_recurrent` and the torch norm serve)."""
    try:
        from fla.modules.norm.fused_norm_gate import rms_norm_gated
        from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd_kernel
    except ImportError:
        return None
    return fused_recurrent_gated_delta_rule_fwd_kernel, rms_norm_gated


def recurrent_step_in_place(
    kernel: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor, scale: float,
) -> torch.Tensor:  # fmt: skip
    """One decode token of the gated delta rule with fla's fused kernel, the state updated **in place**: q, k
    [B, H, Dk] (raw: the kernel l2-normalises them), v [B, Hv, Dv], a, b [B, Hv] (the kernel forms
    ``g = -exp(A_log) softplus(a + dt_bias)`` and ``beta = sigmoid(b)``), state [B, Hv, Dk, Dv] fp32 contiguous.
    Returns o [B, Hv, Dv] in v's dtype. fla's public function writes a new final state, which the caller must
    copy back: a second read and write of every state per step (24 of them per Qwen3.5-9B token). Each of the
    kernel's programs loads its own state tile before the time loop and stores it after, and no two programs
    share a tile, so passing the state as both initial and final state is safe."""
    B, H, K = q.shape
    HV, V = v.shape[1:]
    BV = min(8, 1 << (V - 1).bit_length())
    o = torch.empty_like(v)
    kernel[(-(-V // BV) * B * HV,)](
        q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), g=a.contiguous(), gk=None, gv=None,
        beta=b.contiguous(), A_log=A_log, dt_bias=dt_bias, o=o, h0=state, ht=state, cu_seqlens=None, scale=scale,
        T=1, H=H, HV=HV, K=K, V=V, BK=1 << (K - 1).bit_length(), BV=BV, IS_BETA_HEADWISE=True,
        USE_QK_L2NORM_IN_KERNEL=True, APPLY_BETA_SIGMOID=True, ALLOW_NEG_EIGVAL=False, STATE_V_FIRST=False,
        num_warps=1, num_stages=3,
    )  # fmt: skip
    return o


def linear_layers(model: torch.nn.Module) -> dict[int, GatedDeltaNet]:
    """Decoder layer index -> its linear-attention mixer (empty for a model without one)."""
    return {i: layer.mixer for i, layer in enumerate(model.model.layers) if isinstance(layer.mixer, GatedDeltaNet)}


def state_bytes_per_slot(layers: dict[int, GatedDeltaNet], dtype: torch.dtype) -> int:
    """Bytes of one slot's states over ``layers``: the convolution states in ``dtype``, the recurrent ones in fp32
    (what :class:`LinearStates` allocates per slot; the planner's count:
    :func:`reinforge.plan.kv.state_bytes_per_seq`)."""
    return sum(
        m.conv_dim * (m.conv_kernel - 1) * dtype.itemsize + 4 * m.num_v_heads * m.head_k_dim * m.head_v_dim
        for m in layers.values()
    )


class LinearStates:
    """The states of every linear-attention layer for ``num_slots`` sequences (see the module docstring)."""

    def __init__(self, layers: dict[int, GatedDeltaNet], num_slots: int, device: torch.device, dtype: torch.dtype):
        self.conv = {
            i: torch.zeros(num_slots, m.conv_dim, m.conv_kernel - 1, dtype=dtype, device=device)
            for i, m in layers.items()
        }
        self.rec = {
            i: torch.zeros(num_slots, m.num_v_heads, m.head_k_dim, m.head_v_dim, dtype=torch.float32, device=device)
            for i, m in layers.items()
        }
        self._rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # a prefill's per-prompt states
        # decode steps through flash-linear-attention's fused kernel (CUDA, when installed)
        self.fla_decode = device.type == "cuda"

    def nbytes(self) -> int:
        """Bytes held for all slots and layers."""
        return sum(t.numel() * t.element_size() for d in (self.conv, self.rec) for t in d.values())

    # ------------------------------------------------------------------ prefill
    def prefill(self, start: int, lens: torch.Tensor) -> Callable[[GatedDeltaNet, torch.Tensor], torch.Tensor]:
        """The context hook (``ctx.linear_state``) for a prefill chunk at positions ``[start, start + T)``
        of right-padded prompts of lengths ``lens`` [P]; a chunk at ``start`` 0 begins from zero states."""
        if start == 0:
            self._rows = {}

        def run(m: GatedDeltaNet, x: torch.Tensor) -> torch.Tensor:
            P, T, _ = x.shape
            mixed, z, b, a = m.project(x)
            conv0, rec0 = self._rows.get(m.layer, (None, None))
            if conv0 is None:
                conv0 = mixed.new_zeros(P, m.conv_dim, m.conv_kernel - 1)
            out = causal_conv1d(mixed, m.conv1d.weight[:, 0], state=conv0)
            # the convolution state after each row's last real token of this chunk
            n = (lens.to(x.device) - start).clamp(0, T)  # real tokens of each row in this chunk
            window = torch.cat([conv0, mixed.transpose(1, 2)], -1)  # [P, C, K - 1 + T]
            idx = (n[:, None] + torch.arange(m.conv_kernel - 1, device=x.device))[:, None, :].expand(-1, m.conv_dim, -1)
            conv1 = window.gather(-1, idx)
            q, k, v = m.split_heads(out)
            g, beta = m.gates(b, a)
            real = (torch.arange(T, device=x.device)[None, :] < n[:, None])[..., None]  # padding: no decay, no write
            g, beta = g * real, beta * real
            o, rec1 = gated_delta_rule(q, k, v.float(), g, beta, initial_state=rec0)
            self._rows[m.layer] = (conv1, rec1)
            return m.output(o, z)

        return run

    def commit(self, slots: torch.Tensor, reps: torch.Tensor) -> None:
        """After the last prefill chunk: prompt ``i``'s states into its ``reps[i]`` slots (``slots`` in order)."""
        for layer, (conv, rec) in self._rows.items():
            n = slots.numel()
            self.conv[layer][slots] = conv.repeat_interleave(reps, dim=0, output_size=n).to(self.conv[layer].dtype)
            self.rec[layer][slots] = rec.repeat_interleave(reps, dim=0, output_size=n)
        self._rows = {}

    # ------------------------------------------------------------------ decode
    def decode(self, B: int) -> Callable[[GatedDeltaNet, torch.Tensor], torch.Tensor]:
        """The context hook for a decode step of slots ``[0, B)`` (one token each; idle rows update their
        own states, which the next prefill of that slot overwrites)."""

        fla = fla_recurrent() if self.fla_decode else None
        step = fla_step_kernels() if self.fla_decode else None

        def run(m: GatedDeltaNet, x: torch.Tensor) -> torch.Tensor:
            mixed, z, b, a = m.project(x)  # x [B, 1, hidden]
            conv = self.conv[m.layer][:B]
            window = torch.cat([conv, mixed.transpose(1, 2).to(conv.dtype)], -1)  # [B, C, K]
            out = F.silu((window * m.conv1d.weight[:, 0].to(window.dtype)).sum(-1)).to(mixed.dtype)  # [B, C]
            conv.copy_(window[..., 1:])
            rec = self.rec[m.layer][:B]
            if step is not None:  # one kernel for norms, gates and the state's step in place; one for the gated norm
                kernel, gated_norm = step
                q, k, v = out.split([m.key_dim, m.key_dim, m.value_dim], -1)
                o = recurrent_step_in_place(
                    kernel,
                    q.reshape(B, m.num_k_heads, m.head_k_dim),
                    k.reshape(B, m.num_k_heads, m.head_k_dim),
                    v.reshape(B, m.num_v_heads, m.head_v_dim),
                    a.reshape(B, m.num_v_heads),
                    b.reshape(B, m.num_v_heads),
                    m.A_log,
                    m.dt_bias,
                    rec,
                    m.head_k_dim**-0.5,
                )
                o = gated_norm(
                    o.reshape(-1, m.head_v_dim).to(z.dtype), z.reshape(-1, m.head_v_dim), m.norm.weight, None,
                    activation="silu", eps=m.norm.eps,
                )  # fmt: skip
                return m.out_proj(o.reshape(B, 1, -1))
            if fla is not None:  # one kernel: norms, gates and the state's step
                q, k, v = out.split([m.key_dim, m.key_dim, m.value_dim], -1)
                o, new = fla(
                    q.reshape(B, 1, m.num_k_heads, m.head_k_dim),
                    k.reshape(B, 1, m.num_k_heads, m.head_k_dim),
                    v.reshape(B, 1, m.num_v_heads, m.head_v_dim),
                    g=a,
                    beta=b,
                    scale=m.head_k_dim**-0.5,
                    initial_state=rec,
                    output_final_state=True,
                    use_qk_l2norm_in_kernel=True,
                    use_gate_in_kernel=True,
                    A_log=m.A_log,
                    dt_bias=m.dt_bias,
                    use_beta_sigmoid_in_kernel=True,
                )
                rec.copy_(new)
                return m.output(o.to(z.dtype), z)
            q, k, v = m.split_heads(out)
            g, beta = m.gates(b[:, 0], a[:, 0])
            o, new = recurrent_gated_delta_rule(q, k, v, g, beta, rec)
            rec.copy_(new)
            return m.output(o[:, None].to(z.dtype), z)

        return run
