"""Built-in verifiable rewards. Each takes a :class:`Sample` and returns a float in [0, 1]."""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

from ..records import Sample
from .extract import extract_answer


@functools.cache
def _rg_scorer(task: str):
    from ..data.sources import import_reasoning_gym

    return import_reasoning_gym().get_score_answer_fn(task)


def reasoning_gym_reward(sample: Sample, extraction: str = "tag_or_last_number") -> float:
    """The task's own ``score_answer(answer, entry)`` on the extracted answer.

    Raises:
        KeyError: the sample did not come from a reasoning-gym source.
    """
    info = sample.metadata["reasoning_gym"]
    answer = extract_answer(answer_text(sample), extraction)
    return float(_rg_scorer(info["task"])(answer, info["entry"]))


def math_reward(sample: Sample, extraction: str = "none") -> float:
    """1.0 when math-verify finds the response's answer equal to the label, else 0.0.

    math-verify (Hugging Face) does its own answer extraction (boxed, LaTeX, plain
    expressions); with ``extraction`` other than ``none`` it is applied first. Its
    signal-based timeouts are disabled (rewards run in worker threads; the manager applies
    ``reward.timeout``).
    """
    from math_verify import parse, verify

    _quiet_math_verify()

    label = label_text(sample, "math")
    text = answer_text(sample)
    text = text if extraction == "none" else (extract_answer(text, extraction) or "")
    gold = parse(_as_math(label), parsing_timeout=None)
    pred = parse(text, parsing_timeout=None)
    return 1.0 if verify(gold, pred, timeout_seconds=None) else 0.0


def answer_text(sample: Sample) -> str:
    """The text a built-in reward reads: the response, or for a multi-turn (agent) sample its final
    answer only (``metadata["final_answer"]``: the last turn when it made no tool call, else empty),
    so that a number a tool printed is never taken for the model's answer."""
    return sample.metadata.get("final_answer", sample.response)


def label_text(sample: Sample, reward: str) -> str:
    """The sample's label as text: a string, or a number (``4``, ``2.5``) written as ``str``.

    Raises:
        ValueError: no label.
        TypeError: a label of another type (a list, a dict, a bool): scoring its ``str`` would
            silently give 0, so the manager counts it as a reward error instead.
        ValueError: a NaN or infinite label, for the same reason (a data file's is refused when it
            loads, naming its line: :func:`reinforge.data.sources.load_prompt_file`).
    """
    label = sample.label
    if label is None:
        raise ValueError(f"the {reward} reward needs a label (data.label_key)")
    if isinstance(label, bool) or not isinstance(label, (str, int, float)):
        raise TypeError(
            f"the {reward} reward needs a string or number label (data.label_key), got "
            f"{type(label).__name__} {label!r:.80}"
        )
    if isinstance(label, float) and not math.isfinite(label):
        raise ValueError(
            f"the {reward} reward needs a reference answer, but the label (data.label_key) is {label!r}: "
            f"compared as text it would score every response 0"
        )
    return str(label)


class _NoTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


@functools.cache
def _quiet_math_verify() -> None:
    """Drop math-verify's "Timeout is disabled" warning (up to one per concurrent first call, 22 per
    eval): its signal timeouts are off on purpose, ``reward.timeout`` bounds each call instead."""
    for name in ("math_verify.grader", "math_verify.parser"):
        logging.getLogger(name).addFilter(_NoTimeoutWarning())


def _as_math(label: str) -> str:
    return label if "$" in label or "\\boxed" in label else f"${label}$"


def _normalise(s: Any) -> str:
    return " ".join(str(s).strip().lower().split())


def exact_match_reward(sample: Sample, extraction: str = "tag_or_last_number") -> float:
    """1.0 when the extracted answer equals the label after whitespace/case normalisation."""
    label = label_text(sample, "exact_match")
    answer = extract_answer(answer_text(sample), extraction)
    return 1.0 if answer is not None and _normalise(answer) == _normalise(label) else 0.0
