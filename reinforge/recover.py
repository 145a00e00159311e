"""Auto-recovery (``run.recover: auto``): which checkpoint a restarted run resumes from, whether
its config allows it, and when the running loop writes recover checkpoints.

* :func:`recover_candidates` lists the complete checkpoints of ``<output_dir>/checkpoints``,
  newest first, skipping damaged ones with a warning (the loop then tries them in order, so a
  checkpoint whose shards fail to load falls back to the previous one too); hidden folders of
  saves interrupted by a crash are deleted.
* :func:`check_compatible` refuses a resume whose batch size, group size, optimizer steps per
  rollout or trainer world size changed, saying which key and what to do.
* :class:`RecoverTimer` decides at the end of each rollout whether to write a recover
  checkpoint: every ``run.recover_interval_s`` seconds, or at once after SIGTERM or SIGINT
  (Ctrl-C; then the run stops with :class:`Preempted`; a second SIGINT interrupts at once).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

from . import checkpoint as ckpt
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


def check_compatible(saved: dict[str, Any], cfg: Config, path: Path) -> None:
    """Raise when ``cfg`` cannot continue the run saved in checkpoint ``path`` (config ``saved``).

    Raises:
        ConfigError: naming each changed key, its old and new value, and the ways out.
    """
    now = cfg.to_dict()
    changed = [(k, why, _value(saved, k), _value(now, k)) for k, why in RESUME_KEYS
               if _value(saved, k) != _value(now, k)]
    if changed:
        what = "; ".join(f"{k} changed from {a!r} to {b!r} ({why})" for k, why, a, b in changed)
        raise ConfigError(
            f"run.recover=auto cannot resume {path}: {what}. Restore the old value(s), choose a new run.output_dir, "
            f"or resume from it explicitly with run.load={path} (and run.recover=off) to accept the change")


def recover_candidates(output_dir: Path) -> list[Path]:
    """Complete checkpoints of ``output_dir/checkpoints`` to try, newest first (empty: start
    from scratch). Damaged ones are skipped with a warning; leftovers of interrupted saves removed."""
    root = Path(output_dir) / "checkpoints"
    gone = ckpt.remove_partial_saves(root)
    if gone:
        log.warning("removed %d interrupted checkpoint save(s) in %s: %s", len(gone), root, ", ".join(gone))
    return ckpt.find_resumable(root, warn=log.warning)


SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RecoverTimer:
    """When to write recover checkpoints: every ``interval_s`` seconds of training and after
    SIGTERM or SIGINT. :meth:`install` makes these signals set a flag (checked at the end of
    each rollout: a checkpoint needs a consistent state, which exists only between rollouts);
    a second SIGINT raises ``KeyboardInterrupt`` at once (no checkpoint: the user insisted)."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.last = time.monotonic()
        self.signal: str | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        self._previous = {s: signal.signal(s, self._on_signal) for s in SIGNALS}

    def uninstall(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt(f"second {name}: stopping without a checkpoint")
        self.signal = name
        log.warning("%s received: writing a recover checkpoint at the end of this rollout, then stopping%s", name,
                    " (Ctrl-C again to stop at once, without it)" if signum == signal.SIGINT else "")

    def due(self) -> bool:
        """Whether a recover checkpoint should be written now."""
        return self.signal is not None or time.monotonic() - self.last >= self.interval_s

    def saved(self) -> None:
        self.last = time.monotonic()
