"""Start-up: the part of a command before its run begins, where a bad input is a usage error.

A ``ValueError``, ``KeyError``, ``FileNotFoundError`` or ``FileExistsError`` raised while a
command reads its config, checks its inputs and builds its parts (datasets, model, engine,
reward functions, the checkpoint to resume) is the user's to fix: inside :func:`startup` it
becomes a :class:`UsageError` (a :class:`~reinforge.config.ConfigError`, the dedicated type of
usage errors), which ``reinforge`` prints in one line, without a traceback, and exits with status
2; the supervisor does not relaunch it. Raised once the run has started (a rollout, a custom
generate or reward function, a training step, a save), the same types are faults or bugs: they
keep their traceback, ``reinforge`` exits with status 1 and the supervisor relaunches the run.

A Ctrl-C inside :func:`startup` becomes :class:`StartupInterrupted`, so the last line can say
that the run had not begun (nothing was trained or written).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .config import ConfigError


class UsageError(ConfigError):
    """A ``ValueError`` / ``KeyError`` / ``FileNotFoundError`` / ``FileExistsError`` raised before the
    run started (its ``__cause__``); the message is the original one."""


class StartupInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) arrived during start-up, before the run began."""


@contextlib.contextmanager
def startup(interrupt: bool = True) -> Iterator[None]:
    """Run the block as start-up: a ``ValueError``, ``KeyError``, ``FileNotFoundError`` or
    ``FileExistsError`` raised in it is re-raised as :class:`UsageError` (``from`` the original, so
    ``reinforge -v`` still shows where); a :class:`~reinforge.config.ConfigError` is re-raised as it
    is; a ``KeyboardInterrupt`` as :class:`StartupInterrupted` (unless ``interrupt`` is False: a
    command that has no run, such as ``reinforge convert``).

    Raises:
        UsageError: the block raised one of the types above.
        StartupInterrupted: Ctrl-C during the block.
    """
    try:
        yield
    except (ConfigError, StartupInterrupted):
        raise
    except (ValueError, KeyError, FileNotFoundError, FileExistsError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        raise UsageError(str(message) or type(e).__name__) from e
    except KeyboardInterrupt as e:
        if not interrupt:
            raise
        raise StartupInterrupted() from e
