"""Model families: the architectures reinforge's own model code runs (trainer and embedded engine).

One family = one file in this package, holding a :class:`~reinforge.models.families.base.Family`
(``FAMILY``): its config mapping (Hugging Face config -> :class:`~reinforge.models.args.ModelArgs`),
the modules its decoder layers are built from, its tensor-parallel plan, its expert layout, its KV
shape and its Hugging Face parameter-name mapping. Registering it is one line below (the key is
``config.json``'s ``model_type``; the target is imported only when a model of the family is
built). Everything that asks "does reinforge run this model itself?" reads this registry: the
model loader, the trainer's parallel layouts, the up-front checks, the error messages that name the
supported families. docs/design.md ("Model families") walks through adding one.

This module is torch-free: the up-front checks read the names and properties without importing
any family.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...utils.registry import Registry

if TYPE_CHECKING:
    from .base import Family

FAMILIES: Registry[Family] = Registry("model family", "config.json model_type")
# properties: moe (a mixture-of-experts family: expert parallelism, routing replay, the aux loss
# apply), title (the models it covers, for messages and docs)
FAMILIES.register("llama", "reinforge.models.families.llama:FAMILY", moe=False, title="Llama 2/3, SmolLM/SmolLM2")
FAMILIES.register("qwen2", "reinforge.models.families.qwen2:FAMILY", moe=False, title="Qwen2 / Qwen2.5")
FAMILIES.register("qwen3", "reinforge.models.families.qwen3:FAMILY", moe=False, title="Qwen3 (dense)")
FAMILIES.register(
    "qwen3_moe",
    "reinforge.models.families.qwen3_moe:FAMILY",
    moe=True,
    title="Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B)",
)
FAMILIES.register(
    "qwen2_moe", "reinforge.models.families.qwen2_moe:FAMILY", moe=True, title="Qwen1.5-MoE / Qwen2-57B-A14B"
)
FAMILIES.register(
    "glm4_moe", "reinforge.models.families.glm4_moe:FAMILY", moe=True, title="GLM-4.5 / GLM-4.5-Air / GLM-4.6 (MoE)"
)

FAMILIES.register(
    "qwen3_next",
    "reinforge.models.families.qwen3_next:FAMILY",
    moe=True,
    title="Qwen3-Next (hybrid Gated DeltaNet / gated attention, MoE)",
)

FAMILIES.register(
    "qwen3_5_text",
    "reinforge.models.families.qwen3_next:QWEN3_5_TEXT",
    moe=False,
    title="Qwen3.5 (dense language model)",
)
FAMILIES.register(
    "qwen3_5_moe_text",
    "reinforge.models.families.qwen3_next:QWEN3_5_MOE_TEXT",
    moe=True,
    title="Qwen3.5-MoE (language model)",
)

FAMILIES.register(
    "qwen3_5",
    "reinforge.models.families.qwen3_next:QWEN3_5",
    moe=False,
    title="Qwen3.5 (multimodal checkpoint, its language model)",
)
FAMILIES.register(
    "qwen3_5_moe",
    "reinforge.models.families.qwen3_next:QWEN3_5_MOE",
    moe=True,
    title="Qwen3.5-MoE (multimodal checkpoint, its language model)",
)
FAMILIES.register(
    "gemma3_text",
    "reinforge.models.families.gemma3:FAMILY",
    moe=False,
    title="Gemma 3 (language model; local sliding-window / global layers)",
)
FAMILIES.register(
    "gemma3",
    "reinforge.models.families.gemma3:GEMMA3",
    moe=False,
    title="Gemma 3 (multimodal checkpoint, its language model)",
)

FAMILIES.register(
    "deepseek_v3",
    "reinforge.models.families.deepseek_v3:FAMILY",
    moe=True,
    title="DeepSeek-V3/R1 / Kimi-K2 / Moonlight (multi-head latent attention, MoE)",
)

FAMILIES.register(
    "gpt_oss",
    "reinforge.models.families.gpt_oss:FAMILY",
    moe=True,
    title="GPT-OSS (gpt-oss-20b, gpt-oss-120b: sinks, sliding-window layers, MXFP4 experts)",
)


def model_type_of(config: Any) -> str | None:
    """``model_type`` of a ``config.json`` dict or a ``transformers`` config (a multimodal
    config's ``text_config`` is not looked into: those models are not native)."""
    if isinstance(config, Mapping):
        return config.get("model_type")
    return getattr(config, "model_type", None)


def is_native_type(model_type: str | None) -> bool:
    """Whether ``model_type`` is a registered family (reinforge runs it with its own model code)."""
    return model_type is not None and model_type in FAMILIES


def is_moe_type(model_type: str | None) -> bool:
    """Whether ``model_type`` is a registered mixture-of-experts family."""
    return is_native_type(model_type) and bool(FAMILIES.info(model_type).get("moe"))


def family_of(config: Any) -> Family:
    """The family of a ``config.json`` dict or a ``transformers`` config.

    Raises:
        NotImplementedError: ``model_type`` is not registered; the message lists the registered
            families (``build_model`` falls back to transformers' model on it).
    """
    model_type = model_type_of(config)
    if not is_native_type(model_type):
        raise NotImplementedError(
            f"model_type {model_type!r} is not a registered model family (registered: {', '.join(FAMILIES.names())})"
        )
    return FAMILIES.get(model_type)


def native_models() -> str:
    """The phrase messages use for "a model reinforge runs itself": ``"a model of a registered
    family (llama, qwen2, ...; reinforge's own model code)"``."""
    return f"a model of a registered family ({', '.join(FAMILIES.names())}; reinforge's own model code)"


def moe_models() -> str:
    """The phrase for "a mixture-of-experts model reinforge runs itself": ``"a mixture-of-experts
    model (qwen3_moe / qwen2_moe / ...)"``."""
    return f"a mixture-of-experts model ({' / '.join(n for n in FAMILIES.names() if is_moe_type(n))})"


def describe() -> list[tuple[str, str, bool]]:
    """(model_type, title, moe) of every registered family, in registration order."""
    return [(n, FAMILIES.info(n).get("title", ""), bool(FAMILIES.info(n).get("moe"))) for n in FAMILIES.names()]
