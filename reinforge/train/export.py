"""One checkpoint writer for every trainer (RL's actor and critic, the offline trainer).

:func:`write_trainers` writes a trainer rank's part of a checkpoint folder (shared by every rank):

    dcp/<name>/         each trainer's trainable weights, sharded (``torch.distributed.checkpoint``,
                        loadable on any rank count); with ``share_hf_weights`` and a policy whose
                        Hugging Face folder holds every trained weight as trained, only a pointer to it
    dcp/<name>_optim/   with ``optimizer``: its AdamW state
    model/              the policy as a Hugging Face folder (LoRA merged; a reward model as one)
    adapter/            with LoRA: the PEFT adapter folder
    trainer_state.pt    ``{name: state}``: each trainer's LR scheduler and skipped-step counter

The checkpoint's own files (``state.json``, ``rng.pt``, the manifest) are
:func:`reinforge.checkpoint.save_checkpoint`'s; which trainers and names are the caller's
(:meth:`reinforge.train.worker.TrainWorker.save`, :meth:`reinforge.offline_loop.OfflineLoop.save`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..models.loading import save_hf_state_dict
from ..models.lora import adapter_state_dict, has_lora, merged_named_weights, save_adapter
from .collectives import full_tensor
from .model_trainer import ModelTrainer

HfWriter = Callable[[dict[str, torch.Tensor], Path], None]  # (full state dict, folder) -> None


def policy_state_dict(trainer: ModelTrainer) -> dict[str, torch.Tensor]:
    """The trainer's model as a Hugging Face state dict on CPU, LoRA adapters merged into their
    base weights (rank 0 gets it; other ranks {}); a collective: every rank must call it."""
    if not has_lora(trainer.model):
        return trainer.full_state_dict()
    full = {n: t.detach().cpu() for n, t in merged_named_weights(trainer.model, full_tensor)}
    return full if trainer.parallel.rank == 0 else {}


def write_trainers(
    directory: str | Path,
    trainers: dict[str, ModelTrainer],
    base_path: str | Path,
    optimizer: bool = True,
    share_hf_weights: bool = False,
    write_hf: HfWriter | None = None,
) -> dict[str, Any]:
    """Write this rank's part of a checkpoint into ``directory`` (layout: the module's docstring);
    every rank must call it with the same arguments. The first of ``trainers`` is the policy (its
    model goes to ``model/`` and, with LoRA, ``adapter/``).

    Args:
        directory: the checkpoint folder, the same on every rank.
        trainers: name -> trainer, the policy first (``{"actor": ..., "critic": ...}``, ``{"model": ...}``).
        base_path: the Hugging Face folder the policy was built from (config, tokenizer files copied).
        optimizer: also write each trainer's AdamW state (``run.save_optimizer`` not ``none``).
        share_hf_weights: let ``dcp/<policy>`` name ``model/`` instead of holding a second copy of
            the weights, where ``model/`` holds them as trained (:attr:`ModelTrainer.hf_folder_holds_weights`).
        write_hf: writes ``model/`` from the full state dict (default: a causal LM folder like ``base_path``).
    Returns:
        the ``{name: state}`` written to ``trainer_state.pt`` (on every rank).
    """
    d = Path(directory)
    (policy_name, policy), *_ = trainers.items()
    state = {}
    for name, trainer in trainers.items():
        shared = share_hf_weights and trainer is policy and trainer.hf_folder_holds_weights
        state[name] = trainer.save(str(d / "dcp" / name), optimizer, weights_in="../../model" if shared else None)
    full = policy_state_dict(policy)
    adapter = adapter_state_dict(policy.model, full_tensor) if has_lora(policy.model) else None
    if policy.parallel.rank == 0:
        if write_hf is not None:
            write_hf(full, d / "model")
        else:
            save_hf_state_dict(full, d / "model", base_path)
        if adapter is not None:
            save_adapter(adapter, policy.model.lora_config, d / "adapter", base_path)
        torch.save(state, d / "trainer_state.pt")
    policy.parallel.barrier()
    return state


def read_trainer_state(directory: str | Path, name: str) -> dict[str, Any]:
    """Trainer ``name``'s entry of ``trainer_state.pt`` (checkpoints of offline runs before
    :func:`write_trainers` hold one trainer's state unnamed: returned as is).

    Raises:
        KeyError: the checkpoint holds no state for ``name``."""
    state = torch.load(Path(directory) / "trainer_state.pt", map_location="cpu", weights_only=True)
    if "scheduler" in state:  # the older offline layout: the trainer's own state
        return state
    return state[name]
