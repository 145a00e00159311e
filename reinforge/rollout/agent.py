"""The tool-using agent: ``rollout.custom_generate_function_path: reinforge.rollout.agent:generate``.

Per sample: generate -> parse tool calls (``agent.tool_call_format``) -> run the tools -> append
their outputs as tool messages -> generate again, until the model answers without a call, it has
had ``agent.max_turns`` turns, or the response budget (``params.max_new_tokens``, i.e.
``rollout.rollout_max_response_len``) is spent.

Token in, token out: the sample's tokens are the prompt, then exactly the ids the engine sampled,
then the ids the chat template puts between that turn and the next (tool messages, turn markers,
the next generation prompt; :mod:`reinforge.rollout.chat_turns`), and so on; nothing is ever
re-tokenised. ``loss_mask`` is 1 on sampled ids and 0 on the others, whose
``rollout_log_probs`` are 0.0. Tool failures of any kind become error messages for the model and
are counted (:mod:`reinforge.tools.toolset`); they never end the rollout.

Per-sample numbers go to ``sample.metadata["rollout_stats"]`` (averaged into the rollout
metrics): ``agent/turns``, ``agent/tool_calls``, ``agent/tool_errors`` (and
``agent/tool_errors/<kind>``), ``agent/tool_time`` (seconds), ``agent/tool_tokens`` (masked
response tokens), ``agent/final_answer`` (1 when the last turn made no call). The calls are listed
in ``sample.metadata["tool_calls"]``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from ..config import Config
from ..tools import ParsedMessage, ToolCallFormat, ToolResult, ToolSet, get_format, load_tools
from ..tools.toolset import PARSE
from .chat_turns import TurnRenderer, template_has_tool_role, template_renders_tools
from .generate import STATS_KEY, RolloutContext
from ..records import FinishReason, GenerateRequest, Sample, SamplingParams, Status

CACHE_KEY = __name__
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
    """How the prompts present ``agent.tools`` (``agent.tools_prompt``): ``template`` passes the
    schemas to the chat template, ``system`` describes them in the system prompt in the format's
    words, ``auto`` takes the template when it renders ``tools=`` (SmolLM2's does not), ``none``
    leaves the prompts alone. Nothing when no tools are configured.

    Raises:
        ValueError: ``template`` with a chat template that ignores ``tools=``, or a tool that
            does not load.
    """
    a = cfg.agent
    if not a.tools or a.tools_prompt == "none":
        return PromptTools()
    schemas = [t.schema for t in load_tools(a.tools, a)]
    renders = template_renders_tools(tokenizer, schemas)
    if a.tools_prompt == "template" and not renders:
        raise ValueError("agent.tools_prompt=template, but the chat template ignores tools=: use system or auto")
    if a.tools_prompt == "template" or (a.tools_prompt == "auto" and renders):
        return PromptTools(schemas=schemas)
    return PromptTools(system_text=get_format(a.tool_call_format).describe_tools(schemas))


class Agent:
    """The per-run part of the agent: tools, call format, turn renderer (built once per run)."""

    def __init__(self, cfg: Config, tokenizer: Any):
        self.cfg = cfg.agent
        self.tokenizer = tokenizer
        self.tools = ToolSet.from_config(self.cfg)
        self.format: ToolCallFormat = get_format(self.cfg.tool_call_format)
        self.renderer = TurnRenderer(tokenizer)
        role = self.cfg.tool_role
        self.tool_role = ("tool" if template_has_tool_role(tokenizer) else "user") if role == "auto" else role
        self._specials = [t for t in tokenizer.all_special_tokens if t]

    async def run(self, ctx: RolloutContext, sample: Sample, params: SamplingParams) -> Sample:
        a, tok = self.cfg, self.tokenizer
        budget = params.max_new_tokens
        turn_params = dataclasses.replace(params, stop=list(params.stop))
        if a.stop_after_tool_call:
            turn_params.stop += [s for s in self.format.stop if s not in turn_params.stop]
        tokens = list(sample.tokens)
        mask: list[int] = []
        log_probs: list[float] = []
        versions: list[int] = []  # policy version of each response token (asynchronous RL: turns may differ)
        stats = {"agent/turns": 0, "agent/tool_calls": 0, "agent/tool_errors": 0, "agent/tool_time": 0.0,
                 "agent/tool_tokens": 0, "agent/final_answer": 0}
        calls_log: list[dict[str, Any]] = []
        status, version = Status.COMPLETED, sample.weight_version
        while True:
            room = budget - len(mask)
            request = GenerateRequest(list(tokens), dataclasses.replace(
                turn_params, max_new_tokens=min(room, a.max_turn_tokens or room)))
            (res,) = await ctx.async_engine.generate(request)
            stats["agent/turns"] += 1
            tokens += res.token_ids
            mask += [1] * len(res.token_ids)
            log_probs += res.log_probs
            version = res.weight_version
            versions += res.token_versions or [res.weight_version] * len(res.token_ids)
            if res.finish_reason == FinishReason.ABORT:
                status = Status.ABORTED
                break
            ended_by_token = (res.finish_reason == FinishReason.STOP and bool(res.token_ids)
                              and res.token_ids[-1] in params.stop_token_ids)
            text = tok.decode(res.token_ids[:-1] if ended_by_token else res.token_ids, skip_special_tokens=False)
            parsed = self._parse(text)
            if parsed.is_final:
                stats["agent/final_answer"] = 1
                status = Status.COMPLETED if res.finish_reason == FinishReason.STOP else Status.TRUNCATED
                break
            if len(mask) >= budget:
                status = Status.TRUNCATED
                break
            if stats["agent/turns"] >= a.max_turns:
                break
            results = [ToolResult.failure(None, PARSE, f"{e}") for e in parsed.errors]
            results += await asyncio.gather(*(self.tools.call(c) for c in parsed.calls))
            for r, c in zip(results, [None] * len(parsed.errors) + parsed.calls):
                stats["agent/tool_calls"] += 1
                stats["agent/tool_time"] += r.seconds
                if r.error:
                    stats["agent/tool_errors"] += 1
                    key = f"agent/tool_errors/{r.error}"
                    stats[key] = stats.get(key, 0) + 1
                calls_log.append({"name": r.name, "arguments": None if c is None else c.arguments,
                                  "output": r.output, "error": r.error})
            outputs = [self._clip(r.output) for r in results]
            ended_with = tok.decode(res.token_ids[-1:]) if ended_by_token else None
            delta = self.renderer.append_ids(self._messages(results, outputs), ended_with)
            if len(mask) + len(delta) >= budget:  # no room for the tool output and a further turn
                status = Status.TRUNCATED
                break
            tokens += delta
            mask += [0] * len(delta)
            log_probs += [0.0] * len(delta)
            versions += [version] * len(delta)
            stats["agent/tool_tokens"] += len(delta)
        sample.tokens = tokens
        sample.response_length = len(mask)
        sample.loss_mask = mask
        sample.rollout_log_probs = log_probs
        sample.response = tok.decode(tokens[len(tokens) - len(mask):], skip_special_tokens=True)
        sample.status = status
        sample.weight_version = versions[0] if versions else version
        sample.weight_versions = versions if len(set(versions)) > 1 else []
        sample.metadata[STATS_KEY] = {k: float(v) for k, v in stats.items()}
        sample.metadata["tool_calls"] = calls_log
        return sample

    def close(self) -> None:
        self.tools.close()

    def _parse(self, text: str) -> ParsedMessage:
        """The calls of one turn; a format that raises (a plug-in's bug, input it did not expect)
        gives a parse error for the model, never an exception that ends the rollout."""
        try:
            return self.format.parse(text)
        except Exception as e:  # noqa: BLE001 - any failure to read the turn is the turn's parse error
            return ParsedMessage(errors=[f"the tool call could not be read ({type(e).__name__}: {str(e)[:200]})"])

    def _messages(self, results: list[ToolResult], outputs: list[str]) -> list[dict[str, Any]]:
        """Tool messages: one per result for the ``tool`` role; otherwise one message of that role
        holding every result wrapped in the format's result tags."""
        if self.tool_role == "tool":
            return [{"role": "tool", "name": r.name or "", "content": o} for r, o in zip(results, outputs)]
        return [{"role": self.tool_role, "content": "\n".join(self.format.wrap_result(o) for o in outputs)}]

    def _clip(self, output: str) -> str:
        """A tool output without special-token strings (a tool cannot end a turn) and cut to
        ``agent.tool_output_max_tokens`` tokens."""
        for t in self._specials:
            output = output.replace(t, "")
        limit = self.cfg.tool_output_max_tokens
        ids = self.tokenizer(output, add_special_tokens=False)["input_ids"]
        if len(ids) <= limit:
            return output
        return self.tokenizer.decode(ids[:limit]) + TRUNCATION_NOTE
