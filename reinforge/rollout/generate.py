"""The default rollout: prompts -> groups of scored samples."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from ..config import Config
from ..data import Prompt
from .types import FinishReason, GenerateRequest, RolloutEngine, Sample, SamplingParams, Status

log = logging.getLogger(__name__)

_STATUS = {FinishReason.STOP: Status.COMPLETED, FinishReason.LENGTH: Status.TRUNCATED,
           FinishReason.ABORT: Status.ABORTED}


@dataclass
class RolloutContext:
    """Everything a rollout function needs; custom rollout functions receive it first.

    A custom rollout (``rollout.rollout_function_path``) is
    ``fn(ctx: RolloutContext, rollout_id: int, data_source: PromptDataset) -> list[list[Sample]]``:
    it takes ``ctx.config.rollout.rollout_batch_size`` prompts from ``data_source`` and
    returns one group of samples per prompt (slime's ``--rollout-function-path``). Samples
    left with ``reward=None`` are scored by the configured reward afterwards.
    """

    config: Config
    engine: RolloutEngine
    tokenizer: Any
    reward: Any  # RewardManager
    stop_token_ids: list[int] = field(default_factory=list)

    def sampling_params(self, evaluation: bool = False, greedy: bool = False) -> SamplingParams:
        r, e = self.config.rollout, self.config.eval
        max_new = (e.eval_max_response_len or r.rollout_max_response_len) if evaluation else r.rollout_max_response_len
        temperature = 0.0 if greedy else (e.eval_temperature if evaluation else r.rollout_temperature)
        return SamplingParams(
            max_new_tokens=max_new,
            temperature=temperature,
            top_p=(e.eval_top_p if evaluation else r.rollout_top_p),
            top_k=r.rollout_top_k,
            stop=list(r.rollout_stop),
            stop_token_ids=list(self.stop_token_ids),
        )


def model_stop_token_ids(tokenizer: Any, model_path: str, extra: list[int]) -> list[int]:
    """EOS ids of the model's generation config, plus ``extra``, deduplicated (the
    tokenizer's EOS only when the generation config names none).

    Warns, naming ``rollout.rollout_stop_token_ids``, when the chat template's end-of-turn
    token is not among them: generation would then run past the end of the answer.
    """
    from transformers import GenerationConfig

    ids: list[int] = []
    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
        ids += eos if isinstance(eos, list) else ([eos] if eos is not None else [])
    except OSError:
        pass
    if not ids and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    ids = list(dict.fromkeys(ids + list(extra)))
    eot = end_of_turn_token_id(tokenizer)
    if eot is not None and eot not in ids:
        log.warning("%s: the chat template ends a turn with %r (id %d) but the model's generation config does "
                    "not stop on it: add rollout.rollout_stop_token_ids=[%d]", model_path,
                    tokenizer.convert_ids_to_tokens(eot), eot, eot)
    return ids


def end_of_turn_token_id(tokenizer: Any) -> int | None:
    """The special token the chat template puts right after an assistant message, if any."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        marker = "reinforge-marker"
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}], tokenize=False)
    except Exception:  # templates that refuse this conversation: no opinion
        return None
    after = text[text.rfind(marker) + len(marker):]
    ids = tokenizer(after, add_special_tokens=False)["input_ids"]
    special = set(tokenizer.all_special_ids)
    return next((i for i in ids if i in special), None)


def generate_groups(ctx: RolloutContext, prompts: list[Prompt], n: int, params: SamplingParams,
                    start_index: int = 0) -> list[list[Sample]]:
    """``n`` samples per prompt from the engine (unscored)."""
    requests = [GenerateRequest(p.prompt_ids, params, n=n) for p in prompts]
    results = ctx.engine.generate(requests)
    groups = []
    for gi, (p, res) in enumerate(zip(prompts, results)):
        group = []
        for j, r in enumerate(res):
            group.append(Sample(
                prompt=p.prompt,
                tokens=p.prompt_ids + r.token_ids,
                response_length=len(r.token_ids),
                response=ctx.tokenizer.decode(r.token_ids, skip_special_tokens=True),
                label=p.label,
                metadata=dict(p.metadata),
                index=start_index + gi * n + j,
                group_index=gi,
                loss_mask=[1] * len(r.token_ids),
                rollout_log_probs=list(r.log_probs),
                status=_STATUS[r.finish_reason],
                weight_version=r.weight_version,
            ))
        groups.append(group)
    return groups


def default_rollout(ctx: RolloutContext, rollout_id: int, data_source: Any) -> list[list[Sample]]:
    """``rollout_batch_size`` prompts x ``n_samples_per_prompt`` samples (the loop scores
    every sample whose ``reward`` is still None)."""
    r = ctx.config.rollout
    prompts = data_source.next_batch(r.rollout_batch_size)
    return generate_groups(ctx, prompts, r.n_samples_per_prompt, ctx.sampling_params())


RolloutFn = Callable[[RolloutContext, int, Any], list[list[Sample]]]
