"""A compact decoder-only transformer shared by the trainer and the embedded rollout engine.

One model code path serves both sides of RL post-training, so that the log-probs the engine
reports for a sampled token and the log-probs the trainer recomputes for it come from the same
arithmetic (in fp32 they agree to ~1e-6; see ``tests/unit/test_engine.py``).

The architectures it runs are the registered model families (:mod:`.families`, one file each:
``llama``, ``qwen2``, ``qwen3``, ``qwen3_moe``, ``qwen2_moe``, ``glm4_moe``, ...). A family maps its
Hugging Face config to :class:`ModelArgs` and chooses the attention and MLP modules of each decoder
layer; this module holds the shared parts (RMSNorm, RoPE, possibly partial, grouped-query attention
with optional q/k/v / o biases and per-head q/k norms, the SwiGLU MLP, the decoder and its variants).

Parameter names are exactly the Hugging Face ones (``model.layers.0.self_attn.q_proj.weight``...),
so ``state_dict()`` is a Hugging Face checkpoint and weight sync needs no renaming (MoE experts are
stacked as in transformers 5's memory; the hub stores them per expert: :mod:`.moe`).

Attention is pluggable: ``forward(..., ctx=None)`` runs causal attention over the given tokens
(training, scoring; right-padded batches are exact because padding only follows real tokens);
an engine passes its own ``ctx`` whose ``attend(layer, q, k, v)`` reads and writes a KV cache.
The formulas follow the reference implementation in ``transformers/models/llama/modeling_llama.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..utils.triton import triton_available
from . import fused, ulysses
from .args import STATIC_ROPE_TYPES, ModelArgs, rope_parameters, rotary_dim
from .context import context_window
from .families import family_of
from .moe import Routing, SparseMoeBlock
from .sdpa import causal_mask, sdpa

__all__ = [
    "AttentionContext",
    "Variant",
    "ModelArgs",
    "STATIC_ROPE_TYPES",
    "rope_parameters",
    "rope_tables",
    "RMSNorm",
    "apply_rope",
    "Attention",
    "MLP",
    "DecoderLayer",
    "CausalLM",
]


class AttentionContext(Protocol):
    """What an engine passes as ``ctx`` to run attention against its KV cache. A context whose
    ``applies_rope`` attribute is true rotates q and k in ``attend`` itself: layers that would run
    RoPE in place (:attr:`Attention.rotates_in_place`) then pass them unrotated."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [B, T, H, D]; k, v: [B, T, KVH, D] (RoPE applied). Returns [B, T, H, D].

        A layer that is not plain full attention (:meth:`Attention.attention_kind`) calls it with the
        keywords ``window`` (int, 0: full), ``sinks`` ([H] or None) and ``scale`` (float or None), as
        :func:`~reinforge.models.sdpa.sdpa` and :func:`~reinforge.models.sdpa.window_mask` define them; the
        engine's and the packing contexts take them."""
        ...


@dataclass(frozen=True)
class Variant:
    """How a copy of the model computes, chosen once when the copy is built (:meth:`CausalLM.set_variant`).

    The arithmetic is the same in every variant (fp32 results agree to reassociation); what changes
    is the number of kernels. ``fused_kernels``: RMSNorm, RoPE and SiLU-and-multiply as Triton kernels
    with backward passes (:mod:`.fused`; only where Triton runs, i.e. CUDA). The inference-only
    options (the rollout engine's copy; no autograd, not for FSDP-wrapped layers):
    ``fused_residual``, each residual add inside the next RMSNorm (needs ``fused_kernels``);
    ``fused_projections``, q/k/v and gate/up as one matmul each (the parameters become views into
    the fused matrices, so in-place weight copies land in them), RoPE in place on the q and k heads
    and SiLU-and-multiply on the packed gate/up output.
    """

    fused_kernels: bool = False
    fused_residual: bool = False
    fused_projections: bool = False

    @property
    def inference(self) -> bool:
        return self.fused_residual or self.fused_projections

    @classmethod
    def for_inference(cls, fused_kernels: bool = True) -> Variant:
        """The engine's variant: every fusion that applies."""
        return cls(fused_kernels, fused_kernels, True)


def rope_tables(cfg: Any, head_dim: int, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each [max_positions, R] fp32, for positions 0..max_positions-1, where R is
    the rotary dimensions of a head: ``head_dim``, or ``int(head_dim * partial_rotary_factor)``
    (:func:`~reinforge.models.args.rotary_dim`; RoPE then rotates the first R dimensions only).

    Inverse frequencies come from transformers' ``ROPE_INIT_FUNCTIONS`` (so every static RoPE
    variant matches Hugging Face, partial rotation included); the default variant is
    1 / theta^(2i/R) (Su et al. 2021).
    """
    params = rope_parameters(cfg)
    rope_type = params["rope_type"]
    if rope_type == "default":
        theta, dim = params.get("rope_theta", 10000.0), rotary_dim(cfg, head_dim)
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        scale = 1.0
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](cfg, torch.device("cpu"))
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float), inv_freq.float())
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * scale, emb.sin() * scale


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Zhang & Sennrich 2019), computed in fp32 as Llama does.

    ``offset`` 1: the zero-centred form of Qwen3-Next / Qwen3.5 / Gemma, ``x_norm * (1 + weight)`` with the
    product in fp32 before the cast (their transformers code), weight initialised to 0; with the fused kernels
    on and no gradients (the engine) one kernel (:func:`~.fused.rms_norm`'s ``offset``), else eagerly."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.offset = offset
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))
        self.eps = eps
        self.fused = False  # one Triton kernel forward and one backward (set by CausalLM.set_variant)

    def _offset_kernel(self, *tensors: torch.Tensor) -> bool:
        """Whether the zero-centred norm runs as one kernel: fused kernels on, no gradients (the engine)."""
        return self.fused and not (torch.is_grad_enabled() and any(t.requires_grad for t in (self.weight, *tensors)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.offset and self._offset_kernel(x):
            return fused.rms_norm(x, self.weight, self.eps, x.dtype, offset=self.offset)
        if self.offset:
            dtype = x.dtype
            x = x.float()
            return (
                x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (self.offset + self.weight.float())
            ).to(dtype)
        if self.fused:  # under autocast: output in the autocast dtype (the next matmul's input dtype)
            t = x.device.type
            return fused.rms_norm(
                x, self.weight, self.eps, torch.get_autocast_dtype(t) if torch.is_autocast_enabled(t) else None
            )
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual += x`` in place, then the norm of ``residual``, in one kernel (fused kernels on,
        no gradients: the engine's decoder, ``Variant.fused_residual``)."""
        if self.offset and residual.is_contiguous() and residual.shape == x.shape and self._offset_kernel(x):
            return fused.add_rms_norm(x, residual, self.weight, self.eps, residual.dtype, offset=self.offset)
        if self.offset:
            residual += x
            return self.forward(residual)
        t = x.device.type
        return fused.add_rms_norm(
            x, residual, self.weight, self.eps, torch.get_autocast_dtype(t) if torch.is_autocast_enabled(t) else None
        )


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, heads, D]; cos, sin: [B, T, R] in x's dtype, R <= D: the first R dimensions of each
    head are rotated, the rest pass through (partial RoPE, as transformers' GLM / Phi)."""
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    R = cos.shape[-1]
    if R < x.shape[-1]:
        rot, rest = x[..., :R], x[..., R:]
        return torch.cat((rot * cos + _rotate_half(rot) * sin, rest), dim=-1)
    return x * cos + _rotate_half(x) * sin


def apply_rope_qk(q, k, cos, sin):
    """:func:`apply_rope` of the queries and the keys (eager; ``fused.rope_qk`` is the kernel)."""
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = args.num_heads, args.num_kv_heads, args.head_dim
        self.partial_rope = args.rotary_dims < args.head_dim  # the fused RoPE kernels rotate whole heads only
        self.q_proj = nn.Linear(args.hidden_size, args.num_heads * args.head_dim, bias=args.qkv_bias)
        self.k_proj = nn.Linear(args.hidden_size, args.num_kv_heads * args.head_dim, bias=args.qkv_bias)
        self.v_proj = nn.Linear(args.hidden_size, args.num_kv_heads * args.head_dim, bias=args.qkv_bias)
        self.o_proj = nn.Linear(args.num_heads * args.head_dim, args.hidden_size, bias=args.o_bias)
        if args.qk_norm:
            self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps)
            self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.rope_qk = apply_rope_qk  # or fused.rope_qk (CausalLM.set_variant)
        # attention kind (ModelArgs): sliding window (0: full), sink logits per head, the q.k scale (None: 1/sqrt(D))
        self.window = args.window(layer)
        self.sinks = nn.Parameter(torch.zeros(args.num_heads)) if args.attention_sinks else None
        self.scale = args.attn_scale or None
        self.qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None  # fused projection (fuse_projection)
        # context parallelism (trainer): this rank holds 1/cp of the positions; attention exchanges
        # them for 1/cp of the heads over this group (Ulysses, models/ulysses.py). None: off.
        self.cp_group: Any = None

    def fuse_projection(self, on: bool) -> None:
        """Inference: concatenate the q/k/v weights (and biases) into one matrix whose row blocks
        become the three parameters' storage (views), so the projection is one matmul and an in-place
        weight copy into a parameter lands in the fused matrix. ``on=False`` drops the reference to
        the fused matrix (the parameters keep their views). Fusing again is a no-op (engines that
        share the model keep pointing at the same matrices)."""
        if on and self.qkv is not None:
            return
        self.qkv = fuse_rows((self.q_proj, self.k_proj, self.v_proj)) if on else None

    @property
    def rotates_in_place(self) -> bool:
        """Whether RoPE runs as the in-place kernel on the fused q/k/v output (fused projection and
        kernels, whole heads rotated, no per-head norms). An engine's attention context that rotates
        q and the new key inside its own kernel (``applies_rope``) needs this of every layer."""
        return self.qkv is not None and self.rope_qk is fused.rope_qk and self.q_norm is None

    def forward(self, x, cos, sin, ctx: AttentionContext | None):
        if self.qkv is not None or (
            self.rope_qk is fused.rope_qk and plain_linears(self.q_proj, self.k_proj, self.v_proj)
        ):
            q, k, v = self._fused_qkv(x, cos, sin, getattr(ctx, "applies_rope", False))
        else:
            q, k, v = self._separate_qkv(x, cos, sin)
        return self._attend(q, k, v, ctx)

    def _separate_qkv(self, x, cos, sin):
        """Queries, keys and values from three matmuls (training; ``Variant.fused_projections`` off)."""
        B, T, _ = x.shape
        D = self.head_dim  # head counts from the projections: local ones under tensor parallelism
        q = self.q_proj(x).view(B, T, -1, D)
        k = self.k_proj(x).view(B, T, -1, D)
        v = self.v_proj(x).view(B, T, -1, D)
        return self._norm_and_rope(q, k, v, cos, sin)

    def _norm_and_rope(self, q, k, v, cos, sin):
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return *self.rope_qk(q, k, cos, sin), v

    def _fused_qkv(self, x, cos, sin, rotated_by_attention: bool = False):
        """One matmul for q/k/v over the fused matrix (inference, :meth:`fuse_projection`), or in the
        trainer with the fused kernels over the three weights concatenated at each forward (a copy of a
        few MB; under autocast one cast, not three; backward is one matmul for x's gradient where three
        would be summed). Inference with the fused kernels and no per-head norms runs RoPE in place on
        the q and k heads of the output (one kernel), or not at all when the attention context rotates
        them itself (``rotated_by_attention``, asked only where :attr:`rotates_in_place`)."""
        B, T, _ = x.shape
        if self.qkv is not None:  # (fp8 rollout weights replace the projections' own weights)
            (w, b), heads = self.qkv, [self.num_heads, self.num_kv_heads, self.num_kv_heads]
        else:
            projs = (self.q_proj, self.k_proj, self.v_proj)
            w = torch.cat([p.weight for p in projs])
            b = torch.cat([p.bias for p in projs]) if self.q_proj.bias is not None else None
            heads = [p.weight.shape[0] // self.head_dim for p in projs]
        qkv = F.linear(x, w, b).view(B, T, -1, self.head_dim)
        if self.rotates_in_place:
            if not rotated_by_attention:
                fused.rope_(qkv, cos, sin, heads[0] + heads[1])
            return qkv.split(heads, dim=2)
        return self._norm_and_rope(*qkv.split(heads, dim=2), cos, sin)

    def _attend(self, q, k, v, ctx: AttentionContext | None):
        B, T = q.shape[:2]
        if self.cp_group is not None:  # [B, T/cp, H, D] -> all positions, H/cp heads -> back
            o = ulysses.heads_to_positions(
                self._attention(*ulysses.scatter_qkv(q, k, v, self.cp_group), ctx), self.cp_group
            )
        else:
            o = self._attention(q, k, v, ctx)
        return self.o_proj(o.reshape(B, T, -1))

    @property
    def plain(self) -> bool:
        """Full causal attention at scale ``1/sqrt(head_dim)`` without sinks (no :meth:`attention_kind`)."""
        return not self.window and self.sinks is None and self.scale is None

    def attention_kind(self) -> dict[str, Any]:
        """The keywords an attention context's ``attend`` takes for this layer: ``window`` (tokens, 0:
        full), ``sinks`` ([H] logits or None), ``scale`` (None: ``1/sqrt(head_dim)``)."""
        return dict(window=self.window, sinks=self.sinks, scale=self.scale)

    def _attention(self, q, k, v, ctx: AttentionContext | None):
        """q: [B, T, H, D]; k, v: [B, T, KVH, D] -> [B, T, H, D]: causal, or ``ctx``'s. A layer of
        another kind (sliding window, sinks, scale) passes it as keywords (:meth:`attention_kind`);
        contexts that know only full attention are called as before."""
        if self.plain:
            return sdpa(q, k, v) if ctx is None else ctx.attend(self.layer, q, k, v)
        sinks = self.local_sinks(q.shape[2])
        if ctx is None:
            T = q.shape[1]
            mask = causal_mask(T, T, q.device, self.window) if self.window else None
            return sdpa(q, k, v, mask, scale=self.scale, sinks=sinks)
        return ctx.attend(self.layer, q, k, v, **{**self.attention_kind(), "sinks": sinks})

    def local_sinks(self, heads: int) -> torch.Tensor | None:
        """The sink logits of this rank's ``heads`` query heads: all; under tensor parallelism the local block
        of the ``Shard(0)`` parameter (train/mesh.py); under context parallelism (Ulysses: rank ``i`` attends head
        block ``i``) this rank's block, its gradient summed over the ranks as every parameter's. Raises
        ValueError where the local heads are not the sinks' (a split this code does not know)."""
        sinks = self.sinks
        if sinks is None:
            return None
        sinks = sinks.to_local() if hasattr(sinks, "to_local") else sinks  # (a DTensor: tensor parallelism)
        if sinks.shape[0] != heads and self.cp_group is not None:
            sinks = sinks.chunk(dist.get_world_size(self.cp_group))[dist.get_rank(self.cp_group)]
        if sinks.shape[0] != heads:
            raise ValueError(f"attention sinks: {heads} local query heads but {sinks.shape[0]} sink logits")
        return sinks


class MLP(nn.Module):
    def __init__(self, args: ModelArgs, intermediate_size: int | None = None):
        super().__init__()
        inter = intermediate_size or args.intermediate_size
        self.gate_proj = nn.Linear(args.hidden_size, inter, bias=False)
        self.up_proj = nn.Linear(args.hidden_size, inter, bias=False)
        self.down_proj = nn.Linear(inter, args.hidden_size, bias=False)
        self.fused = False  # SiLU-and-multiply as one Triton kernel (CausalLM.set_variant)
        self.gate_up: torch.Tensor | None = None  # fused projection (fuse_projection)

    def fuse_projection(self, on: bool) -> None:
        """Inference: the gate and up weights as row blocks of one matrix (see
        :meth:`Attention.fuse_projection`)."""
        if on and self.gate_up is not None:
            return
        self.gate_up = fuse_rows((self.gate_proj, self.up_proj))[0] if on else None

    def forward(self, x):
        if self.gate_up is not None or (self.fused and plain_linears(self.gate_proj, self.up_proj)):
            # one matmul, SiLU-and-multiply on the packed output: over the fused matrix (inference), or in
            # the trainer over the two weights side by side (a copy of a few MB; under autocast one cast, not
            # two; backward is one matmul for x's gradient where two would be summed)
            w = self.gate_up if self.gate_up is not None else torch.cat([self.gate_proj.weight, self.up_proj.weight])
            gu = F.linear(x, w)
            h = fused.silu_mul_packed(gu) if self.fused else _silu_mul_packed(gu)
        else:
            g, u = self.gate_proj(x), self.up_proj(x)
            h = fused.silu_mul(g, u) if self.fused else F.silu(g) * u
        return self.down_proj(h)


def plain_linears(*layers: nn.Module) -> bool:
    """Whether ``layers`` are ``nn.Linear`` layers of plain (not DTensor) weights: layers whose weights
    may be concatenated for one matmul (not under tensor parallelism, whose sharded weights would be
    gathered, nor LoRA's wrapped layers). FSDP2 hands a layer its gathered weights as plain parameters."""
    plain = (nn.Parameter, torch.Tensor)  # (fp8 rollout weights delete a layer's own weight: not plain)
    return all(type(m) is nn.Linear and type(getattr(m, "weight", None)) in plain for m in layers)


def fuse_rows(layers: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Inference: the weights (and biases) of ``layers`` concatenated into one matrix [sum of outputs, in]
    whose row blocks become the layers' storage (views), so their projections run as one matmul and an
    in-place weight copy into a parameter (weight sync) lands in the fused matrix. Returns (weight, bias or
    None). Call again after the model moves (``.to`` copies each view on its own)."""
    with torch.no_grad():
        w = torch.cat([m.weight for m in layers])
        b = torch.cat([m.bias for m in layers]) if layers[0].bias is not None else None
    row = 0
    for m in layers:
        n = m.weight.shape[0]
        m.weight.data = w[row : row + n]
        if b is not None:
            m.bias.data = b[row : row + n]
        row += n
    return w, b


def _silu_mul_packed(gu: torch.Tensor) -> torch.Tensor:
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``. The family
    (:class:`~reinforge.models.families.base.Family`) builds the attention and the MLP (dense, or
    sparse in ``args.moe_layers``) and names the tensor-parallel plan (:attr:`tp_plan`)."""

    def __init__(self, args: ModelArgs, layer: int, family: Any, hf_config: Any):
        super().__init__()
        # the token mixer: attention (``self_attn``) or, in a hybrid family, linear attention (``linear_attn``)
        self.mixer_name = family.mixer_name(layer, hf_config)
        self.add_module(self.mixer_name, family.attention(args, layer, hf_config))
        self.sparse = layer in args.moe_layers
        self.mlp = (
            family.sparse_mlp(args, layer, hf_config) if self.sparse else family.dense_mlp(args, layer, hf_config)
        )
        # submodule -> "colwise" / "rowwise" (train/mesh.py: apply_tensor_parallel)
        plan = family.tp_plan(self.sparse)
        if self.mixer_name != "self_attn":  # (a linear-attention mixer stays whole on every tensor-parallel rank)
            plan = {name: style for name, style in plan.items() if not name.startswith("self_attn.")}
        self.tp_plan: dict[str, str] = plan
        self.input_layernorm = family.norm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = family.norm(args.hidden_size, args.rms_norm_eps)

    @property
    def mixer(self) -> nn.Module:
        """The token mixer (``self_attn`` or ``linear_attn``)."""
        return getattr(self, self.mixer_name)

    def forward(self, x, cos, sin, ctx=None, routing: Routing | None = None):
        x = x + self.mixer(self.input_layernorm(x), cos, sin, ctx)
        return x + self._mlp(self.post_attention_layernorm(x), routing)

    def _mlp(self, h, routing: Routing | None):
        return self.mlp(h, routing) if self.sparse else self.mlp(h)

    def forward_residual(self, x, residual, cos, sin, ctx=None, routing: Routing | None = None):
        """:meth:`forward` with each residual add fused into the norm that follows it (inference,
        fused kernels). ``x`` is the previous layer's MLP output and ``residual`` the stream before
        it (None at the first layer, whose ``x`` is the embedding); returns the same pair for the
        next layer. The stream is updated in place. Bypasses module hooks: not for FSDP-wrapped layers."""
        if residual is None:
            residual = x
            h = self.input_layernorm(x)
        else:
            h = self.input_layernorm.add_forward(x, residual)
        h = self.post_attention_layernorm.add_forward(self.mixer(h, cos, sin, ctx), residual)
        return self._mlp(h, routing), residual


class Decoder(nn.Module):
    def __init__(self, args: ModelArgs, family: Any, hf_config: Any):
        super().__init__()
        self.embed_tokens = family.embedding(args)
        self.layers = nn.ModuleList(family.decoder_layer(args, i, hf_config) for i in range(args.num_layers))
        self.norm = family.norm(args.hidden_size, args.rms_norm_eps)


class CausalLM(nn.Module):
    """Decoder-only language model with Hugging Face parameter names.

    Build with :func:`reinforge.models.load_model` (from a folder) or directly from a
    ``transformers`` config (random init is the caller's job: see ``init_weights``).
    """

    def __init__(self, hf_config: Any, max_positions: int | None = None):
        super().__init__()
        self.family = family_of(hf_config)  # raises NotImplementedError for an unregistered model_type
        hf_config = self.family.text_config(hf_config)  # (a multimodal checkpoint's language model)
        self.args = self.family.model_args(hf_config)
        self.config = hf_config
        self.model = Decoder(self.args, self.family, hf_config)
        self.lm_head = nn.Linear(self.args.hidden_size, self.args.vocab_size, bias=False)
        if self.args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.gradient_checkpointing = False
        # with gradient_checkpointing: the first N decoder layers are recomputed, the rest keep their
        # activations (Megatron's --recompute-method block --recompute-num-layers N); None: all layers
        self.recompute_num_layers: int | None = None
        self.variant = Variant()  # how this copy computes (set_variant)
        # RoPE table: the context window, RoPE scaling (YaRN, linear) counted (models/context.py)
        self._max_positions = max_positions or context_window(hf_config).tokens
        self.rope_cos: torch.Tensor
        self.rope_sin: torch.Tensor
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        # the sliding-window layers' own RoPE table where the family has one (Gemma 3's local base); empty: none
        self.rope_local_cos: torch.Tensor
        self.rope_local_sin: torch.Tensor
        self.register_buffer("rope_local_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_local_sin", torch.empty(0), persistent=False)

    def compile_layers(self) -> None:
        """``torch.compile`` every decoder layer in place (``nn.Module.compile``: parameter names
        and the state dict are unchanged), with dynamic shapes so that varying micro-batch sizes
        do not recompile. Inductor fuses each layer's elementwise kernels, forward and backward."""
        for layer in self.model.layers:
            layer.compile(dynamic=True)

    def set_variant(self, variant: Variant) -> Variant:
        """Choose how this copy computes (:class:`Variant`), once when the copy is built: the trainer
        with ``model.fused_kernels``, the rollout engine with :meth:`Variant.for_inference`.

        Returns:
            the variant in force: the fused kernels only where Triton runs (CUDA), the fused residual
            adds only with them.
        """
        on = variant.fused_kernels and triton_available(self.model.embed_tokens.weight.device.type)
        variant = Variant(on, variant.fused_residual and on, variant.fused_projections)
        for m in self.modules():
            if isinstance(m, (RMSNorm, MLP, SparseMoeBlock)):
                m.fused = on
            elif isinstance(m, Attention):
                m.rope_qk = fused.rope_qk if on and not m.partial_rope else apply_rope_qk
        self.variant = variant
        self.fuse_projections(variant.fused_projections)
        return variant

    def fuse_projections(self, on: bool = True) -> None:
        """Each layer's q/k/v and gate/up projections as one matmul each (``Variant.fused_projections``),
        their parameters views into the fused matrices (weight sync's in-place copies still land;
        MoE experts are stacked already: only a shared expert fuses).
        Call with ``on=False`` before moving the model (``.to`` copies each view on its own) and again
        with ``on=True`` after."""
        for layer in self.model.layers:
            if hasattr(layer.mixer, "fuse_projection"):
                layer.mixer.fuse_projection(on)
            layer.mlp.fuse_projection(on)

    def init_rope(self, device: torch.device | str | None = None) -> None:
        """(Re)compute the RoPE tables on ``device`` (call after moving off the meta device)."""
        (cos, sin), local = self.family.rope_tables(self.config, self.args.head_dim, self._max_positions)
        device = device if device is not None else self.model.embed_tokens.weight.device
        self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)
        if local is not None:
            self.rope_local_cos, self.rope_local_sin = local[0].to(device), local[1].to(device)

    def layer_ropes(self, position_ids: torch.Tensor, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) [B, T, R] in ``dtype`` at ``position_ids`` [B, T] for each decoder layer: the family's
        table for the sliding-window layers where it has one (:meth:`Family.rope_tables`), else the one table."""
        glob = (self.rope_cos[position_ids].to(dtype), self.rope_sin[position_ids].to(dtype))
        if not self.rope_local_cos.numel():
            return [glob] * self.args.num_layers
        local = (self.rope_local_cos[position_ids].to(dtype), self.rope_local_sin[position_ids].to(dtype))
        return [local if self.args.window(i) else glob for i in range(self.args.num_layers)]

    def init_weights(self, std: float = 0.02, generator: torch.Generator | None = None) -> None:
        """Random initialisation, the family's (``Family.init_weight``; default: normal(0, std)
        matrices, unit norms, zero biases). A parameter held below fp32 gets the same values as an
        fp32 model's, rounded (trainer and engine of one seed agree whatever dtypes each holds)."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dtype == torch.float32:
                    self.family.init_weight(name, p, std, generator)
                else:  # drawn in fp32 and rounded: the values of an fp32 model cast, one tensor's transient
                    full = torch.empty_like(p, dtype=torch.float32)
                    self.family.init_weight(name, full, std, generator)
                    p.copy_(full)

    def forward_hidden(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        ctx: AttentionContext | None = None,
        routing: Routing | None = None,
    ) -> torch.Tensor:
        """input_ids, position_ids: [B, T] int64 -> final hidden states [B, T, hidden] (after norm).
        ``routing``: the MoE layers' replayed / recorded experts and load-balancing statistics
        (:class:`~reinforge.models.moe.Routing`; ignored by a dense model)."""
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        x = self.model.embed_tokens(input_ids)
        if getattr(ctx, "applies_rope", False):  # every layer's RoPE runs inside the context's attention
            ropes = [(None, None)] * len(self.model.layers)
        else:
            ropes = self.layer_ropes(position_ids, x.dtype)
        if self.variant.fused_residual:
            residual = None
            for layer, (cos, sin) in zip(self.model.layers, ropes):
                x, residual = layer.forward_residual(x, residual, cos, sin, ctx, routing)
            return self.model.norm(x) if residual is None else self.model.norm.add_forward(x, residual)
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        n_recompute = len(self.model.layers) if self.recompute_num_layers is None else self.recompute_num_layers
        for i, (layer, (cos, sin)) in enumerate(zip(self.model.layers, ropes)):
            if recompute and i < n_recompute:
                x = checkpoint(layer, x, cos, sin, ctx, routing, use_reentrant=False)
            else:
                x = layer(x, cos, sin, ctx, routing)
        return self.model.norm(x)

    def forward(
        self,
        input_ids,
        position_ids=None,
        ctx=None,
        logits_mask: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
        routing: Routing | None = None,
    ) -> torch.Tensor:
        """Logits [B, T, vocab] in the parameters' dtype; with ``logits_mask`` ([B, T] bool, or
        (rows [N], columns [N]) index tensors, which may repeat a position) only the selected
        positions, [N, vocab] (saves the LM head's work on prompt tokens; goes through ``forward``
        so FSDP's root hooks run). ``routing``: as :meth:`forward_hidden`."""
        hidden = self.forward_hidden(input_ids, position_ids, ctx, routing)
        if logits_mask is not None:
            hidden = hidden[logits_mask]
        return self.lm_head(hidden)
