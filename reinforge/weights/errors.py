"""The weight sync's errors, importable without torch (the CLI catches them around every command)."""

from __future__ import annotations


class WeightSyncMismatch(RuntimeError):
    """The engine does not hold the trainer's weights after a sync; the message (one line) names
    the bucket, the parameter, the transport and what to check (:mod:`.verify`)."""
