"""Loading user functions from ``module:function`` paths."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def load_function(path: str, key: str) -> Callable[..., Any]:
    """Import ``package.module:function`` (the current directory is importable).

    Raises:
        ValueError: the path is malformed, the module cannot be imported or has no such
            callable; the message names the config ``key``.
    """
    if ":" not in path:
        raise ValueError(f"{key}={path!r} must look like 'package.module:function'")
    module_name, _, attr = path.partition(":")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{key}={path!r}: cannot import module {module_name!r}: {e}") from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ValueError(f"{key}={path!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise ValueError(f"{key}={path!r} is not callable")
    return fn


def check_function_source(path: str | None, key: str) -> None:
    """Compile, without running it, the module of a ``package.module:function`` path, so a syntax
    error in a user's file is reported in a second, before any model is built (the module itself
    is imported later, where it runs: a reward's worker process). Packages above the module are
    imported to find it; a module that cannot be found is left to the later import's message.

    Raises:
        ValueError: the module's file has a syntax error; the message names ``key``, the file and
            the line.
    """
    if not path or ":" not in path:
        return
    import importlib.util

    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        spec = importlib.util.find_spec(path.partition(":")[0])
    except (ImportError, ValueError, SyntaxError):  # (a parent package's own error: the import says it)
        return
    origin = getattr(spec, "origin", None)
    if not origin or not origin.endswith(".py") or not Path(origin).is_file():
        return
    try:
        compile(Path(origin).read_bytes(), origin, "exec")
    except SyntaxError as e:
        raise ValueError(
            f"{key}={path!r}: {e.filename}:{e.lineno}: {type(e).__name__}: {e.msg}; fix the file, then run again"
        ) from None
