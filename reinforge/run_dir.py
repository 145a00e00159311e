"""A new run never writes into an earlier run's directory by accident.

Metrics are appended to ``metrics.jsonl``, TensorBoard adds event files beside the old ones and
checkpoints keep their step numbers, so a second run in the same ``run.output_dir`` mixes the two
runs' records. :func:`check_output_dir` runs before anything is built (``reinforge train`` and
``reinforge offline``) and allows an existing run directory only when the run resumes it
(``run.recover: auto``, ``--max-restarts``, or ``run.load`` inside it) or ``run.overwrite: true``
asks for it to be deleted first.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from .config import ConfigError
from .utils.fs import LOCK_FILE, check_not_locked, lock_directory, write_probe

if TYPE_CHECKING:
    from .config import RunConfig

log = logging.getLogger(__name__)

RUN_MARKERS = ("metrics.jsonl", "checkpoints")  # what only a run that got going leaves behind


def run_markers(out: Path) -> list[str]:
    """The entries of ``out`` that show a run has written there (empty: a fresh directory)."""
    return [m for m in RUN_MARKERS if (out / m).exists()]


def _inside(path: Path, folder: Path) -> bool:
    path, folder = path.expanduser().resolve(), folder.expanduser().resolve()
    return path == folder or folder in path.parents


def check_output_dir(run: RunConfig, rank: int = 0) -> None:
    """Refuse to start in an existing run directory unless this run resumes it or overwrites it.

    Resuming: ``run.recover: auto``, ``run.max_restarts > 0`` (the supervisor resumes with
    ``recover: auto``), or ``run.load`` pointing inside ``run.output_dir``. ``run.overwrite: true``
    deletes what the directory holds, under its lock (rank 0 only; other ranks skip the check),
    refused for the working directory, one of its parents or the home directory.

    Raises:
        DirectoryLocked: a live reinforge process holds the directory.
        ConfigError: an existing run directory and neither resuming nor overwriting; overwrite
            combined with resuming the same directory; overwrite of a directory that holds the
            working directory.
    """
    out = Path(run.output_dir)
    check_not_locked(out)  # a live run there: say so first (and never delete it)
    resumes_here = run.recover == "auto" or bool(run.load and _inside(Path(run.load), out))
    if run.overwrite and resumes_here:
        raise ConfigError(
            f"run.overwrite=true would delete {out}, which this run resumes (run.recover=auto or "
            f"run.load inside it): drop one of the two"
        )
    markers = run_markers(out)
    if not markers:
        return
    if run.overwrite:
        if rank != 0:
            return
        here = Path.cwd().resolve()
        if _inside(here, out) or out.expanduser().resolve() == Path.home().resolve():
            raise ConfigError(
                f"run.overwrite=true refuses to delete {out.resolve()}: it holds the working directory "
                f"or is the home directory; choose a run.output_dir of its own"
            )
        log.warning("run.overwrite=true: deleting the earlier run in %s", out)
        with lock_directory(out):  # two runs overwriting at once: the second is refused (DirectoryLocked)
            for entry in out.iterdir():
                if entry.name == LOCK_FILE:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        return
    if resumes_here or run.max_restarts > 0:
        return
    raise ConfigError(
        f"run.output_dir={str(out)!r} already holds a run ({', '.join(markers)}): a new run there would mix its "
        f"metrics and checkpoints with the old ones. Choose a new run.output_dir, resume it (run.recover=auto, or "
        f"--load {out}), or set run.overwrite=true to delete it first"
    )


def output_dir_problems(output_dir: str | Path, key: str = "run.output_dir") -> list[str]:
    """``run.output_dir`` must be writable: the folder itself, or the nearest existing folder it
    would be created in (a file is created and deleted there). Empty when it is."""
    folder = Path(output_dir).expanduser()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return [f"{key}={output_dir}: {folder} is a file, not a folder; choose another {key}"]
    error = write_probe(folder)
    if error is None:
        return []
    return [
        f"{key}={output_dir} is not writable ({error.strerror or error}: {folder}); the run could write no checkpoint "
        f"or metrics there: choose a writable {key}, or remount / fix the permissions of {folder}"
    ]
