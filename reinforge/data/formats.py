"""Which data format a row is in, and the row rewritten in reinforge's canonical keys.

Formats are TRL's dataset formats (https://huggingface.co/docs/trl/dataset_formats), each either
*standard* (strings) or *conversational* (lists of ``{"role", "content"}`` messages), and verl's RL
layout. docs/data.md shows a two-line example of each.

=========================  ======================================  ==========================
format                     keys                                    used by
=========================  ======================================  ==========================
language modeling          ``text``                                SFT (loss on every token)
conversational LM          ``messages``                            SFT (loss on assistant turns)
prompt-completion          ``prompt``, ``completion``              SFT
preference                 ``prompt``, ``chosen``, ``rejected``    RM, DPO, IPO, CPO, SimPO, ORPO
preference (implicit)      ``chosen``, ``rejected``                the same; prompt = shared prefix
unpaired preference        ``prompt``, ``completion``, ``label``   KTO
prompt-only                ``prompt`` [, ``label``, ``metadata``]  RL (slime's jsonl)
verl RL                    ``prompt``, ``reward_model``,           RL (verl's parquet)
                           ``data_source`` [, ``extra_info``]
=========================  ======================================  ==========================

Keys may be dotted paths into nested objects (``reward_model.ground_truth``): a row's own key of
that exact name wins, else each part is looked up in turn. A key whose value is ``None`` counts as
absent (parquet and saved ``datasets`` give ``None`` for a column a row lacks).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .files import DataError

if TYPE_CHECKING:
    from ..config import OfflineConfig

Messages = list[dict[str, Any]]


def get_key(row: dict[str, Any], key: str) -> Any:
    """``row[key]``, or the value at the dotted path ``key`` (``"reward_model.ground_truth"``);
    ``None`` when absent."""
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def has_key(row: dict[str, Any], key: str | None) -> bool:
    return key is not None and get_key(row, key) is not None


def present_keys(row: dict[str, Any]) -> list[str]:
    """The row's keys that hold a value (sorted)."""
    return sorted(k for k, v in row.items() if v is not None)


def _style(*values: Any) -> str:
    return "conversational" if any(isinstance(v, list) for v in values) else "standard"


# ---------------------------------------------------------------------------- offline data


def offline_formats(kind: str, o: OfflineConfig) -> list[tuple[str, list[str]]]:
    """(format name, its keys) accepted for a data kind as ``OFFLINE_METHODS`` declares it
    (``messages`` / ``pairs`` / ``unpaired``), in the order they are tried; the keys are the
    ``offline.*_key`` options."""
    return {
        "messages": [
            ("conversational language modeling", [o.messages_key]),
            ("prompt-completion", [o.prompt_key, o.completion_key]),
            ("language modeling", [o.text_key]),
        ],
        "pairs": [
            ("preference", [o.prompt_key, o.chosen_key, o.rejected_key]),
            ("preference, implicit prompt", [o.chosen_key, o.rejected_key]),
        ],
        "unpaired": [("unpaired preference", [o.prompt_key, o.completion_key, o.kto_label_key])],
    }[kind]


def detect_offline(row: dict[str, Any], kind: str, o: OfflineConfig, where: str) -> str:
    """The name of the first format of :func:`offline_formats` whose keys the row holds.

    Raises:
        DataError: no format fits (the message names the row, its keys and every format's keys).
    """
    formats = offline_formats(kind, o)
    for name, keys in formats:
        if all(has_key(row, k) for k in keys):
            return name
    wanted = "; ".join(f"{name}: {', '.join(repr(k) for k in keys)}" for name, keys in formats)
    raise DataError(
        f"{where}: no {kind} format fits this row (its keys: {present_keys(row)}); expected {wanted}. "
        f"Rename keys with the offline.*_key options (docs/data.md)"
    )


def offline_fields(row: dict[str, Any], fmt: str, o: OfflineConfig, where: str) -> dict[str, Any]:
    """The row in canonical keys for format ``fmt`` (from :func:`detect_offline`): ``messages``;
    ``prompt`` + ``completion``; ``text``; ``prompt`` + ``chosen`` + ``rejected`` (an implicit prompt
    extracted by :func:`split_implicit_prompt`); ``prompt`` + ``completion`` + ``label``. Values are
    type-checked.

    Raises:
        DataError: a value of the wrong type, or an implicit prompt that cannot be extracted.
    """

    def value(key: str, kinds: tuple[type, ...] = (str, list)) -> Any:
        v = get_key(row, key)
        if not isinstance(v, kinds) or isinstance(v, bool) and bool not in kinds:
            raise DataError(
                f"{where}: {key!r} must be {' or '.join(k.__name__ for k in kinds)}, got {type(v).__name__}"
            )
        if isinstance(v, list):
            check_messages(v, where, key)
        return v

    if fmt == "conversational language modeling":
        return {"messages": value(o.messages_key, (list,))}
    if fmt == "language modeling":
        return {"text": value(o.text_key, (str,))}
    if fmt == "prompt-completion":
        return {"prompt": value(o.prompt_key), "completion": value(o.completion_key)}
    if fmt == "preference":
        return {"prompt": value(o.prompt_key), "chosen": value(o.chosen_key), "rejected": value(o.rejected_key)}
    if fmt == "preference, implicit prompt":
        prompt, chosen, rejected = split_implicit_prompt(value(o.chosen_key), value(o.rejected_key), where)
        return {"prompt": prompt, "chosen": chosen, "rejected": rejected}
    if fmt == "unpaired preference":
        return {
            "prompt": value(o.prompt_key),
            "completion": value(o.completion_key),
            "label": value(o.kto_label_key, (bool,)),
        }
    raise ValueError(f"unknown offline format {fmt!r}")


def style_of(fields: dict[str, Any]) -> str:
    """``standard`` or ``conversational`` (any value a message list) for the log."""
    return _style(*fields.values())


def split_implicit_prompt(
    chosen: str | Messages, rejected: str | Messages, where: str
) -> tuple[str | Messages, str | Messages, str | Messages]:
    """(prompt, chosen, rejected) of a pair given as two whole conversations (TRL's implicit prompt).

    Conversations: the prompt is the longest run of leading messages the two share (as TRL's
    ``extract_prompt`` takes it); each remainder must start with an assistant message. Strings: the
    shared leading text, cut back to its last whitespace so that no word is split (TRL cuts at the
    first differing character, moving a single space to the responses); the whitespace goes with
    the responses. An identical pair is returned unchanged (the caller counts and skips it).

    Raises:
        DataError: a string paired with messages, nothing shared, or a remainder that does not start
            with an assistant turn.
    """
    if chosen == rejected:
        return chosen, chosen, rejected
    if isinstance(chosen, list) and isinstance(rejected, list):
        n = 0
        while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
            n += 1
        if n == 0:
            raise DataError(
                f"{where}: chosen and rejected share no leading message, so no prompt can be extracted; "
                f"give the prompt under its own key"
            )
        for name, conv in (("chosen", chosen), ("rejected", rejected)):
            if n == len(conv) or conv[n].get("role") != "assistant":
                raise DataError(
                    f"{where}: after the {n} shared message(s), {name} does not continue with an "
                    f"assistant message, so the pair has no responses to compare"
                )
        return chosen[:n], chosen[n:], rejected[n:]
    if isinstance(chosen, str) and isinstance(rejected, str):
        n = 0
        while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
            n += 1
        ends = [m.start() for m in re.finditer(r"\s", chosen[:n])]  # word boundaries inside the shared text
        if all(n == len(s) or s[n].isspace() for s in (chosen, rejected)):
            ends.append(n)
        cuts = [
            c
            for c in (len(chosen[:e].rstrip()) for e in reversed(ends))
            if c > 0 and chosen[c:].strip() and rejected[c:].strip()
        ]
        if not cuts:
            raise DataError(
                f"{where}: chosen and rejected share no leading words, so no prompt can be extracted; "
                f"give the prompt under its own key"
            )
        cut = cuts[0]
        return chosen[:cut], chosen[cut:], rejected[cut:]
    raise DataError(
        f"{where}: chosen and rejected must both be strings or both message lists, got "
        f"{type(chosen).__name__} and {type(rejected).__name__}"
    )


def check_messages(messages: list[Any], where: str, key: str) -> None:
    """Raises DataError unless ``messages`` is a non-empty list of ``{"role": str, "content": str}``."""
    if not messages:
        raise DataError(f"{where}: {key!r} is an empty list")
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise DataError(f"{where}: {key!r}[{i}] must be a message {{'role': str, 'content': str}}")


# ---------------------------------------------------------------------------- RL prompts

VERL_LABEL = "reward_model.ground_truth"
VERL_METADATA = ("data_source", "ability", "extra_info")


def is_verl_row(row: dict[str, Any]) -> bool:
    """verl's RL layout: ``reward_model`` an object and ``data_source`` present."""
    return isinstance(row.get("reward_model"), dict) and has_key(row, "data_source")


def prompt_format(row: dict[str, Any]) -> str:
    return "verl RL" if is_verl_row(row) else "prompt-only"
