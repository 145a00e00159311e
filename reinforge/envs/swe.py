"""``agent.environment: swe``: fix the bug of a small Python repository (:mod:`.swe_data` rows).

Per episode, :meth:`SweEnv.reset` makes a copy-on-write workspace (:mod:`.workspace`): the row's
base, shared by every episode and never written (``metadata["swe"]["base"]``: a folder, or
``{"repo": path or URL, "commit": full id}``, extracted once into ``base_cache``), under a layer of
the episode's own (a temporary folder in ``workspace_dir``, default the system's) into which the
row's ``files`` are written and every edit goes; a row may give a base, files, or both.
:meth:`close` deletes the episode's layer. The model has five tools:

* ``list_files()``, ``read_file(path)``: what is in the workspace;
* ``replace_in_file(path, old, new)`` (exactly one occurrence of ``old``), ``write_file(path,
  content)``: edits, at most ``max_file_bytes`` per file and ``max_files`` files; paths are
  relative to the workspace, and any that leaves it (absolute, ``..``, through a link) is refused;
  the test files are read-only;
* ``run_tests()``: the repository's tests, run in the run's sandboxes (``EnvContext.sandboxes``,
  :class:`reinforge.sandbox.Sandboxes`: the ``sandbox`` section: ``sandbox.backend``,
  ``memory_mb``, ``uid``) with the workspace's layers shown merged and read-only in its working
  directory, at most
  ``test_timeout`` seconds (default ``agent.tool_timeout``); the sandboxes of all episodes and the
  ``python`` tool share the ``sandbox.max_concurrent`` slots.

Tools of ``agent.tools`` are offered too. A turn without a call ends the episode; so does
``agent.max_turns``. The reward (:meth:`reward`) is 1.0 when every test of the row passes in a
final run on the workspace as the episode left it (the last ``run_tests`` when nothing was edited
since), else 0.0. The tests that run are exactly the row's read-only test files (compiled from
their own paths: a package or a bytecode cache the model writes cannot shadow them), and in a
generated repository (no base) their asserts compare plain values (:data:`PROGRAM`). A sandbox
that cannot start, in a tool call or in the final run, is an infrastructure failure: the sample is
failed and left out of its group, never scored 0.

``agent.environment_kwargs``: ``workspace_dir``, ``base_cache`` (default
``<reinforge cache>/swe-bases``), ``max_file_bytes`` (65536), ``max_files`` (32: files of the
episode's own layer, the row's and the written ones), ``test_timeout``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..sandbox.workspace import PathRefused, Workspace, folder_base, git_base
from ..tools import ToolCall, ToolResult, check_arguments, function_schema
from ..tools.schema import ToolArgumentError
from ..tools.types import BAD_ARGUMENTS, PARSE, SANDBOX_FAILURE, UNKNOWN_TOOL, ToolError
from .base import Environment, EnvironmentFailure, Step, Turn
from .swe_data import RUNNER

if TYPE_CHECKING:
    from ..config.agent import AgentConfig

KWARGS = ("workspace_dir", "base_cache", "max_file_bytes", "max_files", "test_timeout")
REPO = "repo"  # the workspace's name in the sandbox's working directory
MAX_REPORT_LINES = 20


def list_files() -> str:
    """List the files of the repository with their sizes in bytes."""
    raise NotImplementedError  # the schema only: SweEnv runs the tool


def read_file(path: str) -> str:
    """Show the text of a file of the repository.

    Args:
        path: the file's path relative to the repository, e.g. "numkit.py".
    """
    raise NotImplementedError


def replace_in_file(path: str, old: str, new: str) -> str:
    """Replace text in a file: the old text must occur exactly once in it.

    Args:
        path: the file's path relative to the repository.
        old: the exact text to replace (with its indentation), e.g. one whole line.
        new: the text that replaces it.
    """
    raise NotImplementedError


def write_file(path: str, content: str) -> str:
    """Write a whole file (created or replaced).

    Args:
        path: the file's path relative to the repository.
        content: the file's new text.
    """
    raise NotImplementedError


def run_tests() -> str:
    """Run the repository's tests and show which fail."""
    raise NotImplementedError


SCHEMAS = {f.__name__: function_schema(f) for f in (list_files, read_file, replace_in_file, write_file, run_tests)}

# The test run's main.py after the runner: it deletes itself before any repository code runs (the
# code under test cannot read the nonce from it) and writes the report with an os.write taken
# before that code is imported (patching print, sys.stdout or os.write cannot rewrite it).
PROGRAM = """
import os, sys
_write = os.write
try:
    os.remove(os.path.abspath(sys.argv[0]))
except OSError:
    pass
sys.dont_write_bytecode = True
_root = os.path.abspath({repo!r}) + os.sep
sys.path.insert(0, _root)
_p, _f, _lines = run_tests({tests!r}, _root, {plain!r})
try:
    sys.stdout.flush()
except BaseException:
    pass
_report = _lines[:{lines}] + ["%d passed, %d failed" % (_p, _f), "{nonce} %d %d" % (_p, _f)]
_write(1, ("\\n" + "\\n".join(_report) + "\\n").encode())
"""


class SweEnv(Environment):
    """One repository-fixing episode (module docstring)."""

    def __init__(self, row: dict[str, Any], ctx: Any):
        super().__init__(row, ctx)
        spec = (row.get("metadata") or {}).get("swe")
        if (
            not isinstance(spec, dict)
            or not spec.get("tests")
            or not isinstance(spec.get("files", {}), dict)
            or ("files" not in spec and "base" not in spec)
        ):
            raise ValueError("a swe row needs metadata.swe with tests, and files or a base (reinforge make-data swe)")
        base = spec.get("base")
        if base is not None and not (
            isinstance(base, str) or (isinstance(base, dict) and {"repo", "commit"} <= set(base))
        ):
            raise ValueError(f"metadata.swe.base: {base!r} is neither a folder nor {{'repo': ..., 'commit': ...}}")
        self.spec = spec
        kw = ctx.kwargs
        unknown = sorted(set(kw) - set(KWARGS))
        if unknown:
            raise ValueError(f"agent.environment_kwargs: {unknown} not among the swe keys {list(KWARGS)}")
        self.max_file_bytes = int(kw.get("max_file_bytes", 65536))
        self.max_files = int(kw.get("max_files", 32))
        self.workspace_dir = kw.get("workspace_dir")
        self.base_cache = kw.get("base_cache")
        self.test_timeout = float(kw.get("test_timeout", ctx.agent.tool_timeout))
        self.tests = list(spec["tests"])
        self.protected = {f"{t.replace('.', '/')}.py" for t in self.tests}
        self.ws: Workspace | None = None
        self.counts = {"edits": 0, "test_runs": 0, "refused_paths": 0}
        self.last_run: dict[str, Any] | None = None  # the last run_tests, while nothing was edited since
        self.create_ms = 0.0
        self.base_ms = 0.0

    @property
    def root(self) -> Path | None:
        """The episode's own layer (its files and edits; the base's files are not in it)."""
        return self.ws.upper if self.ws is not None else None

    @classmethod
    def tool_schemas(cls, agent: AgentConfig) -> list[dict[str, Any]]:
        return list(SCHEMAS.values()) + super().tool_schemas(agent)

    async def reset(self) -> None:
        start = time.perf_counter()
        base = await asyncio.to_thread(self._base)
        self.base_ms = (time.perf_counter() - start) * 1000
        start = time.perf_counter()
        self.ws = Workspace(base, self.workspace_dir, name="repository")
        for path, text in self.spec.get("files", {}).items():
            self._write(path, text, edit=False)
        self.create_ms = (time.perf_counter() - start) * 1000
        return None

    def _base(self) -> Path | None:
        """The row's base folder (a git base extracted into the cache the first time)."""
        base = self.spec.get("base")
        if base is None:
            return None
        if isinstance(base, str):
            return folder_base(base)
        from ..models.hub import cache_dir

        cache = self.base_cache or os.path.join(cache_dir(), "swe-bases")
        return git_base(str(base["repo"]), str(base["commit"]), cache)

    async def step(self, turn: Turn) -> Step:
        if turn.is_final:
            return Step(done=True, info=self._info())
        results = [ToolResult.failure(None, PARSE, e) for e in turn.errors]
        for call in turn.calls:  # in order: an edit then a test run sees the edit
            results.append(await self._call(call))
        messages = [{"role": "tool", "name": r.name or "", "content": r.output} for r in results]
        return Step(messages=messages, tool_results=results, info=self._info())

    async def reward(self) -> float:
        run = self.last_run if self.last_run is not None else await self._run_tests()
        if run.get("infra_error"):
            raise EnvironmentFailure(f"the final test run's sandbox failed: {run['infra_error']}")
        return float(run["passed_all"])

    async def close(self) -> None:
        if self.ws is not None:
            self.ws.close()
            self.ws = None

    def _info(self) -> dict[str, float]:
        times = {"workspace_ms": self.create_ms, "base_ms": self.base_ms}
        return {**{k: float(v) for k, v in self.counts.items()}, **times}

    async def _call(self, call: ToolCall) -> ToolResult:
        start = time.perf_counter()
        schema = SCHEMAS.get(call.name)
        if schema is None:
            if call.name in self.ctx.tools.tools:
                return await self.ctx.tools.call(call)
            known = ", ".join([*SCHEMAS, *self.ctx.tools.tools])
            return ToolResult.failure(call.name, UNKNOWN_TOOL, f"unknown tool {call.name!r}; available tools: {known}")
        try:
            args = check_arguments(schema, call.arguments)
        except ToolArgumentError as e:
            return ToolResult.failure(call.name, BAD_ARGUMENTS, f"bad arguments for {call.name}: {e}")
        try:
            if call.name == "run_tests":
                run = await self._run_tests()
                if run.get("infra_error"):
                    return ToolResult.failure(
                        call.name, SANDBOX_FAILURE, f"the test sandbox failed to start: {run['infra_error']}"
                    )
                out = run["report"]
            else:
                out = getattr(self, f"_{call.name}")(**args)
        except ToolError as e:
            if e.kind == "path":
                self.counts["refused_paths"] += 1
            return ToolResult.failure(call.name, e.kind, str(e), time.perf_counter() - start, call.arguments)
        return ToolResult(call.name, out, None, time.perf_counter() - start, call.arguments)

    # -- the tools --------------------------------------------------------------------------------

    def _list_files(self) -> str:
        assert self.ws is not None
        return "\n".join(f"{path} ({size} bytes)" for path, size in self.ws.files().items())

    def _read_file(self, path: str) -> str:
        assert self.ws is not None
        if not self._checked(self.ws.is_file, path):
            raise ToolError(f"no file {path!r} (list_files shows the files)", "path")
        return self.ws.read_bytes(path).decode(errors="replace")[: self.max_file_bytes] or "(empty file)"

    def _replace_in_file(self, path: str, old: str, new: str) -> str:
        assert self.ws is not None
        self._editable(path)
        if not self.ws.is_file(path):
            raise ToolError(f"no file {path!r} (list_files shows the files)", "path")
        if not old:
            raise ToolError("old must not be empty", "edit")
        text = self.ws.read_bytes(path).decode(errors="replace")
        n = text.count(old)
        if n != 1:
            where = "does not occur" if n == 0 else f"occurs {n} times"
            raise ToolError(f"the old text {where} in {path}: give it exactly, enough to be unique", "edit")
        self._write(path, text.replace(old, new))
        return f"replaced 1 occurrence in {path}"

    def _write_file(self, path: str, content: str) -> str:
        assert self.ws is not None
        rel = self._editable(path)
        if not (self.ws.upper / rel).exists() and self.ws.own_files() >= self.max_files:
            raise ToolError(f"the repository has {self.max_files} files already", "too_large")
        self._write(path, content)
        return f"wrote {path} ({len(content.encode())} bytes)"

    # -- workspace --------------------------------------------------------------------------------

    def _checked(self, fn: Any, path: str) -> Any:
        """``fn(path)``; a path that would leave the workspace is a ``ToolError`` of kind ``path``."""
        try:
            return fn(path)
        except PathRefused as e:
            raise ToolError(str(e), "path") from None

    def _editable(self, path: str) -> str:
        """The checked relative path of a file the model may write (not a test file)."""
        assert self.ws is not None
        rel = self._checked(self.ws.check, path).as_posix()
        if rel in self.protected:
            raise ToolError(f"{path} is a test file: the tests are read-only; fix the code", "path")
        return rel

    def _write(self, path: str, text: str, edit: bool = True) -> None:
        """Write a file into the episode's layer, readable by the sandbox's uid; an ``edit`` is the
        model's: at most ``max_file_bytes``, counted, and the last test run no longer stands."""
        data = text.encode()
        if edit and len(data) > self.max_file_bytes:
            raise ToolError(f"{len(data)} bytes: a file may hold at most {self.max_file_bytes}", "too_large")
        assert self.ws is not None
        self._checked(lambda p: self.ws.write_bytes(p, data), path)  # type: ignore[union-attr]
        if edit:
            self.counts["edits"] += 1
            self.last_run = None

    async def _run_tests(self) -> dict[str, Any]:
        """One run of the row's tests in the sandbox: ``{"report", "passed_all", "infra_error",
        "seconds"}``; the result is kept until the next edit."""
        assert self.ws is not None
        nonce = secrets.token_hex(8)
        plain = "base" not in self.spec  # a generated repository: its asserts compare plain values with literals
        program = RUNNER + PROGRAM.format(repo=REPO, tests=self.tests, lines=MAX_REPORT_LINES, nonce=nonce, plain=plain)
        r = await self.ctx.sandboxes.run(program, self.test_timeout, binds={REPO: self.ws.layers})
        self.counts["test_runs"] += 1
        lines = r.stdout.strip().splitlines()
        tail = lines[-1].split() if lines else []
        done = len(tail) == 3 and tail[0] == nonce
        expected = int(self.spec["n_tests"]) if "n_tests" in self.spec else max(1, int(tail[1]) if done else 1)
        passed_all = done and r.returncode == 0 and int(tail[2]) == 0 and int(tail[1]) == expected
        shown = "\n".join(lines[:-1] if done else lines)
        if r.timed_out:
            shown = f"{shown}\nthe tests did not finish within {self.test_timeout:g} s".strip()
        elif not done:
            shown = f"{shown}\n{r.stderr.strip()[-2000:]}\nthe tests did not finish (exit status {r.returncode})"
        run = {"report": shown.strip(), "passed_all": passed_all, "infra_error": r.infra_error, "seconds": r.seconds}
        if not r.infra_error:
            self.last_run = run
        return run
