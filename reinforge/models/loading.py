"""Load and save policy models and tokenizers in Hugging Face format."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .families import family_of, is_native_type, native_models
from .moe import hub_named_tensors
from .mxfp4 import is_mxfp4
from .transformer import CausalLM

log = logging.getLogger(__name__)

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """'bf16' / 'bfloat16' / 'fp32' / ... -> torch dtype. Raises ValueError naming the choices."""
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(DTYPES)}") from None


def load_hf_config(path: str | os.PathLike) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path))


def load_tokenizer(path: str | os.PathLike) -> Any:
    """The folder's tokenizer with a pad token set (pad = eos when the tokenizer has none)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def is_native(model: nn.Module) -> bool:
    """Whether ``model`` is reinforge's own model code (a :class:`CausalLM` of a registered family,
    :mod:`reinforge.models.families`), not a transformers model."""
    return isinstance(model, CausalLM)


def set_gradient_checkpointing(model: nn.Module, enabled: bool, recompute_num_layers: int | None = None) -> None:
    """Activation recomputation for a trained model (``model.gradient_checkpointing`` and
    ``model.recompute_num_layers``; the one place they are applied). reinforge's own model
    recomputes every decoder layer, or only the first ``recompute_num_layers`` (Megatron-LM's
    ``--recompute-method block --recompute-num-layers``: the rest keep their activations, less
    compute for more memory); other models use transformers' ``gradient_checkpointing_enable``.

    ``recompute_num_layers=0`` recomputes nothing, with or without ``enabled`` (the planner's
    ``auto`` may choose it: docs/planner.md).

    Raises:
        ValueError: ``recompute_num_layers`` (other than 0) without ``enabled``, or for a model that is
            not reinforge's own (a registered family).
    """
    if recompute_num_layers == 0:
        enabled, recompute_num_layers = False, None
    if recompute_num_layers is not None and not enabled:
        raise ValueError(f"model.recompute_num_layers={recompute_num_layers} needs model.gradient_checkpointing=true")
    if is_native(model):
        model.gradient_checkpointing = enabled
        model.recompute_num_layers = recompute_num_layers
    elif recompute_num_layers is not None:
        raise ValueError(f"model.recompute_num_layers={recompute_num_layers} needs {native_models()}; set it to null")
    elif enabled:
        model.gradient_checkpointing_enable()


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files, under their stored (Hugging Face) names."""
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = [p.name for p in sorted(path.glob("*.safetensors"))]
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors weights found")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(path / f)))
    return state


def read_native_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The weights of Hugging Face folder ``path`` (a registered family's) under reinforge's own
    parameter names (the family's ``from_hub``: MoE experts stacked), on the CPU as stored."""
    path = Path(path)
    return family_of(json.loads((path / "config.json").read_text())).from_hub(_read_safetensors(path), str(path))


def build_model(
    path: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    random_init: bool = False,
    max_positions: int | None = None,
    seed: int = 0,
    head_optional: bool = False,
    matmul_dtype: torch.dtype | None = None,
) -> nn.Module:
    """The causal LM stored in Hugging Face folder ``path``.

    A registered family (:mod:`reinforge.models.families`: Llama, Qwen2/3, their MoE variants,
    GLM-4.5's MoE, ...) loads into reinforge's :class:`CausalLM` (shared by trainer and engine; the
    checkpoint's tensors through the family's ``from_hub``: MoE experts from the hub's per-expert
    tensors or already stacked); any other architecture loads as
    ``transformers.AutoModelForCausalLM`` with a warning naming the registered families.
    ``random_init`` ignores the stored weights (benchmarks, tests). ``head_optional``
    accepts a folder without ``lm_head.weight`` (a reward model's backbone; the head is zeros)
    and ignores its ``score.weight``. ``matmul_dtype``: the weights that only enter matmuls
    (:func:`~reinforge.models.lora.matmul_weights`) are made in that dtype, the rest in ``dtype``
    (LoRA's frozen base under bf16 autocast, without a transient copy in ``dtype``; native models only).

    Raises:
        FileNotFoundError: no config.json or no safetensors weights in ``path``.
        KeyError: the weights lack a parameter the architecture needs.
    """
    path = Path(path)
    cfg = load_hf_config(path)
    try:
        with torch.device("meta"):
            model = CausalLM(cfg, max_positions=max_positions)
    except NotImplementedError as e:
        log.warning(
            "%s: %s is not implemented natively (%s); using transformers' model (slower rollout)",
            path,
            getattr(cfg, "model_type", "?"),
            e,
        )
        return _build_hf_model(path, cfg, dtype, device, random_init, seed)
    model = model.to(dtype)  # (on the meta device: no memory; to_empty then allocates each tensor once, in dtype)
    if matmul_dtype is not None and matmul_dtype != dtype:
        from .lora import matmul_weights

        for _, module, attr in list(matmul_weights(model)):
            setattr(module, attr, nn.Parameter(getattr(module, attr).to(matmul_dtype)))
    if dtype != torch.float32:  # the family's fp32 parameters (a router) stay fp32
        for name, p in list(model.named_parameters()):
            if name.endswith(model.family.fp32_params):
                module, _, attr = name.rpartition(".")
                setattr(model.get_submodule(module), attr, nn.Parameter(p.float(), requires_grad=p.requires_grad))
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    if random_init:
        model = model.to_empty(device=device)
        if model.args.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        model.init_weights(generator=torch.Generator(device=device).manual_seed(seed))
    else:
        state = model.family.from_hub(_read_safetensors(path), str(path))
        expected = set(model.state_dict())
        if model.args.tie_word_embeddings:
            state.pop("lm_head.weight", None)
            expected.discard("lm_head.weight")
        if head_optional:
            state.pop("score.weight", None)
            if "lm_head.weight" in expected and "lm_head.weight" not in state:
                state["lm_head.weight"] = torch.zeros(model.args.vocab_size, model.args.hidden_size)
        missing = sorted(expected - set(state))
        if missing:
            raise KeyError(f"{path}: weights lack {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        unexpected = sorted(set(state) - expected)
        if unexpected:
            log.warning("%s: ignoring %d unexpected tensors (e.g. %s)", path, len(unexpected), unexpected[0])
        state = {k: v.to(device=device, dtype=dtypes.get(k, dtype)) for k, v in state.items() if k in expected}
        model.load_state_dict(state, strict=False, assign=True)
        if model.args.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
    model.init_rope(device)
    return model


def _build_hf_model(path, cfg, dtype, device, random_init, seed):
    from transformers import AutoModelForCausalLM

    if random_init:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.to(device)


def model_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [B, T, V] for right-padded ``input_ids`` [B, T], native or transformers model."""
    if is_native(model):
        return model(input_ids)
    return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def named_weights(model: nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) for every stored weight; a tied lm_head is not repeated."""
    seen: set[int] = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        yield name, p.detach()


def hub_layout(source: str | os.PathLike | None) -> Callable[[Iterable[tuple[str, torch.Tensor]]], Iterable]:
    """The function that turns a model's (name, tensor) pairs into the layout of the hub checkpoints of the
    model in folder ``source``, for an engine that loads weights as checkpoints name them (the weight sync to
    vLLM / SGLang): a registered family's ``to_hub`` (without copying the checkpoint's untrained tensors: a
    GPT-OSS's stacked experts stay whole, a multimodal checkpoint's language model takes its prefix), else
    (``source`` None, no config.json, no family) :func:`~reinforge.models.moe.hub_named_tensors`, the experts
    split per expert."""
    cfg_file = Path(source) / "config.json" if source is not None else None
    if cfg_file is None or not cfg_file.exists():
        return hub_named_tensors
    cfg = json.loads(cfg_file.read_text())
    if not is_native_type(cfg.get("model_type")):
        return hub_named_tensors
    family = family_of(cfg)
    return lambda named: family.to_hub(named)


def save_hf_folder(
    model: nn.Module, out: str | os.PathLike, source: str | os.PathLike, dtype: torch.dtype | None = None
) -> Path:
    """Write ``model``'s weights as a Hugging Face folder (see :func:`save_hf_state_dict`)."""
    return save_hf_state_dict(dict(named_weights(model)), out, source, dtype)


def save_hf_state_dict(
    state: dict[str, torch.Tensor], out: str | os.PathLike, source: str | os.PathLike, dtype: torch.dtype | None = None
) -> Path:
    """Write (Hugging Face name -> tensor) weights as a folder loadable by ``from_pretrained``.

    Names go through the family's ``to_hub`` (``source``'s ``model_type``; default: stacked
    mixture-of-experts parameters written in the hub's per-expert layout,
    :func:`~reinforge.models.moe.hub_named_tensors`), as published checkpoints are.

    Config, tokenizer, chat template and generation config are copied from ``source`` (the
    folder the model was loaded from); weights are written with ``huggingface_hub``'s
    ``save_torch_state_dict`` (sharded above 5 GB, tied tensors stored once), cast to
    ``dtype`` when given. ``config.json``'s ``dtype`` states the dtype the weights were saved in
    (``source``'s says what it was published in: a bf16 model trained and saved in fp32 is
    written ``"dtype": "float32"``). ``out`` should be a fresh directory (callers write to a
    temporary one and rename).
    """
    from huggingface_hub import save_torch_state_dict

    out, source = Path(out), Path(source)
    out.mkdir(parents=True, exist_ok=True)
    source_cfg = json.loads((source / "config.json").read_text())
    tied = source_cfg.get("tie_word_embeddings")
    to_hub = family_of(source_cfg).to_hub if is_native_type(source_cfg.get("model_type")) else hub_named_tensors
    if tied and "model.embed_tokens.weight" in state:
        state = {n: t for n, t in state.items() if n != "lm_head.weight"}  # stored once, as the embedding
    state = {
        n: _own_storage((t.to(dtype) if dtype is not None else t).detach().contiguous().cpu())
        for n, t in (to_hub(state.items(), str(source)) if to_hub is not hub_named_tensors else to_hub(state.items()))
    }
    import huggingface_hub.serialization._torch as hf_torch  # its logger is named by its file's path

    # its "Model weights successfully saved to <out>!" names the hidden folder of a save in progress
    logging.getLogger(hf_torch.__file__).setLevel(logging.WARNING)
    save_torch_state_dict(state, str(out), max_shard_size="5GB")
    for f in source.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy2(f, out / f.name)
    saved = {t.dtype for t in state.values() if t.is_floating_point()}
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if len(saved) == 1:  # the dtype the weights are stored in (mixed: left as the source says)
        cfg["dtype"] = str(saved.pop()).removeprefix("torch.")
        cfg.pop("torch_dtype", None)
    if is_mxfp4(cfg) and not any(n.endswith("_blocks") for n in state):
        cfg.pop("quantization_config")  # (MXFP4 experts were dequantized at load: written as plain weights)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def _own_storage(t: torch.Tensor) -> torch.Tensor:
    """``t``, copied when it is a view into a larger buffer (gathered FSDP tensors can be), which
    safetensors refuses to save."""
    return t.clone() if t.untyped_storage().nbytes() > t.numel() * t.element_size() else t


@torch.no_grad()
def copy_weights_(model: nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy (Hugging Face name, tensor) pairs into ``model``'s parameters in place (casting
    dtype and device), so anything holding the parameters' storage (CUDA graphs) sees them.

    A tied ``lm_head.weight`` is skipped (it is the embedding). Returns the number copied.

    Raises:
        KeyError: a name the model does not have.
    """
    params = dict(model.named_parameters())
    copied = 0
    for name, tensor in named_tensors:
        if name not in params:
            if name == "lm_head.weight" and "model.embed_tokens.weight" in params:
                continue
            raise KeyError(f"weight sync: the engine's model has no parameter {name!r}")
        params[name].copy_(tensor)
        copied += 1
    return copied


def free_weight_storage(model: nn.Module) -> list[tuple[torch.UntypedStorage, int]]:
    """Free the memory of ``model``'s parameters without a copy anywhere (each storage resized to 0
    bytes; views such as fused projections share theirs): an engine whose next weight sync rewrites
    every parameter (vLLM's sleep level 2). Returns what :func:`restore_weight_storage` needs."""
    freed, seen = [], set()
    for p in model.parameters():
        storage = p.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0 or not storage.resizable():
            continue  # (not resizable: mapped from a safetensors file, no anonymous memory to free)
        seen.add(storage.data_ptr())
        freed.append((storage, storage.nbytes()))
    for storage, _ in freed:
        storage.resize_(0)
    return freed


def restore_weight_storage(freed: list[tuple[torch.UntypedStorage, int]]) -> None:
    """Allocate the storages :func:`free_weight_storage` freed again, at their sizes; their values are
    undefined until a weight sync writes them."""
    for storage, nbytes in freed:
        storage.resize_(nbytes)
