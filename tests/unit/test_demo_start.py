"""Issue 57 item 15: what a fresh clone's demos print and leave on disk: `make demo-agent`'s steps say
where their logs are and how far they got, the demos keep weights-only checkpoints (and the README says
how large), the checkpoint line sizes weights stored once in model/ in words, and the planner's end line
is printed once."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_the_agent_pipeline_prints_each_steps_start_log_and_progress(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import agent_pipeline

    script = "import time\nfor i in range(3):\n    print(f'rollout {i}', flush=True)\n    time.sleep(0.4)\n"
    log = tmp_path / "rl.log"
    seconds = agent_pipeline.run("RL", 4, [sys.executable, "-c", script], log, every=0.3)
    out = capsys.readouterr().out
    assert f"[4/4] RL: started (log: {log})" in out
    assert "[4/4] RL: " in out and " s: rollout " in out  # a progress line with the log's last line
    assert "[4/4] RL: done in" in out and seconds > 0
    assert agent_pipeline.last_line(log) == "rollout 2"
    (tmp_path / "bar.log").write_text("eval:  10%|#  | 1/10\reval:  50%|#  | 5/10\r")
    assert agent_pipeline.last_line(tmp_path / "bar.log") == "eval:  50%|#  | 5/10"


def test_the_demos_keep_weights_only_and_the_readme_says_the_size():
    run = yaml.safe_load((ROOT / "examples" / "demo_cpu.yaml").read_text())["run"]
    assert run["save_optimizer"] == "none" and run["keep_last_n_checkpoints"] == 1
    make = (ROOT / "Makefile").read_text().split("demo-agent: setup")[1].split("\n\n")[0]
    assert "run.save_optimizer=none" in make and "run.keep_last_n_checkpoints=1" in make
    readme = (ROOT / "README.md").read_text()
    assert "about 0.55 GB" in readme and "runs/demo_agent/<step>.log" in readme and "about 1.1 GB" in readme
    assert "2.41x" in readme and "66428a0" not in readme


def test_the_checkpoint_line_says_the_weights_are_model_s(tmp_path):
    from reinforge.checkpoint import size_summary

    ckpt = tmp_path / "rollout_000000"
    (ckpt / "model").mkdir(parents=True)
    (ckpt / "model" / "model.safetensors").write_bytes(b"\0" * 2_000_000)
    (ckpt / "dcp" / "actor").mkdir(parents=True)
    (ckpt / "dcp" / "actor" / "hf_weights.json").write_text('{"weights": "../../model", "dtype": "float32"}\n')
    (ckpt / "dcp" / "actor_optim").mkdir()
    (ckpt / "dcp" / "actor_optim" / "__0_0.distcp").write_bytes(b"\0" * 4_000_000)
    line = size_summary(ckpt)
    assert "dcp/ weights 0.0 MB" not in line and "dcp/ weights: those of model/ (not stored twice)" in line
    assert "optimizer state 4.0 MB" in line and "model/ (Hugging Face, fp32) 2.0 MB" in line


def test_the_plan_end_line_is_logged_only_where_the_loop_does_not_print_it(tiny_model_path, caplog):
    from reinforge.config import load_config
    from reinforge.plan import resolve_config
    from reinforge.plan.report import PlanReport

    _, plan = resolve_config(load_config(None, [f"model.path={tiny_model_path}"]), tiny_model_path, gpu=None)
    report = PlanReport(plan)
    report.rollout({"time/generate": 1.0, "time/logprob": 0.1, "time/train": 0.5, "time/sync": 0.01}, [], [])
    with caplog.at_level(logging.INFO, logger="reinforge"):
        line = report.finish(log_line=False)
    assert line is not None and "no hardware limit given" in line and line not in caplog.text
    with caplog.at_level(logging.INFO, logger="reinforge"):
        assert report.finish() == line
    assert caplog.text.count("no hardware limit given") == 1
