"""Tool-call formats: how a model writes a call, how a result is shown to it, how tools are described.

Each format is registered in :data:`TOOL_CALL_FORMATS` under the name vLLM's tool parsers use:

* ``hermes`` (Qwen2.5 / Qwen3 / Hermes): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  one block per call; results are shown as ``<tool_response>...</tool_response>``.
* ``llama3_json`` (Llama 3.1 / 3.2): the whole message is ``{"name": ..., "parameters": {...}}``
  (optionally after ``<|python_tag|>``; several calls separated by ``;``).

A message with no call is the final answer. A call that cannot be decoded (bad JSON, nesting too
deep for the decoder, no name, an unclosed tag) is reported as a parse error, which the agent turns
into an error message for the model (it is not a final answer); ``parse`` never raises for any text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..utils.registry import Registry
from .types import ToolCall


@dataclass
class ParsedMessage:
    """The tool calls found in one assistant message, and the malformed ones (one message each)."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def is_final(self) -> bool:
        """No call was attempted: the message is an answer."""
        return not self.calls and not self.errors


class ToolCallFormat:
    """Base of the formats. ``stop`` are strings that end a call: with ``agent.stop_after_tool_call``
    generation stops there, so the model does not go on to write the tool's answer itself."""

    name = ""
    stop: list[str] = []

    def parse(self, text: str) -> ParsedMessage:
        raise NotImplementedError

    def wrap_result(self, output: str) -> str:
        """A tool output as it is shown in a message of a role other than ``tool`` (the chat
        templates that have a tool role wrap it themselves)."""
        return output

    def describe_tools(self, schemas: list[dict[str, Any]]) -> str:
        """System-prompt text listing the tools and the call syntax (for chat templates that do
        not render ``tools=``)."""
        raise NotImplementedError


def _call_from_json(obj: Any, arg_keys: tuple[str, ...]) -> ToolCall:
    """A ToolCall from a decoded ``{"name": ..., "arguments": ...}``; raises ValueError."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise ValueError('a tool call must be a JSON object with a "name" string')
    args: Any = {}
    for k in arg_keys:
        if k in obj:
            args = obj[k]
            break
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"the arguments of {obj['name']!r} are a string that is not JSON: {e.msg}") from None
        except RecursionError:
            raise ValueError(f"the arguments of {obj['name']!r} are nested too deeply") from None
    return ToolCall(obj["name"], args)


class HermesFormat(ToolCallFormat):
    name = "hermes"
    stop = ["</tool_call>"]
    _block = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> ParsedMessage:
        out = ParsedMessage()
        for m in self._block.finditer(text):
            body, closed = m.group(1).strip(), bool(m.group(2))
            if not closed:
                out.errors.append("the tool call was not closed with </tool_call>")
                continue
            try:
                out.calls.append(_call_from_json(json.loads(body), ("arguments", "parameters")))
            except json.JSONDecodeError as e:
                out.errors.append(f"the tool call is not valid JSON ({e.msg} at position {e.pos}): {body[:200]}")
            except RecursionError:
                out.errors.append(f"the tool call is nested too deeply to decode: {body[:200]}")
            except ValueError as e:
                out.errors.append(str(e))
        return out

    def wrap_result(self, output: str) -> str:
        return f"<tool_response>\n{output}\n</tool_response>"

    def describe_tools(self, schemas: list[dict[str, Any]]) -> str:
        listing = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{listing}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n\n'
            "The result comes back within <tool_response></tool_response> XML tags. When you know the answer, "
            "reply without a tool call."
        )


class Llama3JsonFormat(ToolCallFormat):
    name = "llama3_json"
    stop: list[str] = []
    _tag = "<|python_tag|>"

    def parse(self, text: str) -> ParsedMessage:
        out = ParsedMessage()
        body = text.strip()
        if body.startswith(self._tag):
            body = body[len(self._tag) :].strip()
        elif not body.startswith("{"):
            return out
        decoder = json.JSONDecoder()
        pos = 0
        while pos < len(body):
            try:
                obj, end = decoder.raw_decode(body, pos)
            except json.JSONDecodeError as e:
                out.errors.append(
                    f"the tool call is not valid JSON ({e.msg} at position {e.pos}): {body[pos : pos + 200]}"
                )
                break
            except RecursionError:
                out.errors.append(f"the tool call is nested too deeply to decode: {body[pos : pos + 200]}")
                break
            try:
                out.calls.append(_call_from_json(obj, ("parameters", "arguments")))
            except ValueError as e:
                out.errors.append(str(e))
            pos = end
            while pos < len(body) and body[pos] in "; \n\t":
                pos += 1
        return out

    def describe_tools(self, schemas: list[dict[str, Any]]) -> str:
        listing = "\n\n".join(json.dumps(s, indent=4, ensure_ascii=False) for s in schemas)
        return (
            "Given the following functions, please respond with a JSON for a function call with its proper "
            "arguments that best answers the given prompt.\n\n"
            'Respond in the format {"name": function name, "parameters": dictionary of argument name and its '
            "value}. Do not use variables. When you know the answer, reply in plain text.\n\n" + listing
        )


TOOL_CALL_FORMATS: Registry[type[ToolCallFormat]] = Registry("tool-call format", "agent.tool_call_format")
TOOL_CALL_FORMATS.register("hermes", HermesFormat)
TOOL_CALL_FORMATS.register("llama3_json", Llama3JsonFormat)


def get_format(name: str) -> ToolCallFormat:
    """An instance of the format registered as ``name`` (KeyError lists the registered ones)."""
    return TOOL_CALL_FORMATS.get(name)()
