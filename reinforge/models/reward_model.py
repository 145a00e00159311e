"""Scalar-output models on the policy's backbone: the reward model (and its Hugging Face form).

A reward model is a :class:`~reinforge.models.transformer.CausalLM` backbone whose final hidden
state at the last non-pad token of a sequence feeds ``score`` (hidden -> 1, no bias). Saved, it is
a Hugging Face ``*ForSequenceClassification`` folder (``num_labels: 1``; backbone under ``model.*``,
head ``score.weight``, ``pad_token_id``): transformers loads it with
``AutoModelForSequenceClassification`` and scores exactly the same token (TRL's ``RewardTrainer``
convention). Where the pad token is also the end-of-turn token (SmolLM2), trailing end-of-turn
tokens count as padding in both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from .families import native_models
from .loading import build_model, is_native, save_hf_state_dict

SEQ_CLS_SUFFIX = "ForSequenceClassification"


class RewardModel(nn.Module):
    """Backbone + ``score`` head; ``forward(input_ids)`` -> rewards [B] (fp32), read at each row's
    last token that is not ``pad_token_id`` (transformers' rule; right-padded rows)."""

    def __init__(self, backbone: nn.Module, pad_token_id: int | None):
        super().__init__()
        if not is_native(backbone):
            raise ValueError(f"the reward model's backbone must be {native_models()}")
        self.backbone = backbone
        self.pad_token_id = pad_token_id
        p = next(backbone.parameters())
        self.score = nn.Linear(backbone.args.hidden_size, 1, bias=False, device=p.device, dtype=p.dtype)
        nn.init.normal_(self.score.weight, std=1.0 / (backbone.args.hidden_size + 1) ** 0.5)
        backbone.lm_head.requires_grad_(False)  # unused: the score head replaces it

    @property
    def model(self) -> nn.Module:
        """The decoder (for FSDP: ``model.layers`` are sharded one unit each)."""
        return self.backbone.model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone.forward_hidden(input_ids)
        return (
            self.score(
                hidden[
                    torch.arange(len(input_ids), device=hidden.device), last_token_index(input_ids, self.pad_token_id)
                ]
            )
            .squeeze(-1)
            .float()
        )

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Weights under ``*ForSequenceClassification`` names (no LM head)."""
        out = {n: t for n, t in self.backbone.state_dict().items() if not n.startswith("lm_head.")}
        out["score.weight"] = self.score.weight
        return out


def last_token_index(input_ids: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """[B] position of each row's last non-pad token (the last position without a pad id), as
    transformers' ``*ForSequenceClassification`` computes it."""
    positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
    if pad_token_id is None:
        return positions[-1].expand(input_ids.shape[0])
    return (positions * (input_ids != pad_token_id)).argmax(-1)


def is_reward_model_folder(path: str | os.PathLike) -> bool:
    cfg = json.loads((Path(path) / "config.json").read_text())
    return any(a.endswith(SEQ_CLS_SUFFIX) for a in cfg.get("architectures") or [])


def build_reward_model(
    path: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    random_init: bool = False,
    seed: int = 0,
    pad_token_id: int | None = None,
) -> RewardModel:
    """A reward model from a causal-LM folder (new ``score`` head; ``pad_token_id`` from the
    caller's tokenizer) or a saved reward-model folder (its config's ``pad_token_id``).

    Raises:
        ValueError: the architecture has no native implementation.
    """
    from safetensors.torch import load_file

    path = Path(path)
    saved = is_reward_model_folder(path)
    backbone = build_model(path, dtype, device, random_init=random_init, seed=seed, head_optional=saved)
    if saved:
        pad_token_id = json.loads((path / "config.json").read_text()).get("pad_token_id")
    rm = RewardModel(backbone, pad_token_id)
    if saved:
        files = sorted(path.glob("*.safetensors"))
        state = {}
        for f in files:
            state.update(load_file(str(f)))
        if "score.weight" not in state:
            raise KeyError(f"{path}: a reward-model folder without score.weight")
        with torch.no_grad():
            rm.score.weight.copy_(state["score.weight"].to(rm.score.weight.dtype))
    return rm


def save_reward_model(
    state: dict[str, torch.Tensor],
    out: str | os.PathLike,
    source: str | os.PathLike,
    pad_token_id: int | None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write :meth:`RewardModel.hf_state_dict` weights as a ``*ForSequenceClassification`` folder
    (config, tokenizer copied from ``source``)."""
    out = save_hf_state_dict(state, out, source, dtype)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    arch = (cfg.get("architectures") or ["LlamaForCausalLM"])[0]
    base = arch[: -len("ForCausalLM")] if arch.endswith("ForCausalLM") else arch.removesuffix(SEQ_CLS_SUFFIX)
    cfg["architectures"] = [base + SEQ_CLS_SUFFIX]
    cfg["num_labels"] = 1
    cfg["id2label"], cfg["label2id"] = {"0": "LABEL_0"}, {"LABEL_0": 0}
    if pad_token_id is not None:
        cfg["pad_token_id"] = pad_token_id
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return out
