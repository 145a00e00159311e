"""State a user can trust, without a model (issue 38): the written config.yaml, keep-last-n and
the optimizer state of older checkpoints, a missing manifest, every checkpoint damaged, leftovers
of interrupted saves, a full disk (checkpoint, model.safetensors, metrics.jsonl, the CLI and the
supervisor), repeated failures, signals during a save, the next: line, two overwrites at once,
the resumed eval labels, and the data digest."""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from reinforge import checkpoint as ckpt
from reinforge.config import load_config
from tests.integration.test_fault_checks import fake_write, save

REPO = Path(__file__).resolve().parents[2]


def names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


# ----------------------------------------------------------------------------- item 1: config.yaml


def test_written_config_describes_the_run_not_the_act_of_resuming_it(tmp_path):
    from reinforge.config import dump_config

    cfg = load_config(
        None, [f"run.output_dir={tmp_path}", f"run.load={tmp_path / 'old'}", "run.overwrite=true", "train.lr=1e-5"]
    )
    dump_config(cfg, tmp_path / "config.yaml")
    run = yaml.safe_load((tmp_path / "config.yaml").read_text())["run"]
    assert run["load"] is None and run["overwrite"] is False  # eval -c / a new run never continue the checkpoint
    again = load_config(tmp_path / "config.yaml")
    assert again.train.lr == 1e-5 and again.run.load is None


# ----------------------------------------------------------------------------- manifest


def test_a_missing_or_emptied_manifest_is_damage(tmp_path):
    c = save(tmp_path, 0)
    (c / ckpt.MANIFEST).unlink()
    assert ckpt.checkpoint_problem(c).startswith("manifest.json is missing")
    with pytest.raises(ckpt.CheckpointError, match=r"rollout_000000 is damaged \(manifest.json is missing"):
        ckpt.load_candidates(c)  # --load of it: refused in words, before any shard is read
    (c / ckpt.MANIFEST).write_text("")
    assert ckpt.checkpoint_problem(c).startswith("manifest.json is unreadable")
    (c / ckpt.MANIFEST).write_text(json.dumps({"version": 1, "files": {}}))
    assert ckpt.checkpoint_problem(c).endswith(
        "is not listed in manifest.json (the manifest was emptied or is of another checkpoint)"
    )
    ckpt.write_manifest(c)
    assert ckpt.checkpoint_problem(c) is None


def test_a_dcp_load_error_is_named_by_its_own_cause():
    from torch.distributed.checkpoint.api import CheckpointException

    e = CheckpointException("plan", {0: (RuntimeError("PytorchStreamReader failed\nmore"), [])})
    assert ckpt.describe_load_error(e) == "RuntimeError: PytorchStreamReader failed"


# ----------------------------------------------------------------------------- keep-last-n, optimizer state


def test_keep_last_n_keeps_the_new_checkpoint_and_the_newest_intact_ones(tmp_path):
    root = tmp_path / "checkpoints"
    for i in (0, 1, 2, 5, 6):
        save(root, i)
    for i in (2, 5, 6):  # damaged: a shard of another size (the run resumed from rollout 1)
        (root / f"rollout_00000{i}" / "dcp" / "actor" / "__0_0.distcp").write_bytes(b"short")
    new = ckpt.save_checkpoint(
        root, 2, fake_write, {"rollout_id": 2, "weight_version": 3, "data": {}, "config": {}}, keep_last=2
    )
    # before: sorted by name, the damaged rollout 5 and 6 were kept and the new one deleted at once
    assert names(root) == ["latest", "rollout_000001", "rollout_000002"]
    assert (root / "latest").read_text().strip() == new.name and ckpt.checkpoint_problem(new) is None
    ckpt.save_checkpoint(
        root, 3, fake_write, {"rollout_id": 3, "weight_version": 4, "data": {}, "config": {}}, keep_last=2
    )
    assert names(root) == ["latest", "rollout_000002", "rollout_000003"]


def optim_write(tmp: Path) -> None:
    fake_write(tmp)
    (tmp / "dcp" / "actor_optim").mkdir()
    (tmp / "dcp" / "actor_optim" / ".metadata").write_bytes(b"meta")
    (tmp / "dcp" / "actor_optim" / "__0_0.distcp").write_bytes(os.urandom(8192))


def test_the_optimizer_state_is_kept_in_the_newest_checkpoint_only(tmp_path):
    root = tmp_path / "checkpoints"
    state = {"rollout_id": 0, "weight_version": 1, "data": {}, "config": {}}
    first = ckpt.save_checkpoint(root, 0, optim_write, state, drop_older_optimizer=True)
    assert ckpt.has_optimizer_state(first) and "optimizer state" in ckpt.size_summary(first)
    second = ckpt.save_checkpoint(root, 1, optim_write, state, drop_older_optimizer=True)
    assert not ckpt.has_optimizer_state(first) and ckpt.has_optimizer_state(second)
    assert ckpt.checkpoint_problem(first) is None  # the manifest was rewritten first
    assert "optimizer state" not in ckpt.size_summary(first)
    third = ckpt.save_checkpoint(root, 2, optim_write, state)  # run.save_optimizer=all
    assert ckpt.has_optimizer_state(second) and ckpt.has_optimizer_state(third)


# ----------------------------------------------------------------------------- recover=auto, --load RUN


def test_recover_auto_with_every_checkpoint_damaged_refuses_and_changes_nothing(tmp_path):
    from reinforge.recover import recover_candidates

    out = tmp_path / "run"
    for i in range(2):
        c = save(out / "checkpoints", i)
        (c / "dcp" / "actor" / "__0_0.distcp").write_bytes(b"")
    (out / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    with pytest.raises(ckpt.CheckpointError, match="every checkpoint in .* is damaged .*nothing was changed"):
        recover_candidates(out)
    assert (out / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'
    assert names(out / "checkpoints") == ["latest", "rollout_000000", "rollout_000001"]
    assert recover_candidates(tmp_path / "fresh") == []  # no checkpoint ever written: start from scratch


HOLD_LOCK = """
import sys, time
from reinforge.utils.fs import lock_directory
with lock_directory(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(60)
"""


def hold_lock(directory: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(directory)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_load_of_a_run_directory_removes_interrupted_saves_unless_a_live_run_holds_it(tmp_path):
    out = tmp_path / "run"
    save(out / "checkpoints", 0)
    leftover = out / "checkpoints" / ".rollout_000001.abc123"
    (leftover / "dcp").mkdir(parents=True)
    holder = hold_lock(out)
    try:
        ckpt.load_candidates(out)
        assert leftover.exists()  # another process is saving into it right now
    finally:
        holder.kill()
        holder.wait()
    warnings: list[str] = []
    assert [p.name for p in ckpt.load_candidates(out, warn=warnings.append)] == ["rollout_000000"]
    assert not leftover.exists() and "removed 1 interrupted checkpoint save(s)" in warnings[0]
    # `reinforge train --load RUN` into RUN itself: this process holds the lock, and still cleans up
    from reinforge.utils.fs import lock_directory

    (leftover / "dcp").mkdir(parents=True)
    with lock_directory(out):
        ckpt.load_candidates(out)
    assert not leftover.exists()


def test_convert_of_a_damaged_newest_checkpoint_falls_back_or_is_refused_in_words(tmp_path, capsys):
    from reinforge.cli import main

    out = tmp_path / "run"
    for i in range(2):
        save(out / "checkpoints", i)
    (out / "checkpoints" / "rollout_000001" / "rng.pt").write_bytes(b"x")
    assert ckpt.newest_intact(out).name == "rollout_000000"
    (out / "checkpoints" / "rollout_000000" / "rng.pt").write_bytes(b"x")
    assert main(["convert", "--checkpoint", str(out), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "reinforge convert: error: --checkpoint=" in err and "every checkpoint in" in err and "Traceback" not in err


# ----------------------------------------------------------------------------- disk full


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 2 MiB tmpfs (needs root / CAP_SYS_ADMIN; skipped elsewhere)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_during_the_model_safetensors_write_is_a_disk_full_error(tiny_disk):
    from huggingface_hub import save_torch_state_dict

    def write(tmp):  # the model/ folder as save_hf_state_dict writes it: safetensors removes its partial file
        (tmp / "model").mkdir()
        save_torch_state_dict({"w": torch.ones(1 << 20)}, str(tmp / "model"))

    with pytest.raises(ckpt.DiskFullError, match="disk full .*checkpoint rollout_000000 was not written"):
        ckpt.save_checkpoint(tiny_disk / "checkpoints", 0, write, {})
    assert names(tiny_disk / "checkpoints") == []


def test_a_full_disk_while_appending_metrics_is_one_message_and_keeps_whole_rows(tiny_disk):
    from reinforge.utils.logging import MetricsLogger

    logger = MetricsLogger(tiny_disk, tensorboard=False)
    logger.log(0, {"x": 1.0})
    (tiny_disk / "filler").write_bytes(b"\0" * ((2 << 20) - 8192))
    with pytest.raises(ckpt.DiskFullError, match=r"disk full: the metrics of step \d+ could not be appended"):
        for step in range(1, 10_000):
            logger.log(step, {"x": float(step), "pad": "y" * 200})
    logger.close()
    rows = [json.loads(x) for x in (tiny_disk / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(len(rows)))


def test_the_cli_reports_a_full_disk_in_one_line_with_its_own_exit_status(tmp_path, monkeypatch, capsys):
    from reinforge import cli
    from reinforge.supervisor import DISK_FULL

    def full(args):
        raise ckpt.DiskFullError(
            errno.ENOSPC, "disk full (1.0 MiB free ...): checkpoint rollout_000003 was not written"
        )

    monkeypatch.setattr(cli, "_train", full)
    monkeypatch.setenv("REINFORGE_FAILURE_FILE", str(tmp_path / "failure"))
    assert cli.main(["train", f"run.output_dir={tmp_path}"]) == DISK_FULL
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("reinforge train: error: disk full (1.0 MiB free")
    assert (tmp_path / "failure").read_text().startswith("DiskFullError: ")


# ----------------------------------------------------------------------------- supervisor

CHILD = """
import os, sys
from pathlib import Path
n = len(list(Path(sys.argv[1]).glob("attempt*")))
Path(sys.argv[1], f"attempt{n}").touch()
mode = sys.argv[2]
if mode == "disk":
    sys.exit(74)
if mode == "same" or n == 0:
    Path(os.environ["REINFORGE_FAILURE_FILE"]).write_text("SyntaxError: invalid syntax (my_reward.py, line 3)")
    sys.exit(1)
sys.exit(0)
"""


@pytest.mark.parametrize("mode,attempts,code", [("same", 2, 1), ("disk", 1, 74), ("once", 2, 0)])
def test_the_supervisor_stops_on_the_same_error_twice_and_on_a_full_disk(tmp_path, mode, attempts, code):
    from reinforge.supervisor import supervise

    status = supervise([], tmp_path, max_restarts=5, command=[sys.executable, "-c", CHILD, str(tmp_path), mode])
    assert status == code
    rows = [json.loads(x) for x in (tmp_path / "restarts.jsonl").read_text().splitlines()]
    assert len(rows) == attempts == len(list(tmp_path.glob("attempt*")))
    if mode != "disk":
        assert rows[0]["error"] == "SyntaxError: invalid syntax (my_reward.py, line 3)"


def test_a_reward_module_with_a_syntax_error_is_refused_before_anything_is_built(tmp_path, monkeypatch, capsys):
    """Before: the error came after 20-38 s of model building, at each --max-restarts attempt. The
    file is compiled, not run (a module that exits at import cannot end the CLI)."""
    from reinforge import cli, supervisor

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_reward.py").write_text("def score(sample):\n    return 1.0 +\n")
    (tmp_path / "exits_at_import.py").write_text("import os\nos._exit(7)\ndef score(sample):\n    return 1.0\n")
    monkeypatch.setattr(supervisor, "supervise", lambda *a, **k: pytest.fail("supervised despite the error"))
    monkeypatch.setattr(cli, "_preflight_rl", lambda cfg: pytest.fail("got to the model"))
    args = ["train", f"run.output_dir={tmp_path / 'run'}", "reward.type=custom", "--max-restarts=2"]
    assert cli.main([*args, "reward.function_path=my_reward:score"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"reward.function_path='my_reward:score': {tmp_path / 'my_reward.py'}:2: SyntaxError: invalid syntax" in err
    from reinforge.utils.imports import check_function_source

    check_function_source("exits_at_import:score", "reward.function_path")  # compiled only: still alive
    check_function_source("no_such_module:score", "reward.function_path")  # left to the import's own message


# ----------------------------------------------------------------------------- signals during a save


def test_ctrl_c_during_a_save_waits_for_it_then_stops():
    from reinforge.recover import RecoverTimer

    timer = RecoverTimer(None)
    timer.install()
    try:
        assert not timer.due()  # recover=off: no timer, only signals
        with timer.saving():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGINT)  # a second one: still no KeyboardInterrupt inside the save
            time.sleep(0.05)
        assert timer.signal == "SIGINT" and timer.due()
    finally:
        timer.uninstall()


def test_a_ctrl_c_outside_a_rollout_boundary_exits_130_in_one_line(tmp_path, monkeypatch, capsys):
    from reinforge import cli

    def interrupted(args):
        raise KeyboardInterrupt("second SIGINT: stopping without a checkpoint")

    monkeypatch.setattr(cli, "_train", interrupted)
    assert cli.main(["train", f"run.output_dir={tmp_path}"]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted (second SIGINT" in err


# ----------------------------------------------------------------------------- next:, overwrite


def test_next_commands_parse_when_the_output_dir_starts_with_a_dash(tmp_path, monkeypatch):
    from reinforge.cli import build_parser, eval_config, train_config
    from reinforge.eval.summary import next_steps

    monkeypatch.chdir(tmp_path)
    run = Path("-run 1")
    line = next_steps(run, "train", run / "checkpoints" / "rollout_000003", "train.num_rollout")
    commands = dict(part.split(": ", 1) for part in line.removeprefix("next: ").split("  |  "))
    parsed = {k: build_parser().parse_args(shlex.split(v.replace("<more>", "5"))[1:]) for k, v in commands.items()}
    assert parsed["resume"].config == "-run 1/config.yaml" and parsed["resume"].load == "-run 1"
    assert parsed["evaluate"].model == "-run 1/checkpoints/rollout_000003/model"
    assert (parsed["export"].checkpoint, parsed["export"].out) == ("-run 1", "-run 1/hf")
    run.mkdir()
    from reinforge.config import dump_config

    dump_config(load_config(None, [f"run.output_dir={run}"]), run / "config.yaml")
    assert train_config(parsed["resume"])[0].run.load == "-run 1"
    assert eval_config(parsed["evaluate"]).model.path == "-run 1/checkpoints/rollout_000003/model"


def test_two_overwrites_at_once_the_second_is_refused_by_the_lock(tmp_path, monkeypatch):
    from reinforge import run_dir
    from reinforge.utils.fs import DirectoryLocked

    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "metrics.jsonl").write_text("{}\n")
    cfg = load_config(None, [f"run.output_dir={out}", "run.overwrite=true"])
    monkeypatch.setattr(run_dir, "check_not_locked", lambda d: None)  # the other run took the lock after the check
    holder = hold_lock(out)
    try:
        with pytest.raises(DirectoryLocked, match="in use by another reinforge process"):
            run_dir.check_output_dir(cfg.run)
        assert (out / "metrics.jsonl").exists()  # (before: both deleted; one ended in [Errno 2] .reinforge.lock)
    finally:
        holder.kill()
        holder.wait()


# ----------------------------------------------------------------------------- resume: labels, data digest


def test_resumed_eval_rows_say_which_run_they_are_from():
    assert ckpt.resumed_label("after", 4, "rollout") == "after rollout 4 (earlier run)"
    assert ckpt.resumed_label("before", 4, "rollout") == "before"
    assert ckpt.resumed_label("rollout_2", 4, "rollout") == "rollout_2"


def test_the_prompts_digest_sees_a_changed_row_with_the_same_count():
    from reinforge.data.dataset import Prompt
    from reinforge.loop import prompts_digest

    a = [Prompt("1+1", "t", [1], "2"), Prompt("2+2", "t", [2], "4")]
    b = [Prompt("1+1", "t", [1], "2"), Prompt("2+3", "t", [2], "5")]
    assert prompts_digest(a) == prompts_digest(list(a)) != prompts_digest(b)


def test_a_changed_lr_is_named_on_resume():
    from reinforge.recover import changed_settings

    saved = json.loads(json.dumps(load_config(None, []).to_dict()))
    now = load_config(None, ["train.lr=1e-5", "train.num_rollout=50", "run.output_dir=x"])
    assert changed_settings(saved, now) == ["train.lr 1e-06 -> 1e-05"]


# ----------------------------------------------------------------------------- metrics.jsonl cut mid-file


def write_rows(path: Path, steps, cut: int = 0) -> None:
    text = "".join(json.dumps({"step": s, "rollout/reward_mean": s / 10}) + "\n" for s in steps)
    path.write_text(text[: len(text) - cut] if cut else text)


def test_a_metrics_file_cut_mid_row_is_named_in_words_on_resume(tmp_path, caplog):
    """A resume after metrics.jsonl was cut short: the cut row is reported by file and line (before:
    counted among the 'rows logged by an earlier attempt; redone now'), the steps whose rows the cut
    removed are named, and the resumed rows follow whole rows."""
    import logging

    from reinforge.utils.logging import MetricsLogger

    path = tmp_path / "metrics.jsonl"
    write_rows(path, range(7), cut=20)  # steps 0-5 whole, step 6's row cut mid-way
    with caplog.at_level(logging.INFO):
        logger = MetricsLogger(tmp_path, tensorboard=False, start_step=5)  # resumed: steps 5, 6 redone
    assert f"{path}:7: its last line is not a whole JSON row (cut short" in caplog.text
    assert "dropped 1 row(s)" in caplog.text and "holds no rows" not in caplog.text
    logger.log(5, {"rollout/reward_mean": 0.0})
    logger.close()
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [0, 1, 2, 3, 4, 5]
    caplog.clear()
    write_rows(path, range(4), cut=50)  # the cut took step 3's row (41 bytes) and the end of step 2's
    with caplog.at_level(logging.INFO):
        MetricsLogger(tmp_path, tensorboard=False, start_step=6).close()
    assert f"{path}:3: its last line is not a whole JSON row" in caplog.text
    assert f"{path} holds no rows for step(s) 2-5, which ran before the checkpoint" in caplog.text
    assert "dropped 0 row(s)" not in caplog.text


def test_appending_after_a_row_cut_short_starts_a_new_line(tmp_path, caplog):
    """A logger that appends (no start_step) after a cut row: the row is dropped with a warning, not
    glued to the next one (before: '{"step": 2, "rollo{"step": 3, ...}', unreadable)."""
    from reinforge.utils.logging import MetricsLogger, read_metrics

    path = tmp_path / "metrics.jsonl"
    write_rows(path, range(3), cut=10)
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(3, {"rollout/reward_mean": 0.3})
    logger.close()
    assert f"{path}:3: its last line is not a whole JSON row" in caplog.text
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 3]
    path.write_text(path.read_text()[:-1])  # a whole row without its newline is kept
    MetricsLogger(tmp_path, tensorboard=False).close()
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 3] and path.read_text().endswith("}\n")


def test_plotting_a_run_whose_metrics_were_cut_names_the_line_and_plots_the_rest(tmp_path, caplog):
    pytest.importorskip("matplotlib")
    from reinforge.eval.summary import plot_run

    path = tmp_path / "metrics.jsonl"
    write_rows(path, range(5), cut=12)
    with path.open("a") as f:  # a torn row inside the file (before: 'could not plot the run: Expecting ...')
        f.write("\n" + json.dumps({"step": 5, "rollout/reward_mean": 0.5}) + "\n")
    assert plot_run(tmp_path) == tmp_path / "curves.png"
    assert f"{path}:5: line 5, not the last, is not a whole JSON row" in caplog.text
