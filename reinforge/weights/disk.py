"""Transport by disk: the weights are written as a temporary Hugging Face folder that the engine
reloads (SGLang's ``/update_weights_from_disk``); slow, but needs nothing shared."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch


@contextlib.contextmanager
def weights_folder(named: list[tuple[str, torch.Tensor]], model_source: str | Path) -> Iterator[Path]:
    """A temporary Hugging Face folder (config and tokenizer from ``model_source``) holding
    ``named``; removed when the block ends."""
    from ..models.loading import save_hf_state_dict

    with tempfile.TemporaryDirectory(prefix="reinforge-weights-") as d:
        save_hf_state_dict(dict(named), d, model_source)
        yield Path(d)
