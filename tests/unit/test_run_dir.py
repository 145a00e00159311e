"""A new run refuses an earlier run's directory unless it resumes it or overwrites it."""

import pytest

from reinforge.cli import main
from reinforge.config import ConfigError, load_config
from reinforge.run_dir import check_output_dir


def run_cfg(out, *extra):
    return load_config(None, [f"run.output_dir={out}", *extra]).run


def test_fresh_and_resumed_directories_are_accepted(tmp_path):
    out = tmp_path / "run"
    check_output_dir(run_cfg(out))  # does not exist
    out.mkdir()
    (out / "config.yaml").write_text("run: {}\n")  # a run that stopped before its first metric
    check_output_dir(run_cfg(out))
    (out / "metrics.jsonl").write_text("{}\n")
    (out / "checkpoints" / "rollout_000001").mkdir(parents=True)
    for resume in (
        ["run.recover=auto"],
        [f"run.load={out}"],
        [f"run.load={out / 'checkpoints' / 'rollout_000001'}"],
        ["run.max_restarts=2"],
    ):
        check_output_dir(run_cfg(out, *resume))
    assert (out / "metrics.jsonl").exists()


def test_existing_run_is_refused_with_the_ways_out(tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    with pytest.raises(
        ConfigError,
        match=r"already holds a run \(checkpoints\).*run.recover=auto.*--load.*"
        r"run.overwrite=true",
    ):
        check_output_dir(run_cfg(out))
    other = tmp_path / "other" / "checkpoints"
    other.mkdir(parents=True)
    with pytest.raises(ConfigError, match="already holds a run"):  # loading another run's checkpoint is not resuming
        check_output_dir(run_cfg(out, f"run.load={other}"))


def test_overwrite_deletes_the_old_run(tmp_path, monkeypatch):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "metrics.jsonl").write_text("{}\n")
    check_output_dir(run_cfg(out, "run.overwrite=true"), rank=1)  # only rank 0 deletes
    assert out.exists()
    check_output_dir(run_cfg(out, "run.overwrite=true"))
    assert [p.name for p in out.iterdir()] == [".reinforge.lock"]  # emptied under its lock
    with pytest.raises(ConfigError, match="would delete"):
        check_output_dir(run_cfg(out, "run.overwrite=true", "run.recover=auto"))
    (out / "checkpoints").mkdir(parents=True)
    monkeypatch.chdir(out)
    with pytest.raises(ConfigError, match="working directory"):
        check_output_dir(run_cfg(out, "run.overwrite=true"))


@pytest.mark.parametrize("command", ["train", "offline"])
def test_cli_refuses_before_building_anything(tmp_path, capsys, command):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    assert main([command, f"run.output_dir={out}", "model.path=/nonexistent"]) == 2
    err = capsys.readouterr()
    assert "already holds a run" in err.out + err.err
