"""The failure record a supervised child leaves for its supervisor (:mod:`reinforge.supervisor`): one line,
``Type: first line of the message``, in the file named by ``REINFORGE_FAILURE_FILE``. Here, below the
supervisor, so that anything in ``utils`` (the stall doctor) can record why the process ends."""

from __future__ import annotations

import os
from pathlib import Path

FAILURE_ENV = "REINFORGE_FAILURE_FILE"  # set in the child: where record_failure writes the error that ended it


def record_failure(e: BaseException) -> None:
    """In a supervised child (``REINFORGE_FAILURE_FILE`` set): write ``Type: first line of the
    message`` of the exception that ends the process, for the supervisor to compare attempts."""
    path = os.environ.get(FAILURE_ENV)
    if not path:
        return
    text = str(e).strip().splitlines()
    try:
        Path(path).write_text(f"{type(e).__name__}: {text[0] if text else ''}"[:2000])
    except OSError:
        pass  # (a full disk): the exit status still tells
