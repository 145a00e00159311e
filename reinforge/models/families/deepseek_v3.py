"""The ``deepseek_v3`` family: DeepSeek-V3 / R1 / V3.1, Kimi-K2, Moonlight-16B-A3B. Formulas:
``transformers/models/deepseek_v3/modeling_deepseek_v3.py`` (fp32 logits agree with
``DeepseekV3ForCausalLM``: ``tests/integration/test_deepseek_v3.py``).

Differences from the Llama defaults (:class:`~reinforge.models.families.base.Family`):

* attention: **multi-head latent attention** (:class:`~reinforge.models.mla.MultiHeadLatentAttention`:
  ``q_lora_rank`` (null: a plain ``q_proj``), ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``,
  ``v_head_dim``, the decoupled RoPE key, ``rope_interleave``, YaRN with DeepSeek's ``mscale_all_dim`` softmax
  scale); the engine caches the compressed latent (``kv_lora_rank + qk_rope_head_dim`` values per token and
  layer) and decodes with the absorbed projections;
* the first ``first_k_dense_replace`` layers keep a dense MLP (``intermediate_size``); a later layer ``i`` is a
  mixture of experts when ``i % moe_layer_freq == 0`` (DeepSeek's reference code; every published
  checkpoint has 1, and transformers reads no ``moe_layer_freq``);
* the MoE block is GLM-4.5's (:class:`~reinforge.models.families.glm4_moe.Glm4MoeBlock`, shared, not
  copied): sigmoid scores, ``e_score_correction_bias``, group-limited top-k (``n_group``, ``topk_group``),
  ``norm_topk_prob``, ``routed_scaling_factor``, ``n_shared_experts`` ungated shared experts; expert
  parallelism and routing replay as every :class:`~reinforge.models.moe.SparseMoeBlock`.

Refused at start (``ValueError`` naming the field): DeepSeek sparse attention's indexer (``index_topk``,
``index_n_heads``, ``index_head_dim``: DeepSeek-V3.2, left for later), a ``scoring_func`` other than
``sigmoid`` or a ``topk_method`` other than ``noaux_tc`` (DeepSeek-V2's softmax routers),
``num_key_value_heads`` other than ``num_attention_heads``. The multi-token-prediction layers of published
checkpoints (``model.layers.{num_hidden_layers}.*``) are not built: loading logs them as ignored.

Parallelism: FSDP, expert parallelism (``train.expert_model_parallel_size``) and routing replay as the other
MoE families; tensor and context parallelism above 1 are refused at start (``train/parallelize.py``: MLA's shared
latent projections would need their own gradient reduction, left for later). :meth:`DeepseekV3.tp_plan` names
a dense layer's MLP only (the attention and a sparse layer's MLP would stay whole).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..args import ModelArgs, check_top_k, dense_args
from ..mla import MultiHeadLatentAttention
from .base import LLAMA_MLP_PLAN, ConfigShape, Family, generic_config_shape
from .glm4_moe import Glm4MoeBlock

# DeepSeek sparse attention (DeepSeek-V3.2's lightning indexer): not implemented
DSA_FIELDS = ("index_topk", "index_n_heads", "index_head_dim")


def check_supported(cfg: Any) -> None:
    """Refuse the fields this family does not implement.

    Raises:
        ValueError: naming config.json's field and what runs instead.
    """
    for name in DSA_FIELDS:
        if getattr(cfg, name, None) is not None:
            raise ValueError(
                f"config.json: {name}={getattr(cfg, name)!r} is DeepSeek sparse attention's indexer (DeepSeek-V3.2 "
                f"DSA), which reinforge's deepseek_v3 family does not implement (left for later); remove the "
                f"index_* fields to run the model as dense multi-head latent attention, or use a DeepSeek-V3 checkpoint"
            )
    for name, allowed in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
        value = getattr(cfg, name, None)
        if value is not None and value != allowed:
            raise ValueError(
                f"config.json: {name}={value!r}: the deepseek_v3 family routes as DeepSeek-V3 does ({name}="
                f"{allowed!r}: sigmoid scores, score-correction bias, group-limited top-k); DeepSeek-V2's routers "
                f"are not implemented"
            )
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None)
    if kv is not None and kv != heads:
        raise ValueError(
            f"config.json: num_key_value_heads={kv} must equal num_attention_heads={heads} in multi-head latent "
            f"attention (every head has its own keys from kv_b_proj)"
        )
    for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        if not isinstance(getattr(cfg, name, None), int) or getattr(cfg, name) < 1:
            raise ValueError(f"config.json: {name}={getattr(cfg, name, None)!r} must be a positive integer")
    if cfg.qk_rope_head_dim % 2:
        raise ValueError(f"config.json: qk_rope_head_dim={cfg.qk_rope_head_dim} must be even (RoPE rotates pairs)")


def moe_layers(cfg: Any) -> tuple[int, ...]:
    """The sparse layers: ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0`` (none without
    ``n_routed_experts``).

    Raises:
        ValueError: ``moe_layer_freq`` < 1.
    """
    experts = int(getattr(cfg, "n_routed_experts", 0) or 0)
    first, freq = int(getattr(cfg, "first_k_dense_replace", 0) or 0), int(getattr(cfg, "moe_layer_freq", 1) or 1)
    if freq < 1:
        raise ValueError(f"config.json: moe_layer_freq={freq} must be >= 1")
    if not experts:
        return ()
    return tuple(i for i in range(cfg.num_hidden_layers) if i >= first and i % freq == 0)


class DeepseekV3(Family):
    model_type = "deepseek_v3"
    fp32_params = (".mlp.gate.weight", ".mlp.gate.e_score_correction_bias")  # (transformers keeps them fp32)
    tp_partial_grads = ()

    def model_args(self, cfg: Any) -> ModelArgs:
        check_supported(cfg)
        rope = int(cfg.qk_rope_head_dim)
        if getattr(cfg, "head_dim", None) not in (None, rope):  # (transformers sets head_dim = qk_rope_head_dim)
            raise ValueError(f"config.json: head_dim={cfg.head_dim} must equal qk_rope_head_dim={rope} (or be absent)")
        # head_dim: the RoPE tables' width (the decoupled key's); one latent "KV head" for the engine's cache
        cfg_rope = _WithHeadDim(cfg, rope)
        args = dense_args(cfg_rope, qkv_bias=False, o_bias=bool(getattr(cfg, "attention_bias", False)), qk_norm=False)
        layers = moe_layers(cfg)
        E, top_k = int(getattr(cfg, "n_routed_experts", 0) or 0), int(getattr(cfg, "num_experts_per_tok", 0) or 0)
        check_top_k(top_k, E, layers)
        moe = int(getattr(cfg, "moe_intermediate_size", 0) or 0)
        return args.with_(
            num_kv_heads=1,
            kv_lora_rank=int(cfg.kv_lora_rank),
            num_experts=E if layers else 0,
            num_experts_per_tok=top_k if layers else 0,
            moe_intermediate_size=moe,
            norm_topk_prob=bool(getattr(cfg, "norm_topk_prob", False)),
            moe_layers=layers,
            shared_expert_intermediate_size=int(getattr(cfg, "n_shared_experts", 0) or 0) * moe,
        )

    def config_shape(self, cfg: dict) -> ConfigShape:
        cfg = cfg.get("text_config", cfg)
        shared = int(cfg.get("n_shared_experts") or 0) * int(cfg.get("moe_intermediate_size") or 0)
        base = generic_config_shape(cfg, ("n_routed_experts",), shared)
        return ConfigShape(
            base.num_layers,
            1,
            int(cfg["qk_rope_head_dim"]),
            base.num_experts,
            base.mlp_width,
            kv_lora_rank=int(cfg["kv_lora_rank"]),
        )

    def attention(self, args: ModelArgs, layer: int, cfg: Any) -> nn.Module:
        return MultiHeadLatentAttention(args, layer, cfg)

    def sparse_mlp(self, args: ModelArgs, layer: int, cfg: Any) -> Glm4MoeBlock:
        return Glm4MoeBlock(args, layer, cfg)

    def tp_plan(self, sparse: bool) -> dict[str, str]:
        return {} if sparse else dict(LLAMA_MLP_PLAN)


class _WithHeadDim:
    """``cfg`` read with ``head_dim`` replaced (the shared config readers size RoPE by it)."""

    def __init__(self, cfg: Any, head_dim: int):
        self._cfg, self.head_dim = cfg, head_dim

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cfg, name)


FAMILY = DeepseekV3()
