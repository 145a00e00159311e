"""The SWE environment (issue 35 item 5a): the repository generator (seeded, every bug verified),
the workspace's path checks, scripted episodes through the agent loop (a fix gets 1, giving up
gets 0, a sandbox that cannot start is an infrastructure failure), and a real training run."""

import asyncio
import dataclasses
import json
import os

import pytest

from reinforge.cli import main
from reinforge.config import load_config
from reinforge.data import Prompt, render_prompt
from reinforge.envs import EnvContext, Turn, load_environment
from reinforge.envs.swe_data import apply_site, generate_repos, mutation_sites, run_in_process
from reinforge.loop import run_training
from reinforge.records import Status
from reinforge.rollout.agent import prompt_tools
from reinforge.rollout.generate import generate_groups
from reinforge.sandbox import Sandboxes, SandboxResult
from reinforge.tools import ToolCall, ToolSet
from tests.integration.test_agent import ScriptedEngine, agent_ctx, tok  # noqa: F401
from tests.integration.test_integration import read_metrics

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


@pytest.fixture(scope="module")
def rows():
    return generate_repos(24, seed=11)


def test_the_generator_is_seeded_and_varied(rows, tmp_path):
    assert generate_repos(24, seed=11) == rows
    assert generate_repos(3, seed=12) != rows[:3]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert main(["make-data", "swe", "--out", str(a), "--num-prompts", "6", "--seed", "3"]) == 0
    assert main(["make-data", "swe", "--out", str(b), "--num-prompts", "6", "--seed", "3"]) == 0
    assert a.read_bytes() == b.read_bytes() and len(a.read_text().splitlines()) == 6
    assert len({json.dumps(r["metadata"]["swe"]["files"]) for r in rows}) == len(rows)
    assert len({r["metadata"]["swe"]["bug"]["kind"] for r in rows}) >= 3


def test_every_bug_fails_its_test_and_the_fix_passes(rows):
    for r in rows:
        spec = r["metadata"]["swe"]
        files, bug = spec["files"], spec["bug"]
        assert set(files) == {"README.md", bug["path"], f"{spec['tests'][0]}.py"}
        buggy = run_in_process(files, spec["tests"])
        assert buggy["failed"] >= 1 and not buggy["timed_out"], r
        assert [x.split("::")[1].split(" - ")[0] for x in buggy["lines"]] == spec["failing"]
        assert spec["failing"][0] in r["prompt"] and buggy["lines"][0] in r["prompt"]
        lines = files[bug["path"]].splitlines(True)
        assert lines[bug["line"] - 1].rstrip("\n") == bug["buggy"] != bug["fixed"]
        lines[bug["line"] - 1] = bug["fixed"] + "\n"
        fixed = run_in_process({**files, bug["path"]: "".join(lines)}, spec["tests"])
        assert fixed == {"passed": spec["n_tests"], "failed": 0, "lines": [], "timed_out": False}


def test_mutations_are_single_edits_of_the_source():
    src = "def f(a, b):\n    if a <= b and b > 0:\n        return (a + b) * 2\n    return a % 3\n"
    kinds = {(s["kind"], s["old"], s["new"]) for s in mutation_sites(src)}
    assert {("wrong_comparison", "<=", "<"), ("wrong_comparison", ">", ">="), ("and_or", "and", "or")} <= kinds
    assert {("swapped_operator", "+", "-"), ("swapped_operator", "*", "+"), ("swapped_operator", "%", "//")} <= kinds
    assert {("off_by_one", "2", "3"), ("off_by_one", "0", "1"), ("off_by_one", "3", "2")} <= kinds
    for site in mutation_sites(src):
        out = apply_site(src, site).splitlines()
        assert sum(x != y for x, y in zip(out, src.splitlines())) == 1


def test_a_looping_mutant_is_stopped_by_the_time_limit():
    files = {
        "m.py": "def f():\n    while True:\n        pass\n",
        "test_m.py": "from m import f\n\ndef test_f():\n    f()\n",
    }
    r = run_in_process(files, ["test_m"], seconds=0.1)
    assert r["timed_out"] and r["failed"] == 1


def _env(row, *overrides, **kwargs):
    no_bwrap = ["sandbox.backend=none"] if not _has_bwrap() else []
    cfg = load_config(None, ["agent.environment=swe", *no_bwrap, *overrides])
    sandboxes = Sandboxes.from_config(cfg.sandbox, cfg.agent.tool_timeout)
    return load_environment("swe")(row, EnvContext(cfg.agent, ToolSet([]), kwargs, sandboxes))


def _has_bwrap():
    from reinforge.sandbox import bwrap_path

    return bwrap_path() is not None


def test_paths_that_leave_the_workspace_are_refused(rows, tmp_path):
    with pytest.raises(ValueError, match="max_file_byte"):
        _env(rows[0], max_file_byte=1000)
    env = _env(rows[0], max_file_bytes=1000)
    spec = rows[0]["metadata"]["swe"]

    async def go():
        await env.reset()
        root = env.root
        os.symlink("/etc", root / "etc_link")
        outside = tmp_path / "outside.txt"
        outside.write_text("secret")
        os.symlink(outside, root / "file_link")
        cases = [
            ("read_file", {"path": "/etc/passwd"}, "path"),
            ("read_file", {"path": "../../etc/passwd"}, "path"),
            ("read_file", {"path": "a/../../x"}, "path"),
            ("read_file", {"path": "etc_link/passwd"}, "path"),
            ("read_file", {"path": "file_link"}, "path"),
            ("read_file", {"path": "nul\0.py"}, "path"),
            ("read_file", {"path": "."}, "path"),
            ("write_file", {"path": str(tmp_path / "x.py"), "content": "x"}, "path"),
            ("write_file", {"path": "../x.py", "content": "x"}, "path"),
            ("write_file", {"path": f"{spec['tests'][0]}.py", "content": "def test_ok(): pass\n"}, "path"),
            ("replace_in_file", {"path": f"{spec['tests'][0]}.py", "old": "assert", "new": "pass or"}, "path"),
            ("write_file", {"path": "big.py", "content": "x" * 1001}, "too_large"),
            ("replace_in_file", {"path": spec["bug"]["path"], "old": "no such text", "new": "x"}, "edit"),
            ("read_file", {"path": 3}, "bad_arguments"),
            ("rm_rf", {}, "unknown_tool"),
        ]
        for name, args, kind in cases:
            step = await env.step(Turn("", [ToolCall(name, args)]))
            (result,) = step.tool_results
            assert result.error == kind and "secret" not in result.output, (name, args, result)
        assert not (tmp_path / "x.py").exists() and outside.read_text() == "secret"
        assert step.info["refused_paths"] == 11 and step.info["edits"] == 0
        ok = await env.step(Turn("", [ToolCall("write_file", {"path": "pkg/new.py", "content": "X = 1\n"})]))
        assert ok.tool_results[0].error is None and (root / "pkg" / "new.py").read_text() == "X = 1\n"
        await env.close()
        assert not root.exists()

    asyncio.run(go())


def _prompt(ctx, row):
    pt = prompt_tools(ctx.config, ctx.tokenizer)
    text = render_prompt(ctx.tokenizer, row["prompt"], True, None, pt.schemas, pt.system_text)
    ids = ctx.tokenizer(text, add_special_tokens=False)["input_ids"]
    return Prompt(row["prompt"], text, ids, row["label"], json.loads(json.dumps(row["metadata"])))


def _call(name, **args):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def _play(tok, row, script, *overrides):  # noqa: F811 - tok is the fixture's value
    engine = ScriptedEngine(tok, script, char_level=False)
    ctx = agent_ctx(
        tok,
        engine,
        "agent.environment=swe",
        "agent.max_turns=6",
        "agent.tool_output_max_tokens=1024",
        "rollout.rollout_max_response_len=6000",
        *overrides,
    )
    (group,) = generate_groups(ctx, [_prompt(ctx, row)], 1, ctx.sampling_params())
    return group[0], engine


def test_a_scripted_fix_gets_reward_1(tok, rows):  # noqa: F811
    row = rows[1]
    bug = row["metadata"]["swe"]["bug"]
    turns = [
        _call("list_files"),
        _call("read_file", path=bug["path"]),
        _call("replace_in_file", path=bug["path"], old=bug["buggy"], new=bug["fixed"]),
        _call("run_tests"),
        "The tests pass now.",
    ]
    s, engine = _play(tok, row, lambda prompt, turn: turns[turn])
    assert s.status == Status.COMPLETED and s.reward == 1.0, s.metadata
    outputs = [c["output"] for c in s.metadata["tool_calls"]]
    assert bug["path"] in outputs[0] and bug["buggy"] in outputs[1] and outputs[2].startswith("replaced 1")
    n = row["metadata"]["swe"]["n_tests"]
    assert outputs[3] == f"{n} passed, 0 failed"
    stats = s.metadata["rollout_stats"]
    assert stats["agent/turns"] == 5 and stats["agent/tool_errors"] == 0 and stats["env/test_runs"] == 1
    assert stats["env/edits"] == 1 and 0 < stats["env/workspace_ms"] < 1000
    assert bug["buggy"] in tok.decode(engine.calls[2][0])  # the file's text came back as an observation


def test_giving_up_gets_0_and_a_failing_run_shows_the_failure(tok, rows):  # noqa: F811
    row = rows[2]
    s, _ = _play(tok, row, lambda prompt, turn: "I cannot fix this.")
    assert s.status == Status.COMPLETED and s.reward == 0.0 and s.metadata["rollout_stats"]["agent/turns"] == 1
    turns = [_call("run_tests"), "Done."]
    s, _ = _play(tok, row, lambda prompt, turn: turns[turn])
    report = s.metadata["tool_calls"][0]["output"].splitlines()
    assert s.reward == 0.0 and report[0] == row["prompt"].splitlines()[1]  # the sandbox's run is the generator's
    assert report[-1] == f"{row['metadata']['swe']['n_tests'] - 1} passed, 1 failed"
    turns = [_call("replace_in_file", path=row["metadata"]["swe"]["bug"]["path"], old="return", new="retur"), "Done."]
    s, _ = _play(tok, row, lambda prompt, turn: turns[turn])  # a syntax error: 0, not a failure
    assert s.status == Status.COMPLETED and s.reward == 0.0


FORGE_PRINT = """import builtins, os, re
_print = builtins.print
def _forged(*a, **k):
    if len(a) == 3 and isinstance(a[0], str) and re.fullmatch("[0-9a-f]{16}", a[0]):
        a = (a[0], N, 0)
    _print(*a, **k)
builtins.print = _forged
_write = os.write
def _forged_write(fd, data):
    return _write(fd, re.sub(rb"([0-9a-f]{16}) \\d+ \\d+", rb"\\1 N 0", data))
os.write = _forged_write
"""

FORGE_MAIN = """import os, re, sys
nonce = re.findall("[0-9a-f]{16}", open(os.path.abspath(sys.argv[0])).read())[-1]
sys.stdout.write("N passed, 0 failed\\n%s N 0\\n" % nonce)
sys.stdout.flush()
os._exit(0)
"""


ALWAYS_EQUAL = """class _Equal:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __hash__(self):
        return 0


def __getattr__(name):
    return lambda *args, **kwargs: _Equal()
"""


@pytest.mark.parametrize("attack", ["shadowing_package", "nonce_from_main_py", "patched_print", "always_equal"])
def test_only_the_read_only_tests_score(tok, rows, attack):  # noqa: F811
    """Issue 51 E4: a package test_<mod>/ with passing tests does not shadow the read-only test
    module; code under test can neither read the runner's nonce from main.py nor rewrite its
    closing line by patching print / os.write, nor return objects equal to anything: none of it
    scores."""
    row = rows[3]
    spec = row["metadata"]["swe"]
    n, test, module = spec["n_tests"], spec["tests"][0], spec["bug"]["path"]
    if attack == "shadowing_package":
        passing = "".join(f"def test_{i}():\n    pass\n\n" for i in range(n))
        edit = _call("write_file", path=f"{test}/__init__.py", content=passing)
    elif attack == "always_equal":  # every function returns an object whose == says True
        edit = _call("write_file", path=module, content=ALWAYS_EQUAL)
    else:  # the module under test, imported by the tests, tries to forge the result
        code = (FORGE_PRINT if attack == "patched_print" else FORGE_MAIN).replace("N", str(n))
        original = row["metadata"]["swe"]["files"][module]
        edit = _call("write_file", path=module, content=code + original)
    s, _ = _play(tok, row, lambda prompt, turn: [edit, _call("run_tests"), "Done."][turn])
    assert s.metadata["tool_calls"][0]["error"] is None, s.metadata["tool_calls"]
    report = s.metadata["tool_calls"][1]["output"]
    assert s.status == Status.COMPLETED and s.reward == 0.0, report
    assert report.splitlines()[-1] != f"{n} passed, 0 failed"


def test_evaluation_keeps_the_environments_reward(tok, rows):  # noqa: F811
    """reward.type would score the final answer against the label (0 here): the episode's own
    reward (the tests pass: 1) is what evaluation reports."""
    from reinforge.eval.evaluate import evaluate
    from reinforge.reward import RewardManager

    row = rows[5]
    bug = row["metadata"]["swe"]["bug"]
    turns = [_call("replace_in_file", path=bug["path"], old=bug["buggy"], new=bug["fixed"]), "Fixed."]
    engine = ScriptedEngine(tok, lambda prompt, turn: turns[turn], char_level=False)
    ctx = agent_ctx(
        tok,
        engine,
        "agent.environment=swe",
        "reward.type=exact_match",
        "eval.n_samples_per_eval_prompt=0",
        "eval.pass_k=[]",
    )
    ctx = dataclasses.replace(ctx, reward=RewardManager(ctx.config.reward, pad_id=0))
    try:
        metrics, samples = evaluate(ctx, [_prompt(ctx, row)])
    finally:
        ctx.reward.close()
    assert samples[0].reward == 1.0 and metrics["eval/greedy_reward"] == 1.0


def test_max_turns_ends_the_episode_and_the_final_run_decides(tok, rows):  # noqa: F811
    row = rows[3]
    bug = row["metadata"]["swe"]["bug"]
    fix = _call("replace_in_file", path=bug["path"], old=bug["buggy"], new=bug["fixed"])
    s, _ = _play(tok, row, lambda prompt, turn: fix if turn == 0 else _call("list_files"), "agent.max_turns=3")
    assert s.reward == 1.0 and s.metadata["rollout_stats"]["agent/turns"] == 3  # never ran the tests itself


def test_a_sandbox_that_cannot_start_is_an_infrastructure_failure(tok, rows, monkeypatch):  # noqa: F811
    from reinforge.sandbox import Sandboxes

    async def broken(*args, **kwargs):
        return SandboxResult("", "bwrap: cannot mount", 1, False, 0.01, infra_error="bwrap: cannot mount")

    monkeypatch.setattr(Sandboxes, "run", broken)
    for turns in ([_call("run_tests"), "Done."], ["Done."]):  # in a tool call; in the final run
        s, _ = _play(tok, rows[4], lambda prompt, turn, t=turns: t[turn])
        assert s.status == Status.FAILED and "cannot mount" in s.metadata["infra_failure"], s.metadata
        assert s.loss_mask == [0] * s.response_length


@pytest.mark.slow
def test_smollm2_trains_in_the_swe_environment(tmp_path):
    """A short real run (SmolLM2-135M-Instruct, examples/agent_swe.yaml): episodes, the final test
    runs in the sandbox and a training step, end to end. The reward is likely 0; it must not crash."""
    train, held_out = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    assert main(["make-data", "swe", "--out", str(train), "--num-prompts", "16", "--seed", "0"]) == 0
    assert main(["make-data", "swe", "--out", str(held_out), "--num-prompts", "2", "--seed", "1"]) == 0
    out = tmp_path / "run"
    overrides = [
        f"data.prompt_data={train}",
        f"data.eval_prompt_data={held_out}",
        "data.n_eval_prompts=2",
        "rollout.rollout_batch_size=2",
        "rollout.n_samples_per_prompt=2",
        "rollout.rollout_max_response_len=96",
        "agent.max_turns=2",
        "agent.max_turn_tokens=48",
        "engine.max_num_seqs=8",
        "train.num_rollout=1",
        "train.max_tokens_per_gpu=2048",
        "eval.eval_interval=1",
        "run.save_final=false",
        "run.progress=false",
        "run.dump_rollouts=true",
        f"run.output_dir={out}",
    ]
    if not _has_bwrap():
        overrides.append("sandbox.backend=none")
    result = run_training(load_config(os.path.join(EXAMPLES, "agent_swe.yaml"), overrides))
    assert result.last_rollout_id == 0
    (row,) = [m for m in read_metrics(out) if "train/loss" in m]
    assert row["agent/turns"] >= 1 and row["env/workspace_ms"] > 0 and row["rollout/infra_failed_samples"] == 0
    assert 0.0 <= row["rollout/reward_mean"] <= 1.0
    dumped = [json.loads(line) for line in (out / "rollouts" / "000000.jsonl").read_text().splitlines()]
    assert len(dumped) == 4 and all(d["reward"] in (0.0, 1.0) for d in dumped)
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert evals and 0.0 <= evals[-1]["eval/greedy_reward"] <= 1.0


def test_the_workspace_is_bound_read_only_into_the_sandbox(tmp_path):
    from reinforge.sandbox import SandboxLimits, run_python

    if not _has_bwrap():
        pytest.skip("bubblewrap is not installed")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "m.py").write_text("X = 41\n")
    for p in (tmp_path, ws):
        os.chmod(p, 0o755)
    os.chmod(ws / "m.py", 0o644)
    code = "import sys\nsys.path.insert(0, 'repo')\nimport m\nprint(m.X + 1, flush=True)\nopen('repo/m.py', 'w')\n"
    r = asyncio.run(run_python(code, SandboxLimits(), binds={"repo": str(ws)}))
    assert r.stdout.strip() == "42" and "Read-only file system" in r.stderr and r.returncode == 1
    assert (ws / "m.py").read_text() == "X = 41\n"
    with pytest.raises(ValueError, match="cannot name a folder"):
        asyncio.run(run_python("pass", SandboxLimits(), binds={"../x": str(ws)}))
