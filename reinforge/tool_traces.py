"""``reinforge make-data tool-sft``: tool-use conversations written by the program, for SFT.

For each prompt of a reasoning-gym task whose entries carry the arithmetic ``expression`` they ask
about (``basic_arithmetic``, ``products``, ...), the trace is the conversation the agent loop
(:mod:`reinforge.rollout.agent`) would see if the model used its tool perfectly:

    system:     data.system_prompt + the tools' description (as the RL prompts have it)
    user:       the question
    assistant:  <tool_call>{"name": "python", "arguments": {"code": "print(<expression>)"}}</tool_call>
    tool:       the entry's answer (what the program prints), shown as the agent shows tool outputs
    assistant:  the answer, in --answer-format

The calls and answers come from the task's own data, never from a model. The tool is the first of
``agent.tools`` that can compute an expression (``python``: ``print(<expression>)``;
``calculator``: ``{"expression": <expression>}``). The tool message takes the role the agent gives
tool outputs with this chat template (``tool``, or ``agent.tool_role`` with the format's result
tags), so SFT on these files teaches exactly the token layout RL then samples. Loss is on the
assistant turns only (docs/offline.md).
"""

from __future__ import annotations

import json
from typing import Any

from .config import Config

TOOL_ARGUMENTS = {"python": lambda expr: {"code": f"print({expr})"}, "calculator": lambda expr: {"expression": expr}}


def tool_trace(cfg: Config, tokenizer: Any, prompt: Any, answer_format: str) -> list[dict[str, Any]] | None:
    """The SFT conversation of one prompt (module docstring), or None when its data row carries no
    ``expression`` to compute.

    Raises:
        ValueError: none of ``agent.tools`` computes expressions (``python``, ``calculator``).
    """
    from .rollout.agent import prompt_tools
    from .rollout.chat_turns import template_has_tool_role
    from .tools import get_format

    a = cfg.agent
    tool = next((t for t in a.tools if t in TOOL_ARGUMENTS), None)
    if tool is None:
        raise ValueError(
            f"make-data tool-sft: agent.tools={a.tools} has no tool that computes an expression; "
            f"add one of {sorted(TOOL_ARGUMENTS)}"
        )
    entry = (prompt.metadata.get("reasoning_gym") or {}).get("entry") or {}
    expr = (entry.get("metadata") or {}).get("expression")
    if not expr or prompt.label is None:
        return None
    fmt = get_format(a.tool_call_format)
    tools = prompt_tools(cfg, tokenizer)
    system = "\n\n".join(s for s in (cfg.data.system_prompt, tools.system_text) if s)
    question = prompt.prompt if isinstance(prompt.prompt, str) else prompt.prompt[-1]["content"]
    call = json.dumps({"name": tool, "arguments": TOOL_ARGUMENTS[tool](expr)})
    role = a.tool_role if a.tool_role != "auto" else ("tool" if template_has_tool_role(tokenizer) else "user")
    output = str(prompt.label)
    tool_message = (
        {"role": "tool", "name": tool, "content": output}
        if role == "tool"
        else {"role": role, "content": fmt.wrap_result(output)}
    )
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [
        {"role": "user", "content": question},
        {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
        tool_message,
        {"role": "assistant", "content": answer_format.format(answer=prompt.label)},
    ]
