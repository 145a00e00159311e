"""Writing files and folders atomically: readers see the old version or the new one, never half."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_directory(target: Path) -> Iterator[Path]:
    """Yield a hidden temporary folder beside ``target``; when the block ends without an
    exception it replaces ``target`` (an existing one is moved aside first and removed after),
    otherwise it is deleted and ``target`` is untouched. The folder and everything in it get the
    modes a plain ``mkdir`` / ``open`` would give (:func:`apply_umask`: 0755 / 0644 under the usual
    umask 022), not the private 0700 / 0600 of temporary files.

    The swap is two renames on the same filesystem: a crash between them leaves the old folder
    as ``.old-<name>`` beside the target and nothing half-written under the target's name.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        apply_umask(tmp)  # mkdtemp (0700) and safetensors (0600) write private files: give them the usual modes
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


def current_umask() -> int:
    """This process's umask (``/proc/self/status`` where it is listed; else set and restored)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(root: Path) -> None:
    """Give ``root`` (a file or a folder, recursively) the modes ``mkdir`` / ``open`` would under the
    umask: folders and executable files ``0o777 & ~umask``, other files ``0o666 & ~umask``."""
    mask = current_umask()
    root = Path(root)
    paths = [root] + (list(root.rglob("*")) if root.is_dir() else [])
    for p in paths:
        if p.is_symlink():
            continue
        mode = p.stat().st_mode
        full = 0o777 if p.is_dir() or mode & 0o111 else 0o666
        os.chmod(p, full & ~mask)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a synced temporary file and a rename (the file gets the
    umask's mode, as ``open`` would give it, not ``mkstemp``'s 0600)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.chmod(tmp, 0o666 & ~current_umask())
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class DiskFullError(OSError):
    """A checkpoint or a metrics row could not be written because its filesystem is full
    (``errno.ENOSPC``); the message names what was not written and what is intact
    (``reinforge.checkpoint.DiskFullError`` is this class)."""


class NotWritableError(OSError):
    """A checkpoint could not be written because its folder is not writable (read-only filesystem,
    permissions: ``errno.EROFS`` / ``EACCES`` / ``EPERM``); the message names the folder, what was
    not written and what is intact."""


_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def not_writable(e: BaseException, where: Path) -> OSError | None:
    """The ``OSError`` (EROFS, EACCES or EPERM) that made a write under ``where`` fail: ``e`` or an
    exception it was raised from whose file is under ``where``, or, for a writer that reports no
    errno or file (torch's ``RuntimeError`` "cannot be opened"), the error of creating a file in
    ``where`` now. None: the folder is writable."""
    seen: set[int] = set()
    x: BaseException | None = e
    root = Path(where).resolve()
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        if isinstance(x, OSError) and x.errno in _NOT_WRITABLE and x.filename is not None:
            name = Path(os.fsdecode(x.filename)).resolve()
            if name == root or root in name.parents:
                return x
        x = x.__cause__ or x.__context__
    folder = Path(where)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return write_probe(folder)


def write_probe(folder: Path) -> OSError | None:
    """Create and delete a hidden file in ``folder``: the ``OSError`` when that is refused for want
    of write access (EROFS, EACCES, EPERM), else None."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-probe.")
    except OSError as e:
        return e if e.errno in _NOT_WRITABLE else None
    os.close(fd)
    os.unlink(probe)
    return None


LOCK_FILE = ".reinforge.lock"


_HELD: set[Path] = set()  # directories whose lock this process holds
SUPERVISOR_PID_ENV = "REINFORGE_SUPERVISOR_PID"  # reinforge.supervisor.PARENT_ENV: set in a supervised trainer


def locked_message(directory: Path, what: str, holder: str) -> str:
    """The refusal of a second process in a locked directory. ``holder`` is the lock file's line
    (``pid 12, supervisor pid 11: <command>``): a supervised trainer is stopped through its
    supervisor (``kill -TERM`` of the trainer alone would be relaunched by the supervisor)."""
    import re

    m = re.match(r"pid (\d+)(?:, supervisor pid (\d+))?", holder)
    if m and m.group(2):
        stop = (
            f"stop its supervisor with kill -TERM {m.group(2)} (the trainer, pid {m.group(1)}, then writes a "
            f"recover checkpoint and the supervisor does not relaunch it; a kill of the trainer alone would be "
            f"relaunched)"
        )
    else:
        stop = f"stop it with kill -TERM {m.group(1) if m else '<pid>'} (it writes a recover checkpoint)"
    return (
        f"{what}={directory} is in use by another reinforge process ({holder}): wait for it to finish or {stop}, "
        f"or choose another {what}"
    )


def held_by_another(directory: Path) -> bool:
    """Whether another live process holds ``directory``'s lock (:func:`lock_directory`)."""
    if Path(directory).resolve() in _HELD:
        return False
    try:
        check_not_locked(directory)
    except DirectoryLocked:
        return True
    return False


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
            raise DirectoryLocked(locked_message(directory, what, holder)) from None
        os.ftruncate(fd, 0)
        import sys

        supervisor = os.environ.get(SUPERVISOR_PID_ENV, "")
        by = f", supervisor pid {supervisor}" if supervisor.isdigit() else ""
        os.pwrite(fd, f"pid {os.getpid()}{by}: {' '.join(sys.argv)}\n".encode(), 0)
        _HELD.add(directory.resolve())
        try:
            yield path
        finally:
            _HELD.discard(directory.resolve())
    finally:
        os.close(fd)  # releases the lock


# Messages of torch's zip writer (``torch.save``, DCP) when a write came up short: it reports
# the position it expected instead of the errno (ambiguous: checked against the free space).
_SHORT_WRITE = ("unexpected pos", "file write failed")
# The errno's own words in the message of a writer that does not raise ``OSError`` (safetensors:
# ``SafetensorError: ... No space left on device (os error 28)``, the partial file already removed).
_NO_SPACE = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122", "enospc")
_LOW_FREE_BYTES = 64 << 20


def is_disk_full(e: BaseException, where: Path) -> bool:
    """Whether ``e`` (or an exception it was raised from) is a failed write on a full disk:
    an ``OSError`` with ``errno`` ENOSPC / EDQUOT, an error whose message carries that errno
    (safetensors' ``os error 28``), or torch's short-write ``RuntimeError`` (``unexpected pos
    ...``) while the filesystem of ``where`` has under 64 MiB or 1 % free."""
    seen: set[int] = set()
    short_write = False
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(e).lower()
        if any(m in text for m in _NO_SPACE):
            return True
        if any(m in text for m in _SHORT_WRITE):
            short_write = True
        e = e.__cause__ or e.__context__
    if not short_write:
        return False
    try:
        usage = shutil.disk_usage(where if Path(where).exists() else Path(where).parent)
    except OSError:
        return False
    return usage.free < max(_LOW_FREE_BYTES, usage.total // 100)
