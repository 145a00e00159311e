"""The agent loop (``rollout.mode: agent``): the generate function ``reinforge.rollout.agent:generate``.

Per sample, one episode of ``agent.environment`` (:mod:`reinforge.envs`; default ``tools``, the
tool-calling environment): generate a turn -> parse its tool calls (``agent.tool_call_format``) ->
``env.step(turn)`` -> append the observation messages -> generate again, until the environment says
``done`` (for ``tools``: the model answered without a call), the model has had ``agent.max_turns``
turns, or the response budget (``params.max_new_tokens``, i.e. ``rollout.rollout_max_response_len``)
is spent.

Token in, token out: the sample's tokens are the prompt, then exactly the ids the engine sampled,
then the ids the chat template puts between that turn and the next (observation messages, turn
markers, the next generation prompt; :mod:`reinforge.rollout.chat_turns`), and so on; nothing is
ever re-tokenised. ``loss_mask`` is 1 on sampled ids and 0 on the others, whose
``rollout_log_probs`` are 0.0. The model's tool failures (bad arguments, a tool's error, a
timeout) become error messages for the model and are counted (:mod:`reinforge.tools.toolset`); they
never end the rollout. An environment that fails (raises, hangs past ``agent.env_timeout``, answers
malformed, calls ``os._exit`` or ``sys.exit``, gives a ``reset()`` prompt longer than the engine is
sized for: :func:`env_prompt_bound`), a sandbox that cannot start or an MCP server that stops, hangs
or is down (tool error kinds ``sandbox``, ``mcp_server``) ends the episode as an infrastructure
failure: the sample's status is ``failed``, its ``metadata["infra_failure"]`` says why
(``metadata["infra_failure_kind"]``: ``environment``, ``sandbox``, ``mcp_server``; counted by
:mod:`reinforge.rollout.infra_guard`), and the trainer leaves it out of its group's statistics and of
the loss (never a reward of 0 for the model).

Rewards: the sum of the environment's per-turn rewards and its final ``reward()`` when any is a
number (``sample.reward``); otherwise the configured reward scores the sample. Each model turn's
last token (its position in the response) is listed in ``sample.metadata["turn_ends"]``, beside
the stepped turns' rewards in ``sample.metadata["turn_rewards"]``: with ``agent.turn_reward:
discounted`` the token-level estimators place each turn's reward there
(:func:`reinforge.train.rollout_advantages.turn_reward_grids`).

With ``run.trace`` the first ``agent.trace_episodes`` episodes of each rollout are drawn turn by
turn, each on a track of its own (:mod:`reinforge.rollout.episode_trace`).

Per-sample numbers go to ``sample.metadata["rollout_stats"]`` (averaged into the rollout
metrics): ``agent/turns``, ``agent/tool_calls``, ``agent/tool_errors`` (and
``agent/tool_errors/<kind>``), ``agent/tool_time`` (seconds), ``agent/tool_tokens`` (masked
response tokens), ``agent/final_answer`` (1 when the last turn made no call),
``agent/infra_failures``, ``agent/overlong_prompts`` (a ``reset()`` prompt too long),
``agent/well_formed_call`` (1 when the sample called a tool and every call of it parsed), and the
environment's ``env/<key>`` numbers. The sandboxes an episode ran
(the ``python`` tool's, an environment's; :mod:`reinforge.sandbox.metrics`) give the fleet
metrics: ``sandbox/runs`` and ``sandbox/failures`` (summed over the rollout, ``rollout_totals``),
``sandbox/start_ms_p50`` and ``_p99`` (over every run of the rollout, ``rollout_values``). The calls are listed in
``sample.metadata["tool_calls"]``, the turns' rewards in ``sample.metadata["turn_rewards"]``, and
the final answer (the last turn's text when it made no call, else empty) in
``sample.metadata["final_answer"]``: the built-in rewards read that, not the whole response, so a
number a tool printed is never taken for the model's answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from dataclasses import dataclass, field
from typing import Any

from ..config import Config
from ..data.dataset import render_prompt
from ..envs import EnvContext, Environment, EnvironmentFailure, Step, Turn, load_environment
from ..records import FinishReason, GenerateRequest, Sample, SamplingParams, Status
from ..sandbox import Sandboxes
from ..sandbox import metrics as sandbox_metrics
from ..tools import ParsedMessage, ToolCallFormat, ToolSet, get_format
from ..tools.types import MCP_SERVER, SANDBOX_FAILURE
from ..utils import stall
from .chat_turns import TurnRenderer, template_has_tool_role, template_renders_tools
from .env_threads import EnvironmentExit, EnvThreads, exit_guard, install_exit_guard
from .episode_trace import EpisodeTrace, span
from .generate import STATS_KEY, TOTALS_KEY, VALUES_KEY, RolloutContext
from .infra_guard import KIND_KEY

CACHE_KEY = __name__
INFRA_ERRORS = (SANDBOX_FAILURE, MCP_SERVER)  # tool error kinds that fail the episode (infrastructure)
TRUNCATION_NOTE = "\n... [output truncated]"


async def generate(ctx: RolloutContext, sample: Sample, params: SamplingParams) -> Sample:
    """One multi-turn sample (slime's custom generate contract; module docstring)."""
    agent = ctx.cache.get(CACHE_KEY)
    if agent is None:
        agent = ctx.cache[CACHE_KEY] = Agent(ctx.config, ctx.tokenizer)
    return await agent.run(ctx, sample, params)


@dataclass
class PromptTools:
    """Where the tool schemas go in the prompt: ``schemas`` for the chat template's ``tools=``,
    or ``system_text`` to add to the system message (one of them, or neither)."""

    schemas: list[dict[str, Any]] | None = None
    system_text: str | None = None


def prompt_tools(cfg: Config, tokenizer: Any) -> PromptTools:
    """How the prompts present the environment's tools (``agent.tools`` for ``tools``;
    ``agent.tools_prompt``): ``template`` passes the schemas to the chat template, ``system``
    describes them in the system prompt in the format's words, ``auto`` takes the template when it
    renders ``tools=`` (SmolLM2's does not), ``none`` leaves the prompts alone. Nothing when the
    environment offers no tools.

    Raises:
        ValueError: ``template`` with a chat template that ignores ``tools=``, a tool that does not
            load, or an unknown ``agent.environment``.
    """
    a = cfg.agent
    if a.tools_prompt == "none":
        return PromptTools()
    if not (a.tools or a.mcp_servers) and a.environment == "tools":  # no agent configured: import nothing
        return PromptTools()
    schemas = load_environment(a.environment).tool_schemas(a)
    if not schemas:
        return PromptTools()
    renders = template_renders_tools(tokenizer, schemas)
    if a.tools_prompt == "template" and not renders:
        raise ValueError("agent.tools_prompt=template, but the chat template ignores tools=: use system or auto")
    if a.tools_prompt == "template" or (a.tools_prompt == "auto" and renders):
        return PromptTools(schemas=schemas)
    return PromptTools(system_text=get_format(a.tool_call_format).describe_tools(schemas))


def env_prompt_bound(cfg: Config) -> tuple[int, str] | None:
    """The longest prompt an environment's ``reset()`` may give, in tokens, and the key that sets
    it, when the agent loop plays an environment that overrides ``reset`` (its
    ``max_prompt_tokens``, else ``data.rollout_max_prompt_len``); None otherwise (the prompts
    are the data's). The engine's ``max_model_len`` makes room for it (``RLLoop``).

    Raises:
        ValueError: an unknown ``agent.environment``.
    """
    if cfg.rollout.mode != "agent":
        return None
    cls = load_environment(cfg.agent.environment)
    if cls.reset is Environment.reset:
        return None
    if cls.max_prompt_tokens is not None:
        return cls.max_prompt_tokens, f"{cls.__module__}.{cls.__qualname__}.max_prompt_tokens"
    return cfg.data.rollout_max_prompt_len, "data.rollout_max_prompt_len"


@dataclass
class Episode:
    """What one sample's episode accumulates: tokens after the prompt with their mask, log-probs
    and policy versions, the turns' rewards, the stats and the tool-call log."""

    tokens: list[int]
    mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    rewards: list[float | None] = field(default_factory=list)  # per stepped turn
    turn_ends: list[int] = field(default_factory=list)  # per model turn: response position of its last token
    final_reward: float | None = None
    final_answer: str = ""  # the last turn's text when it made no call (what built-in rewards read)
    calls: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, float] = field(
        default_factory=lambda: {
            "agent/turns": 0,
            "agent/tool_calls": 0,
            "agent/tool_errors": 0,
            "agent/tool_time": 0.0,
            "agent/tool_tokens": 0,
            "agent/final_answer": 0,
            "agent/infra_failures": 0,
        }
    )

    def add(self, ids: list[int], log_probs: list[float], versions: list[int], sampled: bool) -> None:
        self.tokens += ids
        self.mask += [int(sampled)] * len(ids)
        self.log_probs += log_probs
        self.versions += versions

    def count(self, key: str, value: float = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + value


class Agent:
    """The per-run part of the agent: environment class, tools, call format, turn renderer (built once
    per run); :meth:`run` plays one episode."""

    def __init__(self, cfg: Config, tokenizer: Any):
        self.config = cfg
        self.cfg = cfg.agent
        self.tokenizer = tokenizer
        self.env_class = load_environment(self.cfg.environment)
        # the run's: the python tool's and the environment's
        self.sandboxes = Sandboxes.from_config(cfg.sandbox, self.cfg.tool_timeout)
        self.tools = ToolSet.from_config(self.cfg, self.sandboxes)
        self.env_ctx = EnvContext(self.cfg, self.tools, dict(self.cfg.environment_kwargs), self.sandboxes)
        self.format: ToolCallFormat = get_format(self.cfg.tool_call_format)
        self.renderer = TurnRenderer(tokenizer)
        role = self.cfg.tool_role
        self.tool_role = ("tool" if template_has_tool_role(tokenizer) else "user") if role == "auto" else role
        self._specials = [t for t in tokenizer.all_special_tokens if t]
        self._threads = EnvThreads(self.cfg.tool_concurrency)
        self._prompt_bound = env_prompt_bound(cfg)
        install_exit_guard()
        self._prompt_tools: PromptTools | None = None

    async def run(self, ctx: RolloutContext, sample: Sample, params: SamplingParams) -> Sample:
        """One episode (module docstring), with the fleet metrics of the sandboxes it ran: their
        count and infrastructure failures (summed over the rollout) and start latencies (its
        percentiles), when it ran any."""
        with sandbox_metrics.recording() as runs:
            sample = await self._run(ctx, sample, params)
        if runs.runs:
            sample.metadata[TOTALS_KEY] = {"sandbox/runs": float(runs.runs), "sandbox/failures": float(runs.failures)}
            sample.metadata[VALUES_KEY] = {"sandbox/start_ms": runs.start_ms}
        return sample

    async def _run(self, ctx: RolloutContext, sample: Sample, params: SamplingParams) -> Sample:
        stall.SUBJECT.set(f"sample {sample.index}")  # named in the stall doctor's line (this episode's task)
        row = {"prompt": sample.prompt, "label": sample.label, "metadata": sample.metadata}
        ep = Episode(tokens=list(sample.tokens))
        status, version = Status.COMPLETED, sample.weight_version
        env = None
        tr, started = EpisodeTrace.maybe(sample.index, self.cfg.trace_episodes), time.perf_counter_ns()
        try:
            with span(tr, "env.reset", env=self.env_class.__name__):
                env = await self._env_call(self.env_class, row, self.env_ctx)
                first = await self._env_call(env.reset)
                if first is not None:
                    ep.tokens = self._render_prompt(ctx, self._checked_messages(first, "reset"))
                    self._check_prompt_length(len(ep.tokens), ep)
            prompt_len = len(ep.tokens)
            status, version = await self._play(ctx, env, ep, params, tr)
            with span(tr, "env.reward"):
                final = await self._env_call(env.reward)
            if final is not None and not isinstance(final, (int, float)):
                raise EnvironmentFailure(f"reward() returned {type(final).__name__}, not a number or None")
            ep.final_reward = final
        except (EnvironmentFailure, SandboxInfraError) as e:
            status = Status.FAILED
            sample.metadata["infra_failure"] = str(e)[:2000]
            sample.metadata[KIND_KEY] = getattr(e, "kind", "environment")  # counted by kind (infra_guard)
            ep.count("agent/infra_failures")
            prompt_len = len(ep.tokens) - len(ep.mask)
        finally:
            if env is not None:
                try:
                    with span(tr, "env.close"):
                        await self._env_call(env.close)
                except EnvironmentFailure as e:
                    sample.metadata.setdefault("env_close_error", str(e)[:2000])
        sample.tokens = ep.tokens
        sample.response_length = len(ep.mask)
        sample.loss_mask = ep.mask if status != Status.FAILED else [0] * len(ep.mask)
        sample.rollout_log_probs = ep.log_probs
        sample.response = self.tokenizer.decode(ep.tokens[prompt_len:], skip_special_tokens=True)
        sample.status = status
        sample.weight_version = ep.versions[0] if ep.versions else version
        sample.weight_versions = ep.versions if len(set(ep.versions)) > 1 else []
        given = [r for r in [*ep.rewards, ep.final_reward] if r is not None]
        if status == Status.FAILED:
            sample.reward = 0.0  # a placeholder: failed samples are left out of the statistics and the loss
        elif given:
            sample.reward = float(sum(given))
        sample.metadata["turn_rewards"] = ep.rewards
        sample.metadata["turn_ends"] = ep.turn_ends
        sample.metadata["final_answer"] = ep.final_answer
        ep.stats["agent/well_formed_call"] = float(
            ep.stats["agent/tool_calls"] > 0 and not ep.stats.get("agent/tool_errors/parse")
        )
        sample.metadata[STATS_KEY] = {k: float(v) for k, v in ep.stats.items()}
        sample.metadata["tool_calls"] = ep.calls
        if tr is not None:
            tr.add(
                "episode",
                started,
                time.perf_counter_ns(),
                sample=sample.index,
                group=sample.group_index,
                status=status.value,
                reward=sample.reward,
                turns=int(ep.stats["agent/turns"]),
            )
            tr.flush()
        return sample

    async def _play(
        self, ctx: RolloutContext, env: Environment, ep: Episode, params: SamplingParams, tr: EpisodeTrace | None = None
    ) -> tuple[Status, int]:
        """The turns of one episode; returns the sample's status and the last policy version."""
        a = self.cfg
        turn_params = dataclasses.replace(params, stop=list(params.stop))
        if a.stop_after_tool_call:
            turn_params.stop += [s for s in self.format.stop if s not in turn_params.stop]
        while True:
            with span(tr, "turn", index=int(ep.stats["agent/turns"])):
                done = await self._turn(ctx, env, ep, params, turn_params, tr)
            if done is not None:
                return done

    async def _turn(
        self,
        ctx: RolloutContext,
        env: Environment,
        ep: Episode,
        params: SamplingParams,
        turn_params: SamplingParams,
        tr: EpisodeTrace | None,
    ) -> tuple[Status, int] | None:
        """One model turn and the environment's answer; the episode's (status, version) when it
        ends here, None when another turn follows."""
        a, tok, budget = self.cfg, self.tokenizer, params.max_new_tokens
        room = budget - len(ep.mask)
        request = GenerateRequest(
            list(ep.tokens), dataclasses.replace(turn_params, max_new_tokens=min(room, a.max_turn_tokens or room))
        )
        with span(tr, "model.generate") as args:
            (res,) = await ctx.async_engine.generate(request)
            args.update(
                tokens=len(res.token_ids),
                finish=res.finish_reason.value,
                last_token=len(ep.mask) + len(res.token_ids) - 1,
            )
        ep.count("agent/turns")
        version = res.weight_version
        ep.add(res.token_ids, list(res.log_probs), res.token_versions or [version] * len(res.token_ids), True)
        ep.turn_ends.append(len(ep.mask) - 1)  # where this turn's reward goes (agent.turn_reward: discounted)
        if res.finish_reason == FinishReason.ABORT:
            return Status.ABORTED, version
        ended_by_token = (
            res.finish_reason == FinishReason.STOP
            and bool(res.token_ids)
            and res.token_ids[-1] in params.stop_token_ids
        )
        text = tok.decode(res.token_ids[:-1] if ended_by_token else res.token_ids, skip_special_tokens=False)
        parsed = self._parse(text)
        finished = Status.COMPLETED if res.finish_reason == FinishReason.STOP else Status.TRUNCATED
        if not parsed.is_final and len(ep.mask) >= budget:  # a call that cannot be answered: not stepped
            return Status.TRUNCATED, version
        if not parsed.is_final and ep.stats["agent/turns"] >= a.max_turns:
            return finished, version
        index = int(ep.stats["agent/turns"]) - 1
        with span(tr, "env.step", env=type(env).__name__, calls=len(parsed.calls)) as args:
            stepped = time.perf_counter_ns()
            step = self._checked_step(await self._env_call(env.step, Turn(text, parsed.calls, parsed.errors, index)))
            args.update(reward=step.reward, done=step.done)
            if tr is not None:
                for r in step.tool_results:
                    tr.add(f"tool {r.name or '?'}", stepped, stepped + int(r.seconds * 1e9), error=r.error)
        ep.rewards.append(step.reward)
        self._count(ep, step)
        if step.done:
            ep.stats["agent/final_answer"] = float(parsed.is_final)
            ep.final_answer = self.tokenizer.decode(res.token_ids, skip_special_tokens=True) if parsed.is_final else ""
            return finished, version
        if len(ep.mask) >= budget:
            return Status.TRUNCATED, version
        if ep.stats["agent/turns"] >= a.max_turns:
            return finished, version
        ended_with = tok.decode(res.token_ids[-1:]) if ended_by_token else None
        with span(tr, "observation") as args:
            delta = self.renderer.append_ids(self._observations(step.messages), ended_with)
            args["tokens"] = len(delta)
        if len(ep.mask) + len(delta) >= budget:  # no room for the observation and a further turn
            return Status.TRUNCATED, version
        ep.add(delta, [0.0] * len(delta), [version] * len(delta), False)
        ep.count("agent/tool_tokens", len(delta))
        return None

    def _count(self, ep: Episode, step: Step) -> None:
        for r in step.tool_results:
            if r.error in INFRA_ERRORS:  # the sandbox or MCP server, not the model: the episode is not scored
                raise SandboxInfraError(r.output, r.error)
            ep.count("agent/tool_calls")
            ep.count("agent/tool_time", r.seconds)
            if r.error:
                ep.count("agent/tool_errors")
                ep.count(f"agent/tool_errors/{r.error}")
            ep.calls.append({"name": r.name, "arguments": r.arguments, "output": r.output, "error": r.error})
        for k, v in step.info.items():
            ep.stats[f"env/{k}"] = float(v)

    async def _env_call(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` of the environment, within ``agent.env_timeout``: awaited when it is
        async, in a daemon thread of its own otherwise (:mod:`.env_threads`: a hung call costs only
        its episode, and is never waited for at exit). ``os._exit`` and ``sys.exit`` called by the
        environment's code here end its episode, not the trainer.

        Raises:
            EnvironmentFailure: it raised, exited or timed out (the message names the method).
        """
        name = getattr(fn, "__qualname__", repr(fn))
        busy = stall.busy("env", name)  # the stall doctor's view: which environment call runs since when
        try:
            with exit_guard(name):
                if inspect.iscoroutinefunction(fn):
                    return await asyncio.wait_for(_no_exit(fn(*args), name), self.cfg.env_timeout)
                out = await self._threads.call(fn, args, self.cfg.env_timeout)
                if inspect.isawaitable(out):
                    return await asyncio.wait_for(_no_exit(out, name), self.cfg.env_timeout)
                return out
        except asyncio.TimeoutError:  # TimeoutError from 3.11 on; a class of its own in 3.10
            raise EnvironmentFailure(
                f"{name} did not return within agent.env_timeout={self.cfg.env_timeout:g} s"
            ) from None
        except (EnvironmentFailure, SandboxInfraError):
            raise
        except (EnvironmentExit, SystemExit) as e:
            how = e.how if isinstance(e, EnvironmentExit) else "sys.exit"
            raise EnvironmentFailure(f"{name} called {how}({e.code}): it ends its episode, not the trainer") from None
        except Exception as e:  # noqa: BLE001 - an environment's bug is the episode's infrastructure failure
            raise EnvironmentFailure(f"{name} raised {type(e).__name__}: {str(e)[:500]}") from e
        finally:
            busy.close()

    def _check_prompt_length(self, n: int, ep: Episode) -> None:
        """Refuse a ``reset()`` prompt longer than the engine is sized for (:func:`env_prompt_bound`).

        Raises:
            EnvironmentFailure: the prompt is longer (counted in ``agent/overlong_prompts``).
        """
        bound = self._prompt_bound
        if bound is not None and n > bound[0]:
            ep.count("agent/overlong_prompts")
            raise EnvironmentFailure(
                f"reset() gave a prompt of {n} tokens, longer than the {bound[0]} the engine is sized for: "
                f"raise {bound[1]} (to {n} or more)"
            )

    @staticmethod
    def _checked_messages(messages: Any, where: str) -> list[dict[str, Any]]:
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise EnvironmentFailure(
                f"{where}: messages must be a list of {{'role': str, 'content': str}} dicts, got {str(messages)[:200]}"
            )
        return messages

    def _checked_step(self, step: Any) -> Step:
        if not isinstance(step, Step):
            raise EnvironmentFailure(f"step() returned {type(step).__name__}, not a reinforge.envs.Step")
        self._checked_messages(step.messages, "step()")
        if step.reward is not None and not isinstance(step.reward, (int, float)):
            raise EnvironmentFailure(f"step() returned a reward of type {type(step.reward).__name__}")
        return step

    def _render_prompt(self, ctx: RolloutContext, messages: list[dict[str, Any]]) -> list[int]:
        """The ids of an environment's initial messages, with the tools presented as the data's prompts."""
        if self._prompt_tools is None:
            self._prompt_tools = prompt_tools(self.config, self.tokenizer)
        pt = self._prompt_tools
        text = render_prompt(self.tokenizer, messages, True, self.config.data.system_prompt, pt.schemas, pt.system_text)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def close(self) -> None:
        self.tools.close()

    def _parse(self, text: str) -> ParsedMessage:
        """The calls of one turn; a format that raises (a plug-in's bug, input it did not expect)
        gives a parse error for the model, never an exception that ends the rollout."""
        try:
            return self.format.parse(text)
        except Exception as e:  # noqa: BLE001 - any failure to read the turn is the turn's parse error
            return ParsedMessage(errors=[f"the tool call could not be read ({type(e).__name__}: {str(e)[:200]})"])

    def _observations(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages shown to the model, cut (:meth:`_clip`); ``tool`` messages as the template
        shows them: kept for a template with a tool role, otherwise consecutive ones merged into one
        message of ``agent.tool_role`` holding each output in the format's result tags."""
        out: list[dict[str, Any]] = []
        for m in messages:
            content = self._clip(m["content"])
            if m["role"] != "tool" or self.tool_role == "tool":
                out.append({**m, "content": content})
            elif out and out[-1].get("_tools"):
                out[-1]["content"] += "\n" + self.format.wrap_result(content)
            else:
                out.append({"role": self.tool_role, "content": self.format.wrap_result(content), "_tools": True})
        return [{k: v for k, v in m.items() if k != "_tools"} for m in out]

    def _clip(self, output: str) -> str:
        """An observation without special-token strings (removed until none is left, so nested ones
        such as ``<|im_<|im_end|>end|>`` go too; and :meth:`TurnRenderer.append_ids` tokenises it
        as plain text anyway: it cannot end a turn) and cut to
        ``agent.tool_output_max_tokens`` tokens (a huge one is cut in characters first, so that it is
        never tokenised whole)."""
        limit = self.cfg.tool_output_max_tokens
        output = output[: limit * 32]
        while any(t in output for t in self._specials):  # to a fixed point: <|im_<|im_end|>end|> is gone too
            for t in self._specials:
                output = output.replace(t, "")
        ids = self.tokenizer(output, add_special_tokens=False)["input_ids"]
        if len(ids) <= limit:
            return output
        return self.tokenizer.decode(ids[:limit]) + TRUNCATION_NOTE


async def _no_exit(awaitable: Any, name: str) -> Any:
    """``await awaitable``, with a ``SystemExit`` it raises turned into :class:`EnvironmentExit`
    (asyncio re-raises a task's ``SystemExit`` out of the event loop, ending the rollout)."""
    try:
        return await awaitable
    except SystemExit as e:
        raise EnvironmentExit(name, e.code, "sys.exit") from None


class SandboxInfraError(RuntimeError):
    """A tool call's sandbox failed to start, or its MCP server stopped, hung or is down (``kind``:
    the tool error kind, ``sandbox`` or ``mcp_server``): the episode ends as an infrastructure failure."""

    def __init__(self, message: str, kind: str = SANDBOX_FAILURE):
        super().__init__(message)
        self.kind = kind
