"""The ``embedded`` backend: reinforge's own engine (:mod:`reinforge.engine`) on its own copy of the model."""

from __future__ import annotations

import logging
from typing import Any

from ...engine import EmbeddedEngine
from ...models.families import native_models
from ...models.loading import build_model, is_native

log = logging.getLogger(__name__)


def from_spec(spec) -> Any:
    """The ``embedded`` backend's factory (:mod:`reinforge.rollout.backends`): the engine on its own
    copy of the model; a model the engine does not implement (not of a registered family,
    :mod:`reinforge.models.families`) falls back to transformers' ``generate`` with a warning."""
    model = build_model(spec.model_path, spec.dtype, spec.device, random_init=spec.random_init, seed=spec.init_seed)
    if not is_native(model):
        from .hf import HFEngine

        if spec.record_routes:
            raise ValueError(
                f"algo.use_rollout_routing_replay=true: {spec.model_path} is not a model the embedded "
                f"engine implements, and the transformers fallback (engine.backend=hf) cannot record "
                f"expert routes; set algo.use_rollout_routing_replay=false"
            )
        if spec.engine.quantization:
            raise ValueError(
                f"engine.quantization={spec.engine.quantization}: {spec.model_path} is not a model the embedded "
                f"engine implements ({native_models()}), and the transformers fallback keeps its weights as "
                f"they are; use engine.backend=vllm or set engine.quantization=null"
            )

        log.warning(
            "engine.backend=embedded needs %s; falling back to transformers' generate (engine.backend=hf)",
            native_models(),
        )
        return HFEngine(
            model, pad_token_id=spec.tokenizer.pad_token_id, batch_size=spec.engine.max_num_seqs, seed=spec.seed
        )
    return EmbeddedEngine(
        model,
        spec.engine,
        max_model_len=spec.max_model_len,
        seed=spec.seed,
        tokenizer=spec.tokenizer,
        record_routes=spec.record_routes,
        discard_weights=True,  # a policy engine: the weight sync after training rewrites every parameter
    )
