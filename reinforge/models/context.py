"""The context window of a model: how many positions its config says it can hold.

A config's ``max_position_embeddings`` is the window the model was trained for. RoPE scaling
extends it where the scaled positions count as positions of the original window:

* ``yarn`` (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language
  Models"), ``linear`` (position interpolation, Chen et al. 2023) and ``dynamic`` (NTK-aware):
  ``factor x original_max_position_embeddings`` (``original_max_position_embeddings`` from the
  RoPE settings or the config's top level; ``max_position_embeddings`` when neither has it). Qwen's
  recipe keeps ``max_position_embeddings`` at the original 32768 and adds ``{type: yarn, factor:
  4, original_max_position_embeddings: 32768}``: 131072 positions. DeepSeek-V3 writes the
  extended window into ``max_position_embeddings`` itself; the larger of the two is taken.
* ``llama3`` and ``longrope`` configs already give the extended window in
  ``max_position_embeddings`` (their factor describes the frequencies, not the window).

vLLM derives its default ``max_model_len`` the same way (``_get_and_verify_max_len``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
WINDOW_EXTENDING_ROPE = ("yarn", "linear", "dynamic")


@dataclass(frozen=True)
class ContextWindow:
    """Positions a model holds (prompt + response tokens) and where the number comes from.

    Attributes:
        tokens: the window, in tokens.
        source: how it was read, for messages (``"max_position_embeddings=8192"``, or the RoPE
            scaling product).
    """

    tokens: int
    source: str


def _getter(config: Any):
    if isinstance(config, Mapping):
        config = config.get("text_config") or config  # multimodal configs nest the language model's
        return lambda key: config.get(key)
    text = getattr(config, "text_config", None)
    config = text if text is not None and not isinstance(text, (str, bytes)) else config
    return lambda key: getattr(config, key, None)


def context_window(config: Any) -> ContextWindow | None:
    """The context window of a Hugging Face config (a ``config.json`` dict or a
    ``transformers.PretrainedConfig``); None when the config names no position limit.

    RoPE settings are read from ``rope_parameters`` (transformers 5) or ``rope_scaling``, with
    the type under ``rope_type`` or ``type`` (see the module doc for the rule per type).
    """
    get = _getter(config)
    key = next((k for k in POSITION_KEYS if isinstance(get(k), int) and get(k) > 0), None)
    if key is None:
        return None
    base = int(get(key))
    rope = get("rope_parameters") or get("rope_scaling") or {}
    rope = dict(rope) if isinstance(rope, Mapping) else {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    factor = rope.get("factor")
    if kind in WINDOW_EXTENDING_ROPE and isinstance(factor, (int, float)) and factor > 1:
        original = rope.get("original_max_position_embeddings") or get("original_max_position_embeddings") or base
        scaled = int(factor * int(original))
        if scaled > base:
            return ContextWindow(
                scaled,
                f"{kind} RoPE scaling: factor {factor:g} x original_max_position_embeddings "
                f"{int(original)} = {scaled} ({key}={base})",
            )
    return ContextWindow(base, f"{key}={base}")
