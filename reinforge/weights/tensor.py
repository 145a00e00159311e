"""Transport by tensor: the engine is in this process (local mode), or receives the tensors by
value through Ray's object store (CPU engines in Ray mode)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from ..utils import faults, trace
from .buckets import bucket_by_bytes

if TYPE_CHECKING:
    from ..records import RolloutEngine
    from .verify import SentSums


def sync_in_process(
    named: Iterable[tuple[str, torch.Tensor]],
    engine: RolloutEngine,
    version: int,
    bucket_bytes: int = 256 << 20,
    verify: bool = True,
) -> dict[str, float]:
    """Copy the policy's tensors into ``engine`` in place, in buckets of about ``bucket_bytes``;
    with ``verify`` (``cluster.verify_weight_sync``) each bucket is checksummed before it goes out
    and compared with the engine's checksums after loading (:mod:`.verify`).

    Returns:
        ``{"time/sync": seconds}``; with ``verify`` also ``sync/verified`` (1: every tensor matched;
        0: the engine cannot report checksums) and ``sync/verify_seconds`` (both sides' checksums
        and the comparison; included in ``time/sync``).

    Raises:
        WeightSyncMismatch: the engine holds other bytes than were sent (one line naming them).
    """
    from .verify import SentSums, checkable

    sent = SentSums(engine.weight_dtype) if verify and checkable(engine) else None  # type: ignore[attr-defined]
    with trace.span("update_weights", "sync", version=version) as s:
        stream = with_fault_point(named)
        if sent is not None:
            stream = sent.stream(bucket_by_bytes(stream, bucket_bytes))
        engine.update_weights(stream, version)
        metrics = verify_landed(sent, engine, "in-process tensor", version) if verify else {}
    return {"time/sync": s.seconds, **metrics}


def verify_landed(sent: SentSums | None, engine: Any, transport: str, version: int) -> dict[str, float]:
    """Compare ``sent`` with the engine's ``weight_checksums()`` (None: the engine cannot report them,
    warned once); the ``sync/*`` metrics of :func:`sync_in_process`."""
    from .verify import compare, not_verified

    if sent is None:
        return not_verified(engine)
    with trace.span("verify", "sync", version=version, tensors=len(sent.names)) as v:
        compare(sent, engine.weight_checksums(sent.names), transport)
    return {"sync/verified": 1.0, "sync/verify_seconds": sent.seconds + v.seconds}


def first_difference(named: Iterable[tuple[str, torch.Tensor]], engine: Any, bucket_bytes: int) -> str | None:
    """After a failed probe: checksum the policy's current tensors ``named`` (nothing is sent) and
    compare with what ``engine`` holds; the first difference as one phrase naming the bucket and
    parameter, or None (no checksums from this engine, or all equal)."""
    from .verify import SentSums, WeightSyncMismatch, checkable, checksums, compare

    if not checkable(engine):
        return None
    sums = SentSums(engine.weight_dtype)
    for bucket in bucket_by_bytes(named, bucket_bytes):
        sums.buckets.append(list(zip([n for n, _ in bucket], checksums((t for _, t in bucket), sums.dtype))))
    try:
        compare(sums, engine.weight_checksums(sums.names), "recomputed")
    except WeightSyncMismatch as e:
        detail = str(e).split(": ", 1)[1].split(" (checksum")[0]
        return f"the trainer's weights recomputed now differ from what the engine holds: {detail}"
    return None


def with_fault_point(named: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
    """``named`` with the ``weight_sync`` fault point after its first tensor (tests: a crash
    while the engine holds a mix of old and new weights); a plain pass-through otherwise."""
    for i, item in enumerate(named):
        if i == 1:
            faults.hit("weight_sync")
        yield item


def by_value(bucket: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """A bucket to send by value (detached, so no autograd graph travels with it)."""
    return [(n, t.detach()) for n, t in bucket]
