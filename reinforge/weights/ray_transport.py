"""Weight syncs between Ray actors, both ends of each transport (the actors in
:mod:`reinforge.cluster.ray_cluster` only call these):

* colocated: a trainer rank hands the engine on its GPU each bucket as CUDA IPC handles
  (:mod:`.ipc`), or by value through the object store on CPU (:func:`send_colocated`;
  the engine's end: :func:`receive_ipc`);
* disaggregated: trainer rank 0 broadcasts flat buckets over the weight-sync group (:mod:`.broadcast`;
  :func:`send_broadcast`, the engines' end :func:`receive_broadcast`);
* a replaced engine gets the weights by value from one rank (:func:`send_by_value`);
* verified syncs (:mod:`.verify`): the rank that sent compares its checksums with each engine actor's
  (:func:`verify_on_engines`); the driver merges the ranks' metrics (:func:`sync_metrics`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..utils import trace
from . import ipc
from .broadcast import receive_flat, send_flat
from .tensor import by_value, with_fault_point
from .verify import SentSums, WeightSyncMismatch, compare, not_verified

Bucket = list[tuple[str, torch.Tensor]]


def send_colocated(buckets: Iterable[Bucket], engine: Any, version: int, dtype: Any = None) -> dict[str, float]:
    """Hand every bucket (a trainer rank's gathered full tensors; every rank must iterate its buckets, FSDP
    all-gathers) to ``engine`` (an engine actor on this GPU, or None for a rank without one): CUDA IPC handles,
    or by value on CPU. With ``dtype`` (the engine's weight dtype) verified (:func:`verify_on_engines`); the
    rank's ``sync/*`` metrics."""
    import ray

    sent = SentSums(dtype) if dtype is not None and engine is not None else None
    transport = "CUDA IPC"
    for bucket in trace.spans_over("weight_bucket", with_fault_point(buckets), "sync"):
        if engine is None:
            continue
        bucket = sent.add(bucket) if sent is not None else bucket
        if bucket[0][1].is_cuda:
            ray.get(engine.update_weights_ipc.remote(ipc.to_handles(bucket), version))
        else:
            transport = "by value (Ray object store)"
            ray.get(engine.update_weights.remote(by_value(bucket), version))
    return verify_on_engines(sent, [engine] if engine is not None else [], transport, version)


def send_by_value(buckets: Iterable[Bucket], engine: Any, version: int) -> None:
    """Every bucket to ``engine`` by value through the object store (any device; None: this rank only gathers)."""
    import ray

    for bucket in buckets:
        if engine is not None:
            ray.get(engine.update_weights.remote([(n, t.detach().cpu()) for n, t in bucket], version))


def send_broadcast(
    group: Any, buckets: Iterable[Bucket], engines: list[Any] | None, version: int, dtype: Any, transport: str
) -> dict[str, float]:
    """Broadcast every bucket over the weight-sync ``group`` to ``engines`` (rank 0; the other ranks pass None
    and only gather); each engine actor receives it in :func:`receive_broadcast`. Verified as
    :func:`send_colocated`."""
    import ray

    sent = SentSums(dtype) if dtype is not None and engines else None
    for bucket in trace.spans_over("weight_bucket", with_fault_point(buckets), "sync"):
        if engines:
            bucket = sent.add(bucket) if sent is not None else bucket
            ray.get(send_flat(group, bucket, lambda meta: [e.receive_bucket.remote(meta, version) for e in engines]))
    return verify_on_engines(sent, engines or [], transport, version)


def receive_ipc(engine: Any, handles: ipc.Handles, version: int) -> None:
    """The engine's end of :func:`send_colocated` on a GPU: the tensors behind the IPC handles, into ``engine``."""
    engine.update_weights(ipc.from_handles(handles), version)


def receive_broadcast(
    engine: Any, group: Any, meta: list[tuple[str, tuple[int, ...]]], device: torch.device, version: int
) -> None:
    """The engine's end of :func:`send_broadcast`: one flat bucket of ``meta``'s tensors, into ``engine``."""
    engine.update_weights(receive_flat(group, meta, device), version)


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
