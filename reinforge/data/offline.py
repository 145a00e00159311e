"""Offline datasets: SFT, preference pairs and KTO examples, tokenized with the chat template.

Formats are TRL's, standard (strings) or conversational (messages), detected per row and logged
by name (:mod:`reinforge.data.formats`, docs/data.md; keys configurable in the ``offline`` section):

* SFT: ``{"messages": [...]}`` (loss on every assistant turn), ``{"prompt", "completion"}``, or
  ``{"text": str}`` (language modeling: loss on every token after the first, no chat template);
* pairs (RM, DPO, IPO, CPO, SimPO, ORPO): ``{"prompt", "chosen", "rejected"}``, optionally a
  margin, or ``{"chosen", "rejected"}`` as whole conversations (the shared prefix is the prompt);
* KTO: ``{"prompt", "completion", "label": true | false}``.

Files are ``.jsonl`` / ``.json`` / ``.parquet`` or saved ``datasets`` folders
(:mod:`reinforge.data.files`). Responses are tokenized as the chat template renders them after the
prompt (content, end-of-turn token), and every example is checked: the template's rendering of the
prompt must be a token prefix of the rendering with the response, or the example is refused with a
message naming the template.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .files import DataError, Row
from .files import read_rows as _read_rows
from .formats import detect_offline, get_key, offline_fields, style_of

if TYPE_CHECKING:
    from ..config import OfflineConfig

log = logging.getLogger(__name__)

Messages = list[dict[str, Any]]


@dataclass
class OfflineExample:
    """One tokenized example.

    ``responses`` has one token list per response (SFT and KTO: 1; pairs: chosen, rejected);
    ``loss_masks`` one 0/1 list per response (SFT: 0 on the user / system turns between
    assistant turns). ``prompt_ids`` carry no loss.
    """

    prompt_ids: list[int]
    responses: list[list[int]]
    loss_masks: list[list[int]]
    desirable: bool | None = None  # KTO
    margin: float | None = None  # RM
    source: str = ""  # "file:line" / "file, row N" for messages


@dataclass
class OfflineDataset:
    examples: list[OfflineExample]
    counts: dict[str, int] = field(default_factory=dict)  # dropped / truncated / identical pairs
    formats: dict[str, int] = field(default_factory=dict)  # rows per detected format (formats.py)


# ---------------------------------------------------------------------------- reading


def read_rows(path: str | Path) -> list[Row]:
    """(where, row) of every row of an offline data file or saved ``datasets`` folder; ``where`` is
    ``file:line`` (jsonl) or ``file, row N`` (:func:`reinforge.data.files.read_rows`)."""
    return _read_rows(path, "offline data")


# ---------------------------------------------------------------------------- tokenizing


class Tokenizer:
    """Renders prompts and responses with the chat template and checks the prefix property."""

    def __init__(self, tokenizer: Any, system_prompt: str | None, apply_chat_template: bool = True):
        self.tok, self.system_prompt, self.use_template = tokenizer, system_prompt, apply_chat_template

    def messages(self, prompt: str | Messages) -> Messages:
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if self.system_prompt and (not msgs or msgs[0]["role"] != "system"):
            msgs = [{"role": "system", "content": self.system_prompt}] + msgs
        return msgs

    def render(self, messages: Messages, generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def prompt_and_response(
        self, prompt: str | Messages, response: str | Messages, where: str
    ) -> tuple[list[int], list[int]]:
        """Token ids of the prompt (with the generation prompt) and of the response after it.

        The rendered prompt must be a text prefix of the rendered prompt + response; the two parts
        are tokenized apart (as the engine sees them in RL: prompt tokens, then generated tokens), so
        a response whose first characters would merge with the prompt's last token (a leading
        newline or space) keeps its own tokens.

        Raises:
            DataError: the chat template renders the prompt differently inside the whole chat.
        """
        if not self.use_template:
            if not isinstance(prompt, str) or not isinstance(response, str):
                raise DataError(f"{where}: data.apply_chat_template=false needs string prompts and responses")
            p = self.tok(prompt, add_special_tokens=True)["input_ids"]
            r = self.tok(response, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            return p, r
        msgs = self.messages(prompt)
        turns = [{"role": "assistant", "content": response}] if isinstance(response, str) else list(response)
        p = self.render(msgs, generation_prompt=True)
        full = self.render(msgs + turns, generation_prompt=False)
        if not full.startswith(p):
            raise DataError(
                f"{where}: the chat template does not render the prompt as a prefix of prompt + "
                f"response, so the response tokens cannot be separated"
            )
        return self.ids(p), self.ids(full[len(p) :])

    def text(self, text: str, where: str) -> tuple[list[int], list[int]]:
        """Language modeling: (the first token, the rest) of ``text`` tokenized with the tokenizer's
        special tokens (a BOS where it adds one) and EOS appended, so the loss covers every token
        after the first (TRL's SFT on a ``text`` column). No chat template.

        Raises:
            DataError: the text is shorter than two tokens.
        """
        ids = self.tok(text, add_special_tokens=True)["input_ids"]
        eos = self.tok.eos_token_id
        if eos is not None and (not ids or ids[-1] != eos):
            ids = ids + [eos]
        if len(ids) < 2:
            raise DataError(f"{where}: the text is too short to train on (under two tokens)")
        return ids[:1], ids[1:]

    def chat(self, messages: Messages, where: str) -> tuple[list[int], list[int], list[int]]:
        """(tokens before the first assistant turn, the rest, its loss mask: 1 on assistant turns).
        Each turn's text is tokenized on its own (see :meth:`prompt_and_response`)."""
        msgs = self.messages(messages)
        first = next((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), None)
        if first is None:
            raise DataError(f"{where}: the chat has no assistant message to train on")
        text = self.render(msgs[:first], generation_prompt=True)
        prompt = self.ids(text)
        tokens, mask = [], []
        for i in range(first, len(msgs)):
            upto = self.render(
                msgs[: i + 1],
                generation_prompt=msgs[i]["role"] != "assistant"
                and i + 1 < len(msgs)
                and msgs[i + 1]["role"] == "assistant",
            )
            if not upto.startswith(text):
                raise DataError(
                    f"{where}: the chat template rewrites earlier turns (turn {i}), so assistant "
                    f"tokens cannot be located; use prompt + completion examples instead"
                )
            new = self.ids(upto[len(text) :])
            text = upto
            tokens += new
            mask += [1 if msgs[i]["role"] == "assistant" else 0] * len(new)
        return prompt, tokens, mask


def _fit(
    prompt: list[int], responses: list[list[int]], masks: list[list[int]], o: OfflineConfig
) -> tuple[list[int], list[list[int]], list[list[int]]] | None:
    """Apply ``max_length``: None to drop, else the (possibly truncated) example."""
    if len(prompt) + max(len(r) for r in responses) <= o.max_length:
        return prompt, responses, masks
    if o.truncation == "drop":
        return None
    prompt = prompt[-o.max_prompt_length :]
    room = o.max_length - len(prompt)
    if room < 1:
        return None
    return prompt, [r[:room] for r in responses], [m[:room] for m in masks]


def build_examples(rows: list[Row], name: str, tok: Tokenizer, o: OfflineConfig) -> OfflineDataset:
    """Tokenize and check rows for ``o.method``'s data kind, each in the format it is in
    (:func:`reinforge.data.formats.detect_offline`; the formats found are logged and kept in
    ``formats``); over-long, truncated and identical pairs are counted (``dropped_too_long``,
    ``truncated``, ``identical_pairs``).

    Raises:
        DataError: a row no format fits, a mistyped value, a template that hides the response (the
            message names the file and line or row).
    """
    from ..algo.preference import OFFLINE_METHODS

    kind = OFFLINE_METHODS.info(o.method)["data"]
    out: list[OfflineExample] = []
    counts = {"dropped_too_long": 0, "truncated": 0, "identical_pairs": 0}
    formats: dict[str, int] = {}
    for where, row in rows:
        desirable = margin = None
        fmt = detect_offline(row, kind, o, where)
        f = offline_fields(row, fmt, o, where)
        label = f"{fmt} ({style_of(f)})" if fmt != "language modeling" else fmt
        formats[label] = formats.get(label, 0) + 1
        if "messages" in f:
            prompt, resp, mask = tok.chat(f["messages"], where)
            responses, masks = [resp], [mask]
        elif "text" in f:
            prompt, resp = tok.text(f["text"], where)
            responses, masks = [resp], [[1] * len(resp)]
        elif "chosen" in f:
            if f["chosen"] == f["rejected"]:
                counts["identical_pairs"] += 1
                continue
            prompt, c = tok.prompt_and_response(f["prompt"], f["chosen"], where)
            _, r = tok.prompt_and_response(f["prompt"], f["rejected"], where)
            responses, masks = [c, r], [[1] * len(c), [1] * len(r)]
            if o.margin_key:
                margin = get_key(row, o.margin_key)
                if isinstance(margin, bool) or not isinstance(margin, (int, float)):
                    raise DataError(
                        f"{where}: {o.margin_key!r} (offline.margin_key) must be a number, got {type(margin).__name__}"
                    )
                margin = float(margin)
        else:
            prompt, resp = tok.prompt_and_response(f["prompt"], f["completion"], where)
            responses, masks = [resp], [[1] * len(resp)]
            desirable = f["label"] if "label" in f else None
        if not all(responses):
            raise DataError(f"{where}: an empty response")
        fitted = _fit(prompt, responses, masks, o)
        if fitted is None:
            counts["dropped_too_long"] += 1
            continue
        if fitted[0] is not prompt:
            counts["truncated"] += 1
        out.append(OfflineExample(fitted[0], fitted[1], fitted[2], desirable, margin, where))
    log.info("%s: %d rows, format: %s", name, len(rows), ", ".join(f"{k}: {v}" for k, v in formats.items()))
    for k, v in counts.items():
        if v:
            log.warning(
                "%s: %s: %d examples (offline.max_length=%d, truncation=%s)", name, k, v, o.max_length, o.truncation
            )
    if not out:
        if not rows:
            raise DataError(f"{name}: no rows (an empty file?): offline data needs at least one example")
        why = (
            "raise offline.max_length, or offline.truncation"
            if counts.get("dropped_too_long")
            else "see the counts above"
        )
        raise DataError(f"{name}: none of its {len(rows)} rows is a usable example ({why})")
    return OfflineDataset(out, counts, formats)


def load_offline_datasets(
    o: OfflineConfig, tokenizer: Any, system_prompt: str | None, seed: int, apply_chat_template: bool = True
) -> tuple[OfflineDataset, OfflineDataset | None]:
    """Training and held-out examples of the ``offline`` section (``eval_data``, or a seeded
    ``eval_fraction`` of ``train_data``)."""
    if not o.train_data:
        raise DataError(
            "offline.train_data is not set: a .jsonl / .json / .parquet file or a saved `datasets` "
            "folder of examples (docs/data.md)"
        )
    tok = Tokenizer(tokenizer, system_prompt, apply_chat_template)
    rows = read_rows(o.train_data)
    eval_rows, eval_name = None, o.eval_data
    if o.eval_data:
        eval_rows = read_rows(o.eval_data)
    elif o.eval_fraction > 0:
        rng = random.Random(seed)
        order = list(range(len(rows)))
        rng.shuffle(order)
        held = set(order[: max(1, int(len(rows) * o.eval_fraction))])
        eval_rows = [rows[i] for i in sorted(held)]
        rows = [rows[i] for i in range(len(rows)) if i not in held]
        eval_name = o.train_data
        if not rows and eval_rows:  # (an empty file: build_examples says so)
            raise DataError(
                f"{o.train_data}: all {len(eval_rows)} row(s) went to the held-out set (offline.eval_fraction="
                f"{o.eval_fraction}): add examples, or set offline.eval_fraction=0 (no evaluation)"
            )
    train = build_examples(rows, o.train_data, tok, o)
    evalset = build_examples(eval_rows, eval_name, tok, o) if eval_rows is not None else None  # empty: refused
    return train, evalset
