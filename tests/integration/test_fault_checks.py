"""Fault handling that needs no model (issue 27, "Resume and faults"): checkpoint integrity
(manifest, state keys, model shape), a full disk during a save, --load falling back past a
damaged checkpoint, metrics of redone steps dropped, SIGINT, the output-directory lock, the
supervisor's death reaching the trainer, reward functions that exit / hang / block / always fail,
non-finite config values, non-UTF-8 files, and the commands of the "next:" line."""

from __future__ import annotations

import errno
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from reinforge import checkpoint as ckpt
from reinforge.config import ConfigError, RewardConfig, load_config
from reinforge.records import Sample

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- checkpoints


def fake_write(tmp: Path, layers: int = 2, payload: int = 4096) -> None:
    """The trainers' part of a checkpoint, in miniature (the files resume checks)."""
    (tmp / "model").mkdir()
    (tmp / "model" / "config.json").write_text(json.dumps({"num_hidden_layers": layers, "hidden_size": 64}))
    (tmp / "model" / "model.safetensors").write_bytes(os.urandom(payload))
    (tmp / "dcp" / "actor").mkdir(parents=True)
    (tmp / "dcp" / "actor" / ".metadata").write_bytes(b"meta")
    (tmp / "dcp" / "actor" / "__0_0.distcp").write_bytes(os.urandom(payload))
    torch.save({"actor": {"skipped_steps": 0}}, tmp / "trainer_state.pt")


def save(root: Path, i: int, **kw) -> Path:
    state = {"rollout_id": i, "weight_version": i + 1, "data": {"epoch": 0, "offset": 2 * i, "size": 8}, "config": {}}
    return ckpt.save_checkpoint(root, i, lambda t: fake_write(t, **kw), state)


def test_manifest_detects_missing_and_damaged_files(tmp_path):
    c = save(tmp_path, 0)
    manifest = json.loads((c / ckpt.MANIFEST).read_text())
    assert set(manifest["files"]) >= {"state.json", "rng.pt", "model/model.safetensors", "dcp/actor/__0_0.distcp"}
    assert ckpt.checkpoint_problem(c) is None
    shard = c / "dcp" / "actor" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[100:164] = os.urandom(64)  # random bytes inside a shard: same size
    shard.write_bytes(bytes(data))
    assert ckpt.checkpoint_problem(c, deep=False) is None  # sizes alone cannot see it
    assert "dcp/actor/__0_0.distcp is damaged (CRC-32" in ckpt.checkpoint_problem(c)
    c = save(tmp_path, 1)
    (c / "model" / "model.safetensors").unlink()
    assert ckpt.checkpoint_problem(c) == "model/model.safetensors is missing"


def test_state_without_data_is_a_damaged_checkpoint_and_recover_falls_back(tmp_path, caplog):
    from reinforge.recover import recover_candidates

    root = tmp_path / "run" / "checkpoints"
    save(root, 0)
    c = save(root, 1)
    state = json.loads((c / "state.json").read_text())
    del state["data"]
    (c / "state.json").write_text(json.dumps(state))
    ckpt.write_manifest(c)  # as if it had been saved without the entry
    assert ckpt.checkpoint_problem(c) == "state.json has no 'data' entry"
    with caplog.at_level(logging.WARNING):
        found = recover_candidates(tmp_path / "run")
    assert [p.name for p in found] == ["rollout_000000"]
    assert "rollout_000001 is not usable (state.json has no 'data' entry): falling back" in caplog.text


def test_load_of_a_run_directory_falls_back_past_a_damaged_newest_checkpoint(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    for i in range(3):
        save(root, i)
    (root / "rollout_000002" / "rng.pt").write_bytes(b"PK\x03\x04 truncated zip")
    warnings: list[str] = []
    found = ckpt.load_candidates(tmp_path / "run", warn=warnings.append)
    assert [p.name for p in found] == ["rollout_000001", "rollout_000000"]
    assert len(warnings) == 1 and "rollout_000002" in warnings[0] and "rng.pt" in warnings[0]
    assert [p.name for p in ckpt.load_candidates(root)] == ["rollout_000001", "rollout_000000"]
    # naming the damaged checkpoint itself: refused in words, no fallback to another one
    with pytest.raises(ckpt.CheckpointError, match=r"rollout_000002 is damaged \(rng.pt has"):
        ckpt.load_candidates(root / "rollout_000002")
    for i in (0, 1):
        (root / f"rollout_00000{i}" / "trainer_state.pt").unlink()
    with pytest.raises(ckpt.CheckpointError, match="every checkpoint in .* is damaged"):
        ckpt.load_candidates(tmp_path / "run", warn=warnings.append)


def test_checkpoint_of_a_differently_shaped_model_is_refused(tmp_path):
    c = save(tmp_path / "ck", 0, layers=30)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64}))
    with pytest.raises(ckpt.CheckpointError, match="num_hidden_layers=30 in the checkpoint, 2 in the model"):
        ckpt.load_candidates(c, model_path=model)
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 30, "hidden_size": 64}))
    assert ckpt.load_candidates(c, model_path=model) == [c]


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"),
    ],
)
def test_full_disk_during_a_save_names_what_was_lost_and_what_remains(tmp_path, monkeypatch, error):
    root = tmp_path / "checkpoints"
    first = save(root, 0)

    def failing(tmp):
        fake_write(tmp)
        raise error

    monkeypatch.setattr(ckpt.shutil, "disk_usage", lambda p: type("U", (), {"total": 5 << 20, "free": 4096})())
    with pytest.raises(ckpt.DiskFullError) as e:
        ckpt.save_checkpoint(root, 1, failing, {"rollout_id": 1})
    msg = str(e.value)
    assert e.value.errno == errno.ENOSPC and e.value.__cause__ is error
    assert "disk full" in msg and "checkpoint rollout_000001 was not written" in msg
    assert f"the newest intact checkpoint is {first}" in msg
    # nothing half-written is left, and what was there is intact
    assert sorted(p.name for p in root.iterdir()) == ["latest", "rollout_000000"]
    assert (root / "latest").read_text().strip() == "rollout_000000" and ckpt.checkpoint_problem(first) is None


def test_short_write_with_free_space_is_not_called_a_full_disk(tmp_path):
    def failing(tmp):
        raise RuntimeError("unexpected pos 704 vs 598")

    with pytest.raises(RuntimeError, match="unexpected pos") as e:
        ckpt.save_checkpoint(tmp_path, 0, failing, {})
    assert not isinstance(e.value, ckpt.DiskFullError)


@pytest.fixture
def small_disk(tmp_path):
    """A real 6 MiB tmpfs (needs root / CAP_SYS_ADMIN; skipped elsewhere)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_for_real_with_torch_and_dcp_writers(small_disk):
    import torch.distributed.checkpoint as dcp

    def write(tmp):  # 2 MiB through torch.save and 2 MiB through DCP, as the trainers write
        fake_write(tmp, payload=1024)
        torch.save(torch.zeros(1 << 19), tmp / "trainer_state.pt")
        dcp.save({"w": torch.ones(1 << 19)}, checkpoint_id=str(tmp / "dcp" / "actor"))

    root = small_disk / "checkpoints"
    first = ckpt.save_checkpoint(root, 0, write, {"rollout_id": 0, "weight_version": 1, "data": {}, "config": {}})
    with pytest.raises(ckpt.DiskFullError, match=r"checkpoint rollout_000001 was not written .*intact checkpoint is "):
        ckpt.save_checkpoint(root, 1, write, {"rollout_id": 1})
    assert sorted(p.name for p in root.iterdir()) == ["latest", "rollout_000000"]
    assert ckpt.checkpoint_problem(first) is None


# ----------------------------------------------------------------------------- metrics on resume


def test_metrics_rows_of_redone_steps_are_dropped(tmp_path):
    from reinforge.utils.logging import MetricsLogger, truncate_metrics

    log = MetricsLogger(tmp_path, tensorboard=True)
    for step in range(6):
        log.log(step, {"rollout/reward_mean": float(step)})
    log.close()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 6, "rollout/rew')  # a row torn by SIGKILL
    # TensorBoard reads event files in name order: <seconds>.<host>.<pid>.<a per-process counter>; a resumed run is
    # another process in another second, but here one process writes both, and its counter may pass 9 -> 10
    # (other writers of this test process before: pytest-xdist), which sorts before: make the second differ
    time.sleep(max(0.0, 1.05 - (time.time() % 1.0)))
    log = MetricsLogger(tmp_path, tensorboard=True, start_step=4)  # resumed: steps 4, 5 are redone
    for step in (4, 5, 6):
        log.log(step, {"rollout/reward_mean": 10.0 + step})
    log.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5, 6]
    assert [r["rollout/reward_mean"] for r in rows][3:] == [3.0, 14.0, 15.0, 16.0]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("rollout/reward_mean")
    assert [e.step for e in events] == [0, 1, 2, 3, 4, 5, 6]
    assert [e.value for e in events][4:] == [14.0, 15.0, 16.0]
    assert truncate_metrics(tmp_path / "metrics.jsonl", 0) == 7 and (tmp_path / "metrics.jsonl").read_text() == ""


def test_wandb_continues_the_same_run_rewound_to_the_resume_step(tmp_path, monkeypatch):
    calls = []

    class FakeWandb:
        class util:
            @staticmethod
            def generate_id():
                return "abc123"

        @staticmethod
        def init(**kw):
            calls.append(kw)
            return type("Run", (), {"log": lambda *a, **k: None, "finish": lambda self: None})()

    monkeypatch.setitem(sys.modules, "wandb", FakeWandb)
    from reinforge.utils.logging import MetricsLogger

    MetricsLogger(tmp_path, tensorboard=False, wandb_project="p", start_step=0).close()
    MetricsLogger(tmp_path, tensorboard=False, wandb_project="p", start_step=4).close()
    MetricsLogger(tmp_path, tensorboard=False, wandb_project="p", wandb_mode="offline", start_step=4).close()
    assert calls[0]["id"] == "abc123" and calls[0]["resume"] == "allow"
    assert calls[1]["resume_from"] == "abc123?_step=4" and "id" not in calls[1]
    assert calls[2]["id"] == "abc123" and calls[2]["resume"] == "allow"  # offline runs cannot rewind


# ----------------------------------------------------------------------------- signals, lock, supervisor


def test_sigint_is_handled_like_sigterm_and_a_second_one_interrupts():
    from reinforge.recover import Preempted, RecoverTimer

    timer = RecoverTimer(3600)
    timer.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert timer.signal == "SIGINT" and timer.due()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    finally:
        timer.uninstall()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert Preempted("SIGINT", Path(".")).code == 130 and Preempted("SIGTERM", Path(".")).code == 143


def test_output_directory_lock_keeps_a_second_trainer_out(tmp_path):
    from reinforge.cli import main
    from reinforge.utils.fs import DirectoryLocked, lock_directory

    with lock_directory(tmp_path):
        with pytest.raises(DirectoryLocked, match=f"in use by another reinforge process \\(pid {os.getpid()}"):
            with lock_directory(tmp_path):
                pass
        assert main(["train", f"run.output_dir={tmp_path}"]) == 2  # a usage error: the supervisor won't relaunch
    with lock_directory(tmp_path):  # released with the holder
        pass


CHILD = """
import os, signal, sys, time
from reinforge.supervisor import _child_setup
import subprocess
me = os.getpid()
child = subprocess.Popen([sys.executable, "-c", '''
import os, signal, sys, time
def put(path, text):  # whole or not at all: the test polls for the file and reads it at once
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)
def stop(s, f):
    put(sys.argv[1], "SIGTERM"); sys.exit(143)
signal.signal(signal.SIGTERM, stop)
put(sys.argv[1] + ".ready", str(os.getpid()))
time.sleep(60)
''', sys.argv[1]], preexec_fn=lambda: _child_setup(me))
time.sleep(60)
"""


def test_supervisor_death_sends_the_trainer_sigterm(tmp_path):
    marker = tmp_path / "child"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    sup = subprocess.Popen([sys.executable, "-c", CHILD, str(marker)], env=env)
    deadline = time.monotonic() + 60
    while not Path(f"{marker}.ready").exists():
        assert time.monotonic() < deadline and sup.poll() is None
        time.sleep(0.05)
    child = int(Path(f"{marker}.ready").read_text())
    assert os.getpgid(child) == child  # its own process group: Ctrl-C reaches it through the supervisor only
    sup.kill()  # SIGKILL: no handler of the supervisor runs
    sup.wait()
    while not marker.exists():
        assert time.monotonic() < deadline, "the trainer outlived its supervisor"
        time.sleep(0.05)
    assert marker.read_text() == "SIGTERM"


def test_watch_parent_signals_when_the_parent_pid_changes(monkeypatch):
    from reinforge import supervisor

    monkeypatch.setenv(supervisor.PARENT_ENV, str(os.getppid() + 1))  # "a parent that is gone"
    got = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    try:
        t = supervisor.watch_parent(interval_s=0.01)
        t.join(5)
        time.sleep(0.05)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert got == [signal.SIGTERM]
    monkeypatch.delenv(supervisor.PARENT_ENV)
    assert supervisor.watch_parent() is None


# ----------------------------------------------------------------------------- rewards


def sample(i: int = 0, **metadata) -> Sample:
    return Sample(
        prompt="p",
        tokens=[1, 2, 3],
        response_length=1,
        response="<answer>4</answer>",
        label="4",
        metadata=metadata,
        index=i,
    )


def manager(fn: str, **kw):
    from reinforge.reward import RewardManager

    return RewardManager(RewardConfig(type="custom", function_path=f"tests.reward_fns:{fn}", **kw))


@pytest.mark.parametrize(
    "fn,says",
    [
        ("exits", "ended its worker process (exit code 1"),
        ("sys_exits", "raised SystemExit(3)"),
        ("exits_via_imported_name", "ended its worker process (exit code 7"),
        ("exits_from_a_thread", "ended its worker process (exit code 5"),
    ],
)
def test_a_reward_that_exits_the_process_is_an_error_with_its_name(fn, says, caplog):
    """Issue 38: `from os import _exit` at import and os._exit from a thread bypassed the in-process
    guard and ended the trainer; a worker process takes the exit instead, and is replaced."""
    m = manager(fn)
    samples = [sample(i) for i in range(3)]
    with caplog.at_level("WARNING", logger="reinforge.reward.manager"):
        counts = m.score(samples)  # still alive
    assert counts["reward/errors"] == 3 and all(s.reward == 0.0 for s in samples)
    assert says in samples[0].reward_info["reward_failure"]
    line = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"][0]
    assert f"reward function tests.reward_fns:{fn} failed on sample 0 (prompt 'p'): {says}" in line
    assert "\n" not in line
    assert m.score([sample(0)])["reward/errors"] == 1  # replaced workers answer again
    m.close()


@pytest.mark.parametrize("fn,says", [("exits", "called os._exit(1)"), ("sys_exits", "raised SystemExit(3)")])
def test_a_reward_in_a_thread_that_exits_the_process_is_an_error(fn, says):
    m = manager(fn, isolation="thread")
    samples = [sample(i) for i in range(3)]
    counts = m.score(samples)  # still alive
    assert counts["reward/errors"] == 3 and all(s.reward == 0.0 for s in samples)
    assert f"tests.reward_fns:{fn} {says}" in samples[0].reward_info["reward_failure"]
    m.close()


def test_os_exit_outside_rewards_and_in_forked_children_is_untouched():
    from reinforge.reward import manager as mod

    manager("even_first_token", isolation="thread")
    assert os._exit is mod._guarded_exit
    pid = os.fork()
    if pid == 0:  # a forked child: the real exit, even inside a reward context
        mod._IN_REWARD.set("x")
        os._exit(7)
    assert os.waitpid(pid, 0)[1] >> 8 == 7


def test_hung_sync_rewards_do_not_starve_healthy_samples():
    """A timed-out call's worker is stopped (issue 38: each hung call used to leave its thread behind)."""
    m = manager("hangs_when_flagged", concurrency=2, timeout=0.3)
    hung = [sample(i, hang=True) for i in range(4)]
    healthy = [sample(i) for i in range(6)]
    t = time.perf_counter()
    counts = m.score(hung + healthy)
    assert counts["reward/timeouts"] == 4 and all(s.reward == 1.0 for s in healthy)
    counts = m.score([sample(i) for i in range(6)])
    assert counts["reward/timeouts"] == 0 and counts["reward/abandoned_threads"] == 0
    assert time.perf_counter() - t < 6.0
    assert len(m.pool.workers) <= 2 and all(w.proc.poll() is None for w in m.pool.workers)
    m.close()
    m = manager("hangs_when_flagged", concurrency=2, timeout=0.3, isolation="thread")
    counts = m.score([sample(0, hang=True)] + [sample(i) for i in range(3)])
    assert counts["reward/timeouts"] == 1 and counts["reward/abandoned_threads"] == 1  # a thread cannot be stopped


def test_custom_rewards_run_outside_the_trainer_and_keep_reward_info():
    m = manager("worker_pid")
    s = sample(0)
    m.score([s])
    assert s.reward == 1.0 and s.reward_info["pid"] != os.getpid()
    m.close()


def test_a_blocking_async_reward_honours_the_timeout():
    m = manager("async_blocks", timeout=0.3)
    t = time.perf_counter()
    blocked = sample(0, hang=True)
    counts = m.score([blocked])
    assert counts["reward/timeouts"] == 1 and time.perf_counter() - t < 1.5
    later = [sample(i) for i in range(3)]  # on a fresh loop: the old one is still blocked
    assert m.score(later)["reward/timeouts"] == 0 and all(s.reward == 1.0 for s in later)
    m.close()


def test_a_reward_failing_on_every_sample_stops_the_run():
    from reinforge.reward.manager import RewardFunctionFailing

    m = manager("always_raises")
    for _ in range(m.ALL_FAILED_LIMIT - 1):
        assert m.score([sample(0), sample(1)])["reward/errors"] == 2
    with pytest.raises(
        RewardFunctionFailing,
        match=r"tests.reward_fns:always_raises\) failed on every sample of 3 "
        r"consecutive batches .*reward bug on every sample",
    ):
        m.score([sample(0), sample(1)])
    from reinforge.reward import RewardManager

    m = RewardManager(RewardConfig(type="exact_match"))  # a batch with one success resets the count

    def bad():
        s = sample(0)
        s.label = {"answer": 4}
        return s

    for batch in ([bad(), bad()], [bad(), bad()], [bad(), sample(1)], [bad()], [bad()]):
        m.score(batch)
    with pytest.raises(RewardFunctionFailing, match="reward.type=exact_match"):
        m.score([bad()])


def test_a_label_of_the_wrong_type_is_counted_as_an_error():
    from reinforge.reward import RewardManager

    m = RewardManager(RewardConfig(type="exact_match"))
    good, bad = sample(0), sample(1)
    bad.label = ["4"]
    counts = m.score([good, bad])
    assert good.reward == 1.0 and bad.reward == 0.0 and counts["reward/errors"] == 1
    assert "string or number label" in bad.reward_info["reward_failure"]


# ----------------------------------------------------------------------------- config and data files


@pytest.mark.parametrize(
    "override",
    [
        "rollout.rollout_temperature=.nan",
        "train.lr=.inf",
        "train.lr=-.inf",
        "rollout.rollout_temperature=nan",
        "train.lr=inf",
    ],
)
def test_non_finite_numbers_are_refused(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])


def test_non_utf8_yaml_names_file_and_line(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_bytes(b"train:\n  lr: 1.0e-6\n  # caf\xe9\n")
    with pytest.raises(ConfigError, match=rf"{f}:3: byte 0xe9 at column 8 is not UTF-8"):
        load_config(str(f), [])


def test_non_utf8_jsonl_names_file_and_line(tmp_path):
    from reinforge.data.offline import read_rows
    from reinforge.data.sources import DataError, load_jsonl

    f = tmp_path / "p.jsonl"
    f.write_bytes(b'{"prompt": "1+1", "label": "2"}\n{"prompt": "caf\xe9", "label": "x"}\n')
    with pytest.raises(DataError, match=rf"{f}:2: byte 0xe9 at column 16 is not UTF-8"):
        load_jsonl(f)
    with pytest.raises(DataError, match=rf"{f}:2: byte 0xe9"):
        read_rows(f)


# ----------------------------------------------------------------------------- the "next:" line


def test_every_command_of_the_next_line_parses(tmp_path):
    from reinforge.cli import _convert, _eval, _train, build_parser
    from reinforge.eval.summary import next_steps

    run = tmp_path / "my run"  # a space: the paths must be quoted
    line = next_steps(run, "train", run / "checkpoints" / "rollout_000003", "train.num_rollout")
    assert line.startswith("next: ")
    commands = dict(part.split(": ", 1) for part in line.removeprefix("next: ").split("  |  "))
    assert set(commands) == {"resume", "evaluate", "export"}
    expected = {"resume": _train, "evaluate": _eval, "export": _convert}
    for what, command in commands.items():
        argv = shlex.split(command.replace("<more>", "10"))
        assert argv[0] == "reinforge"
        args, extra = build_parser().parse_known_args(argv[1:])  # exits (SystemExit) on a refused command
        assert not extra, (what, extra)
        assert args.func is expected[what]
    args = build_parser().parse_args(shlex.split(commands["export"])[1:])
    assert (args.checkpoint, args.out) == (str(run), str(run / "hf"))
    offline = next_steps(run, "offline", run / "checkpoints" / "step_000003", "offline.num_epochs", policy=False)
    for part in offline.removeprefix("next: ").split("  |  "):
        build_parser().parse_args(shlex.split(part.split(": ", 1)[1].replace("<more>", "2"))[1:])
