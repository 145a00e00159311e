"""LoRA adapters on the trained model, through ``peft`` (Hu et al. 2021, "LoRA").

``peft.inject_adapter_in_model`` wraps the chosen ``nn.Linear`` layers of reinforge's model (or a
transformers model): W x + (B A x) * alpha / r, with W frozen and only A, B trained. What the rest
of reinforge needs from an adapted model is here:

* :func:`merged_named_weights`: the policy as plain Hugging Face tensors, W + B A * scaling, for
  weight sync into any engine and for the Hugging Face folder of a checkpoint (so engines and
  exports never see adapters: the merged model is what was trained);
* :func:`adapters_disabled`: the base model, for reference log-probs (KL) without a second copy;
* :func:`adapter_state_dict` / :func:`save_adapter`: the adapter alone, as a PEFT folder
  (``adapter_config.json`` + ``adapter_model.safetensors``) that ``peft.PeftModel.from_pretrained``
  loads onto the base model.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

ADAPTER = "default"


def apply_lora(
    model: nn.Module, rank: int, alpha: float, dropout: float, target_modules: list[str], family_targets: bool = False
) -> nn.Module:
    """Inject LoRA adapters (``peft``) into ``model`` in place; the base weights are frozen and only
    the adapters require gradients (B starts at zero: the adapted model equals the base model).

    ``family_targets`` (``model.lora_target_modules`` left at its default) also adapts the projections of the
    family's other token mixers (:func:`with_family_targets`: a hybrid's linear-attention ``in_proj_*`` and
    ``out_proj``).

    With a mixture-of-experts model the routed experts (stacked 3-D parameters, not ``nn.Linear``)
    are not LoRA targets: ``gate_proj`` / ``up_proj`` / ``down_proj`` adapt the dense layers' MLPs
    and a shared expert; the router (``gate``) is an ``nn.Linear`` and may be named.

    Raises:
        ImportError: ``peft`` is not installed (``pip install peft``).
        ValueError: no module matches ``target_modules``, or one names the routed experts.
    """
    if family_targets:
        target_modules = with_family_targets(model, target_modules)
    _refuse_expert_targets(model, target_modules)
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as e:
        raise ImportError("model.lora_rank > 0 needs peft: pip install peft") from e
    config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules), bias="none"
    )
    model = inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for p in model.parameters():  # the adapters train in fp32, also on a base held in bf16 (peft follows the base)
        if p.requires_grad and p.is_floating_point() and p.dtype != torch.float32:
            p.data = p.data.float()
    model.lora_config = config
    return model


def with_family_targets(model: nn.Module, target_modules: list[str]) -> list[str]:
    """``target_modules`` plus the family's ``lora_targets`` present in ``model`` (the caller decides when:
    ``model.lora_target_modules`` left at its default, ``ModelConfig.lora_targets_default``)."""
    family = getattr(model, "family", None)
    if family is None:
        return list(target_modules)
    present = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    return [*target_modules, *(t for t in family.lora_targets if t in present and t not in target_modules)]


def matmul_weights(model: nn.Module) -> Iterator[tuple[str, nn.Module, str]]:
    """(full name, module, attribute) of every weight that only ever enters a matmul: each ``nn.Linear``'s
    weight and bias (the router, an untied LM head, the layers LoRA adapts and their adapters) and the
    routed experts (:class:`~reinforge.models.moe.Experts`); not one tied to an embedding."""
    from .moe import Experts

    tied = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    if getattr(getattr(model, "args", None), "tie_word_embeddings", False):  # (on the meta device: not yet tied)
        tied.add(id(getattr(getattr(model, "lm_head", None), "weight", None)))
    for prefix, module in model.named_modules():
        if isinstance(module, nn.Linear):
            names = ("weight", "bias")
        elif isinstance(module, Experts):
            names = ("gate_up_proj", "down_proj")
        else:
            continue
        for name in names:
            p = getattr(module, name, None)
            if p is not None and id(p) not in tied and p.is_floating_point():
                yield f"{prefix}.{name}" if prefix else name, module, name


def hold_frozen_weights(model: nn.Module, dtype: torch.dtype) -> int:
    """Store the frozen :func:`matmul_weights` of an adapted ``model`` in ``dtype`` (the trainer's
    autocast dtype), in place. Autocast casts these to ``dtype`` before each matmul anyway, so the
    forward and backward passes are unchanged, bit for bit; the memory of the frozen base halves (fp32
    -> bf16: a Qwen3-30B-A3B base takes 57 GiB instead of 114). Embeddings and norms (whose outputs keep
    their input's dtype) and every trained parameter stay as they are.

    Returns:
        the bytes this freed (0 when :func:`~reinforge.models.loading.build_model` loaded them so).
    """
    freed, size = 0, torch.empty((), dtype=dtype).element_size()
    for _, module, name in list(matmul_weights(model)):
        p = getattr(module, name)
        if p.requires_grad or p.dtype == dtype:
            continue
        freed += p.numel() * (p.element_size() - size)
        setattr(module, name, nn.Parameter(p.detach().to(dtype), requires_grad=False))
    return freed


def _refuse_expert_targets(model: nn.Module, target_modules: list[str] | str) -> None:
    """Raise ValueError when ``target_modules`` names a mixture-of-experts model's routed experts."""
    from .moe import Experts

    experts = [n for n, m in model.named_modules() if isinstance(m, Experts)]
    if not experts or isinstance(target_modules, str):  # a string: peft's "all-linear" (Linear layers only)
        return
    for t in target_modules:
        if t in ("gate_up_proj", "experts") or any(n == t or n.endswith("." + t) for n in experts):
            raise ValueError(
                f"model.lora_target_modules: {t!r} names the routed experts of a mixture-of-experts "
                f"model ({experts[0]}, ...), which are not LoRA targets; adapt the attention "
                f"projections (q_proj, k_proj, v_proj, o_proj) and the dense / shared-expert MLPs instead"
            )


def lora_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(module name, peft LoRA layer) of every adapted layer."""
    from peft.tuners.lora import LoraLayer

    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer)]


def has_lora(model: nn.Module) -> bool:
    return getattr(model, "lora_config", None) is not None


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Run ``model`` as its base model (adapters off) inside the block: the frozen reference model
    of KL terms and DPO, with no second copy of the weights."""
    layers = [m for _, m in lora_layers(model)]
    for m in layers:
        m.enable_adapters(False)
    try:
        yield model
    finally:
        for m in layers:
            m.enable_adapters(True)


def merged_named_weights(
    model: nn.Module, gather: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) of the merged model: every adapted Linear's weight becomes
    W + B A * scaling under its original name; adapter tensors are not listed.

    ``gather`` turns a (sharded) parameter into its full tensor; with FSDP it is a collective, so
    every rank must iterate this in step. Tied parameters are listed once.
    """
    from ..utils import faults

    adapted = {f"{n}.base_layer.weight": m for n, m in lora_layers(model)}
    drop = faults.hit("drop_lora_merge")  # fault injection (tests): the merge silently skipped
    seen: set[int] = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen or ".lora_" in name:
            continue
        seen.add(id(p))
        t = gather(p.detach())
        layer = adapted.get(name)
        if layer is not None and not drop:
            a = gather(layer.lora_A[ADAPTER].weight.detach())
            b = gather(layer.lora_B[ADAPTER].weight.detach())
            # in fp32 and rounded once, also where the base is held in bf16 (hold_frozen_weights)
            t = (t.float() + (b.float() @ a.float()) * layer.scaling[ADAPTER]).to(t.dtype)
        if layer is not None:
            name = name.replace(".base_layer.weight", ".weight")
        yield name, t


def adapter_state_dict(
    model: nn.Module, gather: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
) -> dict[str, torch.Tensor]:
    """The adapter tensors under PEFT's saved names (``base_model.model.<module>.lora_A.weight``)."""
    out = {}
    for name, p in model.named_parameters():
        if ".lora_" in name:
            out["base_model.model." + name.replace(f".{ADAPTER}.", ".")] = gather(p.detach()).cpu().contiguous()
    return out


def save_adapter(
    state: dict[str, torch.Tensor], config: Any, out: str | os.PathLike, base_model: str | os.PathLike
) -> Path:
    """Write a PEFT adapter folder (loadable with ``PeftModel.from_pretrained(base, out)``)."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "adapter_model.safetensors"))
    cfg = config.to_dict()
    cfg["base_model_name_or_path"] = str(base_model)
    cfg["task_type"] = "CAUSAL_LM"
    cfg["target_modules"] = sorted(cfg["target_modules"]) if cfg.get("target_modules") else None
    (out / "adapter_config.json").write_text(json.dumps(cfg, indent=2, default=str) + "\n")
    return out
