"""Token ids of the messages that follow an assistant turn, rendered by the chat template.

A multi-turn rollout never re-tokenises the conversation: the sample's tokens are the prompt,
then exactly the ids the engine sampled, then the ids of what the template puts between that
turn and the next generation (the end of the assistant turn if the model did not write it, the
tool messages with their turn markers, the next generation prompt), and so on. Re-rendering the
whole conversation would give different ids wherever the template rewrites earlier turns
(Qwen3 drops the reasoning of earlier assistant turns) or the text tokenises differently from how
it was sampled, and the trainer would score tokens the engine never produced.

:meth:`TurnRenderer.append_ids` renders a fixed two-message conversation ending in an assistant
message whose content is a marker, followed by the new messages, with the generation prompt; the
text after the marker is the delta. Only the template's rendering *after* that assistant message
matters, so templates that rewrite earlier turns give the right delta too. (verl's agent loop
renders the new messages alone and cuts off the template's default system prompt instead.)
"""

from __future__ import annotations

import re
from typing import Any

MARKER = "REINFORGE_ASSISTANT_TURN_7c1f"
CONTENT_SLOT = "REINFORGE_CONTENT_7c1f_"  # + index + "_": where a message's content goes


class TurnRenderer:
    """Deltas between turns for one tokenizer's chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        template_kwargs: extra ``apply_chat_template`` arguments (e.g. ``enable_thinking``).
    """

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("multi-turn rollouts need a tokenizer with a chat template")
        self.tokenizer = tokenizer
        self.kwargs = dict(template_kwargs or {})

    def append_text(self, messages: list[dict[str, Any]], turn_ended_with: str | None = None) -> str:
        """The text the template puts after an assistant turn when ``messages`` follow it, up to
        and including the next generation prompt.

        Args:
            messages: the new messages (``{"role": ..., "content": str}``).
            turn_ended_with: the text of the token that ended the model's turn (its end-of-turn
                token); when the template's text starts with it, it is not repeated. None when
                the turn ended otherwise (a stop string, the length limit).

        Raises:
            ValueError: the template does not render the marker of the assistant message.
        """
        conversation = [
            {"role": "user", "content": "REINFORGE_USER_TURN"},
            {"role": "assistant", "content": MARKER},
            *messages,
        ]
        text = self.tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True, **self.kwargs
        )
        at = text.find(MARKER)
        if at < 0:
            raise ValueError(
                "the chat template does not render the content of an assistant message followed by "
                f"{[m['role'] for m in messages]} messages; set agent.tool_role to a role it renders"
            )
        delta = text[at + len(MARKER) :]
        if turn_ended_with and delta.startswith(turn_ended_with):
            delta = delta[len(turn_ended_with) :]
        return delta

    def append_ids(self, messages: list[dict[str, Any]], turn_ended_with: str | None = None) -> list[int]:
        """:meth:`append_text` tokenised on its own (none added), such that no special token can
        come from a message's content: the template is rendered with a placeholder for each
        content, its own text is tokenised with special tokens recognised (its ``<|im_end|>``,
        ``<|im_start|>``), and each content as plain text (``split_special_tokens``: a tool output
        holding ``<|im_end|>`` gets the ids of those characters, not the end-of-turn token, so it
        cannot forge a turn boundary). A template that does not render each placeholder once, in
        order, is tokenised whole (the agent loop removes special-token strings from observations
        first, :meth:`reinforge.rollout.agent.Agent._clip`)."""
        slots = [f"{CONTENT_SLOT}{i}_" for i in range(len(messages))]
        text = self.append_text([{**m, "content": s} for m, s in zip(messages, slots)], turn_ended_with)
        pieces = re.split("(" + "|".join(map(re.escape, slots)) + ")", text) if slots else [text]
        if [p for p in pieces if p.startswith(CONTENT_SLOT)] != slots:
            text = self.append_text(messages, turn_ended_with)
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        contents = {s: m["content"] for s, m in zip(slots, messages)}
        ids: list[int] = []
        for piece in pieces:
            if piece in contents:
                ids += self.tokenizer(contents[piece], add_special_tokens=False, split_special_tokens=True)["input_ids"]
            elif piece:
                ids += self.tokenizer(piece, add_special_tokens=False)["input_ids"]
        return ids


_TOOL_ROLE = re.compile(r"""role\s*(==|!=|in)\s*[\[(]?\s*['"](tool|ipython)['"]""")


def template_has_tool_role(tokenizer: Any) -> bool:
    """Whether the chat template handles messages of role ``tool`` (Qwen, Llama 3.1, Mistral...)."""
    return bool(_TOOL_ROLE.search(getattr(tokenizer, "chat_template", None) or ""))


def template_renders_tools(tokenizer: Any, schemas: list[dict[str, Any]]) -> bool:
    """Whether passing ``tools=schemas`` to the chat template changes the rendered prompt."""
    if not getattr(tokenizer, "chat_template", None) or not schemas:
        return False
    messages = [{"role": "user", "content": "hi"}]
    try:
        with_tools = tokenizer.apply_chat_template(messages, tools=schemas, tokenize=False, add_generation_prompt=True)
    except Exception:  # templates that refuse tools
        return False
    return with_tools != tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
