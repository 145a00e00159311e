"""Proving a weight sync happened: per-bucket checksums computed on both sides, compared.

A weight sync that silently does not happen costs weeks (verl #7495: LoRA weights never reached
the engine; TRL #5312: stale rollouts after sleep mode). After every sync the sender compares,
for every tensor it sent, a checksum it computed before sending with one the engine computed
where the tensor landed; any difference stops the run with one line naming the bucket, the
parameter and the transport (:class:`WeightSyncMismatch`).

**The checksum** (:func:`checksum`) is exact, not a closeness test: the tensor's bytes are read as
32-bit integer words (16-bit where the byte count is not a multiple of 4) and summed with a
position weight, ``sum_i w_i * (i mod 65521 + 1)`` in int64 (two's-complement wrap-around, so the
sum does not depend on the order of the additions: CPU and GPU, trainer and engine agree bit for
bit). Any change of a single word changes it (the weight is below 2^16, the word below 2^32), and
so does swapping two words whose positions differ modulo 65521 (a transposed or permuted layout).
Cost: one read of the tensor, an int64 temporary of at most :data:`CHUNK` words, a multiply and a
sum per chunk (an integer dot product on CPU); one device-to-host read per bucket (:func:`checksums`).

**The layout both sides compute**: the tensor cast to the engine's weight dtype
(``weight_dtype``, e.g. the trainer's fp32 master weights as the engine's bf16) in its Hugging Face
name and shape. The cast is round-to-nearest-even on every device, so the sender's cast equals the
engine's copy. The engine side (``weight_checksums(names)``) checksums each parameter where it
landed (the embedded engine's own parameter, also a view into a fused q/k/v matrix); a weight the
engine transforms on arrival (fp8-quantized layers, vLLM's repacked layers) is checksummed as it
arrived, cast to the engine's dtype, before the transformation (:class:`ArrivalSums`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..utils import faults
from .errors import WeightSyncMismatch as WeightSyncMismatch  # torch-free: the CLI catches it without torch

log = logging.getLogger(__name__)
_warned: set[str] = set()

PRIME = 65521  # largest prime below 2^16: the position weights are 1 .. PRIME
CHUNK = 64 * PRIME  # words per int64 temporary (a multiple of PRIME: the weights restart per chunk)
_weights: dict[torch.device, torch.Tensor] = {}


def _words(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    raw = flat.view(torch.uint8)
    if raw.numel() % 4 == 0:
        return raw.view(torch.int32)
    if raw.numel() % 2 == 0:
        return raw.view(torch.int16)
    return raw


def _position_weights(device: torch.device) -> torch.Tensor:
    w = _weights.get(device)
    if w is None:
        w = _weights[device] = (torch.arange(CHUNK, device=device) % PRIME + 1).to(torch.int64)
    return w


@torch.no_grad()
def checksum(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The position-weighted integer sum of ``t``'s bytes (see the module docstring), as a 0-dim
    int64 tensor on ``t``'s device (no host sync). ``dtype``: cast ``t`` first (the engine's
    weight dtype), one tensor's temporary at a time."""
    if dtype is not None and t.dtype != dtype:
        t = t.detach().to(dtype)
    words = _words(t)
    weights = _position_weights(words.device)
    total = torch.zeros((), dtype=torch.int64, device=words.device)
    cpu = words.device.type == "cpu"
    for a in range(0, words.numel(), CHUNK):
        part = words[a : a + CHUNK].to(torch.int64)
        w = weights[: part.numel()]
        total += torch.dot(part, w) if cpu else (part * w).sum()  # (integer dot: CPU only, 1.5x the mul + sum)
    return total


def checksums(tensors: Iterable[torch.Tensor], dtype: torch.dtype | None = None) -> list[int]:
    """:func:`checksum` of each tensor, read back to the host at once (one sync per call)."""
    sums = [checksum(t, dtype) for t in tensors]
    if not sums:
        return []
    devices = {s.device for s in sums}
    if len(devices) > 1:
        sums = [s.cpu() for s in sums]
    return [int(v) for v in torch.stack(sums).tolist()]


def corrupt(bucket: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """``bucket`` with its last tensor replaced by a copy whose first element is negated (its sign
    bit flipped: survives any cast). The ``corrupt_bucket`` fault: a transport that damaged bytes."""
    name, t = bucket[-1]
    bad = t.detach().clone()
    bad.view(-1)[0] = -bad.view(-1)[0]
    return [*bucket[:-1], (name, bad)]


@dataclass
class SentSums:
    """The sender's side: for every tensor of a sync, its bucket and checksum (computed before
    sending, in the engine's ``dtype``); :meth:`stream` computes them as the tensors pass by."""

    dtype: torch.dtype | None
    buckets: list[list[tuple[str, int]]] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, bucket: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """Record ``bucket``'s checksums; returns the bucket to send (a corrupted copy where the
        ``corrupt_bucket`` fault fires: after the checksums, as a damaging transport would)."""
        start = time.perf_counter()
        self.buckets.append(list(zip([n for n, _ in bucket], checksums((t for _, t in bucket), self.dtype))))
        self.seconds += time.perf_counter() - start
        return corrupt(bucket) if faults.hit("corrupt_bucket") else bucket

    def stream(self, buckets: Iterable[list[tuple[str, torch.Tensor]]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors of ``buckets``, each bucket checksummed before its first tensor goes out."""
        for bucket in buckets:
            yield from self.add(bucket)

    @property
    def names(self) -> list[str]:
        return [n for b in self.buckets for n, _ in b]


def compare(sent: SentSums, landed: dict[str, int | None], transport: str, engine: str = "the engine") -> list[str]:
    """Compare the sender's checksums with the engine's (``weight_checksums``: name -> checksum,
    None where the engine cannot check that tensor). Returns the names the engine could not check.

    Raises:
        WeightSyncMismatch: a tensor whose checksums differ, or that the engine does not report
            (it never arrived), in one line: bucket, parameter, transport, engine.
    """
    unchecked = []
    for b, bucket in enumerate(sent.buckets):
        for name, want in bucket:
            if name not in landed:
                raise WeightSyncMismatch(
                    f"weight sync ({transport}) did not reach {engine}: bucket {b} parameter {name} was sent "
                    f"but the engine reports no such weight after loading"
                )
            got = landed[name]
            if got is None:
                unchecked.append(name)
            elif got != want:
                raise WeightSyncMismatch(
                    f"weight sync ({transport}) mismatch in {engine}: bucket {b} parameter {name} holds other "
                    f"bytes than the trainer sent (checksum {got} != {want}, in {sent.dtype}); the engine "
                    f"would generate with wrong weights"
                )
    return unchecked


def param_checksums(model: torch.nn.Module, names: list[str], dtype: torch.dtype) -> dict[str, int | None]:
    """The engine side for weights loaded in place: checksums of ``model``'s named parameters where
    they landed (in ``dtype``); None for a tied ``lm_head.weight`` the loader skips (it is the
    embedding); names ``model`` has no parameter for are left out."""
    params = dict(model.named_parameters())
    held = [n for n in names if n in params]
    out: dict[str, int | None] = dict(zip(held, checksums((params[n] for n in held), dtype)))
    if "lm_head.weight" in names and "lm_head.weight" not in params and "model.embed_tokens.weight" in params:
        out["lm_head.weight"] = None
    return out


def checkable(engine: Any) -> bool:
    """Whether ``engine`` reports checksums of what it loaded (``weight_checksums``, ``weight_dtype``)."""
    return callable(getattr(engine, "weight_checksums", None)) and getattr(engine, "weight_dtype", None) is not None


def not_verified(engine: Any) -> dict[str, float]:
    """``sync/verified`` 0 for an engine that cannot report checksums, with one warning per engine type."""
    kind = type(engine).__name__
    if kind not in _warned:
        _warned.add(kind)
        log.warning(
            "cluster.verify_weight_sync: %s cannot report checksums of the weights it loaded; weight syncs are "
            "not verified by checksum (sync/verified=0), only by the log-prob probe "
            "(cluster.weight_sync_probe_interval; docs/reliability.md#weight-sync-verification)",
            kind,
        )
    return {"sync/verified": 0.0}


class ArrivalSums:
    """The engine's side for weights it transforms on arrival (fp8 quantization, repacking): each
    tensor's checksum in the engine's ``dtype`` as it passes into the loader; :meth:`result` reads
    them back once and keeps the latest per name (a name a sync skipped keeps its old checksum,
    which then differs from the new one sent)."""

    def __init__(self, dtype: torch.dtype | None):
        self.dtype = dtype
        self._pending: dict[str, torch.Tensor] = {}
        self._done: dict[str, int] = {}

    def watch(self, named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in named:
            self._pending[name] = checksum(t, self.dtype)
            yield name, t

    def result(self) -> dict[str, int]:
        names = list(self._pending)
        if names:
            values = torch.stack([self._pending[n].cpu() for n in names]).tolist()
            self._done.update(zip(names, (int(v) for v in values)))
        self._pending.clear()
        return dict(self._done)
