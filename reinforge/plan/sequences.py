"""The sequences a run holds at once (:func:`run_max_seqs`): what the engines' slots and KV caches are sized for,
by the planner, the up-front checks and the engine alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import Config


def run_max_seqs(cfg: Config) -> int | None:
    """The most sequences a run asks its engine(s) to hold at once, or ``None`` when that is not
    known (a custom ``rollout.rollout_function_path`` makes its own requests).

    The larger of one rollout, ``rollout_batch_size * n_samples_per_prompt`` (0 when
    ``train.num_rollout`` is 0, as in ``reinforge eval``), and one evaluation pass,
    ``data.n_eval_prompts * max(1, eval.n_samples_per_eval_prompt)`` (the greedy pass holds one
    sequence per prompt, the sampled pass ``n_samples_per_eval_prompt``). The rule holds for the
    loop's other ways of generating: a dynamic-sampling round (``algo.dynamic_sampling``) is one
    rollout's worth of prompts, rounds run one after another; an agent
    (``rollout.custom_generate_function_path``) has one request in flight per sample; the
    asynchronous producer (``rollout.max_staleness``) generates one rollout at a time and
    evaluation pauses it.
    """
    r = cfg.rollout
    if r.rollout_function_path:
        return None
    rollout = r.rollout_batch_size * r.n_samples_per_prompt if cfg.train.num_rollout > 0 else 0
    evaluation = cfg.data.n_eval_prompts * max(1, cfg.eval.n_samples_per_eval_prompt)
    return max(rollout, evaluation, 1)
