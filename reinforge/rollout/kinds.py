"""The kinds of rollout (``rollout.mode``), registered: how the samples of one rollout are made.

- ``default``: one engine request per prompt group, every sample run to its end
  (:func:`~reinforge.rollout.generate.default_rollout`);
- ``over_sampling``: ``rollout.over_sampling_batch_size`` prompts in flight, generation stopped once
  ``rollout_batch_size`` groups are complete (:class:`~reinforge.rollout.over_sampling.OverSampledRollout`;
  docs/design.md#over-sampling-and-early-stop);
- ``agent``: multi-turn episodes with tools and an environment (the ``agent`` section), each sample
  made by the agent loop's generate function (:func:`reinforge.rollout.agent.generate`; docs/agents.md).

Properties the config reads (through ``reinforge.config.fields.registry``; the config sits below
``rollout``): ``generate``, the ``module:function`` that makes each sample (it becomes
``rollout.custom_generate_function_path``); ``needs``, a ``rollout`` key the kind cannot run without;
``own_requests``, it makes the engine requests itself (no custom rollout or generate function with it).
A rollout kind of your own is a ``rollout.rollout_function_path`` or ``custom_generate_function_path``.
"""

from __future__ import annotations

from typing import Any

from ..utils.registry import Registry

AGENT_LOOP = "reinforge.rollout.agent:generate"

ROLLOUT_KINDS: Registry[Any] = Registry("rollout kind", "rollout.mode")
ROLLOUT_KINDS.register("default", "reinforge.rollout.generate:default_rollout")
ROLLOUT_KINDS.register(
    "over_sampling",
    "reinforge.rollout.over_sampling:OverSampledRollout",
    needs="over_sampling_batch_size",
    own_requests=True,
)
ROLLOUT_KINDS.register("agent", AGENT_LOOP, generate=AGENT_LOOP)
