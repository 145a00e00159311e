"""Built-in verifiable rewards. Each takes a :class:`Sample` and returns a float in [0, 1]."""

from __future__ import annotations

import functools
from typing import Any

from ..records import Sample
from .extract import extract_answer


@functools.lru_cache(maxsize=None)
def _rg_scorer(task: str):
    from ..data.sources import import_reasoning_gym

    return import_reasoning_gym().get_score_answer_fn(task)


def reasoning_gym_reward(sample: Sample, extraction: str = "tag_or_last_number") -> float:
    """The task's own ``score_answer(answer, entry)`` on the extracted answer.

    Raises:
        KeyError: the sample did not come from a reasoning-gym source.
    """
    info = sample.metadata["reasoning_gym"]
    answer = extract_answer(sample.response, extraction)
    return float(_rg_scorer(info["task"])(answer, info["entry"]))


def math_reward(sample: Sample, extraction: str = "none") -> float:
    """1.0 when math-verify finds the response's answer equal to the label, else 0.0.

    math-verify (Hugging Face) does its own answer extraction (boxed, LaTeX, plain
    expressions); with ``extraction`` other than ``none`` it is applied first. Its
    signal-based timeouts are disabled (rewards run in worker threads; the manager applies
    ``reward.timeout``).
    """
    from math_verify import parse, verify

    if sample.label is None:
        raise ValueError("math reward needs a label")
    text = sample.response if extraction == "none" else (extract_answer(sample.response, extraction) or "")
    gold = parse(_as_math(str(sample.label)), parsing_timeout=None)
    pred = parse(text, parsing_timeout=None)
    return 1.0 if verify(gold, pred, timeout_seconds=None) else 0.0


def _as_math(label: str) -> str:
    return label if "$" in label or "\\boxed" in label else f"${label}$"


def _normalise(s: Any) -> str:
    return " ".join(str(s).strip().lower().split())


def exact_match_reward(sample: Sample, extraction: str = "tag_or_last_number") -> float:
    """1.0 when the extracted answer equals the label after whitespace/case normalisation."""
    answer = extract_answer(sample.response, extraction)
    return 1.0 if answer is not None and _normalise(answer) == _normalise(sample.label) else 0.0
