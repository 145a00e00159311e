"""Fault injection: crashes at named points (REINFORGE_FAULT, reinforge/utils/faults.py), bad reward
functions, NaN losses, damaged checkpoints, preemption, resource shortfalls.

Each test asserts what was lost (at most the rollout in flight) and that the run ends with every
rollout trained. With ``REINFORGE_FAULT_REPORT=<file>`` each scenario appends a JSON line with
its measurements (``bench/faults.py`` turns them into the table of docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from reinforge.config import ConfigError, load_config
from reinforge.utils import faults
from tests.integration.test_integration import read_metrics, tiny_overrides

REPO = Path(__file__).resolve().parents[2]
ROLLOUTS = 4
SAMPLES_PER_ROLLOUT = 2 * 4  # tiny_overrides: rollout_batch_size * n_samples_per_prompt


def report(**row) -> None:
    path = os.environ.get("REINFORGE_FAULT_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def overrides(model, out, **extra):
    base = {
        "eval.eval_before_train": "false",
        "data.n_eval_prompts": 0,
        "train.num_rollout": ROLLOUTS,
        "run.save_interval": 1,
        "run.tensorboard": "false",
        "reward.type": "custom",
        "reward.function_path": "tests.reward_fns:even_first_token",
        "rollout.rollout_top_k": 8,
    }
    base.update(extra)
    return tiny_overrides(model, out, **base)


def cli_train(tmp_path: Path, args: list[str], fault: str | None = None, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop(faults.ENV, None)
    if fault:
        env[faults.ENV] = fault
        env[faults.STATE_ENV] = str(tmp_path / "fault-state")  # fire once, not again after the restart
    return subprocess.Popen(
        [sys.executable, "-m", "reinforge", "train", *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def train_rows(out: Path) -> list[dict]:
    return [r for r in read_metrics(out) if "train/loss" in r]


# ----------------------------------------------------------------------------- crashes + restarts

CRASHES = [  # (fault spec, where, rollout steps done before the crash (the weight sync is part of a step),
    # whether the crash is inside a rollout step)
    ("ckpt_write:2", "SIGKILL during a checkpoint write: rollout 1's (model written, rng/state not)", 2, False),
    ("optimizer_step:3", "SIGKILL during an optimizer step: rollout 2's", 2, True),
    ("weight_sync:3", "SIGKILL during weight sync: after rollout 1 (engine half updated)", 1, True),
]


@pytest.mark.parametrize("fault,where,trained,mid_rollout", CRASHES, ids=[c[0] for c in CRASHES])
def test_crash_is_restarted_and_loses_at_most_one_rollout(
    tmp_path, tiny_model_path, fault, where, trained, mid_rollout
):
    out = tmp_path / "run"
    proc = cli_train(tmp_path, ["--max-restarts", "2", *overrides(tiny_model_path, out)], fault=fault)
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log[-3000:]
    assert (tmp_path / "fault-state" / f"{fault.split(':')[0]}.fired").exists()  # the fault did fire
    attempts = [json.loads(x) for x in (out / "restarts.jsonl").read_text().splitlines()]
    assert [a["cause"] for a in attempts] == ["killed by SIGKILL", "exit status 0"]
    crash_t = attempts[0]["time"]
    rows = train_rows(out)
    before = [int(r["rollout_id"]) for r in rows if r["time"] < crash_t]
    after = [int(r["rollout_id"]) for r in rows if r["time"] >= crash_t]
    # the run ends with every rollout trained, in order after the resume
    assert sorted(set(before + after)) == list(range(ROLLOUTS))
    assert after == list(range(after[0], ROLLOUTS))
    # the work thrown away: rollouts trained before the crash that ran again, and the one in flight (the resumed
    # run drops the metrics rows of the rollouts it redoes, so ``before`` may not show the last trained one)
    assert max(before) < trained
    lost = (trained - after[0]) + int(mid_rollout)
    assert lost <= 1, (before, after)
    # nothing partial is left behind, and the newest checkpoint is complete
    ck = out / "checkpoints"
    assert not [p for p in ck.iterdir() if p.name.startswith(".")]
    assert (ck / (ck / "latest").read_text().strip() / "state.json").is_file()
    first_after = min(r["time"] for r in rows if r["time"] >= crash_t)
    report(
        fault=where.split(":")[0],
        injected=f"REINFORGE_FAULT={fault} + --max-restarts 2",
        what=where.split(": ")[1],
        happened="supervisor relaunched (--max-restarts), run.recover=auto resumed from the newest complete checkpoint",
        rollouts_lost=lost,
        samples_lost=lost * SAMPLES_PER_ROLLOUT,
        recover_s=round(first_after - crash_t, 1),
        rollouts_done=len(set(before + after)),
    )


def start_until_first_rollout(tmp_path, args, out, **popen):
    """``reinforge train`` started in the background, returned once its first rollout is logged (the
    whole process group is killed, and the test fails, if none is within 300 s)."""
    proc = cli_train(tmp_path, args, **popen)
    deadline = time.monotonic() + 300
    while not ((out / "metrics.jsonl").exists() and train_rows(out)):
        if proc.poll() is not None or time.monotonic() > deadline:
            if popen.get("start_new_session"):
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            pytest.fail(f"no rollout finished: {proc.communicate()[0][-3000:]}")
        time.sleep(0.2)
    return proc


def stop_with(proc, sig) -> tuple[str, float]:
    """Send ``sig`` to a running ``reinforge train``; its log and the seconds it took to exit."""
    t = time.time()
    proc.send_signal(sig)
    log, _ = proc.communicate(timeout=300)
    return log, time.time() - t


def latest_pointed(out: Path) -> Path:
    """The checkpoint the run directory's ``checkpoints/latest`` pointer names."""
    return out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()


def test_sigterm_writes_a_recover_checkpoint_and_resume_loses_nothing(tmp_path, tiny_model_path):
    out = tmp_path / "run"
    args = overrides(
        tiny_model_path,
        out,
        **{"train.num_rollout": 8, "run.save_interval": "null", "run.recover": "auto", "run.recover_interval_s": 3600},
    )
    proc = start_until_first_rollout(tmp_path, args, out)
    log, stopped = stop_with(proc, signal.SIGTERM)
    assert proc.returncode == 143, log[-3000:]
    before = [int(r["rollout_id"]) for r in train_rows(out)]
    saved = json.loads((latest_pointed(out) / "state.json").read_text())["rollout_id"]
    assert saved == before[-1]  # the checkpoint holds the last rollout finished: nothing lost
    proc = cli_train(tmp_path, args)
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log[-3000:]
    ids = [int(r["rollout_id"]) for r in train_rows(out)]
    assert ids == list(range(8))  # each rollout exactly once
    report(
        fault="SIGTERM (preemption)",
        injected="kill -TERM <pid> after the first rollout",
        what="SIGTERM mid-run, run.recover=auto",
        happened=f"recover checkpoint at the end of the rollout in flight, exit 143 after {stopped:.1f} s; "
        f"a rerun resumed",
        rollouts_lost=0,
        samples_lost=0,
        recover_s=None,
        rollouts_done=len(ids),
    )


# ----------------------------------------------------------------------------- checkpoints


def _finished_run(tmp_path, model, n=3, **extra):
    from reinforge.loop import run_training

    out = tmp_path / "run"
    run_training(
        load_config(
            None, overrides(model, out, **{"train.num_rollout": n, "run.keep_last_n_checkpoints": "null", **extra})
        )
    )
    return out


def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, tiny_model_path, caplog):
    from reinforge.loop import run_training

    out = _finished_run(tmp_path, tiny_model_path)
    ck = out / "checkpoints"
    assert (ck / "latest").read_text().strip() == "rollout_000002"
    (ck / "rollout_000002" / "rng.pt").write_bytes(b"truncated")  # unreadable file
    # the weights (model/'s safetensors: full-parameter checkpoints store them there only)
    shard = next((ck / "rollout_000001" / "model").glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = os.urandom(64)  # random bytes inside the weights: found by CRC-32
    shard.write_bytes(bytes(data))
    (ck / ".rollout_000003.partial").mkdir()  # leftover of a save killed mid-way
    t = time.perf_counter()
    result = run_training(
        load_config(
            None,
            overrides(
                tiny_model_path,
                out,
                **{"train.num_rollout": 5, "run.recover": "auto", "run.keep_last_n_checkpoints": "null"},
            ),
        )
    )
    seconds = time.perf_counter() - t
    assert "rollout_000002 is not usable (rng.pt has 9 bytes" in caplog.text
    assert f"rollout_000001 is not usable (model/{shard.name} is damaged (CRC-32" in caplog.text
    assert not (ck / ".rollout_000003.partial").exists()
    assert len(result.prompts) == 4  # resumed after rollout 0: rollouts 1..4 trained
    ids = [int(r["rollout_id"]) for r in train_rows(out)]
    assert ids == [0, 1, 2, 3, 4]  # rollouts 1, 2 redone: their first rows were dropped, each appears once
    report(
        fault="damaged newest checkpoints",
        injected="truncated rng.pt of the newest, 64 random bytes inside the "
        "model.safetensors of the one before, a leftover temporary folder",
        what="restart with run.recover=auto",
        happened="warned, skipped both, resumed from the third newest",
        rollouts_lost=2,
        samples_lost=2 * SAMPLES_PER_ROLLOUT,
        recover_s=round(seconds, 1),
        rollouts_done=5,
    )


def test_load_of_a_run_directory_skips_its_damaged_newest_checkpoint(tmp_path, tiny_model_path, caplog):
    """--load RUN_DIR (run.recover off) whose newest checkpoint is damaged: the newest intact one
    is loaded, with a warning naming the damaged file (before: a PytorchStreamReader traceback)."""
    from reinforge.loop import run_training

    out = _finished_run(tmp_path, tiny_model_path)
    (out / "checkpoints" / "rollout_000002" / "trainer_state.pt").write_bytes(b"PK\x03\x04")
    result = run_training(
        load_config(
            None, overrides(tiny_model_path, tmp_path / "b", **{"run.load": str(out), "run.save_interval": "null"})
        )
    )
    assert "rollout_000002 is not usable (trainer_state.pt has 4 bytes" in caplog.text
    assert len(result.prompts) == 2  # resumed after rollout 1: rollouts 2 and 3
    # a checkpoint of another model shape is refused before anything loads
    c = out / "checkpoints" / "rollout_000001"
    config = json.loads((c / "model" / "config.json").read_text())
    (c / "model" / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 30}))
    from reinforge.checkpoint import CheckpointError, write_manifest

    write_manifest(c)
    with pytest.raises(CheckpointError, match="num_hidden_layers=30 in the checkpoint, 2 in the model"):
        run_training(load_config(None, overrides(tiny_model_path, tmp_path / "c", **{"run.load": str(c)})))
    report(
        fault="damaged newest checkpoint, plain --load",
        injected="trainer_state.pt of the newest overwritten (4 bytes)",
        what="--load RUN_DIR (run.recover off)",
        happened="warned naming the file, resumed from the newest intact checkpoint",
        rollouts_lost=1,
        samples_lost=SAMPLES_PER_ROLLOUT,
        recover_s="-",
        rollouts_done=4,
    )


def test_resume_logs_each_rollout_once(tmp_path, tiny_model_path):
    """A run killed after writing rollout 2's metrics but before its checkpoint (simulated by
    deleting the newest checkpoints) redoes rollouts 1 and 2: metrics.jsonl has each rollout once."""
    import shutil

    from reinforge.loop import run_training

    out = _finished_run(tmp_path, tiny_model_path, n=3)
    for name in ("rollout_000002", "rollout_000001"):
        shutil.rmtree(out / "checkpoints" / name)
    run_training(
        load_config(
            None,
            overrides(
                tiny_model_path,
                out,
                **{"train.num_rollout": 4, "run.recover": "auto", "run.keep_last_n_checkpoints": "null"},
            ),
        )
    )
    assert [int(r["rollout_id"]) for r in train_rows(out)] == [0, 1, 2, 3]
    steps = [r["step"] for r in read_metrics(out)]
    assert steps == sorted(steps)
    report(
        fault="metrics of redone rollouts",
        injected="the 2 newest checkpoints deleted after rollout 2 was logged",
        what="restart with run.recover=auto",
        happened="rows from the first redone step dropped (metrics.jsonl, "
        "TensorBoard purge_step): each rollout logged once",
        rollouts_lost=2,
        samples_lost=2 * SAMPLES_PER_ROLLOUT,
        recover_s="-",
        rollouts_done=4,
    )


def test_reward_failing_on_every_sample_stops_the_run(tmp_path, tiny_model_path):
    from reinforge.loop import run_training
    from reinforge.reward.manager import RewardFunctionFailing

    out = tmp_path / "run"
    with pytest.raises(RewardFunctionFailing, match="failed on every sample of 3 consecutive batches"):
        run_training(
            load_config(
                None,
                overrides(
                    tiny_model_path,
                    out,
                    **{
                        "train.num_rollout": 5,
                        "run.save_interval": "null",
                        "reward.function_path": "tests.reward_fns:always_raises",
                    },
                ),
            )
        )
    assert [int(r["rollout_id"]) for r in train_rows(out)] == [0, 1]
    report(
        fault="reward function fails on every sample",
        injected="reward.function_path=tests.reward_fns:always_raises",
        what="raises on all samples",
        happened="run stopped at the 3rd all-failed rollout with RewardFunctionFailing (exit status 1)",
        rollouts_lost=0,
        samples_lost=0,
        recover_s="-",
        rollouts_done=2,
    )


def test_supervisor_sigkill_stops_the_trainer_and_the_lock_keeps_a_second_one_out(tmp_path, tiny_model_path):
    out = tmp_path / "run"
    args = overrides(tiny_model_path, out, **{"train.num_rollout": 50, "run.save_interval": "null"})
    sup = start_until_first_rollout(tmp_path, ["--max-restarts", "2", *args], out, start_new_session=True)
    child = int(Path(f"/proc/{sup.pid}/task/{sup.pid}/children").read_text().split()[0])
    second = cli_train(tmp_path, args)  # a rerun into the same directory
    log2, _ = second.communicate(timeout=300)
    assert second.returncode == 2 and "is in use by another reinforge process (pid" in log2, log2[-3000:]
    t = time.time()
    sup.kill()  # SIGKILL: the supervisor cannot forward anything
    log, _ = sup.communicate(timeout=300)  # the pipe closes when the trainer is gone too
    while os.path.exists(f"/proc/{child}") and "zombie" not in Path(f"/proc/{child}/status").read_text():
        assert time.time() - t < 300, "the trainer outlived its supervisor"
        time.sleep(0.2)
    stopped = time.time() - t
    assert "SIGTERM received" in log, log[-3000:]
    latest = latest_pointed(out)
    assert json.loads((latest / "state.json").read_text())["rollout_id"] == max(
        int(r["rollout_id"]) for r in train_rows(out)
    )  # the recover checkpoint holds the last rollout
    report(
        fault="SIGKILL of the supervisor",
        injected="kill -KILL <supervisor pid> after the first rollout",
        what="--max-restarts 2, trainer mid-run",
        happened=f"trainer got SIGTERM (PR_SET_PDEATHSIG), wrote a recover "
        f"checkpoint and exited after {stopped:.1f} s; a second trainer in the same run.output_dir was refused "
        f"(exit 2, lock)",
        rollouts_lost=0,
        samples_lost=0,
        recover_s="-",
        rollouts_done="-",
    )


def test_sigint_writes_a_recover_checkpoint(tmp_path, tiny_model_path):
    out = tmp_path / "run"
    args = overrides(
        tiny_model_path,
        out,
        **{"train.num_rollout": 50, "run.save_interval": "null", "run.recover": "auto", "run.recover_interval_s": 3600},
    )
    proc = start_until_first_rollout(tmp_path, args, out)
    log, stopped = stop_with(proc, signal.SIGINT)
    assert proc.returncode == 130, log[-3000:]
    latest = latest_pointed(out)
    assert json.loads((latest / "state.json").read_text())["rollout_id"] == int(train_rows(out)[-1]["rollout_id"])
    report(
        fault="SIGINT (Ctrl-C)",
        injected="kill -INT <pid> after the first rollout",
        what="SIGINT mid-run, run.recover=auto",
        happened=f"recover checkpoint at the end of the rollout in flight, exit 130 after {stopped:.1f} s",
        rollouts_lost=0,
        samples_lost=0,
        recover_s="-",
        rollouts_done="-",
    )


def test_recover_refuses_changed_batch_group_or_world_size(tmp_path, tiny_model_path):
    from reinforge.loop import RLLoop

    out = _finished_run(tmp_path, tiny_model_path, n=1)
    for key, value in (("rollout.n_samples_per_prompt", 2), ("rollout.rollout_batch_size", 4)):
        cfg = load_config(None, overrides(tiny_model_path, out, **{"run.recover": "auto", key: value}))
        with pytest.raises(ConfigError, match=f"cannot resume .*{key} changed from .* to {value}.*run.load="):
            RLLoop(cfg)
    # through the supervisor: a usage error is reported once, not relaunched
    proc = cli_train(
        tmp_path, ["--max-restarts", "3", *overrides(tiny_model_path, out, **{"rollout.rollout_batch_size": 4})]
    )
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2 and "rollout.rollout_batch_size changed from 2 to 4" in log, log[-3000:]
    attempts = [json.loads(x) for x in (out / "restarts.jsonl").read_text().splitlines()]
    assert [a["exit_code"] for a in attempts] == [2]
    from reinforge.recover import check_compatible

    saved = load_config(None, overrides(tiny_model_path, out)).to_dict()
    cfg = load_config(
        None, overrides(tiny_model_path, out, **{"cluster.mode": "ray", "cluster.actor_num_gpus_per_node": 2})
    )
    with pytest.raises(ConfigError, match="cluster.world_size changed from 1 to 2"):
        check_compatible(saved, cfg, out)


def test_resume_at_an_epoch_boundary_trains_the_remaining_rollouts(tmp_path, tiny_model_path):
    """4 prompts, 2 per rollout: rollout 1 ends the first epoch exactly."""
    from reinforge.loop import run_training

    common = {"data.num_prompts": 4, "run.save_interval": "null"}
    full = run_training(load_config(None, overrides(tiny_model_path, tmp_path / "full", **common)))
    first = run_training(
        load_config(None, overrides(tiny_model_path, tmp_path / "a", **common, **{"train.num_rollout": 2}))
    )
    state = json.loads((tmp_path / "a" / "checkpoints" / "rollout_000001" / "state.json").read_text())
    assert state["data"] == {"epoch": 0, "offset": 4, "size": 4}
    resumed = run_training(
        load_config(None, overrides(tiny_model_path, tmp_path / "a", **common, **{"run.recover": "auto"}))
    )
    assert len(resumed.prompts) == 2 and resumed.last_rollout_id == ROLLOUTS - 1
    assert first.prompts + resumed.prompts == full.prompts
    # resuming a finished run trains nothing, and says so
    again = run_training(
        load_config(None, overrides(tiny_model_path, tmp_path / "a", **common, **{"run.recover": "auto"}))
    )
    assert again.prompts == []


def test_recover_interval_writes_checkpoints_without_save_interval(tmp_path, tiny_model_path):
    from reinforge.loop import run_training

    out = tmp_path / "run"
    run_training(
        load_config(
            None,
            overrides(
                tiny_model_path,
                out,
                **{
                    "train.num_rollout": 3,
                    "run.save_interval": "null",
                    "run.save_final": "false",
                    "run.recover": "auto",
                    "run.recover_interval_s": 1e-3,
                    "run.keep_last_n_checkpoints": "null",
                },
            ),
        )
    )
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "rollout_000000", "rollout_000001"]


def test_recover_off_survives_yaml_booleans(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("run:\n  recover: off\n")  # YAML 1.1 reads `off` as false
    assert load_config(str(f), []).run.recover == "off"
    assert load_config(None, ["run.recover=off"]).run.recover == "off"
    assert load_config(None, ["run.recover=auto"]).run.recover == "auto"


def test_fault_spec_parsing_and_noop_default(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    assert faults.hit("optimizer_step") is False
    assert faults.parse("ckpt_write:2, nan_loss:1:nan") == {"ckpt_write": (2, "kill"), "nan_loss": (1, "nan")}
    for bad, msg in (
        ("nope:1", "unknown fault point"),
        ("rollout:0", "positive integer"),
        ("rollout:1:explode", "unknown action"),
    ):
        with pytest.raises(ValueError, match=msg):
            faults.parse(bad)
    monkeypatch.setenv(faults.ENV, "rollout:2:raise")
    faults.reset()
    try:
        assert faults.hit("rollout") is False
        with pytest.raises(faults.InjectedFault):
            faults.hit("rollout")
        assert faults.hit("rollout") is False  # only the n-th hit
    finally:
        faults.reset()


# ----------------------------------------------------------------------------- rewards, NaN loss

REWARD_FAULTS = [
    ("raises", "tests.reward_fns:raises_on_odd_first_token", {}, "reward/errors"),
    ("hangs", "tests.reward_fns:hangs", {"reward.timeout": 0.3}, "reward/timeouts"),
    ("returns NaN", "tests.reward_fns:nan_on_odd_first_token", {}, "reward/errors"),
]


@pytest.mark.parametrize("kind,fn,extra,counter", REWARD_FAULTS, ids=[r[0] for r in REWARD_FAULTS])
def test_bad_reward_function_scores_zero_and_the_run_goes_on(tmp_path, tiny_model_path, kind, fn, extra, counter):
    from reinforge.loop import run_training
    from reinforge.reward.manager import RewardFunctionFailing

    out = tmp_path / "run"
    cfg = load_config(
        None,
        overrides(
            tiny_model_path,
            out,
            **{
                "train.num_rollout": 2,
                "run.save_interval": "null",
                "run.save_final": "false",
                "reward.function_path": fn,
                **extra,
            },
        ),
    )
    if kind == "hangs":  # every reward failed: the run trains on, then ends in error (issue 38 item 7)
        with pytest.raises(RewardFunctionFailing, match="every reward of this run failed"):
            run_training(cfg)
    else:
        assert run_training(cfg).last_rollout_id == 1
    rows = train_rows(out)
    assert len(rows) == 2
    failed = sum(r[counter] for r in rows)
    assert failed > 0
    if kind == "hangs":
        assert failed == 2 * SAMPLES_PER_ROLLOUT and all(r["time/reward"] < 2.0 for r in rows)
    report(
        fault=f"reward function {kind}",
        injected=f"reward.function_path={fn}",
        what=f"{kind}" + (" (3 s sleep, reward.timeout=0.3)" if kind == "hangs" else " on some samples"),
        happened=f"scored 0 and counted in {counter}; training went on",
        rollouts_lost=0,
        samples_lost=f"0 (reward 0 for {int(failed)} of {2 * SAMPLES_PER_ROLLOUT})",
        recover_s=round(max(r["time/reward"] for r in rows), 2),
        rollouts_done=2,
    )


def test_nan_loss_step_is_skipped_counted_and_parameters_unchanged(tmp_path, tiny_model_path, monkeypatch):
    from reinforge.loop import RLLoop

    monkeypatch.setenv(faults.ENV, "nan_loss:1:nan")
    faults.reset()
    out = tmp_path / "run"
    loop = RLLoop(
        load_config(
            None,
            overrides(
                tiny_model_path,
                out,
                **{"train.num_rollout": 2, "rollout.rollout_batch_size": 4, "rollout.n_samples_per_prompt": 8},
            ),
        )
    )
    try:
        params = lambda: {n: p.detach().clone() for n, p in loop.cluster.worker.actor.model.named_parameters()}  # noqa
        before = params()
        m0, _ = loop.rollout_step(0)
        assert m0["train/skipped_steps"] == 1.0 and m0["rollout/zero_std_groups"] < 1.0
        assert all(torch.equal(before[n], p) for n, p in params().items())
        m1, _ = loop.rollout_step(1)
        assert m1["train/skipped_steps"] == 1.0  # the next step was applied
        assert any(not torch.equal(before[n], p) for n, p in params().items())
    finally:
        loop.close()
        faults.reset()
    report(
        fault="NaN loss",
        injected="REINFORGE_FAULT=nan_loss:1:nan",
        what="the policy loss of step 1 is NaN",
        happened="step skipped (train/skipped_steps=1), parameters unchanged, the next step applied",
        rollouts_lost=0,
        samples_lost=f"0 ({4 * 8} trained on no update)",
        recover_s=0,
        rollouts_done=2,
    )


# ----------------------------------------------------------------------------- resources


def test_impossible_placement_fails_fast_in_words(tmp_path, tiny_model_path):
    from reinforge.cluster.resources import ClusterError, check_placement

    cfg = load_config(
        str(REPO / "examples" / "arith_grpo.yaml"),
        ["cluster.mode=ray", "colocate=false", "actor_num_gpus_per_node=8", "rollout_num_gpus=8"],
    )
    with pytest.raises(ClusterError) as e:
        check_placement(cfg, {"CPU": 2, "GPU": 0, "memory": 20 * 2**30}, tiny_model_path)
    msg = str(e.value)
    for part in (
        "no GPU, 2 CPU cores and 20.0 GiB",
        "16 worker processes (8 trainer rank(s) + 8 engine(s))",
        "= 16 CPU cores",
        "GiB of memory",
        "cluster.rollout_num_gpus",
        "cluster.num_cpus_per_worker",
    ):
        assert part in msg, msg
    assert check_placement(cfg, {"CPU": 32, "GPU": 16}) is True
    with pytest.raises(ClusterError, match="needs 16 GPUs .* has 8"):
        check_placement(cfg, {"CPU": 32, "GPU": 8})
    # the CLI, end to end: exit status 2 and the message, before any process starts
    t = time.perf_counter()
    proc = cli_train(
        tmp_path,
        [
            "-c",
            "examples/arith_grpo.yaml",
            "cluster.mode=ray",
            "colocate=false",
            "actor_num_gpus_per_node=8",
            "rollout_num_gpus=8",
            f"run.output_dir={tmp_path}/r",
            "data.num_prompts=64",
        ],
    )
    log, _ = proc.communicate(timeout=120)
    seconds = time.perf_counter() - t
    if os.cpu_count() and os.cpu_count() >= 16 and not torch.cuda.is_available():
        pytest.skip("this machine has 16 cores")
    assert proc.returncode == 2 and "reinforge train: error: the disaggregated" in log and "Traceback" not in log
    report(
        fault="placement larger than the machine",
        injected="cluster.mode=ray colocate=false actor_num_gpus_per_node=8 rollout_num_gpus=8 on 2 cores, no GPU",
        what="16 Ray actors asked for",
        happened="refused before Ray starts, exit 2, one message naming cores, memory and the flags",
        rollouts_lost=0,
        samples_lost=0,
        recover_s=round(seconds, 1),
        rollouts_done=0,
    )


# ----------------------------------------------------------------------------- Ray engines


def test_dead_engine_actor_is_replaced_and_its_requests_requeued(tmp_path, tiny_model_path, monkeypatch):
    """Ray (local CPU cluster), disaggregated: 1 trainer + 2 engine actors; one engine process is
    SIGKILLed inside its second generate call (rollout 1). The pool replaces it, re-syncs the
    weights, rebuilds the weight-sync group and re-sends its requests: the run does not end."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("needs its own Ray instance (the fault is armed through the workers' environment)")
    from reinforge.loop import RLLoop

    monkeypatch.setenv(faults.ENV, "engine_generate:2")  # Ray workers inherit the driver's environment
    monkeypatch.setenv(faults.STATE_ENV, str(tmp_path / "fault-state"))
    out = tmp_path / "run"
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        loop = RLLoop(
            load_config(
                None,
                overrides(
                    tiny_model_path,
                    out,
                    **{
                        "cluster.mode": "ray",
                        "cluster.actor_num_gpus_per_node": 1,
                        "cluster.rollout_num_gpus": 2,
                        "cluster.colocate": "false",
                        "cluster.weight_sync_bucket_mb": 1,
                        "cluster.weight_sync_probe_interval": 0,  # (the start-up probe would be the 1st generate)
                        "train.num_rollout": 3,
                        "run.save_interval": "null",
                        "run.save_final": "false",
                    },
                ),
            )
        )
        try:
            t = time.perf_counter()
            result = loop.train()
            seconds = time.perf_counter() - t
            restarts = loop.engine.restarts
        finally:
            loop.close()
    finally:
        ray.shutdown()
        faults.reset()
    assert (tmp_path / "fault-state" / "engine_generate.fired").exists()
    assert restarts == 1 and result.last_rollout_id == 2
    rows = train_rows(out)
    assert [int(r["rollout_id"]) for r in rows] == [0, 1, 2]
    assert [r["rollout/engine_restarts"] for r in rows] == [0.0, 1.0, 1.0]
    assert all(r["rollout/num_samples"] == SAMPLES_PER_ROLLOUT for r in rows)  # nothing dropped
    # the replacement generated with the trainer's weights (log-probs agree) after later syncs too
    assert all(r["train/logprob_abs_diff"] < 1e-4 for r in rows)
    report(
        fault="engine actor killed mid-rollout (Ray)",
        injected="REINFORGE_FAULT=engine_generate:2 (SIGKILL inside an engine actor's generate)",
        what="1 of 2 engine actors dies during rollout 1",
        happened="actor replaced in its bundle, weights re-synced, weight-sync group rebuilt, its requests "
        "re-queued; the run went on",
        rollouts_lost=0,
        samples_lost="0 (its requests regenerated)",
        recover_s=round(rows[1]["time/generate"], 1),
        rollouts_done=3,
        total_s=round(seconds, 1),
    )


def test_dead_trainer_rank_restarts_the_group_from_the_last_checkpoint(tmp_path, tiny_model_path):
    """Ray, 2 trainer ranks (FSDP over gloo) + a colocated engine, started by the run itself; one rank's
    process is SIGKILLed in its optimizer step of rollout 1. The driver fails at once (the other rank is
    blocked in a collective), the supervisor relaunches, every rank resumes from checkpoint 0."""
    pytest.importorskip("ray")
    out = tmp_path / "run"
    args = overrides(
        tiny_model_path,
        out,
        **{
            "cluster.mode": "ray",
            "cluster.actor_num_gpus_per_node": 2,
            "cluster.rollout_num_gpus": 1,
            "cluster.colocate": "true",
            "cluster.weight_sync_bucket_mb": 1,
            "train.num_rollout": 3,
        },
    )
    proc = cli_train(tmp_path, ["--max-restarts", "1", *args], fault="optimizer_step:2")
    log, _ = proc.communicate(timeout=1500)  # (8-10 min on a loaded 2-core machine: Ray actors start slowly)
    assert proc.returncode == 0, log[-3000:]
    attempts = [json.loads(x) for x in (out / "restarts.jsonl").read_text().splitlines()]
    assert len(attempts) == 2 and attempts[0]["exit_code"] != 0 and attempts[1]["exit_code"] == 0
    crash_t = attempts[0]["time"]
    rows = train_rows(out)
    before = [int(r["rollout_id"]) for r in rows if r["time"] < crash_t]
    after = [int(r["rollout_id"]) for r in rows if r["time"] >= crash_t]
    assert before == [0] and after == [1, 2]  # rollout 1 (in flight) redone, nothing else
    report(
        fault="SIGKILL of a trainer rank (Ray)",
        injected="REINFORGE_FAULT=optimizer_step:2 + --max-restarts 1 (2 FSDP ranks)",
        what="one rank dies in the optimizer step of rollout 1",
        happened="driver failed at once (" + attempts[0]["cause"] + "), supervisor relaunched the whole group "
        "from the last checkpoint",
        rollouts_lost=1,
        samples_lost=SAMPLES_PER_ROLLOUT,
        recover_s=round(min(r["time"] for r in rows if r["time"] >= crash_t) - crash_t, 1),
        rollouts_done=3,
    )
