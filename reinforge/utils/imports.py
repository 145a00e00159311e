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
