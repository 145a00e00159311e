"""The advantage estimators' registry (:data:`ADV_ESTIMATORS`): their names and properties, without torch.

The config validates ``algo.advantage_estimator`` and the keys each estimator reads from here, so
``reinforge config`` and the other config-only paths never import torch; the functions themselves
live in :mod:`reinforge.algo.advantages` and are imported when first used (a ``"module:attr"``
target of :class:`~reinforge.utils.registry.Registry`). Registration properties:
:mod:`reinforge.algo.advantages`'s module doc. A new estimator registers with the decorator, as
before (``@ADV_ESTIMATORS.register("my_estimator", ...)``, the same registry object).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..utils.registry import Registry

ADV_ESTIMATORS: Registry[Callable[..., Any]] = Registry("advantage estimator", "algo.advantage_estimator")

_FN = "reinforge.algo.advantages:"
ADV_ESTIMATORS.register("grpo", _FN + "grpo_estimator", group_based=True, reads=("grpo_std_normalization",))
ADV_ESTIMATORS.register("dr_grpo", _FN + "dr_grpo_estimator", group_based=True)
ADV_ESTIMATORS.register("rloo", _FN + "rloo_estimator", group_based=True)
ADV_ESTIMATORS.register(
    "reinforce_plus_plus", _FN + "reinforce_plus_plus_estimator", reads=("gamma",), token_level=True
)
ADV_ESTIMATORS.register("reinforce_plus_plus_baseline", _FN + "reinforce_plus_plus_baseline_estimator")
ADV_ESTIMATORS.register("gae", _FN + "gae_estimator", needs_critic=True, reads=("gamma", "lambd"), token_level=True)
