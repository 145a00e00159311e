"""The algorithm registries the config chooses from, their names and properties, without torch:
:data:`ADV_ESTIMATORS` (``algo.advantage_estimator``), :data:`POLICY_LOSSES` (``algo.policy_loss``),
:data:`KL_ESTIMATORS` (``algo.kl_loss_type``), :data:`LOSS_AGG_MODES` (``algo.loss_agg_mode``) and
:data:`OFFLINE_METHODS` (``offline.method``).

The config validates names (and the keys each estimator reads) from here, so ``reinforge config`` and
the other config-only paths never import torch; the functions live in :mod:`.advantages`,
:mod:`.losses` and :mod:`.preference` (which re-export these registries) and are imported when first
used (a ``"module:attr"`` target of :class:`~reinforge.utils.registry.Registry`). Registration
properties: those modules' docs. A new entry registers as before, e.g.
``@ADV_ESTIMATORS.register("my_estimator", ...)`` on the same registry object.
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

_LOSS = "reinforge.algo.losses:"
POLICY_LOSSES: Registry[Callable[..., Any]] = Registry("policy loss", "algo.policy_loss")
POLICY_LOSSES.register("ppo", _LOSS + "ppo_policy_loss")
POLICY_LOSSES.register("gspo", _LOSS + "gspo_policy_loss")

KL_ESTIMATORS: Registry[Callable[..., Any]] = Registry("KL estimator", "algo.kl_loss_type")
KL_ESTIMATORS.register("k1", _LOSS + "kl_k1")
KL_ESTIMATORS.register("k2", _LOSS + "kl_k2")
KL_ESTIMATORS.register("k3", _LOSS + "kl_k3")
KL_ESTIMATORS.register("low_var_kl", _LOSS + "kl_low_var")

LOSS_AGG_MODES: Registry[Callable[..., Any]] = Registry("loss aggregation", "algo.loss_agg_mode")
LOSS_AGG_MODES.register("token_mean", _LOSS + "agg_token_sum")
LOSS_AGG_MODES.register("seq_mean_token_sum", _LOSS + "agg_token_sum")
LOSS_AGG_MODES.register("seq_mean_token_mean", _LOSS + "agg_token_mean")
LOSS_AGG_MODES.register("seq_mean_token_sum_norm", _LOSS + "agg_token_sum_norm")

_PREF = "reinforge.algo.preference:"
OFFLINE_METHODS: Registry[Callable[..., Any]] = Registry("offline method", "offline.method")
OFFLINE_METHODS.register("sft", _PREF + "sft_objective", data="messages", model="policy")
OFFLINE_METHODS.register("rm", _PREF + "reward_model_objective", data="pairs", model="reward")
OFFLINE_METHODS.register("dpo", _PREF + "dpo_objective", data="pairs", model="policy", reference=True)
OFFLINE_METHODS.register(
    "ipo", _PREF + "ipo_objective", data="pairs", model="policy", reference=True, length_normalized=True
)
OFFLINE_METHODS.register("cpo", _PREF + "cpo_objective", data="pairs", model="policy")
OFFLINE_METHODS.register("simpo", _PREF + "simpo_objective", data="pairs", model="policy", length_normalized=True)
OFFLINE_METHODS.register("orpo", _PREF + "orpo_objective", data="pairs", model="policy", length_normalized=True)
OFFLINE_METHODS.register("kto", _PREF + "kto_objective", data="unpaired", model="policy", reference=True)
OFFLINE_METHODS.register("gkd", _PREF + "gkd_objective", data="messages", model="policy", teacher=True)
