"""The shape of a Hugging Face model folder, read without loading it: parameter count (from the
safetensors headers) and the KV-cache dimensions (from config.json). Used by the resource checks
(``cluster/resources.py``) and the up-front checks (``preflight.py``)."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ModelShape:
    """What the estimate needs from a Hugging Face folder."""

    num_params: int
    vocab_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int


def model_shape(folder: Path) -> ModelShape:
    """Parameter count (from the safetensors headers, without reading tensors) and KV-cache
    dimensions (from config.json) of a Hugging Face folder.

    Raises:
        FileNotFoundError: no config.json in ``folder``.
    """
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    layers, vocab = int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
    params = 0
    for f in folder.glob("*.safetensors"):
        with f.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        params += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    if not params:  # no weights on disk yet (random_init): count from the config
        params = layers * (4 * hidden * hidden + 3 * hidden * _mlp_width(cfg, hidden)) + vocab * hidden * (
            1 if cfg.get("tie_word_embeddings", True) else 2)
    return ModelShape(params, vocab, layers, int(cfg.get("num_key_value_heads", heads)),
                      int(cfg.get("head_dim") or hidden // heads))


def _mlp_width(cfg: dict, hidden: int) -> int:
    """The summed width of a layer's MLP matrices: a dense model's ``intermediate_size``; a
    mixture-of-experts model's experts (``num_experts`` x ``moe_intermediate_size``, every layer
    counted sparse) plus a shared expert's width."""
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    if experts:
        return experts * int(cfg["moe_intermediate_size"]) + int(cfg.get("shared_expert_intermediate_size") or 0)
    return int(cfg.get("intermediate_size", 4 * hidden))
