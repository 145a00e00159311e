"""The words of a checkpoint save that failed for its filesystem: full, or not writable.

Both name the checkpoint that was not written, the folder, and the newest checkpoint that is
still there, without the random name of the temporary folder the save went through (the
supervisor compares the errors of two attempts).
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from .utils.fs import NotWritableError, not_writable


def disk_full_message(root: Path, name: str, previous: Path | None, where: Path) -> str:
    """Checkpoint ``name`` of ``root`` did not fit on the filesystem of ``where``; ``previous`` is
    the newest intact checkpoint (None: none)."""
    try:
        free = f"{shutil.disk_usage(where).free / 2**20:.1f} MiB free"
    except OSError:
        free = "free space unknown"
    kept = f"the newest intact checkpoint is {previous}" if previous else "no earlier checkpoint exists in this run"
    return (
        f"disk full ({free} on the filesystem of {root}): checkpoint {name} was not written (its partial "
        f"files were removed; nothing already written was changed); {kept}. Free space or move "
        f"run.output_dir to a larger disk (run.keep_last_n_checkpoints limits how many are kept), then resume "
        f"with run.recover=auto or --load"
    )


def not_writable_error(e: BaseException, root: Path, name: str, previous: Path | None) -> NotWritableError | None:
    """The :class:`~reinforge.utils.fs.NotWritableError` to raise for ``e``, the failure of saving
    checkpoint ``name`` into ``root``, when ``root`` is not writable (read-only filesystem,
    permissions: :func:`~reinforge.utils.fs.not_writable`); None when that is not the cause.
    ``previous`` is the newest checkpoint still there (None: none)."""
    cause = not_writable(e, root)
    if cause is None:
        return None
    kept = f"the newest checkpoint is {previous}" if previous else "no earlier checkpoint exists in this run"
    return NotWritableError(
        cause.errno,
        f"checkpoint {name} could not be written: its folder {root} is not writable "
        f"({cause.strerror or errno.errorcode.get(cause.errno or 0, cause)}); nothing already written changed and "
        f"{kept}. Make {root} writable (remount it read-write, fix its permissions) or move run.output_dir, then "
        f"resume with run.recover=auto or --load",
    )
