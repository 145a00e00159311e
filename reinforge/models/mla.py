"""Multi-head latent attention (MLA; DeepSeek-V2 paper, Sec. 2.1: arXiv 2405.04434), as DeepSeek-V3/R1,
Kimi-K2 and Moonlight use it. Formulas: ``transformers/models/deepseek_v3/modeling_deepseek_v3.py``
(``DeepseekV3Attention``; fp32 logits agree: ``tests/integration/test_deepseek_v3.py``).

For x [B, T, hidden] and H heads (the names are the config's):

* queries: ``q = q_b_proj(q_a_layernorm(q_a_proj(x)))`` (a rank-``q_lora_rank`` bottleneck), or
  ``q_proj(x)`` when ``q_lora_rank`` is null; [B, T, H, qk_nope_head_dim + qk_rope_head_dim], split
  into ``q_nope`` and ``q_rot``;
* the compressed latent: ``kv_a_proj_with_mqa(x)`` = [c | k_rot]: ``c = kv_a_layernorm(.)``
  [B, T, kv_lora_rank] and the **decoupled RoPE key** ``k_rot`` [B, T, qk_rope_head_dim], one for all
  heads (MQA-like);
* RoPE on ``q_rot`` and ``k_rot`` only (``rope_interleave``: DeepSeek's pairs ``(x0, x1), (x2, x3)``,
  computed as transformers does: the dimensions reordered evens-then-odds, then the usual rotation);
* keys and values expanded per head: ``kv_b_proj(c)`` = [k_nope | v] per head
  ([qk_nope_head_dim | v_head_dim]); ``k = [k_nope | k_rot]``;
* softmax scale ``qk_head_dim ** -0.5``, times ``mscale ** 2`` with YaRN's
  ``mscale = 0.1 * mscale_all_dim * ln(factor) + 1`` when the RoPE is scaled and ``mscale_all_dim`` is set
  (DeepSeek's reference code; ``yarn_apply_mscale`` in transformers);
* ``o_proj`` over the H heads' [v_head_dim] outputs.

The trainer computes exactly that (:meth:`MultiHeadLatentAttention.forward` without an engine context).
The embedded engine caches only the latent ``[c | k_rot]`` (``kv_lora_rank + qk_rope_head_dim`` values
per token and layer: 576 for DeepSeek-V3 against 2 x 128 x 192 expanded) and attends with the
**absorbed projections** (the DeepSeek-V2 paper's inference form, as FlashMLA and vLLM's MLA backend):
``q_nope`` goes through ``W_UK`` (the key rows of ``kv_b_proj``) into the latent space, the attention runs
as multi-query attention of one head of width ``kv_lora_rank + qk_rope_head_dim`` whose keys and values
are the same cached rows (values: their first ``kv_lora_rank`` entries), and the output goes through
``W_UV`` (the value rows) before ``o_proj``. The decode contexts (``caches_kv``) see it as an ordinary
one-KV-head layer, so the paged and slot decode paths and prefix sharing run unchanged (on CUDA the Triton
kernel of :mod:`reinforge.engine.mla_decode`); the runner stores one tensor for keys and values
(:attr:`ModelArgs.kv_lora_rank <reinforge.models.args.ModelArgs>`). Prefill (``ctx.latent_rows``) stores the
chunk's latent rows and expands the cached rows of the whole prefix into keys and values, as the trainer
(fewer FLOPs than the absorbed form over many queries, and flash attention's head widths).

Every attention call pads the values to the keys' width (``qk_nope_head_dim + qk_rope_head_dim``) and cuts
the output back: one head width, which flash attention needs (FlashAttention-2 supports 192, not 192 / 128).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .args import ModelArgs, rope_parameters
from .sdpa import sdpa
from .transformer import AttentionContext, RMSNorm, apply_rope

# DeepSeek's latent norms use RMSNorm's default epsilon, not rms_norm_eps (transformers' DeepseekV3RMSNorm(dim))
LATENT_NORM_EPS = 1e-6


def mla_softmax_scale(cfg: Any) -> float:
    """``qk_head_dim ** -0.5``, times ``mscale ** 2`` for a scaled RoPE with ``mscale_all_dim`` set
    (``mscale = 0.1 * mscale_all_dim * ln(factor) + 1``, 1 for ``factor`` <= 1)."""
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    params = rope_parameters(cfg)
    if params.get("rope_type", "default") != "default" and params.get("mscale_all_dim"):
        factor = float(params.get("factor") or 1.0)
        if factor > 1:
            m = 0.1 * float(params["mscale_all_dim"]) * math.log(factor) + 1.0
            scale *= m * m
    return scale


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """DeepSeek's interleaved RoPE pairs ``(x0, x1), (x2, x3), ...`` of the last dimension reordered into
    the halves the usual rotation pairs (evens then odds), as transformers' ``apply_rotary_pos_emb_interleave``."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


class MultiHeadLatentAttention(nn.Module):
    """MLA (module docstring). Parameters under the decoder layer's ``self_attn.`` with Hugging Face
    names: ``q_proj`` or ``q_a_proj`` / ``q_a_layernorm`` / ``q_b_proj``, ``kv_a_proj_with_mqa``,
    ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj`` (``attention_bias`` biases ``q_a_proj``,
    ``kv_a_proj_with_mqa`` and ``o_proj``, as transformers does).

    Args:
        args: the model's :class:`ModelArgs` (``head_dim`` is ``qk_rope_head_dim``: the RoPE tables' width).
        layer: the decoder layer's index (the engine context's key).
        cfg: the Hugging Face config (``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``,
            ``qk_rope_head_dim``, ``v_head_dim``, ``rope_interleave``, ``attention_bias``, RoPE scaling).
    """

    def __init__(self, args: ModelArgs, layer: int, cfg: Any):
        super().__init__()
        self.layer = layer
        H, hidden = args.num_heads, args.hidden_size
        self.q_lora_rank = getattr(cfg, "q_lora_rank", None)
        self.kv_lora_rank = int(cfg.kv_lora_rank)
        self.nope, self.rope, self.v_dim = int(cfg.qk_nope_head_dim), int(cfg.qk_rope_head_dim), int(cfg.v_head_dim)
        bias = bool(getattr(cfg, "attention_bias", False))
        if self.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, H * (self.nope + self.rope), bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(self.q_lora_rank, H * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, self.kv_lora_rank + self.rope, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, H * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(H * self.v_dim, hidden, bias=bias)
        self.scale = mla_softmax_scale(cfg)
        self.interleave = bool(getattr(cfg, "rope_interleave", False))

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if self.q_lora_rank is None:
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.interleave:
            x = deinterleave(x)
        return apply_rope(x, cos, sin)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: AttentionContext | None):
        """x [B, T, hidden] -> [B, T, hidden]; cos, sin [B, T, qk_rope_head_dim]. An engine context
        (``caches_kv``) gets the latent form (:meth:`_absorbed`), any other the expanded keys and values."""
        B, T, _ = x.shape
        q = self._queries(x).view(B, T, -1, self.nope + self.rope)  # (local heads under tensor parallelism)
        q_nope, q_rot = q.split([self.nope, self.rope], dim=-1)
        c, k_rot = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope], dim=-1)
        c = self.kv_a_layernorm(c)
        q_rot = self._rope(q_rot, cos, sin)
        k_rot = self._rope(k_rot.view(B, T, 1, self.rope), cos, sin)
        q = torch.cat([q_nope, q_rot], dim=-1)
        mask = None
        if hasattr(ctx, "latent_rows"):  # the engine's prefill: the latent cached, keys and values expanded
            rows, mask = ctx.latent_rows(self.layer, torch.cat([c, k_rot[:, :, 0]], dim=-1))
            c, k_rot = rows.split([self.kv_lora_rank, self.rope], dim=-1)
            k_rot = k_rot.unsqueeze(2)
        elif getattr(ctx, "caches_kv", False):  # the engine's decode: absorbed projections
            return self.o_proj(self._absorbed(q_nope, q_rot, c, k_rot, ctx).reshape(B, T, -1))
        S = c.shape[1]
        k_nope, v = self.kv_b_proj(c).view(B, S, -1, self.nope + self.v_dim).split([self.nope, self.v_dim], -1)
        k = torch.cat([k_nope, k_rot.expand(-1, -1, k_nope.shape[2], -1)], dim=-1)
        D = self.nope + self.rope
        # values padded to the keys' width: one head width for every attention kernel (flash attention's too)
        v = torch.nn.functional.pad(v, (0, D - self.v_dim)) if D > self.v_dim else v
        if ctx is None or mask is not None or hasattr(ctx, "latent_rows"):
            o = sdpa(q, k, v, mask, scale=self.scale)
        else:  # another context (packed rows): its default scale 1/sqrt(D)
            o = ctx.attend(self.layer, q * (self.scale * math.sqrt(D)), k, v)
        return self.o_proj(o[..., : self.v_dim].reshape(B, T, -1))

    def _absorbed(self, q_nope, q_rot, c, k_rot, ctx) -> torch.Tensor:
        """The engine's form: queries [B, T, H, kv_lora_rank + rope] in the latent space against the cached
        latent rows [B, T, 1, kv_lora_rank + rope] (keys and values alike), the output through ``W_UV``:
        [B, T, H, v_head_dim]."""
        R = self.kv_lora_rank
        w = self.kv_b_proj.weight
        if not isinstance(w, torch.Tensor):  # an fp8 rollout weight (engine/fp8.py: Fp8Linear)
            w = w.dequantize(q_nope.dtype)
        w = w.view(-1, self.nope + self.v_dim, R).to(q_nope.dtype)  # [H, nope + v, R]
        w_uk, w_uv = w[:, : self.nope], w[:, self.nope :]
        q_lat = torch.einsum("bthn,hnr->bthr", q_nope, w_uk)
        D = R + self.rope
        q = torch.cat([q_lat, q_rot], dim=-1) * (self.scale * math.sqrt(D))  # the contexts scale by 1/sqrt(D)
        latent = torch.cat([c.unsqueeze(2), k_rot], dim=-1)  # [B, T, 1, D]
        o = ctx.attend(self.layer, q, latent, latent)[..., :R]
        return torch.einsum("bthr,hvr->bthv", o, w_uv)
