"""The rewards ``reward.type`` names, registered with the properties the rest of the package reads
instead of testing the name (issue 54): the config (which keys a reward needs or takes), the data
checks (whether the prompts can be scored) and the evaluation (what its metrics are called).

Properties (absent: False / None):

- ``label``: it compares each response with the prompt's label, by ``how`` (``math-verify``, ``exact
  match``): ``"required"``, or ``"unless_reasoning_gym"`` (``auto``: reasoning-gym prompts use
  their task's own scorer); the data checks refuse prompts that have none (every sample would score 0);
- ``reasoning_gym_only``: it scores with a reasoning-gym task's own scorer (every prompt must come
  from one);
- ``needs``: the ``reward`` key it cannot run without (``function_path``, ``model_path``);
- ``takes_function_path``: ``reward.function_path`` may be set (``custom``; ``auto``: the function
  replaces the built-in scorers);
- ``judge``: an LLM judge (the ``judge`` section; its endpoint is checked before the policy
  is built);
- ``preference``: its scores measure a preference, not correctness (a reward model): the evaluation
  names its shares ``score_above_threshold``, not ``accuracy``.

A target is what scores (a function of ``(sample, extraction)``, or the class that does); names
only this module and the manager load.
"""

from __future__ import annotations

from typing import Any

from ..utils.registry import Registry

REWARDS: Registry[Any] = Registry("reward", "reward.type")
REWARDS.register(
    "auto",
    "reinforge.reward.functions:math_reward",  # reasoning-gym prompts: reasoning_gym's scorer
    label="unless_reasoning_gym",
    how="math-verify",
    takes_function_path=True,
)
REWARDS.register("reasoning_gym", "reinforge.reward.functions:reasoning_gym_reward", reasoning_gym_only=True)
REWARDS.register("math", "reinforge.reward.functions:math_reward", label="required", how="math-verify")
REWARDS.register("exact_match", "reinforge.reward.functions:exact_match_reward", label="required", how="exact match")
REWARDS.register(
    "custom", "reinforge.utils.imports:load_function", needs="function_path", takes_function_path=True
)  # the function of reward.function_path, loaded by the manager (or its worker processes)
REWARDS.register("model", "reinforge.reward.model_reward:ModelReward", needs="model_path", preference=True)
REWARDS.register("judge", "reinforge.reward.judge:JudgeReward", judge=True)
