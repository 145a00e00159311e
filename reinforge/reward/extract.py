"""Pulling the final answer out of a completion."""

from __future__ import annotations

import re

_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")

EXTRACTION_METHODS = ("tag", "tag_or_last_number", "boxed", "last_number", "none")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def last_number(text: str) -> str | None:
    """The last number in the text (thousands separators removed), or None."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def extract_answer(text: str, method: str = "tag_or_last_number") -> str | None:
    """The answer in a completion, or None when there is none.

    * ``tag``: the last ``<answer>...</answer>`` (reasoning-gym's prompt format), stripped.
    * ``tag_or_last_number``: the tag, else the last number in the text.
    * ``boxed``: the last ``\\boxed{...}``.
    * ``last_number``: the last number.
    * ``none``: the whole completion, stripped.

    Raises:
        ValueError: unknown method.
    """
    if method == "none":
        return text.strip()
    if method in ("tag", "tag_or_last_number"):
        tags = _TAG.findall(text)
        if tags:
            return tags[-1].strip()
        return last_number(text) if method == "tag_or_last_number" else None
    if method == "boxed":
        return last_boxed(text)
    if method == "last_number":
        return last_number(text)
    raise ValueError(f"unknown answer extraction {method!r}; choose one of {EXTRACTION_METHODS}")
