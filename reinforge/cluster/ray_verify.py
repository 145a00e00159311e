"""Verified weight syncs in Ray placements (:mod:`reinforge.weights.verify`): the trainer rank that
sent compares its checksums with each engine actor's; the driver merges the ranks' metrics."""

from __future__ import annotations

from typing import Any

import torch

from ..utils import trace
from ..weights.verify import SentSums, WeightSyncMismatch, compare, not_verified


def verify_on_engines(sent: SentSums | None, engines: list[Any], transport: str, version: int) -> dict[str, float]:
    """Compare ``sent`` with each engine actor's ``weight_checksums`` (one call per engine after the
    last bucket); the rank's ``sync/*`` metrics ({} where it sent nothing or verification is off).

    Raises:
        WeightSyncMismatch: naming the engine's index, the bucket, the parameter and the transport.
    """
    import ray

    if sent is None:
        return {}
    with trace.span("verify", "sync", version=version, engines=len(engines)) as v:
        landed = ray.get([e.weight_checksums.remote(sent.names) for e in engines])
        for e, sums in zip(engines, landed):
            try:
                compare(sent, sums, transport)
            except WeightSyncMismatch as err:  # (named by its index: one more call, on failure only)
                index = ray.get(e.engine_index.remote())
                raise WeightSyncMismatch(str(err).replace("the engine", f"engine {index}", 1)) from None
    return {"sync/verified": 1.0, "sync/verify_seconds": sent.seconds + v.seconds}


def unwrap_mismatch(get_all: Any, refs: list[Any]) -> list[Any]:
    """``get_all(refs)``; a :class:`WeightSyncMismatch` raised in an actor is raised here as itself
    (Ray wraps it in a ``RayTaskError`` whose message holds the actor's traceback).

    Raises:
        WeightSyncMismatch: the actor's, its one line unchanged.
    """
    try:
        return get_all(refs)
    except Exception as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, WeightSyncMismatch):
            raise WeightSyncMismatch(str(cause)) from None
        raise


def sync_metrics(verify: bool, results: list[dict[str, float]], engine: Any) -> dict[str, float]:
    """The driver's ``sync/*`` metrics from the ranks' (:func:`verify_on_engines`): verified when the
    sending ranks verified (the slowest one's seconds); 0 when the engines report no checksums."""
    if not verify:
        return {}
    seconds = [r["sync/verify_seconds"] for r in results if r]
    if not seconds:
        return not_verified(engine)
    return {"sync/verified": 1.0, "sync/verify_seconds": max(seconds)}


def transport_name(colocate: bool, use_gpu: bool) -> str:
    """The transport of a Ray placement's weight syncs, as mismatch messages name it."""
    if colocate:
        return "CUDA IPC" if use_gpu else "by value (Ray object store)"
    return "NCCL broadcast" if use_gpu else "gloo broadcast"


class EngineDtype:
    """The engines' weight dtype, asked once (again after an engine was replaced); None when the
    engines report no checksums (``EngineActor.weight_dtype``)."""

    def __init__(self) -> None:
        self._of: list[Any] | None = None
        self._dtype: torch.dtype | None = None

    def get(self, handles: list[Any]) -> torch.dtype | None:
        import ray

        if self._of != handles:
            self._dtype = ray.get(handles[0].weight_dtype.remote())
            self._of = list(handles)
        return self._dtype
