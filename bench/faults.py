"""Measure the fault-injection suite and print the table of docs/reliability.md.

    PYTHONPATH=. python bench/faults.py                 # runs tests/integration/test_faults.py, prints the table
    PYTHONPATH=. python bench/faults.py --from run.jsonl  # only format recorded measurements

Each scenario of tests/integration/test_faults.py appends one JSON line (fault, how it was injected, what
happened, rollouts and samples lost, seconds to recover) to the file named by
``REINFORGE_FAULT_REPORT``; this script sets it, runs pytest and formats the lines as Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLUMNS = ("fault", "injected", "what", "happened", "rollouts_lost", "samples_lost", "recover_s")
HEADERS = (
    "fault",
    "how it was injected",
    "scenario",
    "what happened",
    "rollouts lost",
    "samples lost",
    "time to recover (s)",
)


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for r in rows:
        cells = ["-" if r.get(c) is None else str(r[c]).replace("|", "\\|") for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="source", help="format this JSON-lines file instead of running the suite")
    p.add_argument("-k", help="pytest -k expression (a subset of the scenarios)")
    args = p.parse_args()
    if args.source:
        path = Path(args.source)
    else:
        path = Path(tempfile.mkstemp(prefix="faults-", suffix=".jsonl")[1])
        env = {
            **os.environ,
            "REINFORGE_FAULT_REPORT": str(path),
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/integration/test_faults.py"]
        if args.k:
            cmd += ["-k", args.k]
        code = subprocess.call(cmd, cwd=REPO, env=env)
        if code:
            print(f"pytest exited {code}: the table below has the scenarios that passed", file=sys.stderr)
        print(f"measurements: {path}", file=sys.stderr)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
