"""The finished rollouts an asynchronous checkpoint keeps, so a resume trains them instead of
generating them again (issue 51; docs/reliability.md#asynchronous-resume).

With ``rollout.max_staleness`` k > 0 a checkpoint after rollout ``i`` is taken while the producer
thread has rollouts ``i + 1 .. i + m`` (m <= k + 1) buffered or in flight. The checkpoint waits for
the ones in flight, then writes all of them to ``async_rollouts.pt`` in the checkpoint folder: every
sample as generated and scored (tokens, rollout log-probs, per-token policy versions, reward,
status, routed experts), which groups the rollout trains on (dynamic sampling), its counts, and the
data position before it. ``state.json``'s ``data`` is then the position after them, and
``data["buffered_rollouts"]`` lists them (id and the position before each), so a resume that cannot
use them (synchronous now, another ``rollout.n_samples_per_prompt`` or a lower ``max_staleness``)
rewinds to the position before the first one it drops and generates from there.

The file is read with ``torch.load(weights_only=True)``: only plain values (numbers, strings, lists,
dicts with string keys, tensors) are written; a rollout holding anything else (a custom reward's
object in ``reward_info``) is not kept and is generated again on resume (a warning says so).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..records import Sample, Status

ROLLOUTS_FILE = "async_rollouts.pt"
FORMAT_VERSION = 1

Groups = list[list[Sample]]
Produced = tuple[Groups, Groups, dict[str, float]]  # (groups to train on, every group generated, counts)


def is_plain(x: Any) -> bool:
    """Whether ``x`` is made of values ``torch.load(weights_only=True)`` reads back unchanged:
    None, bool, int, float, str, tensors, and lists / tuples / string-keyed dicts of them."""
    if x is None or isinstance(x, (bool, int, float, str, torch.Tensor)):
        return True
    if isinstance(x, (list, tuple)):
        return all(is_plain(v) for v in x)
    if isinstance(x, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in x.items())
    return False


# per-token lists stored as tensors (int64 / float64: every Python int of a token id and every Python
# float reads back equal); a list mixing types stays a list
PER_TOKEN = ("tokens", "loss_mask", "rollout_log_probs", "weight_versions")


def _packed(values: list) -> torch.Tensor | None:
    if values and all(type(v) is int for v in values):
        return torch.tensor(values, dtype=torch.int64)
    if values and all(type(v) is float for v in values):
        return torch.tensor(values, dtype=torch.float64)
    return None


def sample_record(s: Sample) -> dict[str, Any]:
    """Every field of ``s``: ``status`` as its string value, ``routed_experts`` as the tensor it is, the
    per-token lists as tensors (named in ``packed``; reading a long Python list back through
    ``torch.load(weights_only=True)`` takes seconds per million entries, a tensor milliseconds)."""
    d = dict(s.__dict__)
    d["status"] = s.status.value
    d["packed"] = []
    for name in PER_TOKEN:
        t = _packed(d[name]) if isinstance(d[name], list) else None
        if t is not None:
            d[name] = t
            d["packed"].append(name)
    return d


def sample_from_record(d: dict[str, Any]) -> Sample:
    """The :class:`Sample` of :func:`sample_record`, its lists as they were."""
    d = dict(d)
    for name in d.pop("packed", []):
        d[name] = d[name].tolist()
    return Sample(**{**d, "status": Status(d["status"])})


def rollout_record(rollout_id: int, value: Produced, generate_s: float, data_before: dict) -> dict | None:
    """A produced rollout (``value``: the producer's ``(groups, generated, counts)``) as a plain dict,
    or None when it holds something :func:`is_plain` refuses (it is then generated again on resume).

    ``data_before`` is the data position before the rollout drew its prompts (``PromptDataset.state_dict``)."""
    groups, generated, counts = value
    where = {id(g): i for i, g in enumerate(generated)}
    if any(id(g) not in where for g in groups):  # a custom rollout whose kept groups are not among the generated
        return None
    rec = {
        "version": FORMAT_VERSION,
        "rollout_id": int(rollout_id),
        "generate_s": float(generate_s),
        "counts": dict(counts),
        "generated": [[sample_record(s) for s in g] for g in generated],
        "kept": [where[id(g)] for g in groups],
        "data_before": dict(data_before),
    }
    return rec if is_plain(rec) else None


def rollout_from_record(rec: dict[str, Any]) -> tuple[Produced, float]:
    """``((groups, generated, counts), generate_s)`` of :func:`rollout_record`; the kept groups are
    the same list objects as the generated ones, as the producer made them."""
    generated = [[sample_from_record(d) for d in g] for g in rec["generated"]]
    groups = [generated[i] for i in rec["kept"]]
    return (groups, generated, dict(rec["counts"])), float(rec["generate_s"])


def save_rollouts(directory: Path, records: list[dict[str, Any]]) -> Path:
    """Write ``records`` (of :func:`rollout_record`) to ``directory/async_rollouts.pt``."""
    path = Path(directory) / ROLLOUTS_FILE
    torch.save(records, path)
    return path


def load_rollouts(directory: Path) -> list[dict[str, Any]]:
    """The records :func:`save_rollouts` wrote into checkpoint ``directory``.

    Raises:
        ValueError: the file is missing or unreadable, or of a newer format (the message names it;
            :class:`~.source.AsyncRollouts` then generates those rollouts again).
    """
    path = Path(directory) / ROLLOUTS_FILE
    if not path.is_file():
        raise ValueError(f"{path} is missing (state.json lists buffered rollouts it should hold)")
    try:
        records = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"{path} does not load ({type(e).__name__}: {e})") from e
    newer = [r.get("version") for r in records if r.get("version", 0) > FORMAT_VERSION]
    if newer:
        raise ValueError(f"{path} is of format {newer[0]}, newer than this reinforge's {FORMAT_VERSION}")
    return records
