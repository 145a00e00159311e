"""Auto-recovery (``run.recover: auto``): which checkpoint a restarted run resumes from, whether
its config allows it, and when the running loop writes recover checkpoints.

* :func:`recover_candidates` lists the complete checkpoints of ``<output_dir>/checkpoints``,
  newest first, skipping damaged ones with a warning (the loop then tries them in order, so a
  checkpoint whose shards fail to load falls back to the previous one too); hidden folders of
  saves interrupted by a crash are deleted. When every checkpoint is damaged it refuses in words:
  starting over would overwrite the run's history (metrics rows, checkpoints).
* :func:`check_compatible` refuses a resume whose batch size, group size, optimizer steps per
  rollout or trainer world size changed, saying which key and what to do.
* :class:`RecoverTimer` decides at the end of each rollout whether to write a recover
  checkpoint: every ``run.recover_interval_s`` seconds (``recover: auto``), or at once after
  SIGTERM or SIGINT (Ctrl-C; whatever ``run.recover``; then the run stops with :class:`Preempted`;
  a second SIGINT interrupts at once, except during a save, which is finished first).
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import checkpoint as ckpt
from .checkpoint_line import finish_retiring
from .config import Config, ConfigError

log = logging.getLogger(__name__)

# (dotted key, what depends on it): a change of these makes a resumed run a different run.
RESUME_KEYS = (
    ("rollout.rollout_batch_size", "the data position and the learning-rate schedule"),
    ("rollout.n_samples_per_prompt", "the group size of the advantages"),
    ("train.num_steps_per_rollout", "the global batch size and the learning-rate schedule"),
    ("cluster.world_size", "the trainer world size (actor_num_nodes * actor_num_gpus_per_node)"),
    ("model.path", "the policy's weights"),
    ("data.prompt_data", "the prompts"),
)
# The same for an offline run (``reinforge offline``).
OFFLINE_RESUME_KEYS = (
    ("offline.method", "what is trained (the checkpoint's state and loss)"),
    ("offline.global_batch_size", "the data position and the learning-rate schedule"),
    ("offline.train_data", "the examples"),
    ("model.path", "the initial weights"),
)


class Preempted(SystemExit):
    """The run stopped after SIGTERM / SIGINT once its recover checkpoint was written (exit
    status 128 + the signal number: 143, 130)."""

    def __init__(self, signame: str, path: Path):
        super().__init__(128 + int(getattr(signal.Signals, signame, signal.SIGTERM)))
        self.signame, self.path = signame, path


def _value(cfg: dict[str, Any], key: str) -> Any:
    section, name = key.split(".")
    c = cfg.get(section, {})
    if key == "cluster.world_size":
        return int(c.get("actor_num_nodes", 1)) * int(c.get("actor_num_gpus_per_node", 1))
    return c.get(name)


def check_compatible(
    saved: dict[str, Any], cfg: Config, path: Path, keys: tuple[tuple[str, str], ...] = RESUME_KEYS
) -> None:
    """Raise when ``cfg`` cannot continue the run saved in checkpoint ``path`` (config ``saved``):
    a key of ``keys`` (:data:`RESUME_KEYS`, :data:`OFFLINE_RESUME_KEYS`) changed.

    Raises:
        ConfigError: naming each changed key, its old and new value, and the ways out.
    """
    now = cfg.to_dict()
    changed = [(k, why, _value(saved, k), _value(now, k)) for k, why in keys if _value(saved, k) != _value(now, k)]
    if changed:
        what = "; ".join(f"{k} changed from {a!r} to {b!r} ({why})" for k, why, a, b in changed)
        raise ConfigError(
            f"run.recover=auto cannot resume {path}: {what}. Restore the old value(s), choose a new run.output_dir, "
            f"or resume from it explicitly with run.load={path} (and run.recover=off) to accept the change"
        )


# Keys whose change on resume is expected: where the run writes, how it is resumed, how long it trains,
# what is evaluated and logged.
NOT_COMPARED = ("run.", "eval.", "train.num_rollout", "offline.num_epochs")


def changed_settings(saved: dict[str, Any], cfg: Config) -> list[str]:
    """``key: old -> new`` for each setting of ``cfg`` that differs from the checkpoint's config
    ``saved`` (keys the checkpoint does not have, and :data:`NOT_COMPARED`, are not compared)."""
    now = json.loads(json.dumps(cfg.to_dict(), default=str))  # as state.json holds it (tuples as lists)
    out = []
    for section, values in now.items():
        old = saved.get(section)
        if not isinstance(old, dict) or not isinstance(values, dict):
            continue
        for key, value in values.items():
            name = f"{section}.{key}"
            if key in old and old[key] != value and not any(name.startswith(x) for x in NOT_COMPARED):
                out.append(f"{name} {old[key]!r} -> {value!r}")
    return out


def recover_candidates(output_dir: Path, prefix: str = "rollout") -> list[Path]:
    """Complete checkpoints (``<prefix>_NNNNNN``) of ``output_dir/checkpoints`` to try, newest first
    (empty: no checkpoint was ever written, start from scratch). Damaged ones are skipped with a warning; leftovers of
    interrupted saves removed.

    Raises:
        CheckpointError: there are checkpoints but every one is damaged (starting over would drop
            the run's metrics and its checkpoints would be deleted by newer ones).
    """
    root = Path(output_dir) / "checkpoints"
    finish_retiring(root)  # a rollback interrupted by a crash: its abandoned line is not resumed
    gone = ckpt.remove_partial_saves(root)
    if gone:
        log.warning("removed %d interrupted checkpoint save(s) in %s: %s", len(gone), root, ", ".join(gone))
    found = ckpt.find_resumable(root, prefix, warn=log.warning)
    if not found and ckpt.list_checkpoints(root, prefix):
        raise all_damaged(root)
    return found


def all_damaged(root: Path, why: str = "see the warnings above") -> ckpt.CheckpointError:
    """The refusal of ``run.recover=auto`` when no checkpoint of ``root`` can be resumed."""
    return ckpt.CheckpointError(
        f"run.recover=auto: every checkpoint in {root} is damaged ({why}); starting from scratch would overwrite "
        f"this run's history (metrics.jsonl, checkpoints), so nothing was changed. Restore a checkpoint from a "
        f"backup, move {root} away to start over in {root.parent} (its metrics rows from the first step on are "
        f"then replaced), or choose a new run.output_dir"
    )


SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RecoverTimer:
    """When to write recover checkpoints: every ``interval_s`` seconds of training (None: never
    on a timer, ``recover: off``) and after SIGTERM or SIGINT. :meth:`install` makes these
    signals set a flag (checked at the end of each rollout: a checkpoint needs a consistent state,
    which exists only between rollouts); a second SIGINT raises ``KeyboardInterrupt`` at once (no
    checkpoint: the user insisted), except inside :meth:`saving`: a save is finished first."""

    def __init__(self, interval_s: float | None):
        self.interval_s = interval_s
        self.last = time.monotonic()
        self.signal: str | None = None
        self._previous: dict[int, Any] = {}
        self._saving = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        self._previous = {s: signal.signal(s, self._on_signal) for s in SIGNALS}

    def uninstall(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """A checkpoint is being written: signals wait until it is complete."""
        self._saving = True
        try:
            yield
        finally:
            self._saving = False

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self._saving:
            log.warning(
                "%s received while a checkpoint is being written: stopping once it is complete "
                "(kill -9 stops at once, without it)",
                name,
            )
            self.signal = self.signal or name
            return
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt(f"second {name}: stopping without a checkpoint")
        self.signal = name
        log.warning(
            "%s received: writing a checkpoint at the end of this rollout, then stopping%s",
            name,
            " (Ctrl-C again to stop at once, without it)" if signum == signal.SIGINT else "",
        )

    def due(self) -> bool:
        """Whether a recover checkpoint should be written now."""
        return self.signal is not None or (
            self.interval_s is not None and time.monotonic() - self.last >= self.interval_s
        )

    def saved(self) -> None:
        self.last = time.monotonic()
