"""Did-you-mean hints for the command line: a mistyped option against the command's own options."""

from __future__ import annotations

import argparse


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
