"""MCP tools (``agent.mcp_servers``): a small MCP server of the tests' own (tests/mcp_server.py, the
SDK's ``MCPServer`` over stdio) started by the ToolSet; its schemas in the prompt, calls through
``ToolSet.call`` (argument checks, timeouts, error kinds), a server that dies, hangs or does not
start, and the agent loop counting its errors."""

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("mcp")

from reinforge.config import ConfigError, load_config  # noqa: E402
from reinforge.config.mcp import parse_server_specs  # noqa: E402
from reinforge.rollout.agent import prompt_tools  # noqa: E402
from reinforge.tools import ToolCall, ToolSet, load_tools  # noqa: E402
from reinforge.tools.mcp import MCPStartError  # noqa: E402
from reinforge.tools.schema import function_schema  # noqa: E402
from tests.integration.test_agent import AGENT, IM_END, ScriptedEngine, call, run_agent, tok  # noqa: E402,F401 (tok: a fixture)

SERVER = str(Path(__file__).parents[1] / "mcp_server.py")
TOOLS = ["add", "echo", "calls", "pid", "crash", "slow", "freeze", "fail"]


def server(name="t", **extra):
    return {"name": name, "command": sys.executable, "args": [SERVER], **extra}


def agent(*servers, tools=(), timeout=5.0, max_tokens=256):
    return SimpleNamespace(
        tools=list(tools), mcp_servers=list(servers), tool_timeout=timeout, tool_output_max_tokens=max_tokens
    )


def toolset(*servers, tools=(), timeout=5.0):
    a = agent(*servers, tools=tools, timeout=timeout)
    return ToolSet(load_tools(a.tools, a), timeout=timeout)


def run(ts, name, **arguments):
    return asyncio.run(ts.call(ToolCall(name, arguments)))


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_until(predicate, seconds=10.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end and not predicate():
        time.sleep(0.05)
    return predicate()


@pytest.fixture(scope="module")
def ts():
    tools = toolset(server())
    yield tools
    tools.close()


# ------------------------------------------------------------------------------------------- config


def test_config_entries_are_checked_with_their_key(tmp_path):
    good = parse_server_specs(
        [server(env={"A": "1"}, cwd=str(tmp_path), tools=["add"], prefix="m_", startup_timeout=5, max_restarts=0)]
    )
    assert (good[0].name, good[0].env, good[0].tools, good[0].prefix, good[0].max_restarts) == (
        "t",
        {"A": "1"},
        ["add"],
        "m_",
        0,
    )
    bad = [
        ([{"name": "t"}], r"agent\.mcp_servers\[0\]\.command: required"),
        ([server(), server()], r"agent\.mcp_servers\[1\]\.name: another server is already named 't'"),
        ([server(port=1)], r"agent\.mcp_servers\[0\]: unknown key\(s\) 'port'"),
        ([server(env={"PORT": 8080})], r"agent\.mcp_servers\[0\]\.env\.PORT: expected a string, got 8080"),
        ([server(args=["--port", 1])], r"agent\.mcp_servers\[0\]\.args\[1\]: expected a string"),
        ([server(cwd=str(tmp_path / "none"))], r"agent\.mcp_servers\[0\]\.cwd: .* is not a folder"),
        ([server(name="a b")], r"agent\.mcp_servers\[0\]\.name: 'a b' may hold only"),
        ([server(max_restarts=-1)], r"agent\.mcp_servers\[0\]\.max_restarts: expected an integer >= 0"),
        (["python server.py"], r"agent\.mcp_servers\[0\]: expected a mapping"),
    ]
    for raw, message in bad:
        with pytest.raises(ValueError, match=message):
            parse_server_specs(raw)
    with pytest.raises(ConfigError, match=r"agent\.mcp_servers\[0\]\.command: required"):
        load_config(None, ["agent.mcp_servers=[{name: fs}]"])
    cfg = load_config(None, [f"agent.mcp_servers=[{{name: fs, command: {sys.executable}, args: [{SERVER}]}}]"])
    assert cfg.agent.mcp_servers[0]["args"] == [SERVER]


def test_schema_layout_from_an_mcp_input_schema():
    schema = function_schema(
        {
            "name": "f",
            "description": " Find. ",
            "input_schema": {
                "title": "fArguments",
                "type": "object",
                "required": ["q"],
                "properties": {
                    "q": {"title": "Q", "type": "string"},
                    "title": {"type": ["string", "null"]},
                    "n": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
                    "v": {"type": ["integer", "string"]},
                    "xs": {"type": "array", "items": {"title": "X", "type": "number"}},
                },
            },
        },
        "m_f",
    )
    assert schema == {
        "type": "function",
        "function": {
            "name": "m_f",
            "description": "Find.",
            "parameters": {
                "type": "object",
                "required": ["q"],
                "properties": {
                    "q": {"type": "string"},
                    "title": {"type": "string", "nullable": True},
                    "n": {"type": "integer", "default": None, "nullable": True},
                    "v": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                    "xs": {"type": "array", "items": {"type": "number"}},
                },
            },
        },
    }


# -------------------------------------------------------------------------------------------- calls


def test_tools_are_listed_with_their_schemas(ts):
    assert list(ts.tools) == TOOLS
    add = ts.tools["add"].schema
    assert add["function"]["description"].startswith("Add two integers.")
    assert add["function"]["parameters"] == {
        "type": "object",
        "required": ["a", "b"],
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    }
    echo = ts.tools["echo"].schema["function"]["parameters"]["properties"]
    assert echo["sep"] == {"type": "string", "default": None, "nullable": True}


def test_a_call_returns_the_tools_output(ts):
    r = run(ts, "add", a=2, b=40)
    assert (r.output, r.error) == ("42", None)
    assert run(ts, "add", a=2.0, b=1).output == "3"  # an integral float is an integer, as for Python tools
    assert run(ts, "echo", text="ab", times=3, sep="-").output == "ab-ab-ab"


def test_bad_arguments_are_refused_before_the_server_is_called(ts):
    before = int(run(ts, "calls").output)
    for args in ({"a": "x", "b": 1}, {"a": 1}, {"a": 1, "b": 2, "c": 3}):
        r = asyncio.run(ts.call(ToolCall("add", args)))
        assert r.error == "bad_arguments" and r.output.startswith("Error: bad arguments for add"), r
    assert run(ts, "echo", text="x", sep=None).output == "x"  # null is allowed where the schema says so
    assert int(run(ts, "calls").output) == before + 1  # the refused calls never reached the server
    assert run(ts, "nope").error == "unknown_tool"


def test_a_tool_error_is_reported_to_the_model(ts):
    r = run(ts, "fail", message="no such file")
    assert r.error == "mcp_error" and "no such file" in r.output and r.output.startswith("Error: ")
    assert run(ts, "add", a=1, b=1).output == "2"  # the server is fine


def test_output_is_capped_before_it_reaches_the_agent():
    a = agent(server(), max_tokens=4)
    tools = ToolSet(load_tools([], a), timeout=5)
    try:
        assert run(tools, "echo", text="abcdefgh", times=100).output == ("abcdefgh" * 16)  # 32 chars per token
    finally:
        tools.close()


# ---------------------------------------------------------------------------------- servers failing


def test_a_server_that_dies_is_restarted_and_then_given_up():
    ts = toolset(server(max_restarts=1), tools=["calculator"])
    try:
        first = int(run(ts, "pid").output)
        r = run(ts, "crash")  # the process exits during the call
        assert r.error == "mcp_server" and "its MCP server 't' stopped during the call" in r.output
        assert not alive(first) or wait_until(lambda: not alive(first))
        second = int(run(ts, "pid").output)  # restarted (restart 1 of 1)
        assert second != first
        os.kill(second, signal.SIGKILL)  # dies while idle: noticed at once; no restart left
        hub = ts.tools["pid"].resource
        assert wait_until(lambda: hub.servers[0].state == "down")
        r = run(ts, "add", a=1, b=2)
        assert r.error == "mcp_server" and "its MCP server 't' is down: it stopped 2 times" in r.output
        assert "agent.mcp_servers[0].max_restarts=1" in r.output
        assert run(ts, "calculator", expression="6*7").output == "42"  # the run goes on
    finally:
        ts.close()


def test_a_slow_call_is_a_timeout_and_a_hung_server_an_mcp_server_failure():
    ts = toolset(server(), timeout=1.0)
    try:
        first = int(run(ts, "pid").output)
        start = time.monotonic()
        r = run(ts, "slow", seconds=60)  # the server goes on answering meanwhile
        assert r.error == "timeout" and r.output == "Error: slow did not finish within 1 s"
        assert time.monotonic() - start < 3
        time.sleep(1.5)  # the ping after the timeout is answered: the server is kept
        assert int(run(ts, "pid").output) == first
        start = time.monotonic()
        r = run(ts, "freeze", seconds=60)  # blocks the server's event loop: no answer, no pong
        assert r.error == "mcp_server" and "freeze did not finish within 1 s and its MCP server 't'" in r.output
        assert "did not answer a ping within 1 s either: it hangs" in r.output  # infrastructure, not the model
        assert time.monotonic() - start < 4
        hub = ts.tools["pid"].resource
        assert wait_until(lambda: hub.servers[0].restarts == 1, 15)
        r = run(ts, "pid")  # waits for the restart (not counted in the call's time)
        assert r.error is None and int(r.output) != first
        assert wait_until(lambda: not alive(first))  # the hung process was stopped
    finally:
        ts.close()


def test_close_stops_the_servers():
    ts = toolset(server())
    pid = int(run(ts, "pid").output)
    ts.close()
    assert wait_until(lambda: not alive(pid))
    r = run(ts, "pid")
    assert r.error == "mcp_server" and "not running" in r.output
    ts.close()  # twice is fine


def test_startup_failures_name_the_entry(tmp_path):
    with pytest.raises(MCPStartError, match=r"agent\.mcp_servers\[0\] \('t'\): could not start `no-such-mcp-server"):
        load_tools([], agent({"name": "t", "command": "no-such-mcp-server"}))
    exits = server("x", env={"MCP_TEST_EXIT_AT_START": "1", "MCP_TEST_STDERR": "missing API key"})
    with pytest.raises(MCPStartError, match=r"(?s)agent\.mcp_servers\[1\] \('x'\): could not start .*missing API key"):
        load_tools([], agent(server(), exits))
    silent = {
        "name": "s",
        "command": sys.executable,
        "args": ["-c", "import time; time.sleep(60)"],
        "startup_timeout": 1,
    }
    start = time.monotonic()
    with pytest.raises(MCPStartError, match=r"agent\.mcp_servers\[0\] \('s'\): .*no answer .* within 1 s"):
        load_tools([], agent(silent))
    assert time.monotonic() - start < 15
    with pytest.raises(MCPStartError, match=r"agent\.mcp_servers\[0\]\.tools: the server 't' has no tool 'ad'"):
        load_tools([], agent(server(tools=["ad"])))


def test_names_clash_unless_prefixed():
    clash = (
        r"agent\.mcp_servers\[1\]: the tool 'add' of server 'u' clashes with the one of "
        r"agent\.mcp_servers\[0\] \('t'\); set agent\.mcp_servers\[1\]\.prefix"
    )
    with pytest.raises(ValueError, match=clash):
        load_tools([], agent(server("t"), server("u")))
    both = agent(server("t", tools=["add"]), server("u", tools=["add", "pid"], prefix="u_"))
    tools = load_tools(["calculator"], both)
    assert [t.name for t in tools] == ["calculator", "add", "u_add", "u_pid"]
    ts = ToolSet(tools, timeout=5)
    try:
        assert run(ts, "u_add", a=1, b=1).output == "2" and run(ts, "add", a=2, b=2).output == "4"
    finally:
        ts.close()


# --------------------------------------------------------------------------------------- the agent


def mcp_ctx(tok, engine, *overrides):
    from reinforge.rollout.generate import RolloutContext

    entry = f"{{name: t, command: {sys.executable}, args: [{SERVER}], max_restarts: 1}}"
    cfg = load_config(
        None,
        [
            AGENT,
            f"agent.mcp_servers=[{entry}]",
            "rollout.rollout_max_response_len=400",
            "agent.max_turns=4",
            *overrides,
        ],
    )
    return RolloutContext(cfg, engine, tok, None, [IM_END])


def test_the_schemas_reach_the_prompt(tok):
    for tools in ("[]", "[calculator]"):
        ctx = mcp_ctx(tok, None, f"agent.tools={tools}")
        pt = prompt_tools(ctx.config, ctx.tokenizer)
        assert pt.system_text is not None and '"name": "add"' in pt.system_text, tools
        assert "Add two integers." in pt.system_text and '"name": "freeze"' in pt.system_text
        assert ('"name": "calculator"' in pt.system_text) == (tools != "[]")


def test_the_agent_calls_mcp_tools_and_counts_the_models_errors(tok):
    turns = [
        call("add", a=20, b=22),
        call("fail", message="no such file"),
        call("add", a=1, b="two") + call("echo", text="hi"),
        "The answer is 42.",
    ]
    engine = ScriptedEngine(tok, lambda prompt, turn: turns[turn], char_level=False)
    ctx = mcp_ctx(tok, engine)
    try:
        (sample,) = run_agent(ctx, "What is 20 + 22?")
    finally:
        ctx.close()
    log = [(c["name"], c["error"], c["output"]) for c in sample.metadata["tool_calls"]]
    assert log[0] == ("add", None, "42")
    assert log[1][:2] == ("fail", "mcp_error")  # the tool's error answer: the model's, shown to it
    assert log[2][:2] == ("add", "bad_arguments") and log[3] == ("echo", None, "hi")
    stats = sample.metadata["rollout_stats"]
    assert stats["agent/tool_calls"] == 4 and stats["agent/tool_errors"] == 2
    assert stats["agent/tool_errors/mcp_error"] == 1 and stats["agent/tool_errors/bad_arguments"] == 1
    assert "42" in tok.decode(sample.tokens) and sample.status.value == "completed"


def test_a_server_that_dies_during_a_call_fails_the_sample_not_the_model(tok):
    """Issue 57 item 4: a crashed MCP server is infrastructure, like a sandbox that cannot start: the
    episode ends as failed (left out of training), never as the model's error scored 0."""
    turns = [call("add", a=20, b=22), call("crash"), "The answer is 42."]
    engine = ScriptedEngine(tok, lambda prompt, turn: turns[turn], char_level=False)
    ctx = mcp_ctx(tok, engine)
    try:
        (sample,) = run_agent(ctx, "What is 20 + 22?")
    finally:
        ctx.close()
    assert sample.status.value == "failed" and sample.metadata["infra_failure_kind"] == "mcp_server"
    assert "its MCP server 't' stopped during the call" in sample.metadata["infra_failure"]
    assert sample.loss_mask == [0] * sample.response_length and len(engine.calls) == 2  # no turn after it
    assert sample.metadata["rollout_stats"]["agent/infra_failures"] == 1


def mcp_children():
    """Processes of tests/mcp_server.py that are children of this process."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if SERVER in cmd and ppid == os.getpid():
            found.append(int(d.name))
    return found


def test_training_with_mcp_tools_end_to_end(tmp_path, tiny_model_path, monkeypatch):
    from reinforge.loop import run_training
    from reinforge.tools import TOOL_CALL_FORMATS
    from reinforge.utils.registry import Entry
    from tests.integration.test_agent import AlwaysCall
    from tests.integration.test_integration import read_metrics, tiny_overrides

    monkeypatch.setitem(TOOL_CALL_FORMATS._entries, "always_call", Entry("always_call", AlwaysCall))
    others = set(mcp_children())  # servers of other tests' ToolSets (the module's fixture)
    out = tmp_path / "run"
    entry = f"{{name: t, command: {sys.executable}, args: [{SERVER}], tools: [echo]}}"
    result = run_training(
        load_config(
            None,
            tiny_overrides(
                tiny_model_path,
                out,
                **{
                    "rollout.custom_generate_function_path": "reinforge.rollout.agent:generate",
                    "agent.mcp_servers": f"[{entry}]",
                    "agent.tool_call_format": "always_call",
                    "agent.max_turns": 3,
                    "agent.max_turn_tokens": 6,
                    "agent.tool_output_max_tokens": 4,
                    "rollout.rollout_max_response_len": 96,
                    "reward.type": "custom",
                    "reward.function_path": "tests.reward_fns:even_first_token",
                    "run.save_final": "false",
                },
            ),
        )
    )
    assert result.last_rollout_id == 1
    rows = [m for m in read_metrics(out) if "train/loss" in m]
    assert len(rows) == 2
    for m in rows:  # every turn but the last calls echo on the MCP server, and every call succeeds
        assert m["agent/turns"] == 3 and m["agent/tool_calls"] == 2 and m["agent/tool_errors"] == 0
    assert wait_until(lambda: not set(mcp_children()) - others)  # the servers were stopped with the run
