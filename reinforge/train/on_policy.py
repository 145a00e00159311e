"""GKD's on-policy share (TRL ``GKDConfig.lmbda``): which offline GKD steps train on the student's own samples,
and those samples.

Agarwal et al. 2024 ("On-Policy Distillation of Language Models", Algorithm 1): with probability ``lmbda`` a
step's responses are sampled from the student itself (on-policy), else the dataset's are used; the divergence
to the teacher (:func:`~reinforge.algo.distill.generalized_jsd`) is then computed on those tokens either way.
TRL's ``GKDTrainer.training_step`` draws ``random.random() <= lmbda`` per batch; here the draw is seeded by
``(data.seed, step)`` so that every rank and a resumed run make the same choice.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from ..data.offline import OfflineExample

STUDENT_SOURCE = " (student sample)"
"""Appended to an example's ``source`` when its response is the student's sample."""


def is_on_policy_step(lmbda: float, seed: int, step: int) -> bool:
    """Whether optimizer step ``step`` trains on the student's samples: a seeded draw below ``lmbda``
    (``lmbda`` 1: every step, 0: none), the same on every rank and after a resume."""
    if lmbda <= 0:
        return False
    return random.Random(seed * 1_000_003 + step).random() < lmbda


@torch.no_grad()
def sample_responses(
    trainer: Any,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float,
    stop_ids: list[int],
    generator: torch.Generator,
) -> list[list[int]]:
    """The student's sampled completion of each prompt, at ``temperature``, each ending with its first token of
    ``stop_ids`` (kept) or after ``max_new_tokens`` tokens.

    Each new token comes from one forward pass of ``trainer.model`` over the prompt and the tokens so far (no KV
    cache: meant for the short responses and small models of offline GKD), through the trainer's own forward
    (:func:`~reinforge.train.step.forward`: its precision, sharding and layouts). A placeholder response token
    (``trainer.pad_id``) makes the forward return the logits that predict the next token. Under FSDP every rank
    samples every prompt with the same ``generator`` seed and the ranks agree on when all are done, so they issue
    the same forward passes.

    Args:
        trainer: an :class:`~reinforge.train.offline.OfflineTrainer` (its ``model``, ``pad_id``, ``device``,
            ``parallel``).
        prompts: token ids of each prompt.
        max_new_tokens: most tokens of a completion (>= 1).
        temperature: > 0; the logits are divided by it before the softmax.
        stop_ids: token ids that end a completion (the model's EOS ids).
        generator: CPU generator of the draws.
    Returns:
        one token list per prompt (at least one token each).
    Raises:
        ValueError: ``max_new_tokens`` < 1 or ``temperature`` <= 0.
    """
    from .batching import build
    from .step import forward

    if max_new_tokens < 1 or temperature <= 0:
        raise ValueError(
            f"sample_responses: max_new_tokens={max_new_tokens} must be >= 1 and temperature={temperature} > 0 "
            f"(offline.gkd_max_new_tokens, offline.gkd_temperature)"
        )
    model, stops = trainer.model, set(stop_ids)
    out: list[list[int]] = [[] for _ in prompts]
    active = list(range(len(prompts)))
    was = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            if not trainer.parallel.max_int(len(active)):
                break
            tokens = [prompts[i] + out[i] + [trainer.pad_id] for i in active]
            rows = [[k] for k in range(len(tokens))] or [[0]]
            if not tokens:  # (this rank is done, another is not: a dummy pass keeps the collectives in step)
                tokens = [[trainer.pad_id, trainer.pad_id]]
            mb = build(tokens, [1] * len(tokens), [[1]] * len(tokens), rows, trainer.pad_id).to(trainer.device)
            (logits,) = forward(trainer, model, mb, lambda lg, targets: (lg,))
            if not active:
                continue
            logits = logits.float().cpu()[: len(active)]
            order = mb.indices  # the sequence of each grid row (one response token each, row-major)
            probs = torch.softmax(logits / temperature, dim=-1)
            drawn = torch.multinomial(probs, 1, generator=generator)[:, 0].tolist()
            for k, tok in zip(order, drawn):
                out[active[k]].append(int(tok))
            active = [i for i in active if out[i][-1] not in stops]
    finally:
        model.train(was)
    return out


def student_examples(
    trainer: Any,
    examples: list[OfflineExample],
    ids: list[int],
    max_new_tokens: int,
    temperature: float,
    stop_ids: list[int],
    seed: int,
) -> list[OfflineExample]:
    """Examples ``ids`` with their responses replaced by the student's samples (:func:`sample_responses`, drawn
    with a generator seeded by ``seed``), every sampled token trained (loss mask 1). The prompt is the example's
    ``prompt_ids`` (a chat up to its first assistant turn): a multi-turn chat's later turns are left out."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [examples[i].prompt_ids for i in ids]
    responses = sample_responses(trainer, prompts, max_new_tokens, temperature, stop_ids, gen)
    return [
        OfflineExample(p, [r], [[1] * len(r)], source=examples[i].source + STUDENT_SOURCE)
        for i, p, r in zip(ids, prompts, responses)
    ]
