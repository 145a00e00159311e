"""Issue 57 item 11: an evaluation prints a start line, a progress bar fed by the engine's steps, and an
end line (it used to print nothing for a minute or more on a CPU)."""

from __future__ import annotations

import logging

import torch

from reinforge.config import EngineConfig, load_config
from reinforge.engine import EmbeddedEngine
from reinforge.eval import evaluate as ev
from reinforge.models.loading import build_model
from reinforge.records import GenerateRequest, Sample, SamplingParams, Status


def test_the_engine_reports_finished_completions_after_each_step(tiny_model_path):
    eng = EmbeddedEngine(
        build_model(tiny_model_path, torch.float32), EngineConfig(max_num_seqs=8, sync_interval=1), max_model_len=64
    )
    seen: list[int] = []
    eng.on_step = seen.append
    params = [SamplingParams(max_new_tokens=m, temperature=0.0) for m in (2, 7, 15)]
    eng.generate([GenerateRequest([11, 12, 13], p, n=2) for p in params])
    assert seen == sorted(seen) and seen[-1] == 6 and len(set(seen)) >= 3  # it grows as sequences finish


def test_evaluate_prints_a_start_line_progress_and_an_end_line(monkeypatch, caplog, capsys):
    class Engine:
        on_step = None

    class Reward:
        def score(self, samples):
            for s in samples:
                s.reward = 1.0
            return {}

    class Ctx:
        reward, engine, custom_generate = Reward(), Engine(), None

        def __init__(self, cfg):
            self.config = cfg

        def sampling_params(self, **kw):
            return None

    bars: list[int] = []

    def fake_groups(ctx, prompts, n, params):
        assert ctx.engine.on_step is not None  # the progress hook is set while the engine runs
        for k in range(1, len(prompts) * n + 1):
            ctx.engine.on_step(k)
        return [[Sample(prompt=p, tokens=[1], response_length=1, status=Status.COMPLETED)] * n for p in prompts]

    class Bar:
        def __init__(self, total, **kw):
            self.total, self.n = total, 0

        def update(self, k):
            self.n += k
            bars.append(self.n)

        def close(self):
            pass

    import tqdm.auto

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    monkeypatch.setattr(ev, "generate_groups", fake_groups)
    cfg = load_config(None, ["eval.n_samples_per_eval_prompt=2", "eval.pass_k=[1,2]", "run.progress=true"])
    ctx = Ctx(cfg)
    with caplog.at_level(logging.INFO, logger="reinforge"):
        ev.evaluate(ctx, ["a", "b", "c"], "before")
    assert "evaluating 3 prompts (before): 1 greedy + 2 sampled completion(s) each, 9 in all" in caplog.text
    assert "evaluated 9 completions in" in caplog.text
    assert bars == sorted(bars) and bars[-1] == 9 and 3 in bars  # the greedy pass, then the sampled one
    assert ctx.engine.on_step is None  # the hook is removed
