"""Help and hints for the command line: the config sections for ``--help``, "did you mean" for a mistyped
option (against the command's own options)."""

from __future__ import annotations

import argparse

from .config import SECTIONS


def option_hint(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> str:
    """``"; did you mean --load?"`` for each mistyped option of ``extra`` close to one of the command's
    options (``difflib``), or ``""``."""
    import difflib

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = sub.choices.get(getattr(args, "command", None) or "", parser)
    options = [o for a in command._actions for o in a.option_strings if o.startswith("--")]
    hints = []
    for x in extra:
        if x.startswith("--"):
            close = difflib.get_close_matches(x.split("=")[0], options, n=2, cutoff=0.6)
            if close:
                hints.append(f"{x.split('=')[0]}: did you mean {' or '.join(close)}?")
    return "; " + "; ".join(hints) if hints else ""


def config_help() -> str:
    """The sections and a few of their keys, for ``--help`` (every key: docs/config.md)."""
    import dataclasses

    lines = [
        "config sections (write keys as section.key=value after the command; every key, its default and",
        "meaning: docs/config.md; the resolved config: reinforge config -c FILE [key=value ...]):",
    ]
    for name, cls in SECTIONS.items():
        keys = [f.name for f in dataclasses.fields(cls)]
        shown = ", ".join(keys[:3]) + (f", ... ({len(keys)} keys)" if len(keys) > 3 else "")
        lines.append(f"  {name:8s} {shown}")
    return "\n".join(lines)
