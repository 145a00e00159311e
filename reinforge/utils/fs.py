"""Writing files and folders atomically: readers see the old version or the new one, never half."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_directory(target: Path) -> Iterator[Path]:
    """Yield a hidden temporary folder beside ``target``; when the block ends without an
    exception it replaces ``target`` (an existing one is moved aside first and removed after),
    otherwise it is deleted and ``target`` is untouched.

    The swap is two renames on the same filesystem: a crash between them leaves the old folder
    as ``.old-<name>`` beside the target and nothing half-written under the target's name.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            old = target.parent / f".old-{target.name}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a synced temporary file and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


LOCK_FILE = ".reinforge.lock"


class DirectoryLocked(RuntimeError):
    """Another live process holds the run directory's lock; the message names its pid."""


def check_not_locked(directory: Path, what: str = "run.output_dir") -> None:
    """Raise :class:`DirectoryLocked` when a live process holds ``directory``'s lock (see
    :func:`lock_directory`); checked before anything else looks at or deletes the directory."""
    with lock_directory(directory, what, create=False):
        pass


@contextlib.contextmanager
def lock_directory(directory: Path, what: str = "run.output_dir", create: bool = True) -> Iterator[Path]:
    """Hold an exclusive ``fcntl.flock`` on ``directory/.reinforge.lock`` for the block, so two
    trainers cannot write into one run directory. The kernel releases the lock when the holder
    dies (even by SIGKILL), so a stale lock file never blocks a rerun. The file records the
    holder's pid and command line for the message. Without ``fcntl`` (Windows) nothing is locked.

    Raises:
        DirectoryLocked: another process holds the lock.
    """
    directory = Path(directory)
    path = directory / LOCK_FILE
    if not create and not path.exists():
        yield path
        return
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield path
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
            raise DirectoryLocked(
                f"{what}={directory} is in use by another reinforge process ({holder}): wait for it to finish or "
                f"stop it (kill -TERM <pid> writes a recover checkpoint), or choose another {what}") from None
        os.ftruncate(fd, 0)
        import sys

        os.pwrite(fd, f"pid {os.getpid()}: {' '.join(sys.argv)}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock
