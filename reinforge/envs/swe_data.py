"""``reinforge make-data swe``: synthetic small Python repositories with one injected bug each.

A repository (:func:`make_repo`) is one module of a handful of functions of one theme
(:mod:`.swe_templates`), a tests file with one ``test_<function>`` per function (its expected
values are what the original code returns) and a README. One mutation (:data:`MUTATIONS`: a
swapped operator, a wrong comparison, an off-by-one constant, ``and`` for ``or``) is applied to one
line of one function, in the source text, so the rest of the file is untouched. Every repository
is verified by running its tests (in-process, :func:`run_in_process`, under a time limit): the
tests must fail on the buggy code and pass on the original; mutations that change nothing the
tests see, or that make the code loop, are tried no further.

Rows (jsonl; ``data.prompt_data``) are what the ``swe`` environment (:mod:`.swe`) plays::

    {"prompt": "<the task: which test fails, and how>",
     "label": "<the original line>",
     "metadata": {"swe": {"files": {path: text}, "tests": ["test_numkit"], "n_tests": 5,
                          "failing": ["test_clamp"], "bug": {"path", "line", "kind", "buggy", "fixed"},
                          "id": "<seed>-<index>"}}}

The same ``seed`` gives the same file, byte for byte.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.util
import json
import linecache
import random
import signal
import sys
import threading
from itertools import zip_longest
from pathlib import Path
from typing import Any

from .swe_templates import THEMES, Template

RUNNER = r'''
import ast, importlib, sys, traceback


def _where(e, root):
    frames = traceback.extract_tb(e.__traceback__)
    text = "%s: %s" % (type(e).__name__, str(e)[:200]) if str(e) else type(e).__name__
    for f in reversed(frames):  # the deepest frame in the repository
        name = f.filename[len(root):] if root and f.filename.startswith(root) else f.filename
        if not name.startswith("<") and "/" not in name:
            return "%s at %s:%d: %s" % (text, name, f.lineno, (f.line or "").strip())
    return text


_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def _plain(value):
    """``value`` when it is made of plain built-in values only (what a literal is made of), else a
    TypeError: an object whose ``__eq__`` says True to anything does not pass an assert."""
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        t = type(v)
        if t in (list, tuple, set, frozenset, dict):
            if id(v) not in seen:
                seen.add(id(v))
                stack.extend([*v.keys(), *v.values()] if t is dict else v)  # all alive: ids stay unique
        elif t not in _PLAIN:
            raise TypeError("got a %s where a plain value (a number, string, list...) was expected" % t.__name__)
    return value


def _literal(node):
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


class _PlainAsserts(ast.NodeTransformer):
    """``assert x == <literal>`` (or ``!=``) becomes ``assert _reinforge_plain(x) == <literal>``."""

    def visit_Assert(self, node):
        t = node.test
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.NotEq)):
            if _literal(t.comparators[0]):
                t.left = ast.Call(ast.Name("_reinforge_plain", ast.Load()), [t.left], [])
        return node


def _load(name, root, plain=False):
    """The test module ``name``: with a ``root``, compiled from its own file there (root +
    name.replace(".", "/") + ".py"), never from a package, a bytecode cache or another file that
    an import by name would find first; without, imported by name (the generator's own code).
    With ``plain``, what its asserts compare with a literal must be a plain value (:func:`_plain`)."""
    if not root:
        return importlib.import_module(name)
    path = root + name.replace(".", "/") + ".py"
    with open(path, "rb") as f:
        tree = ast.parse(f.read(), path)
    if plain:
        tree = ast.fix_missing_locations(_PlainAsserts().visit(tree))
    mod = type(sys)(name)
    mod.__file__, mod.__package__ = path, name.rpartition(".")[0]
    mod._reinforge_plain = _plain
    sys.modules[name] = mod
    exec(compile(tree, path, "exec"), mod.__dict__)
    return mod


def run_tests(modules, root="", plain=False):
    """Run every test_* function of each test module; (passed, failed, report lines)."""
    passed, failed, lines = 0, 0, []
    for name in modules:
        try:
            mod = _load(name, root, plain)
        except BaseException as e:
            failed += 1
            lines.append("ERROR %s.py: %s" % (name, _where(e, root)))
            continue
        for fname, fn in list(vars(mod).items()):
            if not fname.startswith("test_") or not callable(fn):
                continue
            try:
                fn()
            except BaseException as e:
                failed += 1
                lines.append("FAILED %s.py::%s - %s" % (name, fname, _where(e, root)))
            else:
                passed += 1
    return passed, failed, lines
'''
"""The test runner, as source: the generator runs it in-process, the environment in its sandbox."""

_runner: dict[str, Any] = {}
exec(compile(RUNNER, "<swe runner>", "exec"), _runner)
run_tests = _runner["run_tests"]

# operator swaps (text of the operator in the source -> its replacement)
BINARY = {
    ast.Add: ("+", "-"),
    ast.Sub: ("-", "+"),
    ast.Mult: ("*", "+"),
    ast.FloorDiv: ("//", "/"),
    ast.Mod: ("%", "//"),
}
COMPARE = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
}
MUTATIONS = ("swapped_operator", "wrong_comparison", "off_by_one", "and_or")
VERIFY_SECONDS = 0.25


class _Timeout(BaseException):
    pass


class _Sources(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports modules from ``{module name: (file name, source)}`` (in-process runs)."""

    def __init__(self, sources: dict[str, tuple[str, str]]):
        self.sources = sources

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.util.spec_from_loader(name, self) if name in self.sources else None

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        filename, source = self.sources[module.__name__]
        module.__file__ = filename
        exec(compile(source, filename, "exec"), module.__dict__)


def run_in_process(files: dict[str, str], tests: list[str], seconds: float = VERIFY_SECONDS) -> dict[str, Any]:
    """Run the ``tests`` modules of ``files`` here, as the sandbox runs them: ``{"passed",
    "failed", "lines", "timed_out"}``. Only for the generator's own code and its mutants (in the
    main thread a timer bounds the run; elsewhere nothing does)."""
    sources = {p[:-3]: (p, text) for p, text in files.items() if p.endswith(".py") and "/" not in p}
    finder = _Sources(sources)
    timed_out = False
    main = threading.current_thread() is threading.main_thread()

    def alarm(*_: Any) -> None:
        nonlocal timed_out
        timed_out = True
        raise _Timeout(f"the tests did not finish within {seconds:g} s")

    old = signal.signal(signal.SIGALRM, alarm) if main else None
    sys.meta_path.insert(0, finder)
    for filename, text in sources.values():
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    try:
        if main:
            signal.setitimer(signal.ITIMER_REAL, seconds, 0.05)  # fires again until cancelled: every loop ends
        passed, failed, lines = run_tests(tests)
    finally:
        while main:
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
                break
            except _Timeout:
                continue
        sys.meta_path.remove(finder)
        for name, (filename, _) in sources.items():
            sys.modules.pop(name, None)
            linecache.cache.pop(filename, None)
    return {"passed": passed, "failed": failed, "lines": lines, "timed_out": timed_out}


def mutation_sites(source: str) -> list[dict[str, Any]]:
    """Every single-line mutation of ``source``: ``{"kind", "line", "col", "end", "old", "new"}``
    (1-based line; the columns of the replaced text on it)."""
    lines = source.splitlines()
    sites: list[dict[str, Any]] = []

    def between(a: ast.AST, b: ast.AST, symbol: str, new: str, kind: str) -> None:
        if a.end_lineno != b.lineno:
            return
        text = lines[b.lineno - 1]
        seg = text[a.end_col_offset : b.col_offset]
        if seg.strip(" ()") != symbol:
            return
        col = a.end_col_offset + seg.index(symbol)
        sites.append({"kind": kind, "line": b.lineno, "col": col, "end": col + len(symbol), "old": symbol, "new": new})

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            return []  # positions inside f-strings are not reliable before Python 3.12: templates have none
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
            between(node.left, node.right, *BINARY[type(node.op)], "swapped_operator")
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in COMPARE:
            between(node.left, node.comparators[0], *COMPARE[type(node.ops[0])], "wrong_comparison")
        elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
            symbol, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            between(node.values[0], node.values[1], symbol, new, "and_or")
        elif (
            isinstance(node, ast.Constant)
            and type(node.value) is int
            and node.lineno == node.end_lineno
            and lines[node.lineno - 1][node.col_offset : node.end_col_offset] == str(node.value)
        ):
            for delta in (1, -1):
                if node.value + delta >= 0:
                    sites.append(
                        {
                            "kind": "off_by_one",
                            "line": node.lineno,
                            "col": node.col_offset,
                            "end": node.end_col_offset,
                            "old": str(node.value),
                            "new": str(node.value + delta),
                        }
                    )
    return sorted(sites, key=lambda s: (s["line"], s["col"], s["new"]))


def apply_site(source: str, site: dict[str, Any]) -> str:
    lines = source.splitlines(True)
    text = lines[site["line"] - 1]
    lines[site["line"] - 1] = text[: site["col"]] + site["new"] + text[site["end"] :]
    return "".join(lines)


def _test_source(module: str, templates: list[Template], rng: random.Random) -> str | None:
    """The tests file: one test per function, each asserting what the original returns."""
    namespace: dict[str, Any] = {}
    exec(compile("".join(t.source for t in templates), f"{module}.py", "exec"), namespace)
    parts = [f"from {module} import {', '.join(t.name for t in templates)}\n"]
    for t in templates:
        asserts = []
        for args in t.cases(rng):
            try:
                value = namespace[t.name](*args)
            except Exception:  # noqa: BLE001 - an input the original does not take: not a case
                continue
            call = f"{t.name}({', '.join(repr(a) for a in args)})"
            line = f"    assert {call} is None\n" if value is None else f"    assert {call} == {value!r}\n"
            if line not in asserts:
                asserts.append(line)
        if not asserts:
            return None
        parts.append(f"\n\ndef test_{t.name}():\n" + "".join(asserts))
    return "".join(parts)


def make_repo(rng: random.Random, index: int, seed: int) -> dict[str, Any] | None:
    """One verified repository row (module docstring), or None when no mutation of the drawn
    functions makes a test fail (the caller draws again)."""
    theme = rng.choice(sorted(THEMES))
    templates, modules, about = THEMES[theme]
    module = rng.choice(modules)
    chosen = rng.sample(templates, rng.randint(4, min(6, len(templates))))
    source = "".join(("\n\n" if i else "") + t.source for i, t in enumerate(chosen))
    tests = _test_source(module, chosen, rng)
    if tests is None:
        return None
    test_mod = f"test_{module}"
    files = {
        "README.md": f"# {module}\n\n{about} Run the tests with the run_tests tool.\n",
        f"{module}.py": source,
        f"{test_mod}.py": tests,
    }
    clean = run_in_process(files, [test_mod])
    if clean["failed"] or clean["timed_out"]:
        return None
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for site in mutation_sites(source):
        by_kind.setdefault(site["kind"], []).append(site)
    kinds = sorted(by_kind)
    rng.shuffle(kinds)
    for k in kinds:
        rng.shuffle(by_kind[k])
    # round-robin over the kinds (in a random order): each kind as likely as the sites allow
    sites = [s for group in zip_longest(*(by_kind[k] for k in kinds)) for s in group if s is not None]
    for site in sites[:12]:
        buggy = apply_site(source, site)
        result = run_in_process({**files, f"{module}.py": buggy}, [test_mod])
        if result["timed_out"] or not result["failed"]:
            continue
        line = site["line"]
        failing = [x.split("::")[1].split(" - ")[0] for x in result["lines"] if x.startswith("FAILED")]
        first = result["lines"][0]
        prompt = (
            f"This Python repository has a bug: {', '.join(failing)} in {test_mod}.py fails.\n{first}\n"
            f"Find the bug (list_files, read_file), fix the code with replace_in_file (the tests are "
            f"read-only) and check with run_tests. When the tests pass, reply without a tool call."
        )
        return {
            "prompt": prompt,
            "label": source.splitlines()[line - 1].strip(),
            "metadata": {
                "swe": {
                    "id": f"{seed}-{index}",
                    "files": {**files, f"{module}.py": buggy},
                    "tests": [test_mod],
                    "n_tests": clean["passed"],
                    "failing": failing,
                    "bug": {
                        "path": f"{module}.py",
                        "line": line,
                        "kind": site["kind"],
                        "buggy": buggy.splitlines()[line - 1],
                        "fixed": source.splitlines()[line - 1],
                    },
                }
            },
        }
    return None


def generate_repos(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` verified rows drawn with ``seed`` (the same rows for the same seed)."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 20 * n + 100:
            raise RuntimeError(f"make-data swe: only {len(rows)} of {n} repositories in {attempts} attempts")
        row = make_repo(random.Random(rng.getrandbits(64)), len(rows), seed)
        if row is not None:
            rows.append(row)
    return rows


def write_swe_data(out: str | Path, n: int, seed: int = 0) -> dict[str, float]:
    """Write ``n`` rows to ``out`` (jsonl); returns counts (``examples``, and per mutation kind)."""
    rows = generate_repos(n, seed)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    counts = {"examples": float(len(rows)), **{k: 0.0 for k in MUTATIONS}}
    with out.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")
            counts[row["metadata"]["swe"]["bug"]["kind"]] += 1
    return counts
