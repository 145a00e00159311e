"""Tools and a custom generate function for the agent tests (loaded by `module:function` path)."""

from __future__ import annotations

import time
from typing import Literal

from reinforge.records import Sample, Status


def echo(text: str) -> str:
    """Return the text unchanged.

    Args:
        text: what to echo.
    """
    return text


def add(a: int, b: int = 1, mode: Literal["plain", "verbose"] = "plain") -> str:
    """Add two integers.

    Args:
        a: the first one.
        b: the second one,
            described on two lines.
        mode: how to answer.
    """
    return str(a + b) if mode == "plain" else f"{a} + {b} = {a + b}"


def boom(x: str) -> str:
    """Always fails.

    Args:
        x: ignored.
    """
    raise RuntimeError("kaboom")


def sleepy(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: how long.
    """
    time.sleep(seconds)
    return "awake"


FIXED_RESPONSE = [2]  # the tokenizer's <|im_end|>: a one-token answer


async def fixed_generate(ctx, sample: Sample, params) -> Sample:
    """A custom generate that never calls the engine: a fixed one-token response and a marker stat."""
    assert sample.response_length == 0 and sample.status == Status.PENDING
    sample.tokens = sample.tokens + FIXED_RESPONSE
    sample.response_length = len(FIXED_RESPONSE)
    sample.loss_mask = [1] * len(FIXED_RESPONSE)
    sample.rollout_log_probs = [-1.0] * len(FIXED_RESPONSE)
    sample.status = Status.COMPLETED
    sample.weight_version = ctx.engine.weight_version
    sample.metadata["rollout_stats"] = {"test/custom_generate": 1.0, "test/group_index": float(sample.group_index)}
    return sample
