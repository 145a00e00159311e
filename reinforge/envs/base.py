"""The environment interface of multi-turn (agentic) rollouts.

An :class:`Environment` is one episode, made per sample from its data row (gym's
``reset``/``step``; prime-rl's ``verifiers`` ``MultiTurnEnv``; SkyRL-gym). The agent loop
(:mod:`reinforge.rollout.agent`) drives it::

    env = EnvClass(row, ctx)                  # row: the sample's prompt, label, metadata
    messages = await env.reset()              # None: the data row's prompt, as rendered
    while True:
        text = <the model's turn>             # exactly the ids the engine sampled
        step = await env.step(Turn(text, calls, errors, index))
        if step.done: break
        <step.messages rendered by the chat template, masked out of the loss>
    reward = await env.reward()               # None: the configured reward scores the sample
    await env.close()

The sample's reward is the sum of the per-turn rewards (``Step.reward``) and the final
``reward()`` when any of them is a number; when all are None the configured reward
(``reward.type``) scores the sample as for any other rollout. With ``agent.turn_reward:
discounted`` (``reinforce_plus_plus``, ``gae``) each turn's reward is instead placed at the last
token of that turn's model output, discounted by ``agent.turn_discount`` per turn.

Methods may be ``async`` or plain (a plain one runs in a daemon thread of its own,
:mod:`reinforge.rollout.env_threads`: one that hangs costs only its episode). Whatever an
environment does wrong (raises, exceeds ``agent.env_timeout``, returns something that is not a
:class:`Step` of chat messages, calls ``os._exit`` or ``sys.exit``, gives a ``reset()`` prompt
longer than :attr:`Environment.max_prompt_tokens`) is an :class:`EnvironmentFailure`: the sample
is marked failed (infrastructure, not the model's doing), dropped from its group's statistics and
counted; the run goes on. Observations are cut to ``agent.tool_output_max_tokens`` tokens like
tool outputs, and can hold no special token.

Environments are registered in :data:`ENVIRONMENTS` or loaded from a ``module:Class`` path
(``agent.environment``); ``agent.environment_kwargs`` reach the constructor as ``ctx.kwargs``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..sandbox import Sandboxes
from ..tools import ToolCall, ToolResult, ToolSet
from ..utils.registry import Registry, did_you_mean

if TYPE_CHECKING:
    from ..config.agent import AgentConfig


class EnvironmentFailure(RuntimeError):
    """The environment failed (raised, hung, answered malformed): infrastructure, not the model."""


@dataclass
class Turn:
    """One model turn as the environment receives it: the decoded ``text`` (special tokens kept,
    the end-of-turn token dropped), the tool ``calls`` parsed from it (``agent.tool_call_format``),
    the ``errors`` of calls that could not be parsed, and its 0-based ``index``."""

    text: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    index: int = 0

    @property
    def is_final(self) -> bool:
        """No call was attempted: an answer."""
        return not self.calls and not self.errors


@dataclass
class Step:
    """The environment's answer to a turn: observation ``messages`` (chat messages: ``role`` and
    string ``content``; ``role: tool`` messages are shown the way the chat template shows tool
    outputs), this turn's ``reward`` (None: none), ``done`` (the episode ends; the messages are then
    not shown), ``tool_results`` (counted in the ``agent/tool_*`` metrics) and ``info`` (numbers
    averaged into the rollout metrics as ``env/<key>``)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    reward: float | None = None
    done: bool = False
    tool_results: list[ToolResult] = field(default_factory=list)
    info: dict[str, float] = field(default_factory=dict)


@dataclass
class EnvContext:
    """What the run gives every episode: the ``agent`` config section, the run's :class:`ToolSet`
    (``agent.tools``), ``kwargs`` (``agent.environment_kwargs``) and the run's
    :class:`~reinforge.sandbox.Sandboxes` (limits and slots shared by all episodes and the ``python``
    tool; None: the defaults of the ``sandbox`` section with ``agent.tool_timeout``)."""

    agent: AgentConfig
    tools: ToolSet
    kwargs: dict[str, Any] = field(default_factory=dict)
    sandboxes: Sandboxes = None  # type: ignore[assignment]  # None -> the defaults

    def __post_init__(self) -> None:
        if self.sandboxes is None:
            self.sandboxes = Sandboxes.from_config(None, self.agent.tool_timeout)


class Environment:
    """Base class of environments (module docstring). Subclasses override :meth:`step` and any of
    the others; the constructor receives the data ``row`` (``prompt``, ``label``, ``metadata``)
    and the :class:`EnvContext`."""

    max_prompt_tokens: int | None = None
    """The longest prompt :meth:`reset` gives, in tokens (its messages after the chat template and
    the tool schemas), when it gives one; None: ``data.rollout_max_prompt_len``. The engine is
    sized for prompts of this length; an episode whose prompt is longer fails (infrastructure, the
    message names the key to raise), the run goes on."""

    def __init__(self, row: dict[str, Any], ctx: EnvContext):
        self.row = row
        self.ctx = ctx

    @classmethod
    def tool_schemas(cls, agent: AgentConfig) -> list[dict[str, Any]]:
        """The function-calling schemas the prompts present (``agent.tools_prompt``): by default
        those of ``agent.tools``."""
        from ..tools import load_tools

        return [t.schema for t in load_tools(agent.tools, agent)]

    async def reset(self) -> list[dict[str, Any]] | None:
        """Initial messages of the episode (rendered with the chat template and the tool schemas,
        replacing the data row's prompt), or None to keep the prompt as the data pipeline rendered it."""
        return None

    async def step(self, turn: Turn) -> Step:
        raise NotImplementedError

    async def reward(self) -> float | None:
        """The episode's final reward (added to the per-turn rewards), or None."""
        return None

    async def close(self) -> None:
        """Release the episode's resources (always called, also after a failure)."""


ENVIRONMENTS: Registry[type[Environment]] = Registry("environment", "agent.environment")
ENVIRONMENTS.register("tools", "reinforge.envs.tool_env:ToolEnv")
ENVIRONMENTS.register("swe", "reinforge.envs.swe:SweEnv")


def load_environment(spec: str) -> type[Environment]:
    """The environment class of ``agent.environment``: a registered name or a ``module:Class`` path.

    Raises:
        ValueError: an unknown name, a path that does not import, or not an :class:`Environment`
            subclass (the message names ``agent.environment``).
    """
    if ":" in spec:
        from ..utils.imports import load_function

        cls = load_function(spec, "agent.environment")
    elif spec in ENVIRONMENTS:
        cls = ENVIRONMENTS.get(spec)
    else:
        raise ValueError(
            f"agent.environment: unknown environment {spec!r}{did_you_mean(spec, ENVIRONMENTS.names())}; registered: "
            f"{', '.join(ENVIRONMENTS.names())} (or give a 'module:Class' path)"
        )
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ValueError(f"agent.environment={spec!r} is not a subclass of reinforge.envs.Environment")
    return cls
