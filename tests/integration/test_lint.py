"""Lint, format and types (issue 38 item 13): ``ruff check``, ``ruff format --check`` and ``mypy`` on the typed
core, configured in pyproject.toml. ``make lint`` fixes what ruff can."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATHS = ["reinforge", "tests", "bench", "scripts"]


def _tool(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    found = str(exe) if exe.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: `make setup` installs it (the `test` extra)")
    return found


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_lint():
    r = _run(_tool("ruff"), "check", "--output-format", "concise", *PATHS)
    assert r.returncode == 0, f"ruff check found problems (`make lint` fixes some):\n{r.stdout}{r.stderr}"


def test_ruff_format():
    r = _run(_tool("ruff"), "format", "--check", *PATHS)
    assert r.returncode == 0, f"files not formatted (`make lint` formats them):\n{r.stdout}{r.stderr}"


def test_mypy_typed_core():
    r = _run(_tool("mypy"))
    assert r.returncode == 0, f"mypy on the typed core (pyproject.toml [tool.mypy]):\n{r.stdout}{r.stderr}"
