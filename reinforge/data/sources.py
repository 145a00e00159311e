"""Prompt sources: jsonl files in slime's format and reasoning-gym task generators.

A record is ``{"prompt": str | [messages], "label": Any, "metadata": dict}`` after key
mapping (``input_key`` / ``label_key`` / ``metadata_key``). Reasoning-gym records carry the
generator's entry under ``metadata["reasoning_gym"]`` so its own ``score_answer`` can score
them later.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REASONING_GYM_PREFIX = "reasoning_gym:"


class DataError(ValueError):
    """Malformed input data; the message names the file and line."""


@dataclass
class PromptRecord:
    prompt: str | list[dict[str, Any]]
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)


def is_reasoning_gym(source: str) -> bool:
    return source.startswith(REASONING_GYM_PREFIX)


def load_source(
    source: str,
    *,
    input_key: str = "prompt",
    label_key: str = "label",
    metadata_key: str = "metadata",
    size: int = 1000,
    seed: int = 0,
    task_kwargs: dict[str, Any] | None = None,
) -> list[PromptRecord]:
    """Records of a source: ``reasoning_gym:<task>`` (``size`` entries from ``seed``) or a jsonl path.

    Raises:
        DataError: a malformed jsonl line (file and line number in the message), an unknown
            reasoning-gym task or invalid task arguments.
        FileNotFoundError: the jsonl file does not exist.
    """
    if is_reasoning_gym(source):
        return load_reasoning_gym(source[len(REASONING_GYM_PREFIX):], size=size, seed=seed, **(task_kwargs or {}))
    if task_kwargs:
        raise DataError(f"data.task_kwargs is only for reasoning_gym sources, but prompt data is {source!r}")
    return load_jsonl(source, input_key=input_key, label_key=label_key, metadata_key=metadata_key)


def import_reasoning_gym():
    """``reasoning_gym``, imported without the ``SyntaxWarning`` lines that some of its dependencies
    (cellpylib) print when their sources are compiled for the first time (installers that skip
    byte-compiling, such as uv, leave that to the first import)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        import reasoning_gym
        import reasoning_gym.factory  # noqa: F401
    return reasoning_gym


def load_reasoning_gym(task: str, size: int, seed: int, **kwargs: Any) -> list[PromptRecord]:
    """``size`` procedurally generated problems of a reasoning-gym task (offline)."""
    reasoning_gym = import_reasoning_gym()
    DATASETS = reasoning_gym.factory.DATASETS

    if task not in DATASETS:
        import difflib

        close = difflib.get_close_matches(task, list(DATASETS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise DataError(f"unknown reasoning-gym task {task!r}{hint}")
    try:
        ds = reasoning_gym.create_dataset(task, size=size, seed=seed, **kwargs)
    except (TypeError, ValueError, AssertionError) as e:
        raise DataError(f"reasoning_gym:{task} with data.task_kwargs={kwargs}: {e}") from None
    records = []
    for i in range(size):
        entry = _jsonable(ds[i])
        records.append(PromptRecord(
            prompt=entry["question"],
            label=entry["answer"],
            metadata={"reasoning_gym": {"task": task, "entry": entry}},
        ))
    return records


def _jsonable(x: Any) -> Any:
    """Tuples -> lists, recursively (so entries survive a json round trip unchanged)."""
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def parse_jsonl_line(line: str, where: str) -> dict[str, Any]:
    """One jsonl line as a JSON object.

    Raises:
        DataError: not valid JSON, or not an object (the message starts with ``where``, e.g. ``file:line``).
    """
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def utf8_lines(path: str | Path) -> list[tuple[int, str]]:
    """``(line number, text)`` of every line of a text file, numbered from 1.

    Raises:
        DataError: a line that is not UTF-8, naming ``file:line``, the byte and its column.
    """
    path = Path(path)
    out = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                out.append((lineno, raw.decode("utf-8")))
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{lineno}: byte 0x{raw[e.start]:02x} at column {e.start + 1} is not UTF-8 "
                                f"text ({e.reason}); save the file as UTF-8") from None
    return out


def load_jsonl(path: str | Path, input_key: str = "prompt", label_key: str = "label",
               metadata_key: str = "metadata") -> list[PromptRecord]:
    """Read a jsonl prompt file (one JSON object per line; blank lines are skipped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt data {path} not found")
    records = []
    for lineno, line in utf8_lines(path):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        obj = parse_jsonl_line(line, where)
        if input_key not in obj:
            raise DataError(f"{where}: no {input_key!r} key (data.input_key); keys are {sorted(obj)}")
        prompt = obj[input_key]
        _check_prompt(prompt, where, input_key)
        metadata = obj.get(metadata_key) or {}
        if not isinstance(metadata, dict):
            raise DataError(f"{where}: {metadata_key!r} must be an object, got {type(metadata).__name__}")
        records.append(PromptRecord(prompt=prompt, label=obj.get(label_key), metadata=metadata))
    if not records:
        raise DataError(f"{path}: no prompts")
    return records


def _check_prompt(prompt: Any, where: str, key: str) -> None:
    if isinstance(prompt, str):
        if not prompt:
            raise DataError(f"{where}: {key!r} is empty")
        return
    if isinstance(prompt, list) and prompt:
        for i, m in enumerate(prompt):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise DataError(f"{where}: {key!r}[{i}] must be a message {{'role': str, 'content': str}}")
        return
    raise DataError(f"{where}: {key!r} must be a string or a non-empty list of chat messages")
