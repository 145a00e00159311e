"""Prompt sources: data files (slime's jsonl, verl's parquet, ...) and reasoning-gym task generators.

A record is ``{"prompt": str | [messages], "label": Any, "metadata": dict}`` after key
mapping (``input_key`` / ``label_key`` / ``metadata_key``). Reasoning-gym records carry the
generator's entry under ``metadata["reasoning_gym"]`` so its own ``score_answer`` can score
them later.
"""

from __future__ import annotations

import difflib
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .files import DataError, read_rows
from .formats import VERL_LABEL, VERL_METADATA, get_key, has_key, is_verl_row, present_keys

log = logging.getLogger(__name__)

REASONING_GYM_PREFIX = "reasoning_gym:"


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
    label_key: str | None = "label",
    metadata_key: str = "metadata",
    size: int = 1000,
    seed: int = 0,
    task_kwargs: dict[str, Any] | None = None,
) -> list[PromptRecord]:
    """Records of a source: ``reasoning_gym:<task>`` (``size`` entries from ``seed``) or a data file /
    saved ``datasets`` folder (:func:`load_prompt_file`).

    ``task_kwargs`` (and ``size`` / ``seed``) apply to reasoning-gym sources only; with a file,
    ``task_kwargs`` is ignored with a warning.

    Raises:
        DataError: a malformed row (file and line or row in the message), a label key no row holds,
            an unknown reasoning-gym task or invalid task arguments.
        FileNotFoundError: the file does not exist.
    """
    if is_reasoning_gym(source):
        return load_reasoning_gym(source[len(REASONING_GYM_PREFIX) :], size=size, seed=seed, **(task_kwargs or {}))
    if task_kwargs:  # an example config pointed at a file: say so, but do not make the user unset it
        log.warning(
            "data.task_kwargs=%s applies to reasoning_gym:<task> sources only: ignored for the file %s",
            task_kwargs,
            source,
        )
    return load_prompt_file(source, input_key=input_key, label_key=label_key, metadata_key=metadata_key)


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
        records.append(
            PromptRecord(
                prompt=entry["question"],
                label=entry["answer"],
                metadata={"reasoning_gym": {"task": task, "entry": entry}},
            )
        )
    return records


def _jsonable(x: Any) -> Any:
    """Tuples -> lists, recursively (so entries survive a json round trip unchanged)."""
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def load_prompt_file(
    path: str | Path, input_key: str = "prompt", label_key: str | None = "label", metadata_key: str = "metadata"
) -> list[PromptRecord]:
    """Prompt records of a data file or saved ``datasets`` folder (:func:`reinforge.data.files.read_rows`).

    Two layouts are recognised per row (:mod:`reinforge.data.formats`) and logged by name:
    *prompt-only* (slime's jsonl: ``prompt``, ``label``, ``metadata``) and *verl RL* (``prompt`` as
    messages, ``reward_model.ground_truth``, ``data_source``, ``extra_info``): for verl rows the label
    defaults to ``reward_model.ground_truth`` (when ``label_key`` is ``label`` and the row has none)
    and ``data_source`` / ``ability`` / ``extra_info`` go into the metadata. Keys may be dotted
    paths into nested objects.

    Args:
        label_key: the reference answer's key; ``None`` for prompts without one (reward models).
    Raises:
        FileNotFoundError: no such file or folder.
        DataError: a malformed row, a missing / mistyped prompt or a NaN / infinite label
            (``file:line`` in the message), no rows, or a ``label_key`` that no row holds (the message
            names the file and the key).
    """
    path = Path(path)
    rows = read_rows(path, "prompt data")
    records, formats, labelled = [], {}, 0
    for where, obj in rows:
        verl = is_verl_row(obj)
        formats["verl RL" if verl else "prompt-only"] = formats.get("verl RL" if verl else "prompt-only", 0) + 1
        prompt = get_key(obj, input_key)
        if prompt is None:
            raise DataError(
                f"{where}: no {input_key!r} key (data.input_key); keys are {present_keys(obj)}. Prompt "
                f"data is prompt-only ({{prompt, label, metadata}}) or verl RL ({{prompt, reward_model, "
                f"data_source}}), docs/data.md"
            )
        _check_prompt(prompt, where, input_key)
        metadata = get_key(obj, metadata_key) or {}
        if not isinstance(metadata, dict):
            raise DataError(f"{where}: {metadata_key!r} must be an object, got {type(metadata).__name__}")
        label = None
        if label_key is not None:
            label = get_key(obj, label_key)
            if label is None and verl and label_key == "label":
                label = get_key(obj, VERL_LABEL)
            _check_label(label, where, label_key)
        labelled += label is not None
        if verl:
            metadata = {**{k: obj[k] for k in VERL_METADATA if has_key(obj, k)}, **metadata}
        records.append(PromptRecord(prompt=prompt, label=label, metadata=metadata))
    if not records:
        raise DataError(f"{path}: no prompts")
    if label_key is not None and not labelled:
        keys = present_keys(rows[0][1])
        close = difflib.get_close_matches(label_key, keys, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise DataError(
            f"{path}: data.label_key={label_key!r} is in no row{hint}; the first row's keys are {keys}. "
            f"Set data.label_key to the reference answer's key (a dotted path such as "
            f"reward_model.ground_truth reaches into nested objects), or data.label_key=null if the "
            f"prompts have no reference answer (reward models, custom rewards)"
        )
    if label_key is not None and labelled < len(records):
        log.warning(
            "%s: %d of %d prompts have no %r (label None)", path, len(records) - labelled, len(records), label_key
        )
    log.info("%s: %d prompts, format: %s", path, len(records), ", ".join(f"{k} ({v} rows)" for k, v in formats.items()))
    return records


load_jsonl = load_prompt_file  # the name of the jsonl-only reader it replaces


def _check_label(label: Any, where: str, key: str) -> None:
    """Refuse a NaN or infinite label (JSON's ``NaN`` / ``Infinity``, a float column's NaN): compared
    with a response as text (``nan``) it would score every sample 0 without an error.

    Raises:
        DataError: naming ``where`` (``file:line`` or ``file, row N``) and the key.
    """
    if isinstance(label, float) and not math.isfinite(label):
        raise DataError(
            f"{where}: {key!r} (data.label_key) is {label!r}, not a reference answer: every response compared "
            f"with it would score 0. Write the answer as a string or a finite number, drop the row, or set "
            f"data.label_key=null if the prompts have no reference answer"
        )


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
