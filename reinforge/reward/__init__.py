"""Reward functions and the manager that runs them over a rollout.

Names are imported on first use, so that a reward worker process
(``python -m reinforge.reward.workers``) imports neither the config nor the built-in scorers."""

from __future__ import annotations

from typing import Any

__all__ = [
    "JudgeReward",
    "RewardManager",
    "exact_match_reward",
    "extract_answer",
    "math_reward",
    "reasoning_gym_reward",
]

_WHERE = {
    "RewardManager": "manager",
    "exact_match_reward": "functions",
    "math_reward": "functions",
    "reasoning_gym_reward": "functions",
    "extract_answer": "extract",
    "JudgeReward": "judge",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
