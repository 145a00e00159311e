"""Faults from outside (issue 57, item 16): a crash after a rollback, errors raised at run time,
the "directory in use" message under a supervisor, a checkpoint folder that turns read-only, a
read-only output directory, an absent device, a reward function that leaks memory, the lines of a
stale ``checkpoints/latest`` and of a Ctrl-C during start-up. Each test runs without a model (or
on fakes of the loop), in a few seconds."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from reinforge import checkpoint as ckpt
from reinforge import rollback
from reinforge.config import ConfigError

REPO = Path(__file__).resolve().parents[2]


def fake_write(tmp: Path) -> None:
    """The trainers' part of a checkpoint, in miniature (the files resume checks)."""
    (tmp / "model").mkdir()
    (tmp / "model" / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64}))
    (tmp / "model" / "model.safetensors").write_bytes(os.urandom(256))
    (tmp / "dcp" / "actor").mkdir(parents=True)
    (tmp / "dcp" / "actor" / ".metadata").write_bytes(b"meta")
    torch.save({"actor": {"skipped_steps": 0}}, tmp / "trainer_state.pt")


def save(root: Path, i: int) -> Path:
    state = {"rollout_id": i, "weight_version": i + 1, "data": {"epoch": 0, "offset": 2 * i, "size": 8}, "config": {}}
    return ckpt.save_checkpoint(root, i, fake_write, state)


# ----------------------------------------------------------------------------- run-time errors are not usage errors


class FakeLoop:
    """Stands for RLLoop in `reinforge train`: ``fail_init`` / ``fail_train`` raise at start-up / at run time."""

    fail_init: BaseException | None = None
    fail_train: BaseException | None = None
    closed = False

    def __init__(self, cfg, plan=None):
        if FakeLoop.fail_init is not None:
            raise FakeLoop.fail_init

    def train(self):
        if FakeLoop.fail_train is not None:
            raise FakeLoop.fail_train

    def close(self):
        FakeLoop.closed = True


@pytest.fixture
def fake_train(monkeypatch, tmp_path):
    from reinforge import cli

    monkeypatch.setattr("reinforge.loop.RLLoop", FakeLoop)
    monkeypatch.setattr(cli, "_preflight_rl", lambda cfg: None)
    failure = tmp_path / "failure.txt"
    monkeypatch.setenv("REINFORGE_FAILURE_FILE", str(failure))
    FakeLoop.fail_init = FakeLoop.fail_train = None
    FakeLoop.closed = False
    return ["train", f"run.output_dir={tmp_path / 'run'}"], failure


def test_an_error_raised_at_run_time_keeps_its_traceback(fake_train, capsys):
    """Before: a KeyError of a custom generate function printed `reinforge train: error: missing_key`,
    exit 2, and the supervisor did not relaunch. Now it propagates (traceback, exit 1) and is recorded."""
    from reinforge.cli import main

    args, failure = fake_train
    for error in (KeyError("missing_key"), ValueError("bad value"), FileNotFoundError("gone.txt")):
        FakeLoop.fail_train = error
        with pytest.raises(type(error)):
            main(args)
        assert FakeLoop.closed
        assert failure.read_text().startswith(type(error).__name__)
    assert "error:" not in capsys.readouterr().err


def test_the_same_error_at_start_up_is_a_usage_error(fake_train, capsys):
    from reinforge.cli import main

    args, failure = fake_train
    FakeLoop.fail_init = FileNotFoundError("data.prompt_data='x.jsonl': no such file")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err == "reinforge train: error: data.prompt_data='x.jsonl': no such file\n"
    assert failure.read_text().startswith("UsageError: data.prompt_data")
    FakeLoop.fail_init = KeyError("missing_key")
    assert main(args) == 2 and capsys.readouterr().err == "reinforge train: error: missing_key\n"


def test_startup_turns_plain_errors_into_usage_errors():
    from reinforge.startup import StartupInterrupted, UsageError, startup

    with pytest.raises(UsageError, match="^no such file$") as e:
        with startup():
            raise FileNotFoundError("no such file")
    assert isinstance(e.value, ConfigError) and isinstance(e.value.__cause__, FileNotFoundError)
    with pytest.raises(ConfigError) as c:
        with startup():
            raise ConfigError("as it is")
    assert type(c.value) is ConfigError
    with pytest.raises(RuntimeError):  # not an input problem: unchanged
        with startup():
            raise RuntimeError("x")
    with pytest.raises(StartupInterrupted):
        with startup():
            raise KeyboardInterrupt()


def test_ctrl_c_during_start_up_says_so(fake_train, capsys):
    """Before: `reinforge train: interrupted (); no checkpoint was written at this point`."""
    from reinforge.cli import main

    args, _ = fake_train
    FakeLoop.fail_init = KeyboardInterrupt()
    assert main(args) == 130
    assert capsys.readouterr().err == (
        "reinforge train: interrupted (Ctrl-C) during start-up, before the run began: nothing was trained\n"
    )
    FakeLoop.fail_init, FakeLoop.fail_train = None, KeyboardInterrupt()  # a second Ctrl-C during the run
    assert main(args) == 130
    assert "interrupted (Ctrl-C); no checkpoint was written at this point" in capsys.readouterr().err


# ----------------------------------------------------------------------------- a crash after a rollback


def run_config(out: Path, *overrides: str):
    from reinforge.config import load_config

    return load_config(None, [f"run.output_dir={out}", *overrides]).run


def test_a_rollback_makes_recovery_follow_the_chosen_line(tmp_path, caplog):
    """Before: after `--load checkpoints/rollout_000001` in the same run directory, a crash and
    run.recover=auto resumed rollout_000003 of the abandoned line."""
    from reinforge.recover import recover_candidates
    from reinforge.rollback import follow_load

    out = tmp_path / "run"
    root = out / "checkpoints"
    for i in range(4):
        save(root, i)
    with caplog.at_level("WARNING"):
        moved = follow_load(run_config(out, f"run.load={root / 'rollout_000001'}"))
    assert [p.name for p in moved] == ["rollout_000003", "rollout_000002"]
    assert all(p.parent.parent == root / "abandoned" and p.parent.name.endswith("-after-rollout_000001") for p in moved)
    assert all(ckpt.checkpoint_problem(p) is None for p in moved)  # kept intact, not deleted
    assert "rolling back to rollout_000001; its 2 newer checkpoint(s) (rollout_000003, rollout_000002)" in caplog.text
    assert (root / "latest").read_text().strip() == "rollout_000001"
    assert [p.name for p in recover_candidates(out)] == ["rollout_000001", "rollout_000000"]  # the crash's resume
    assert ckpt.load_candidates(out)[0].name == "rollout_000001"  # --load RUN_DIR too
    assert follow_load(run_config(out, f"run.load={out}")) == []  # the newest already: nothing to move


def test_an_interrupted_rollback_is_completed_before_a_resume(tmp_path):
    from reinforge.recover import recover_candidates

    out = tmp_path / "run"
    root = out / "checkpoints"
    for i in range(3):
        save(root, i)
    plan = {
        "kept": "rollout_000000",
        "into": "t-after-rollout_000000",
        "checkpoints": ["rollout_000002", "rollout_000001"],
    }
    (root / rollback.RETIRING).write_text(json.dumps(plan))
    (root / rollback.ABANDONED / plan["into"]).mkdir(parents=True)
    os.replace(
        root / "rollout_000002", root / rollback.ABANDONED / plan["into"] / "rollout_000002"
    )  # crash after one move
    assert [p.name for p in recover_candidates(out)] == ["rollout_000000"]
    assert not (root / rollback.RETIRING).exists()
    assert sorted(p.name for p in (root / rollback.ABANDONED / plan["into"]).iterdir()) == [
        "rollout_000001",
        "rollout_000002",
    ]


def test_max_restarts_with_load_honours_a_rollback_and_says_when_load_is_not_used(tmp_path, monkeypatch, caplog):
    """Before: `--max-restarts 2 --load <older checkpoint>` resumed the newest checkpoint silently."""
    from reinforge import cli, supervisor

    out = tmp_path / "run"
    root = out / "checkpoints"
    for i in range(3):
        save(root, i)
    seen = []
    monkeypatch.setattr(supervisor, "supervise", lambda args, *a, **k: seen.append(recover_newest(out)) or 0)
    monkeypatch.delenv(supervisor.PARENT_ENV, raising=False)
    base = ["train", f"run.output_dir={out}", "--max-restarts=2"]
    assert cli.main([*base, f"--load={root / 'rollout_000000'}"]) == 0
    assert seen == ["rollout_000000"]  # every attempt resumes the loaded checkpoint's line
    other = tmp_path / "other" / "checkpoints"
    save(other, 5)
    save(root, 1)
    with caplog.at_level("WARNING"):
        assert cli.main([*base, f"--load={other / 'rollout_000005'}"]) == 0
    assert f"run.load={other / 'rollout_000005'} is not used: {root} already holds checkpoints" in caplog.text
    assert seen[-1] == "rollout_000001"


def recover_newest(out: Path) -> str:
    from reinforge.recover import recover_candidates

    return recover_candidates(out)[0].name


# ----------------------------------------------------------------------------- the directory in use


def test_directory_in_use_names_the_supervisor_to_stop(tmp_path, monkeypatch):
    """Before: `kill -TERM <pid>` of the trainer, which the supervisor then relaunched."""
    from reinforge.utils.fs import DirectoryLocked, lock_directory

    monkeypatch.setenv("REINFORGE_SUPERVISOR_PID", "4242")  # as in a supervised trainer
    with lock_directory(tmp_path):
        monkeypatch.delenv("REINFORGE_SUPERVISOR_PID")
        with pytest.raises(DirectoryLocked) as e:
            with lock_directory(tmp_path):
                pass
    msg = str(e.value)
    assert f"(pid {os.getpid()}, supervisor pid 4242: " in msg
    assert "stop its supervisor with kill -TERM 4242 (the trainer, pid" in msg
    with lock_directory(tmp_path):  # unsupervised: the trainer's own pid
        with pytest.raises(DirectoryLocked, match=f"stop it with kill -TERM {os.getpid()} \\(it writes a recover"):
            with lock_directory(tmp_path):
                pass


# ----------------------------------------------------------------------------- a checkpoint folder turns read-only


def test_a_read_only_checkpoint_folder_is_named_in_one_line(tmp_path):
    """Before: a raw traceback naming `.rollout_000001.<random>/...`."""
    import errno

    from reinforge.utils.fs import NotWritableError

    root = tmp_path / "run" / "checkpoints"
    save(root, 0)

    def read_only(tmp: Path) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(tmp / "model" / "model.safetensors"))

    state = {"rollout_id": 1, "weight_version": 2, "data": {}, "config": {}}
    with pytest.raises(NotWritableError) as e:
        ckpt.save_checkpoint(root, 1, read_only, state)
    msg = e.value.strerror
    assert msg.startswith(f"checkpoint rollout_000001 could not be written: its folder {root} is not writable")
    assert "(Read-only file system)" in msg and f"the newest checkpoint is {root / 'rollout_000000'}" in msg
    assert ".rollout_000001." not in msg and e.value.errno == errno.EROFS
    assert [p.name for p in ckpt.list_checkpoints(root)] == ["rollout_000000"]  # nothing else changed
    with pytest.raises(RuntimeError, match="a bug"):  # a writable folder: the error as it is
        ckpt.save_checkpoint(root, 1, lambda t: (_ for _ in ()).throw(RuntimeError("a bug")), state)


def test_errors_compared_without_random_temporary_names():
    from reinforge.supervisor import normalise_error

    a = "OSError: [Errno 30] Read-only file system: '/r/checkpoints/.rollout_000001.1r9nj8bd/model/model.safetensors'"
    b = "OSError: [Errno 30] Read-only file system: '/r/checkpoints/.rollout_000001.x_7qa02k/model/model.safetensors'"
    assert a != b and normalise_error(a) == normalise_error(b)
    assert normalise_error("RuntimeError: in /tmp/tmpab12cd34/x (pid 123)") == "RuntimeError: in /tmp/tmp*/x (pid N)"
    assert normalise_error("ValueError: rollout_000001 bad") != normalise_error("ValueError: rollout_000002 bad")


CHILD = """
import os, sys, tempfile
from pathlib import Path
n = len(list(Path(sys.argv[1]).glob("attempt*")))
Path(sys.argv[1], f"attempt{n}").touch()
tmp = tempfile.mkdtemp(prefix=".rollout_000001.", dir=sys.argv[1])
Path(os.environ["REINFORGE_FAILURE_FILE"]).write_text(f"OSError: [Errno 30] Read-only file system: '{tmp}/rng.pt'")
sys.exit(1)
"""


def test_the_supervisor_stops_when_only_a_temporary_name_differs(tmp_path):
    """Before: rollout 1 was trained 3 times (each attempt's error named another temporary folder)."""
    from reinforge.supervisor import supervise

    status = supervise([], tmp_path, max_restarts=5, command=[sys.executable, "-c", CHILD, str(tmp_path)])
    rows = [json.loads(x) for x in (tmp_path / "restarts.jsonl").read_text().splitlines()]
    assert status == 1 and len(rows) == 2 and rows[0]["error"] != rows[1]["error"]


# ----------------------------------------------------------------------------- start-up: device, output directory


def test_a_device_this_machine_lacks_is_refused_in_words(monkeypatch):
    """Before: `train.device=tpu`, `cuda` or `cuda:7` on a CPU machine ended in a raw traceback (exit 1)."""
    from reinforge.utils.device import device_problems

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert device_problems("auto") == device_problems("cpu") == []
    assert device_problems("tpu") == [
        "train.device='tpu' is not a device type torch knows; use auto, cpu, cuda or cuda:N (this machine: cpu only "
        "(no CUDA GPU is visible))"
    ]
    for name in ("cuda", "cuda:7"):
        assert device_problems(name)[0].startswith(f"train.device='{name}': this machine has cpu only")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_problems("cuda") == device_problems("cuda:1") == []
    assert "2 CUDA GPU(s) (cuda:0..cuda:1)" in device_problems("cuda:7")[0]


def test_cli_refuses_an_absent_device_before_building_anything(tmp_path, monkeypatch, capsys):
    from reinforge import cli

    monkeypatch.setattr("reinforge.loop.RLLoop", lambda cfg: pytest.fail("got to the loop"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("tpu", "cuda:7"):
        assert cli.main(["train", f"run.output_dir={tmp_path / 'run'}", f"train.device={device}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"reinforge train: error: this run cannot start: train.device='{device}'")
        assert err.count("\n") == 1


@pytest.mark.skipif(not __import__("shutil").which("bwrap"), reason="needs bubblewrap for a read-only mount")
def test_a_read_only_output_directory_is_refused_at_start(tmp_path):
    """Before: a raw `OSError: [Errno 30] Read-only file system` traceback after 42 s."""
    import subprocess

    ro = tmp_path / "ro"
    ro.mkdir()
    code = (
        "from reinforge.run_dir import output_dir_problems as p; "
        f"print(p({str(ro / 'run')!r})[0]); print(len(p({str(tmp_path / 'rw')!r})))"
    )
    bwrap = ["bwrap", "--bind", "/", "/", "--ro-bind", str(ro), str(ro), "--dev", "/dev", "--proc", "/proc"]
    out = subprocess.run(
        [*bwrap, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == 2, out.stderr[-2000:]
    assert lines[0].startswith(f"run.output_dir={ro / 'run'} is not writable (Read-only file system: {ro})")
    assert lines[1] == "0"


# ----------------------------------------------------------------------------- a reward function that leaks memory


def test_a_leaking_reward_worker_is_replaced_past_the_memory_limit(caplog):
    """Before: a worker grew without limit, with no warning. `tests.reward_fns:leaks` keeps 40 MiB per call."""
    from reinforge.config import RewardConfig
    from reinforge.records import Sample
    from reinforge.reward import RewardManager

    cfg = RewardConfig(type="custom", function_path="tests.reward_fns:leaks", worker_max_memory_mb=100)
    m = RewardManager(cfg)
    try:
        s = Sample(prompt="p", tokens=[1, 2], response_length=1, response="x", label="1")
        with caplog.at_level("WARNING"):
            held = []
            for _ in range(4):
                m.score([s])
                held.append(s.reward)
        assert held == [1.0, 2.0, 3.0, 1.0]  # the fourth call ran in a new worker
        assert m.pool.recycled == 1
        assert "past reward.worker_max_memory_mb=100: replaced by a new worker (1 so far)" in caplog.text
    finally:
        m.close()
    assert RewardConfig().worker_max_memory_mb == 4096  # the default bounds a leak; 0 turns it off


# ----------------------------------------------------------------------------- the last line


def test_a_stale_latest_is_not_reported_as_no_checkpoint_written(tmp_path):
    """Before: `checkpoints/latest` naming a missing checkpoint made the summary say "no checkpoint was
    written (run.save_final=false ...)"."""
    from reinforge.eval.summary import next_steps

    root = tmp_path / "checkpoints"
    save(root, 0)
    c = save(root, 1)
    __import__("shutil").rmtree(c)  # latest names rollout_000001, which is gone
    assert ckpt.latest_checkpoint(tmp_path) is None
    line = next_steps(tmp_path, "train", None, "train.num_rollout")
    assert f"--model={root / 'rollout_000000' / 'model'}" in line  # the newest one there is
    __import__("shutil").rmtree(root / "rollout_000000")
    line = next_steps(tmp_path, "train", None, "train.num_rollout")
    assert line == (
        f"no checkpoint to resume or export: {root / 'latest'} names rollout_000001, which does not exist (deleted "
        f"or moved), and {root} holds no other"
    )
    assert "save_final" in next_steps(tmp_path / "fresh", "train", None, "train.num_rollout")
