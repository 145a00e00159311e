"""Resume with a tiny model (issue 38): what checkpoints hold (run.save_optimizer, LoRA), what a
resume says it cannot restore, the written config.yaml, and Ctrl-C with the default run.recover=off."""

from __future__ import annotations

import json
import logging
import signal

import yaml

from reinforge import checkpoint as ckpt
from reinforge.config import load_config
from tests.integration.test_faults import latest_pointed, overrides, start_until_first_rollout, stop_with, train_rows


def test_optimizer_state_in_the_newest_checkpoint_only_and_a_resume_says_what_it_lacks(
    tmp_path, tiny_model_path, caplog
):
    from reinforge.loop import run_training

    out = tmp_path / "run"
    args = {"train.num_rollout": 3, "run.keep_last_n_checkpoints": "null"}
    with caplog.at_level(logging.INFO):
        run_training(load_config(None, overrides(tiny_model_path, out, **args)))
    cks = {p.name: p for p in ckpt.list_checkpoints(out / "checkpoints")}
    assert [ckpt.has_optimizer_state(cks[f"rollout_00000{i}"]) for i in range(3)] == [False, False, True]
    assert all(ckpt.checkpoint_problem(p) is None for p in cks.values())
    # every parameter trains: the weights are model/'s (fp32), stored once; AdamW in dcp/actor_optim
    c = cks["rollout_000002"]
    assert not (c / "dcp" / "actor" / ".metadata").exists()
    assert json.loads((c / "dcp" / "actor" / "hf_weights.json").read_text())["weights"] == "../../model"
    weights = sum(f.stat().st_size for f in (c / "model").glob("*.safetensors"))
    optim = sum(f.stat().st_size for f in (c / "dcp" / "actor_optim").rglob("*") if f.is_file())
    second_copy = sum(f.stat().st_size for f in (c / "dcp" / "actor").rglob("*") if f.is_file())
    assert 1.9 * weights < optim < 2.1 * weights and second_copy < 1024  # 4 + 8 bytes a parameter (was 16)
    assert "saved checkpoint" in caplog.text and "optimizer state" in caplog.text and " MB" in caplog.text
    assert "checkpoints/.rollout_" not in caplog.text  # item 10: no save logs its hidden temporary folder
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # an older checkpoint, a changed learning rate
        run_training(
            load_config(
                None,
                overrides(
                    tiny_model_path,
                    out,
                    **{**args, "train.num_rollout": 4, "run.load": str(cks["rollout_000001"]), "train.lr": 0.01},
                ),
            )
        )
    assert "holds no optimizer state for the actor (run.save_optimizer): AdamW's moments restart" in caplog.text
    assert "settings that differ from the checkpoint's: train.lr 0.001 -> 0.01" in caplog.text
    assert yaml.safe_load((out / "config.yaml").read_text())["run"]["load"] is None  # (before: kept run.load)
    assert [int(r["rollout_id"]) for r in train_rows(out)] == [0, 1, 2, 3]


def test_a_lora_checkpoint_holds_the_adapters_and_their_optimizer_state_only(tmp_path, tiny_model_path):
    from torch.distributed.checkpoint import FileSystemReader

    from reinforge.loop import run_training

    out = tmp_path / "run"
    run_training(
        load_config(
            None,
            overrides(tiny_model_path, out, **{"train.num_rollout": 1, "model.lora_rank": 4, "model.lora_alpha": 8}),
        )
    )
    c = latest_pointed(out)
    keys = FileSystemReader(str(c / "dcp" / "actor")).read_metadata().state_dict_metadata
    assert keys and all("lora_" in k for k in keys)  # (before: every base weight too, 1.2 GB for SmolLM2)
    assert ckpt.has_optimizer_state(c)
    run_training(
        load_config(
            None,
            overrides(
                tiny_model_path,
                out,
                **{"train.num_rollout": 2, "model.lora_rank": 4, "model.lora_alpha": 8, "run.load": str(out)},
            ),
        )
    )
    assert [int(r["rollout_id"]) for r in train_rows(out)] == [0, 1]


def test_ctrl_c_with_recover_off_writes_a_checkpoint_and_exits_130(tmp_path, tiny_model_path):
    out = tmp_path / "run"
    args = overrides(tiny_model_path, out, **{"train.num_rollout": 50, "run.save_interval": "null"})  # recover: off
    proc = start_until_first_rollout(tmp_path, args, out)
    log, _ = stop_with(proc, signal.SIGINT)
    assert proc.returncode == 130, log[-3000:]  # (before: a KeyboardInterrupt traceback, no checkpoint)
    assert "Traceback" not in log
    assert json.loads((latest_pointed(out) / "state.json").read_text())["rollout_id"] == int(
        train_rows(out)[-1]["rollout_id"]
    )
    assert "stopped after SIGINT: checkpoint" in log


def test_an_offline_resume_names_a_changed_lr_and_logs_each_step_once(tmp_path, tiny_model_path, caplog):
    """`reinforge offline --load CHECKPOINT` of an older checkpoint, with another train.lr and
    metrics.jsonl cut mid-row: the changed lr is said (as the RL loop says it), the cut row is named,
    and the redone steps' rows replace the earlier attempt's (before: appended after them, the first
    glued onto the cut row)."""
    from reinforge.offline_loop import run_offline
    from reinforge.utils.logging import read_metrics
    from tests.integration.test_offline import offline_overrides, write_data

    files, out = write_data(tmp_path, n=18), tmp_path / "run"  # 3 steps of 6
    args = {"run.save_interval": 1, "run.keep_last_n_checkpoints": "null", "offline.eval_fraction": 0}
    run_offline(load_config(None, offline_overrides(tiny_model_path, out, files["sft"], "sft", **args)))
    metrics = out / "metrics.jsonl"
    assert [r["step"] for r in read_metrics(metrics) if "train/loss" in r] == [1, 2, 3]
    metrics.write_text(metrics.read_text()[:-25])  # the last row (step 3's) cut mid-way
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        run_offline(
            load_config(
                None,
                offline_overrides(
                    tiny_model_path,
                    out,
                    files["sft"],
                    "sft",
                    **{**args, "run.load": str(out / "checkpoints" / "step_000000"), "train.lr": 0.002},
                ),
            )
        )
    assert "settings that differ from the checkpoint's: train.lr 0.001 -> 0.002" in caplog.text
    assert "is not a whole JSON row (cut short" in caplog.text
    caplog.clear()
    rows = read_metrics(metrics)
    assert not caplog.text  # every line a whole row
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3]  # steps 2 and 3 redone, logged once
