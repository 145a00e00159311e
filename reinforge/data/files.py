"""Rows of a data file or a saved ``datasets`` folder, each with where it came from.

Accepted (the layouts TRL, verl, AReaL and Hugging Face users bring):

* ``.jsonl``: one JSON object per line (blank lines skipped); a row is located as ``file:line``;
* ``.json``: a JSON array of objects, or JSON lines in a ``.json`` file; ``file, row N``;
* ``.parquet``: read with Hugging Face ``datasets``; ``file, row N``;
* a folder written by ``Dataset.save_to_disk`` (or ``DatasetDict.save_to_disk``: its ``train``
  split, or its only split), read with ``datasets.load_from_disk``; ``folder, row N``.

Rows are numbered from 0 as ``datasets`` indexes them. JSON is parsed with the standard library
rather than ``datasets``: a malformed line is reported with its line number, and a key whose type
varies across rows (a label that is ``"2"`` in one row and ``3`` in the next) is kept as written
(Arrow would refuse the file).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """Malformed input data; the message names the file and line (or row)."""


Row = tuple[str, dict[str, Any]]  # (where: "file:line" or "file, row N", the row)

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


def parse_jsonl_line(line: str, where: str) -> dict[str, Any]:
    """One jsonl line as a JSON object.

    Raises:
        DataError: not valid JSON, or not an object (the message starts with ``where``, e.g. ``file:line``).
    """
    text = line.rstrip("\r\n")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        if e.pos >= len(text.rstrip()):  # json counts the line's end as a new line: say where it really is
            raise DataError(
                f"{where}: not valid JSON ({e.msg} at the end of the line, column {len(text) + 1}: the "
                f"object is not closed; jsonl holds one whole JSON object per line)"
            ) from None
        raise DataError(f"{where}: not valid JSON ({e.msg} at column {e.pos + 1})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def describe_accepted() -> str:
    return "a .jsonl, .json or .parquet file, or a folder saved with `datasets` (Dataset.save_to_disk)"


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``."""
    return path.is_dir() and any((path / f).is_file() for f in ("dataset_info.json", "state.json", "dataset_dict.json"))


def read_rows(path: str | Path, what: str = "data") -> list[Row]:
    """Every row of ``path`` with its location (see the module docstring for the layouts).

    Args:
        what: how the caller names the input in errors (``"offline data"``, ``"prompt data"``).
    Returns:
        ``[(where, row), ...]`` in file order; ``row`` is a dict (parquet / saved folders give
        ``None`` for a column a row lacks).
    Raises:
        FileNotFoundError: no such file or folder.
        DataError: an unknown layout, a malformed line or array element (``file:line``), a
            folder whose splits are ambiguous, or a file ``datasets`` cannot read.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} not found (expected {describe_accepted()})")
    if path.is_dir():
        if not is_saved_dataset(path):
            raise DataError(
                f"{path}: a folder, but not one saved with `datasets` (no dataset_info.json, state.json "
                f"or dataset_dict.json); {what} must be {describe_accepted()}"
            )
        return _read_saved(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".json":
        return _read_json(path)
    if suffix == ".parquet":
        return _read_parquet(path)
    raise DataError(f"{path}: unknown extension {suffix!r}; {what} must be {describe_accepted()}")


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
                raise DataError(
                    f"{path}:{lineno}: byte 0x{raw[e.start]:02x} at column {e.start + 1} is not UTF-8 "
                    f"text ({e.reason}); save the file as UTF-8"
                ) from None
    return out


def _read_jsonl(path: Path) -> list[Row]:
    rows = []
    for lineno, line in utf8_lines(path):
        if line.strip():
            where = f"{path}:{lineno}"
            rows.append((where, parse_jsonl_line(line, where)))
    return rows


def _read_json(path: Path) -> list[Row]:
    text = "".join(line for _, line in utf8_lines(path))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # JSON lines in a .json file
            return _read_jsonl(path)
        raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
    if isinstance(data, dict) and len(data) == 1 and isinstance(next(iter(data.values())), list):
        data = next(iter(data.values()))  # {"data": [...]}
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON array of objects (or JSON lines), got {type(data).__name__}")
    rows = []
    for i, obj in enumerate(data):
        if not isinstance(obj, dict):
            raise DataError(f"{path}, row {i}: expected a JSON object, got {type(obj).__name__}")
        rows.append((f"{path}, row {i}", obj))
    return rows


def _datasets():
    import datasets

    datasets.disable_progress_bars()
    return datasets


def _rows_of(ds: Any, name: Path) -> list[Row]:
    return [(f"{name}, row {i}", row) for i, row in enumerate(ds.to_list())]


def _read_parquet(path: Path) -> list[Row]:
    datasets = _datasets()
    try:
        ds = datasets.load_dataset("parquet", data_files=str(path), split="train")
    except Exception as e:  # datasets / pyarrow raise many types; report the message with the file
        raise DataError(f"{path}: cannot read it as parquet: {type(e).__name__}: {e}") from None
    return _rows_of(ds, path)


def _read_saved(path: Path) -> list[Row]:
    datasets = _datasets()
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:
        raise DataError(f"{path}: cannot read the saved dataset: {type(e).__name__}: {e}") from None
    if isinstance(ds, datasets.DatasetDict):
        splits = list(ds)
        if "train" in ds:
            ds = ds["train"]
        elif len(splits) == 1:
            ds = ds[splits[0]]
        else:
            raise DataError(
                f"{path}: a DatasetDict with splits {splits} and no 'train' split: point to one split's "
                f"folder ({path}/<split>)"
            )
    return _rows_of(ds, path)
