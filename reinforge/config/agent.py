"""The ``agent`` section: multi-turn rollouts with tools and environments (docs/agents.md).

Its registries are read by name, as the other sections' are: the config sits below ``tools`` and
``envs`` and imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..utils.registry import did_you_mean
from .fields import ConfigError, Section, check_function_path, opt, registered
from .mcp import parse_server_specs, require_sdk

TOOL_CALL_FORMATS = registered("reinforge.tools.formats:TOOL_CALL_FORMATS")
ENVIRONMENTS = registered("reinforge.envs.base:ENVIRONMENTS")
TOOLS = registered("reinforge.tools.toolset:TOOLS")


@dataclass
class AgentConfig(Section):
    """Multi-turn rollouts with tools, read by `rollout.mode: agent` (see [agents.md](agents.md)). A
    sample's whole response (every turn plus the tool outputs) is bounded by `rollout.rollout_max_response_len`
    (`eval.eval_max_response_len` in evaluation). Setting `agent.environment` (other than `tools`),
    `agent.tools` or `agent.mcp_servers` switches the agent loop on (`rollout.mode: agent`) when no
    custom generate or rollout function is set."""

    name = "agent"
    environment: str = opt(
        "tools",
        "the episode's environment: a registered name (`tools`: the model calls "
        "`agent.tools` until it answers without a call; `swe`: fix the bug of a small repository, "
        "[agents.md](agents.md#the-swe-environment)) or a `module:Class` path of a "
        "`reinforge.envs.Environment` subclass ([agents.md](agents.md#environments))",
    )
    environment_kwargs: dict[str, Any] = opt({}, "keyword settings of the environment (its docstring lists them)")
    env_timeout: float = opt(
        60.0,
        "seconds an environment's `reset`, `step`, `reward` or `close` may take; past "
        "it, or when it raises, the sample is an infrastructure failure (left out of the "
        "statistics, never scored 0)",
        gt=0,
    )
    tools: list[str] = opt(
        [],
        "tools the model may call: registered names (`calculator`, `python`) or "
        "`module:function` paths of plain functions with type hints and a Google-style docstring",
    )
    mcp_servers: list[dict[str, Any]] = opt(
        [],
        "MCP servers (stdio) whose tools the model may call beside `tools`: a list of `{name, command, args, env, "
        "cwd, tools, prefix, startup_timeout, max_restarts}` ([agents.md](agents.md#mcp-tools)); your own trusted "
        "processes, not sandboxed. A server that stops, hangs or is down during a call fails the sample "
        "(infrastructure: left out of the statistics, never scored 0)",
    )
    tool_call_format: str = opt(
        "hermes",
        "how calls are written: `hermes` (`<tool_call>{json}</tool_call>`, Qwen), `llama3_json`",
        choices=TOOL_CALL_FORMATS,
    )
    max_turns: int = opt(4, "model turns (generations) per sample at most; the last one may not call a tool", ge=1)
    max_turn_tokens: int | None = opt(
        None, "new tokens per model turn at most (`null`: what is left of the response budget)", ge=1
    )
    tool_timeout: float = opt(
        10.0,
        "seconds per tool call (the `python` tool's process is killed after this); an MCP call past it is the "
        "model's `timeout` while its server answers a ping within it, else `mcp_server` (infrastructure)",
        gt=0,
    )
    tool_output_max_tokens: int = opt(256, "a tool output longer than this many tokens is cut", ge=1)
    tool_role: str = opt(
        "auto",
        "chat role of tool outputs: `auto` = `tool` when the chat template handles tool "
        "messages, else `user` (outputs wrapped in the format's result tags); or a role name",
    )
    tools_prompt: Literal["auto", "template", "system", "none"] = opt(
        "auto",
        "where the tool schemas go: `template` (the chat template's `tools=`), `system` (described in the "
        "system prompt), `auto` (template when it renders them, else system), `none` (your prompts describe them)",
    )
    stop_after_tool_call: bool = opt(
        True, "end a turn where a call closes (`</tool_call>`), so the model does not write the tool's answer itself"
    )
    tool_concurrency: int = opt(
        8,
        "threads running plain-function tools; also the plain environment methods running at once "
        "(each in a thread of its own; one abandoned at `agent.env_timeout` frees its place)",
        ge=1,
    )
    turn_reward: Literal["sum", "discounted"] = opt(
        "sum",
        "how an environment's per-turn rewards reach the advantage estimator: `sum` (added into the "
        "sample's reward, every estimator) or `discounted` (each turn's reward at the last token of that "
        "turn's model output, returns discounted by `agent.turn_discount` per turn; token-level estimators "
        "only: `reinforce_plus_plus`, `gae`) ([agents.md](agents.md#per-turn-rewards))",
    )
    turn_discount: float = opt(
        1.0, "`turn_reward: discounted`: discount per turn (times `algo.gamma` per token)", ge=0, le=1
    )
    trace_episodes: int = opt(
        1,
        "with `run.trace`, the episodes of each rollout drawn turn by turn in the trace (samples 0 .. n-1 of "
        "the rollout; each on its own track: generation, environment step, tool calls); 0: none",
        ge=0,
    )

    def check(self) -> None:
        for i, spec in enumerate(self.tools):
            if ":" in spec:
                check_function_path(f"agent.tools[{i}]", spec)
            elif spec not in TOOLS():
                raise ConfigError(
                    f"agent.tools[{i}]: unknown tool {spec!r}{did_you_mean(spec, list(TOOLS()))}; registered: "
                    f"{', '.join(TOOLS())} "
                    f"(or write 'package.module:function')"
                )
        if self.turn_reward == "sum" and self.turn_discount != 1.0:
            raise ConfigError(
                f"agent.turn_discount={self.turn_discount:g} applies with agent.turn_reward=discounted; "
                f"with `sum` the turns' rewards are added undiscounted: set turn_reward=discounted or remove it"
            )
        if not self.tool_role.strip():
            raise ConfigError("agent.tool_role must be `auto` or a role name")
        if self.mcp_servers:
            try:
                parse_server_specs(self.mcp_servers)
                require_sdk()
            except ValueError as e:
                raise ConfigError(str(e)) from None
        if ":" in self.environment:
            check_function_path("agent.environment", self.environment)
        elif self.environment not in ENVIRONMENTS():
            raise ConfigError(
                f"agent.environment: unknown environment {self.environment!r}"
                f"{did_you_mean(self.environment, list(ENVIRONMENTS()))}; registered: "
                f"{', '.join(ENVIRONMENTS())} (or write 'package.module:Class')"
            )
