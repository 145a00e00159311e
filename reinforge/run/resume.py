"""Which checkpoint a run resumes from, for every mode (:class:`~reinforge.run.driver.Driver`'s jobs).

* :func:`resume_candidates`: the checkpoints to try, newest first: with ``run.recover=auto`` the run's
  own (``<output_dir>/checkpoints``, refused when its config cannot continue them,
  :func:`~reinforge.recover.check_compatible`), else those of ``run.load`` (a checkpoint, or a run
  directory: its newest intact one first).
* :func:`load_first`: load them in order until one loads; a damaged one falls back to the next with a
  warning (``run.recover=auto`` or a run directory given), a single one of ``run.load`` is refused in words.
* :func:`read_state`: its ``state.json`` and RNG state, with a warning naming each setting that
  changed since (:func:`~reinforge.recover.changed_settings`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import checkpoint as ckpt
from ..config import Config
from ..recover import RESUME_KEYS, all_damaged, changed_settings, check_compatible, recover_candidates

log = logging.getLogger(__name__)


def resume_candidates(
    cfg: Config, base_path: str | Path, unit: str = "rollout", keys: tuple[tuple[str, str], ...] = RESUME_KEYS
) -> list[Path]:
    """Checkpoints (``<unit>_NNNNNN`` folders) to resume from, newest first; empty: start from scratch.

    Raises:
        CheckpointError: ``run.load`` names nothing loadable, or every checkpoint of the run is damaged.
        ConfigError: ``run.recover=auto`` and a key of ``keys`` changed since the newest checkpoint.
    """
    r = cfg.run
    found = ckpt.load_candidates(r.load, prefix=unit, warn=log.warning, model_path=base_path) if r.load else []
    if r.recover == "auto":
        own = recover_candidates(Path(r.output_dir), unit)  # this run's own checkpoints win over run.load
        if own:
            check_compatible(ckpt.load_checkpoint_state(own[0])[0]["config"], cfg, own[0], keys)
            return own
        if not found:
            log.info(
                "run.recover=auto: no checkpoint in %s yet, starting from scratch", Path(r.output_dir) / "checkpoints"
            )
    return found


def load_first(cfg: Config, candidates: list[Path], load: Callable[[Path], list[str]]) -> Path | None:
    """Load (``load(path)``: the trainers' state; returns the models whose optimizer state the
    checkpoint lacks) the first of ``candidates`` that loads; with ``run.recover=auto`` or several
    candidates a failure falls back to the next one with a warning. Returns the one loaded (None: none given).

    Raises:
        CheckpointError: the single checkpoint of ``run.load`` does not load, or none of the candidates
            does (the message lists why each failed).
    """
    errors = []
    for path in candidates:
        log.info("resuming from %s", path)
        try:
            without = load(path)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # a damaged shard (DCP's CheckpointException is a BaseException)
            why = ckpt.describe_load_error(e)
            if len(candidates) == 1 and cfg.run.recover != "auto":
                raise ckpt.CheckpointError(
                    f"run.load: checkpoint {path} does not load ({why}); it is damaged or "
                    f"of another run: load an older checkpoint of its run, or its run "
                    f"directory to fall back automatically"
                ) from e
            errors.append(f"{path.name}: {why}")
            log.warning("could not load checkpoint %s (%s): falling back to an older one", path, why)
            continue
        if without:
            log.warning(
                "checkpoint %s holds no optimizer state for the %s (run.save_optimizer): AdamW's moments "
                "restart from zero, so the run does not continue exactly",
                path,
                " and ".join(without),
            )
        return path
    if errors:
        raise all_damaged(Path(cfg.run.output_dir) / "checkpoints", "; ".join(errors))
    return None


def read_state(path: Path, cfg: Config) -> tuple[dict[str, Any], dict[str, Any]]:
    """``state.json`` and the RNG state of checkpoint ``path``, with a warning naming each setting of
    ``cfg`` that differs from the checkpoint's (the run will not continue exactly)."""
    state, rng = ckpt.load_checkpoint_state(path)
    changed = changed_settings(state["config"], cfg)
    if changed:
        log.warning(
            "resuming %s with settings that differ from the checkpoint's: %s; the run will not continue exactly",
            path,
            "; ".join(changed),
        )
    return state, rng
