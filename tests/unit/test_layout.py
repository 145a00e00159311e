"""The tests' layout: every test file sits in tests/unit/ (in one process: no whole training loop, no Ray, no
spawned ranks, no subprocess) or tests/integration/ (those); nothing names a test file by its old place."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
KINDS = ("unit", "integration")
# what makes a test an integration test, as it reads in the test's source
INTEGRATION = {
    "a subprocess": r"subprocess\.|Popen|cli_train|run_cli\(",
    "Ray": r"ray\.init|importorskip\(\"ray\"\)|RayCluster\(",
    "a whole run": r"(?<!\.)tiny_overrides\(|RLLoop\(|run_grpo|\.train\(\)|run_offline\("
    r"|main\(\[\s*\"(train|offline|sft|dpo)\"",
    "spawned ranks": r"run_ranks|mp\.spawn|torch\.multiprocessing|spawn\(",
    "the sandbox": r"bwrap|run_python|python_tool|Sandbox\(",
}
# where test files are named by path or module
NAMED_IN = ["README.md", "Makefile", "pyproject.toml", ".ci/run", "docs/**/*.md", "reinforge/**/*.py", "bench/**/*.py"]
NAMED_IN += ["scripts/**/*", "tests/**/*.py"]


def test_every_test_file_sits_in_unit_or_integration():
    stray = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not stray, (
        f"tests/ holds {', '.join(stray)}: `git mv` each into tests/unit/ (in one process) or tests/integration/ "
        "(a whole training loop, Ray, spawned ranks or a subprocess), and fix its imports (tests.<kind>.test_...)"
    )
    for kind in KINDS:
        assert (TESTS / kind / "__init__.py").is_file(), f"tests/{kind}/__init__.py is missing"


def test_unit_tests_start_no_loop_ray_ranks_or_subprocess():
    wrong = []
    for path in sorted((TESTS / "unit").glob("test_*.py")):
        if path.name == Path(__file__).name:
            continue
        source = path.read_text()
        wrong += [f"tests/unit/{path.name}: {what}" for what, rx in INTEGRATION.items() if re.search(rx, source)]
    assert not wrong, "these start what an integration test does: move them to tests/integration/\n" + "\n".join(wrong)


def test_nothing_names_a_test_file_by_its_old_place():
    moved = {p.stem: p.parent.name for kind in KINDS for p in (TESTS / kind).glob("test_*.py")}
    old = re.compile(r"\btests(/|\.)(test_\w+)\b")
    stale = []
    for pattern in NAMED_IN:
        for path in sorted(ROOT.glob(pattern)):
            if not path.is_file() or path.suffix in (".pyc", ".png", ".gz", ".json", ".jsonl"):
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            for m in old.finditer(text):
                if m.group(2) in moved:
                    new = f"tests{m.group(1)}{moved[m.group(2)]}{m.group(1)}{m.group(2)}"
                    stale.append(f"{path.relative_to(ROOT)}: {m.group(0)} -> {new}")
    assert not stale, "test files named by their old place:\n" + "\n".join(sorted(set(stale)))
