"""The shape of a Hugging Face model folder, read without loading it: parameter count (from the
safetensors headers) and the KV-cache dimensions (from config.json, through the model's family:
:mod:`reinforge.models.families`). Used by the resource checks (``cluster/resources.py``) and the
up-front checks (``preflight.py``)."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, fields
from pathlib import Path

from .families.base import ConfigShape


class ShapeUnknown(ValueError):
    """A ``config.json`` without a key the size estimates read (a family reinforge does not know, with
    its own names for the sizes): the estimate is unavailable. Up-front checks skip the estimate and
    say so in one line; they never stop on it."""


# the common size keys under the other names some families' config.json use (transformers' ``attribute_map``
# of GPT-2, GPT-J, BLOOM, OPT, Falcon, MPT, T5-style configs): common key -> its aliases, first found wins
SIZE_ALIASES = {
    "hidden_size": ("n_embd", "n_embed", "d_model"),
    "num_hidden_layers": ("n_layer", "n_layers", "num_layers"),
    "num_attention_heads": ("n_head", "n_heads", "num_heads"),
    "intermediate_size": ("n_inner", "ffn_dim", "ffn_hidden_size"),
}


def with_common_names(cfg: dict) -> dict:
    """``cfg`` with the common size keys (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
    ``intermediate_size``) filled in from their aliases (:data:`SIZE_ALIASES`: GPT-2's ``n_embd``...)
    where only those are set; a new dict when anything was added, else ``cfg`` itself."""
    extra = {}
    for key, aliases in SIZE_ALIASES.items():
        if cfg.get(key) is None:
            found = next(
                (cfg[a] for a in aliases if isinstance(cfg.get(a), int) and not isinstance(cfg[a], bool)), None
            )
            if found is not None:
                extra[key] = found
    return {**cfg, **extra} if extra else cfg


def require(cfg: dict, read, where: str = "config.json"):
    """``read(cfg)`` (the size keys' aliases filled in: :func:`with_common_names`), a :class:`ShapeUnknown`
    naming the missing key instead of a bare ``KeyError``."""
    try:
        return read(with_common_names(cfg))
    except KeyError as e:
        raise ShapeUnknown(
            f"{where} (model_type {cfg.get('model_type')!r}) has no {e.args[0]!r}, which the size estimate reads"
        ) from None


@dataclass(frozen=True)
class ModelShape(ConfigShape):
    """A model folder's :class:`~reinforge.models.families.base.ConfigShape` (its family's reading of
    config.json: the KV-cache shape, experts, MLP width, linear-attention states, sliding windows) and what
    the folder adds: ``num_params`` (from the safetensors headers) and ``vocab_size``."""

    num_params: int = 0
    vocab_size: int = 0


def model_shape(folder: Path) -> ModelShape:
    """Parameter count (from the safetensors headers, without reading tensors) and KV-cache
    dimensions (from config.json, read by the model's family when it is registered:
    :func:`config_shape`) of a Hugging Face folder.

    Raises:
        FileNotFoundError: no config.json in ``folder``.
        ShapeUnknown: config.json lacks a size key (named in the message).
    """
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    where = str(folder / "config.json")
    shape = require(cfg, config_shape, where)
    hidden, vocab = require(cfg, lambda c: (int(c["hidden_size"]), int(c["vocab_size"])), where)
    params = 0
    for f in folder.glob("*.safetensors"):
        with f.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        params += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    if not params:  # no weights on disk yet (random_init): count from the config
        params = shape.num_layers * (4 * hidden * hidden + 3 * hidden * shape.mlp_width) + vocab * hidden * (
            1 if cfg.get("tie_word_embeddings", True) else 2
        )
    return ModelShape(
        **{f.name: getattr(shape, f.name) for f in fields(ConfigShape)}, num_params=params, vocab_size=vocab
    )


def config_shape(cfg: dict) -> ConfigShape:
    """The KV-cache shape, routed experts and MLP width of a ``config.json`` dict
    (:class:`~reinforge.models.families.base.ConfigShape`): the registered family's reading
    (``Family.config_shape``), else the common keys."""
    from .families import family_of, is_native_type
    from .families.base import generic_config_shape

    cfg = cfg.get("text_config", cfg)
    if is_native_type(cfg.get("model_type")):
        return family_of(cfg).config_shape(cfg)
    return generic_config_shape(cfg)


def num_experts(cfg: dict) -> int:
    """The routed experts per sparse layer of a ``config.json`` dict of a registered
    mixture-of-experts family (0: dense, or not a model reinforge runs itself)."""
    from .families import is_moe_type

    cfg = cfg.get("text_config", cfg)
    return config_shape(cfg).num_experts if is_moe_type(cfg.get("model_type")) else 0
