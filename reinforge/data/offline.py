"""Offline datasets: SFT chats, preference pairs and KTO examples, tokenized with the chat template.

Formats (the field's conventions, TRL's; keys configurable in the ``offline`` section):

* SFT: ``{"messages": [{"role": ..., "content": ...}, ...]}`` (loss on every assistant turn), or
  ``{"prompt": str | messages, "completion": str}``;
* pairs (RM, DPO, IPO, CPO, SimPO, ORPO): ``{"prompt": str | messages, "chosen": str | messages,
  "rejected": str | messages}``, optionally a margin;
* KTO: ``{"prompt": ..., "completion": ..., "label": true | false}``.

Files are ``.jsonl`` / ``.json`` or ``.parquet``, read with ``datasets``. Responses are tokenized
as the chat template renders them after the prompt (content, end-of-turn token), and every
example is checked: the template's rendering of the prompt must be a token prefix of the rendering
with the response, or the example is refused with a message naming the template.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .sources import DataError, parse_jsonl_line, utf8_lines

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
    source: str = ""  # "file:line" for messages


@dataclass
class OfflineDataset:
    examples: list[OfflineExample]
    counts: dict[str, int] = field(default_factory=dict)  # dropped / truncated / identical pairs


# ---------------------------------------------------------------------------- reading

def read_rows(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) of a jsonl / json / parquet file through ``datasets``; for jsonl a row
    that does not parse is reported with its line.

    Raises:
        FileNotFoundError: no such file.
        DataError: unknown extension, or a malformed line (file:line in the message).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"offline data file {path} not found")
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".json", ".parquet"):
        raise DataError(f"{path}: offline data must be .jsonl, .json or .parquet")
    numbered = utf8_lines(path) if suffix == ".jsonl" else []  # not UTF-8: file:line, before pyarrow fails
    import datasets

    datasets.disable_progress_bars()
    kind = "parquet" if suffix == ".parquet" else "json"
    try:
        ds = datasets.load_dataset(kind, data_files=str(path), split="train")
    except Exception as e:  # locate the bad line for jsonl, else report datasets' message
        if suffix == ".jsonl":
            _raise_bad_line(path)
        raise DataError(f"{path}: cannot read it: {e}") from None
    rows = ds.to_list()
    if suffix == ".jsonl":  # row i is the i-th non-empty line
        lines = [i for i, line in numbered if line.strip()]
    else:
        lines = list(range(1, len(rows) + 1))
    return list(zip(lines, rows))


def _raise_bad_line(path: Path) -> None:
    for i, line in utf8_lines(path):
        if line.strip():
            parse_jsonl_line(line, f"{path}:{i}")
    raise DataError(f"{path}: rows do not share one schema (check the types of each key)")


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

    def prompt_and_response(self, prompt: str | Messages, response: str | Messages, where: str
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
            raise DataError(f"{where}: the chat template does not render the prompt as a prefix of prompt + "
                            f"response, so the response tokens cannot be separated")
        return self.ids(p), self.ids(full[len(p):])

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
            upto = self.render(msgs[:i + 1], generation_prompt=msgs[i]["role"] != "assistant"
                               and i + 1 < len(msgs) and msgs[i + 1]["role"] == "assistant")
            if not upto.startswith(text):
                raise DataError(f"{where}: the chat template rewrites earlier turns (turn {i}), so assistant "
                                f"tokens cannot be located; use prompt + completion examples instead")
            new = self.ids(upto[len(text):])
            text = upto
            tokens += new
            mask += [1 if msgs[i]["role"] == "assistant" else 0] * len(new)
        return prompt, tokens, mask


def _field(row: dict[str, Any], key: str, where: str, kinds: tuple[type, ...] = (str, list)) -> Any:
    if key not in row or row[key] is None:
        raise DataError(f"{where}: missing key {key!r} (present: {sorted(row)}); set the offline.*_key option "
                        f"if the file names it differently")
    value = row[key]
    if not isinstance(value, kinds):
        raise DataError(f"{where}: {key!r} must be {' or '.join(k.__name__ for k in kinds)}, got "
                        f"{type(value).__name__}")
    return value


def _fit(prompt: list[int], responses: list[list[int]], masks: list[list[int]], o: "OfflineConfig"
         ) -> tuple[list[int], list[list[int]], list[list[int]]] | None:
    """Apply ``max_length``: None to drop, else the (possibly truncated) example."""
    if len(prompt) + max(len(r) for r in responses) <= o.max_length:
        return prompt, responses, masks
    if o.truncation == "drop":
        return None
    prompt = prompt[-o.max_prompt_length:]
    room = o.max_length - len(prompt)
    if room < 1:
        return None
    return prompt, [r[:room] for r in responses], [m[:room] for m in masks]


def build_examples(rows: list[tuple[int, dict[str, Any]]], name: str, tok: Tokenizer, o: "OfflineConfig"
                   ) -> OfflineDataset:
    """Tokenize and check rows for ``o.method``'s data kind; over-long, truncated and identical
    pairs are counted (``dropped_too_long``, ``truncated``, ``identical_pairs``).

    Raises:
        DataError: a missing or mistyped key, a template that hides the response (file:line).
    """
    from ..algo.preference import OFFLINE_METHODS

    kind = OFFLINE_METHODS.info(o.method)["data"]
    out: list[OfflineExample] = []
    counts = {"dropped_too_long": 0, "truncated": 0, "identical_pairs": 0}
    for line, row in rows:
        where = f"{name}:{line}"
        desirable = margin = None
        if kind == "messages":
            if o.messages_key in row and row[o.messages_key] is not None:
                prompt, resp, mask = tok.chat(_field(row, o.messages_key, where, (list,)), where)
                responses, masks = [resp], [mask]
            else:
                prompt, resp = tok.prompt_and_response(_field(row, o.prompt_key, where),
                                                       _field(row, o.completion_key, where), where)
                responses, masks = [resp], [[1] * len(resp)]
        elif kind == "pairs":
            chosen, rejected = _field(row, o.chosen_key, where), _field(row, o.rejected_key, where)
            if chosen == rejected:
                counts["identical_pairs"] += 1
                continue
            prompt_text = _field(row, o.prompt_key, where)
            prompt, c = tok.prompt_and_response(prompt_text, chosen, where)
            _, r = tok.prompt_and_response(prompt_text, rejected, where)
            responses, masks = [c, r], [[1] * len(c), [1] * len(r)]
            if o.margin_key:
                margin = float(_field(row, o.margin_key, where, (int, float)))
        else:
            label = _field(row, o.kto_label_key, where, (bool,))
            prompt, resp = tok.prompt_and_response(_field(row, o.prompt_key, where),
                                                   _field(row, o.completion_key, where), where)
            responses, masks, desirable = [resp], [[1] * len(resp)], bool(label)
        if not all(responses):
            raise DataError(f"{where}: an empty response")
        fitted = _fit(prompt, responses, masks, o)
        if fitted is None:
            counts["dropped_too_long"] += 1
            continue
        if fitted[0] is not prompt:
            counts["truncated"] += 1
        out.append(OfflineExample(fitted[0], fitted[1], fitted[2], desirable, margin, where))
    for k, v in counts.items():
        if v:
            log.warning("%s: %s: %d examples (offline.max_length=%d, truncation=%s)", name, k, v, o.max_length,
                        o.truncation)
    if not out:
        raise DataError(f"{name}: no usable example (see the counts above: raise offline.max_length?)")
    return OfflineDataset(out, counts)


def load_offline_datasets(o: "OfflineConfig", tokenizer: Any, system_prompt: str | None, seed: int,
                          apply_chat_template: bool = True) -> tuple[OfflineDataset, OfflineDataset | None]:
    """Training and held-out examples of the ``offline`` section (``eval_data``, or a seeded
    ``eval_fraction`` of ``train_data``)."""
    if not o.train_data:
        raise DataError("offline.train_data is not set: a .jsonl or .parquet file of examples")
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
    train = build_examples(rows, o.train_data, tok, o)
    evalset = build_examples(eval_rows, eval_name, tok, o) if eval_rows else None
    return train, evalset
