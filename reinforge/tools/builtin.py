"""Built-in tools: ``calculator`` (arithmetic, evaluated on the syntax tree, never ``eval``) and
``python`` (a program run in a sandboxed subprocess, :mod:`reinforge.sandbox`)."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..sandbox import Sandboxes, SandboxLimits, SandboxResult, run_python
from .types import SANDBOX_FAILURE, ToolError

if TYPE_CHECKING:
    from ..config.agent import AgentConfig

MAX_EXPRESSION_CHARS = 1000
MAX_INT_BITS = 4096  # results beyond ~1e1233 are refused rather than computed
# round(x, -n) with an integer x computes 10**n in C with the GIL held (round(1, -10**8) takes over a minute
# and no timeout can stop a thread): n is clamped to the digits an admissible integer can have, beyond
# which the result is 0 anyway (|x| < 10**1234 < 10**n / 2).
MAX_ROUND_DIGITS = 1300

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _round(x: int | float, ndigits: int | None = None) -> int | float:
    """``round`` with ``ndigits`` clamped to ``[-MAX_ROUND_DIGITS, MAX_ROUND_DIGITS]`` (same result)."""
    if ndigits is None:
        return round(x)
    if not isinstance(ndigits, int):
        raise ValueError("round's second argument (digits) must be an integer")
    return round(x, max(-MAX_ROUND_DIGITS, min(MAX_ROUND_DIGITS, ndigits)))


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "round": _round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "floor": math.floor,
    "ceil": math.ceil,
    "log": math.log,
    "exp": math.exp,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "(1234 + 5678) * 9"; also abs, round,
            min, max, sqrt, floor, ceil, log, exp, pi and e.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/"), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {e.msg}") from None
    return format_number(_evaluate(tree.body))


def format_number(x: int | float) -> str:
    """Integers as integers (``12.0`` -> ``12``), other floats to 12 significant digits."""
    if isinstance(x, float):
        if math.isfinite(x) and x.is_integer() and abs(x) < 1e16:
            return str(int(x))
        return format(x, ".12g")
    return str(x)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(left, int) and isinstance(right, int) and right > 0:
            if abs(left) > 1 and right * max(abs(left).bit_length() - 1, 1) > MAX_INT_BITS:
                raise ValueError("result too large")
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, complex):
            raise ValueError("complex result")
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise ValueError("result too large")
        return value
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        return _FUNCTIONS[node.func.id](*(_evaluate(a) for a in node.args))
    raise ValueError(f"unsupported syntax: {ast.unparse(node)[:40]!r}")


async def python(code: str) -> str:
    """Run a Python program and return what it prints (stdout; stderr too if it fails).

    Args:
        code: a complete Python program; print the values you need.
    """
    return sandbox_output(await run_python(code, SandboxLimits()))


def make_python(agent: AgentConfig | None, sandboxes: Sandboxes | None = None) -> Callable[..., Any]:
    """The ``python`` tool of a run: its programs run in the run's ``sandboxes`` (their limits:
    ``agent.tool_timeout`` and the ``sandbox`` section; their ``sandbox.max_concurrent`` slots,
    shared with the environment's sandboxes); None: sandboxes of its own with the ``sandbox`` section's
    defaults and ``agent.tool_timeout`` (:meth:`Sandboxes.from_config`; the defaults of
    :class:`SandboxLimits` without ``agent``).

    The tool bounds its own time (``self_timed``): a call first waits for a slot, then runs at most
    ``tool_timeout`` seconds.

    Raises:
        SandboxUnavailable: the sandbox cannot run here (the message names ``sandbox.backend``).
    """
    sandboxes = sandboxes or Sandboxes.from_config(None, agent.tool_timeout if agent else None)
    sandboxes.check()

    async def python(code: str) -> str:
        return sandbox_output(await sandboxes.run(code))

    python.__doc__ = globals()["python"].__doc__
    python.self_timed = True  # type: ignore[attr-defined]
    return python


def sandbox_output(r: SandboxResult) -> str:
    """The tool output of a sandbox run.

    Raises:
        ToolError: kind ``sandbox`` (the sandbox itself failed to start: infrastructure, not the
            program), ``timeout``, ``memory`` (a process killed at the sandbox's memory limit, even
            when the program then exited 0; or ``MemoryError`` under the per-process limit),
            ``network`` (the program failed on the network guard) or ``program_error`` (non-zero
            exit); the message holds the program's output.
    """
    both = (r.stdout + ("\n" if r.stdout and r.stderr else "") + r.stderr).strip()
    if r.infra_error:
        raise ToolError(f"the sandbox failed to start (not your program's fault): {r.infra_error}", SANDBOX_FAILURE)
    if r.timed_out:
        raise ToolError(f"the program did not finish within the time limit.\n{both}".strip(), "timeout")
    if r.oom_kills:
        raise ToolError(
            f"a process of the program was killed at the memory limit (exit status {r.returncode}).\n{both}".strip(),
            "memory",
        )
    if r.returncode != 0:
        if r.network_denied:
            raise ToolError(f"network access is disabled in the python tool.\n{both}".strip(), "network")
        kind = "memory" if r.out_of_memory else "program_error"
        raise ToolError(f"the program exited with status {r.returncode}.\n{both}".strip(), kind)
    return r.stdout.strip() or both or "(the program printed nothing)"
