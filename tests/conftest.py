"""Shared fixtures: the real SmolLM2 folder and tiny random models that use its tokenizer."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs 2 workers on 2 cores: one thread each, not 2 x 2
    torch.set_num_threads(1)
# Ray's workers at the tests' priority, also in the Ray instances tests start themselves (ray.init in a test);
# at Ray's default niceness 15 they wait behind every other process of the machine
# (reinforge/cluster/ray_cluster.py starts its own Ray with worker_niceness 0 likewise)
os.environ.setdefault("RAY_worker_niceness", "0")

from reinforge.check_model import TOKENIZER_FILES  # noqa: E402,F401 (the files a tiny model copies; tests import it here)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by its folder: ``unit`` (tests/unit/: in one process) or ``integration``
    (tests/integration/: a whole training loop, Ray, spawned ranks or subprocesses); ``-m unit`` selects."""
    here = Path(__file__).resolve().parent
    for item in items:
        parts = Path(item.path).resolve().relative_to(here).parts
        if parts[0] in ("unit", "integration"):
            item.add_marker(parts[0])


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from reinforge.models.hub import resolve_model_path

    return resolve_model_path("smollm2-135m-instruct")


def make_tiny_model(out: Path, tokenizer_src: Path, model_type: str = "llama", seed: int = 0, **overrides) -> Path:
    """A randomly initialised 2-layer model of ``model_type`` with SmolLM2's tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = dict(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    if model_type in ("qwen2", "qwen3"):
        kwargs["head_dim"] = 16
    kwargs.update(overrides)
    cfg = AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # larger weights than the default init, so outputs (and MoE routing) vary with the input
        for name, p in model.named_parameters():
            if p.dim() >= 2:  # (3-D: an MoE model's stacked experts)
                p.normal_(0, 0.2)
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
    model.save_pretrained(out)
    for f in TOKENIZER_FILES:
        if (tokenizer_src / f).exists():
            shutil.copy2(tokenizer_src / f, out / f)
    return out


@pytest.fixture(scope="session")
def smollm2_tokenizer_path() -> Path:
    """SmolLM2's tokenizer files: the converted model's folder, or (a GPU machine without the model
    package) the tokenizer files carried in ``.device/cache/models/smollm2-135m-instruct``."""
    from reinforge.models.hub import resolve_model_path

    try:
        return resolve_model_path("smollm2-135m-instruct")
    except FileNotFoundError:
        carried = Path(__file__).resolve().parents[1] / ".device" / "cache" / "models" / "smollm2-135m-instruct"
        if not (carried / "tokenizer.json").exists():
            raise
        return carried


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory, smollm2_tokenizer_path) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"), smollm2_tokenizer_path)
