"""Tools: schemas from signatures, argument checks, the safe call path, the built-ins and the sandbox,
tool-call formats, and the agent config section."""

import asyncio
import time

import pytest

from reinforge.config import ConfigError, load_config
from reinforge.sandbox import Sandboxes, SandboxLimits, run_python
from reinforge.tools import (
    TOOLS,
    ToolArgumentError,
    ToolCall,
    ToolSet,
    check_arguments,
    function_schema,
    get_format,
    load_tools,
)
from reinforge.tools.builtin import calculator, make_python
from reinforge.tools.schema import parse_google_docstring
from tests import agent_tools
from tests.integration.test_sandbox import needs_bwrap


def run(coro):
    return asyncio.run(coro)


# ---------------------------------------------------------------- schemas
def test_schema_from_signature_and_docstring():
    s = function_schema(agent_tools.add)
    f = s["function"]
    assert s["type"] == "function" and f["name"] == "add" and f["description"] == "Add two integers."
    props = f["parameters"]["properties"]
    assert props["a"] == {"type": "integer", "description": "the first one."}
    assert props["b"] == {"type": "integer", "description": "the second one, described on two lines.", "default": 1}
    assert props["mode"]["enum"] == ["plain", "verbose"] and props["mode"]["type"] == "string"
    assert f["parameters"]["required"] == ["a"]


def test_schema_matches_transformers_for_the_builtins():
    from transformers.utils import get_json_schema

    for fn in (calculator, agent_tools.echo):
        theirs = get_json_schema(fn)
        theirs["function"].pop("return", None)
        assert function_schema(fn) == theirs


def test_schema_refuses_what_json_cannot_say():
    def no_hint(x):
        """Doc."""

    def star(*args: int) -> str:
        """Doc."""

    for fn in (no_hint, star):
        with pytest.raises(TypeError):
            function_schema(fn)


def test_google_docstring():
    desc, args = parse_google_docstring(
        "Do it.\n\nMore words.\n\nArgs:\n    x (int): first.\n    y: second\n"
        "        continued.\n\nReturns:\n    z: not an arg."
    )
    assert desc == "Do it. More words."
    assert args == {"x": "first.", "y": "second continued."}


def test_check_arguments():
    schema = function_schema(agent_tools.add)
    assert check_arguments(schema, {"a": 2.0, "b": 3}) == {"a": 2, "b": 3}
    for bad, msg in [
        ({}, "missing required argument"),
        ({"a": 1, "c": 2}, "unknown argument"),
        ({"a": "1"}, "must be of type integer"),
        ({"a": 1.5}, "must be of type integer"),
        ({"a": True}, "must be of type integer"),
        ({"a": 1, "mode": "loud"}, "must be one of"),
        ([1], "must be a JSON object"),
    ]:
        with pytest.raises(ToolArgumentError, match=msg):
            check_arguments(schema, bad)


# ---------------------------------------------------------------- calculator
@pytest.mark.parametrize(
    "expr, value",
    [
        ("1 + 2 * 3", "7"),
        ("(1234 + 5678) * 9", "62208"),
        ("7 / 2", "3.5"),
        ("10 / 5", "2"),
        ("-3 - -4", "1"),
        ("2 ^ 10", "1024"),
        ("sqrt(16)", "4"),
        ("17 % 5", "2"),
        ("1/3", "0.333333333333"),
        ("max(2, 9) - abs(-1)", "8"),
    ],
)
def test_calculator(expr, value):
    assert calculator(expr) == value


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('true')",
        "().__class__",
        "open('x')",
        "x + 1",
        "2 ** 100000",
        "'a' * 3",
        "lambda: 1",
        "1; 2",
        "[1, 2]",
    ],
)
def test_calculator_refuses_anything_but_arithmetic(expr):
    with pytest.raises(ValueError):
        calculator(expr)


def test_calculator_division_by_zero_raises():
    with pytest.raises(ZeroDivisionError):
        calculator("1 / 0")


# ---------------------------------------------------------------- the call path
def toolset(timeout=5.0):
    return ToolSet(
        load_tools(["calculator", "tests.agent_tools:add", "tests.agent_tools:boom", "tests.agent_tools:sleepy"]),
        timeout=timeout,
    )


def test_toolset_calls_and_errors():
    ts = toolset(timeout=0.5)
    ok = run(ts.call(ToolCall("add", {"a": 2, "b": 3})))
    assert (ok.output, ok.error) == ("5", None) and ok.seconds >= 0
    assert run(ts.call(ToolCall("calculator", {"expression": "6*7"}))).output == "42"
    cases = {
        "unknown_tool": ToolCall("search", {"q": "x"}),
        "bad_arguments": ToolCall("add", {"a": "two"}),
        "exception": ToolCall("boom", {"x": "y"}),
        "timeout": ToolCall("sleepy", {"seconds": 3}),
    }
    for kind, call in cases.items():
        r = run(ts.call(call))
        assert r.error == kind, (kind, r)
        assert r.output.startswith("Error: ")
    assert "available tools: calculator, add, boom, sleepy" in run(ts.call(cases["unknown_tool"])).output
    assert "kaboom" in run(ts.call(cases["exception"])).output
    assert run(ts.call(ToolCall("calculator", {"expression": "1/0"}))).error == "exception"
    ts.close()


def test_load_tools_names_the_key():
    assert [t.name for t in load_tools(["calculator", "python"])] == ["calculator", "python"]
    with pytest.raises(ValueError, match=r"agent.tools\[0\]: unknown tool 'calc'.*calculator"):
        load_tools(["calc"])
    with pytest.raises(ValueError, match=r"agent.tools\[1\].*cannot import"):
        load_tools(["calculator", "no_such_module:fn"])
    with pytest.raises(ValueError, match="already loaded"):
        load_tools(["calculator", "reinforge.tools.builtin:calculator"])
    assert "python" in TOOLS and TOOLS.info("python")["factory"]


# ---------------------------------------------------------------- sandbox
def python_tool(timeout=5.0, memory_mb=256):
    cfg = load_config(None, [f"agent.tool_timeout={timeout}", f"sandbox.memory_mb={memory_mb}"])
    return ToolSet(load_tools(["python"], cfg.agent, Sandboxes.from_config(cfg.sandbox, timeout)), timeout=timeout)


@needs_bwrap
def test_python_tool_runs_code_in_a_fresh_directory():
    ts = python_tool()
    r = run(
        ts.call(
            ToolCall(
                "python",
                {"code": "import os\nprint(sum(range(10)))\nprint(os.listdir('.'))\nopen('f.txt', 'w').write('x')"},
            )
        )
    )
    assert r.error is None and r.output == "45\n['main.py']"
    again = run(ts.call(ToolCall("python", {"code": "import os; print(os.listdir('.'))"})))
    assert again.output == "['main.py']"  # nothing left from the previous run
    failed = run(ts.call(ToolCall("python", {"code": "1/0"})))
    assert failed.error == "program_error" and "ZeroDivisionError" in failed.output and "main.py" in failed.output


@needs_bwrap
def test_python_tool_memory_limit():
    r = run(python_tool(memory_mb=200).call(ToolCall("python", {"code": "x = bytearray(400 * 2**20)\nprint('no')"})))
    assert r.error == "memory" and "MemoryError" in r.output and "no" not in r.output.split("\n")[-1]
    ok = run(python_tool(memory_mb=512).call(ToolCall("python", {"code": "x = bytearray(100 * 2**20)\nprint('ok')"})))
    assert ok.output == "ok"


@needs_bwrap
def test_python_tool_timeout_kills_the_process(tmp_path):
    marker = tmp_path / "alive"
    code = f"import time\ntime.sleep(1.5)\nopen({str(marker)!r}, 'w').write('x')\n"
    t = time.perf_counter()
    r = run(python_tool(timeout=0.5).call(ToolCall("python", {"code": code})))
    assert r.error == "timeout" and time.perf_counter() - t < 1.4
    time.sleep(1.5)
    assert not marker.exists()  # killed, not left running


@needs_bwrap
@pytest.mark.parametrize(
    "code",
    [
        "import socket\ns = socket.create_connection(('127.0.0.1', 9))",
        "import socket\nsocket.socket().connect(('1.1.1.1', 80))",
        "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=2)",
        "import socket\nprint(socket.gethostbyname('example.com'))",
    ],
)
def test_python_tool_has_no_network(code):
    r = run(python_tool().call(ToolCall("python", {"code": code})))
    assert r.error == "network", r
    assert "network access is disabled" in r.output


@needs_bwrap
def test_sandbox_network_namespace():
    """Code that bypasses the prelude's guard (the raw C socket type) still finds no network: the
    process runs in an empty network namespace (loopback only)."""
    code = (
        "import socket\nraw = socket.socket.__mro__[2]\n"  # (guard, socket.socket, _socket.socket, object)
        "s = raw(socket.AF_INET, socket.SOCK_STREAM)\n"
        "try:\n    s.connect(('1.1.1.1', 80))\n    print('connected')\n"
        "except OSError as e:\n    print('errno', e.errno)\n"
        "print(open('/proc/net/dev').read().count(':'))"
    )
    r = run(run_python(code, SandboxLimits(timeout=5)))
    assert r.returncode == 0 and not r.network_denied, r
    assert "connected" not in r.stdout and r.stdout.split()[-1] == "1", r  # one interface: lo


@needs_bwrap
def test_sandbox_caps_output():
    r = run(run_python("print('a' * 100000)", SandboxLimits(max_output_bytes=1000)))
    assert len(r.stdout) < 1100 and "bytes of output dropped" in r.stdout


@needs_bwrap
def test_make_python_without_config_uses_defaults():
    fn = make_python(None)
    assert run(fn("print(6 * 7)")) == "42"
    assert function_schema(fn)["function"]["parameters"]["required"] == ["code"]


# ---------------------------------------------------------------- formats
def test_hermes_format():
    f = get_format("hermes")
    p = f.parse(
        'Let me.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
        '<tool_call>{"name": "echo", "arguments": "{\\"text\\": \\"hi\\"}"}</tool_call>'
    )
    assert [(c.name, c.arguments) for c in p.calls] == [("add", {"a": 1}), ("echo", {"text": "hi"})] and not p.errors
    assert f.parse("The answer is 3.").is_final
    for text, msg in [
        ("<tool_call>{bad json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', '"name"'),
        ('<tool_call>{"name": "add", "arguments": {"a": 1}', "not closed"),
    ]:
        p = f.parse(text)
        assert not p.calls and not p.is_final and msg in p.errors[0], (text, p)
    assert f.stop == ["</tool_call>"]
    assert f.wrap_result("5") == "<tool_response>\n5\n</tool_response>"
    assert "<tools>" in f.describe_tools([function_schema(calculator)])


def test_llama3_json_format():
    f = get_format("llama3_json")
    p = f.parse('<|python_tag|>{"name": "add", "parameters": {"a": 1}}; {"name": "echo", "parameters": {"text": "x"}}')
    assert [c.name for c in p.calls] == ["add", "echo"]
    assert f.parse("It is 4.").is_final
    assert f.parse('{"name": oops}').errors


# ---------------------------------------------------------------- config
def test_agent_config_validation():
    base = ["rollout.custom_generate_function_path=reinforge.rollout.agent:generate"]
    cfg = load_config(None, base + ["agent.tools=[calculator, tests.agent_tools:add]", "agent.max_turns=3"])
    assert cfg.agent.tools == ["calculator", "tests.agent_tools:add"] and cfg.agent.max_turns == 3
    assert load_config(None, base + ["engine.backend=hf", "agent.stop_after_tool_call=false"]).engine.backend == "hf"
    for overrides, msg in [
        (base + ["agent.tools=[calc]"], r"agent.tools\[0\]: unknown tool 'calc'"),
        (base + ["agent.tool_call_format=xml"], "agent.tool_call_format: 'xml' is not one of"),
        (base + ["agent.max_turns=0"], "agent.max_turns must be >= 1"),
        (base + ["agent.max_turn_tokens=999"], "agent.max_turn_tokens=999 exceeds rollout.rollout_max_response_len"),
        (base + ["agent.tools_prompt=everywhere"], "agent.tools_prompt: 'everywhere' is not one of"),
        (["rollout.custom_generate_function_path=nocolon"], "custom_generate_function_path='nocolon' must look like"),
        (base + ["engine.backend=hf"], "set agent.stop_after_tool_call=false"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            load_config(None, overrides)
