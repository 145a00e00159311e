"""What a new user trips on (issue 28): the run's config.yaml loads again through every command
of the "next:" line, W&B's own environment variables, the engine's KV cache sized by the run,
``--help`` / ``reinforge config``, truthful and readable checkpoint folders, and reward-model
scores not called accuracy."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import stat
from pathlib import Path

import pytest
import torch
import yaml

from reinforge import cli
from reinforge.config import ConfigError, dump_config, load_config
from reinforge.eval.summary import next_steps

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo_cpu.yaml"


# ----------------------------------------------------------------------------- config.yaml and the "next:" line


def _commands(line: str) -> dict[str, list[str]]:
    assert line.startswith("next: "), line
    parts = dict(part.split(": ", 1) for part in line.removeprefix("next: ").split("  |  "))
    return {what: shlex.split(cmd.replace("<more>", "10"))[1:] for what, cmd in parts.items()}


def _config_of(argv: list[str]):
    """The config the command line ``argv`` would run with (parsed as ``main`` does)."""
    parser = cli.build_parser()
    args, extra = parser.parse_known_args(argv)
    assert not extra, extra
    if args.func is cli._train:
        return cli.train_config(args)[0]
    if args.func is cli._eval:
        return cli.eval_config(args)
    if args.func is cli._offline:
        return cli.offline_config(args)[0]
    assert args.func is cli._convert
    return None


@pytest.mark.parametrize(
    "source,overrides",
    [
        (DEMO, []),
        (ROOT / "examples" / "arith_grpo.yaml", []),
        (ROOT / "examples" / "arith_ppo.yaml", []),  # a critic: critic.* kept
        (ROOT / "examples" / "arith_reinforce_pp.yaml", []),  # algo.gamma read, grpo_std_normalization not
        (None, ["algo.advantage_estimator=rloo", "run.wandb_mode=offline"]),
    ],
)
def test_every_next_command_loads_the_runs_config_yaml(tmp_path, source, overrides):
    run = tmp_path / "my run"
    original = load_config(source, overrides + [f"run.output_dir={run}"])
    run.mkdir()
    dump_config(original, run / "config.yaml")
    written = yaml.safe_load((run / "config.yaml").read_text())
    if not original.algo.needs_critic:
        assert "critic" not in written  # every critic.* default used to be written, and refused on reading
    line = next_steps(run, "train", run / "checkpoints" / "rollout_000003", "train.num_rollout")
    commands = _commands(line)
    assert set(commands) == {"resume", "evaluate", "export"}
    resumed = _config_of(commands["resume"])
    assert resumed == dataclasses.replace(
        original,
        run=dataclasses.replace(original.run, load=str(run)),
        train=dataclasses.replace(original.train, num_rollout=10),
    )
    evaluated = _config_of(commands["evaluate"])
    assert evaluated.model.path == str(run / "checkpoints" / "rollout_000003" / "model")
    assert evaluated.train.num_rollout == 0 and evaluated.data == original.data
    assert _config_of(commands["export"]) is None


def test_the_offline_next_commands_load_the_runs_config_yaml(tmp_path):
    run = tmp_path / "dpo run"
    original = load_config(ROOT / "examples" / "offline" / "dpo.yaml", [f"run.output_dir={run}"])
    run.mkdir()
    dump_config(original, run / "config.yaml")
    line = next_steps(run, "offline", run / "checkpoints" / "step_000003", "offline.num_epochs", policy=False)
    commands = _commands(line)
    assert set(commands) == {"resume", "export"}
    resumed = _config_of(commands["resume"])
    assert resumed.offline == dataclasses.replace(original.offline, num_epochs=10)
    assert resumed.run.load == str(run) and resumed.model == original.model


def test_a_config_given_explicitly_is_still_refused_where_unused():
    with pytest.raises(ConfigError, match="critic.lr set, but algo.advantage_estimator=grpo uses no critic"):
        load_config(None, ["critic.lr=1e-5"])
    with pytest.raises(ConfigError, match="algo.gamma set, but algo.advantage_estimator=grpo does not use it"):
        load_config(None, ["algo.gamma=0.9"])


# ----------------------------------------------------------------------------- --help and `reinforge config`


def test_help_lists_the_sections_and_points_to_the_reference(capsys):
    for argv in (["--help"], ["train", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        out = capsys.readouterr().out
        assert "docs/config.md" in out and "reinforge config" in out
        for section in ("model", "rollout", "engine", "algo", "train", "eval", "run"):
            assert f"\n  {section} " in out, section


def test_config_command_prints_the_resolved_config_that_loads_again(tmp_path, capsys):
    assert cli.main(["config", "-c", str(DEMO), "train.lr=3e-6", "rollout.n_samples_per_prompt=4"]) == 0
    printed = capsys.readouterr().out
    (tmp_path / "c.yaml").write_text(printed)
    expected = load_config(DEMO, ["train.lr=3e-6", "rollout.n_samples_per_prompt=4"])
    assert load_config(tmp_path / "c.yaml") == expected
    d = yaml.safe_load(printed)
    assert d["train"]["lr"] == 3e-6 and d["engine"]["max_num_seqs"] == 64 and "critic" not in d
    assert d["rollout"]["rollout_temperature"] == 1.0  # defaults are shown

    assert cli.main(["config", "-c", str(DEMO), "--changed", "--section", "rollout"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == {"rollout": {"rollout_max_response_len": 48}}
    assert cli.main(["config", "--section", "nope"]) == 2
    assert "no such section" in capsys.readouterr().err
    assert cli.main(["config", "train.lrr=1"]) == 2
    assert "did you mean train.lr" in capsys.readouterr().err


# ----------------------------------------------------------------------------- W&B's environment variables


def _no_wandb_env(monkeypatch, home: Path) -> None:
    for k in list(os.environ):
        if k.startswith("WANDB_") or k == "NETRC":
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(home))


def test_wandb_mode_and_project_come_from_the_environment_when_the_config_leaves_them(tmp_path, monkeypatch):
    from reinforge.utils.logging import WandbSetupError, check_wandb, wandb_target

    _no_wandb_env(monkeypatch, tmp_path)
    run = load_config(None, []).run
    assert run.wandb_mode is None and wandb_target(run.wandb_project, run.wandb_mode) == (None, "online")
    check_wandb(run)  # no project: nothing to check
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    with pytest.raises(WandbSetupError, match="no W&B API key was found.*WANDB_MODE=offline"):
        check_wandb(run)  # online without credentials fails here, not after the engine is built
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_target(run.wandb_project, run.wandb_mode) == ("from-env", "offline")
    check_wandb(run)
    assert wandb_target("p", "online") == ("p", "online")  # the config's own keys win
    monkeypatch.setenv("WANDB_MODE", "offlne")
    with pytest.raises(WandbSetupError, match="WANDB_MODE .*'offlne' is not a W&B mode"):
        check_wandb(run)
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    check_wandb(run)


def test_train_refuses_a_bad_wandb_setup_before_building_anything(tmp_path, monkeypatch, capsys):
    _no_wandb_env(monkeypatch, tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offlien")
    built = []
    monkeypatch.setattr(cli, "_preflight_rl", lambda cfg: built.append(cfg))
    code = cli.main(["train", f"run.output_dir={tmp_path / 'run'}", "run.wandb_project=p"])
    assert code == 2 and not built
    assert "'offlien' is not a W&B mode" in capsys.readouterr().err


def test_wandb_offline_from_the_environment_logs_without_network(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from reinforge.utils.logging import MetricsLogger, check_wandb

    _no_wandb_env(monkeypatch, tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = load_config(None, ["run.wandb_project=reinforge-test"]).run  # run.wandb_mode left at its default
    check_wandb(run)
    out = tmp_path / "run"
    logger = MetricsLogger(out, tensorboard=False, wandb_project=run.wandb_project, wandb_mode=run.wandb_mode)
    logger.log(1, {"rollout/reward_mean": 0.5})
    logger.close()
    assert list((out / "wandb").glob("offline-run-*/run-*.wandb"))


# ----------------------------------------------------------------------------- the engine's KV cache


def _walkthrough(*extra: str):
    """The demo config as the walkthrough ran it: 4 samples of one prompt, the examples' 1024 slots."""
    return load_config(
        DEMO,
        [
            "train.device=cpu",
            "engine.max_num_seqs=1024",
            "rollout.rollout_batch_size=1",
            "rollout.n_samples_per_prompt=4",
            "data.n_eval_prompts=2",
            *extra,
        ],
    )


def test_engine_slots_are_capped_at_what_the_run_holds_at_once():
    from reinforge.rollout.backends import engine_config_for, run_max_seqs

    cfg = _walkthrough()
    assert run_max_seqs(cfg) == 4  # max(1 prompt x 4 samples, 2 eval prompts x 1 greedy)
    assert engine_config_for(cfg).max_num_seqs == 4
    assert engine_config_for(cfg, max_seqs=1).max_num_seqs == 1  # reinforge generate --n 1
    assert run_max_seqs(_walkthrough("eval.n_samples_per_eval_prompt=8")) == 16  # 2 prompts x 8 samples
    assert run_max_seqs(_walkthrough("train.num_rollout=0")) == 2  # reinforge eval: only the evaluation
    demo = load_config(DEMO)
    assert engine_config_for(demo).max_num_seqs == 64  # 8 x 8: the demo's own setting is what it needs
    assert engine_config_for(demo, max_seqs=1000).max_num_seqs == 64  # the cap never raises the slots
    custom = _walkthrough("rollout.rollout_function_path=tests.reward_fns:anything")
    assert run_max_seqs(custom) is None and engine_config_for(custom).max_num_seqs == 1024  # unknown: kept


def test_demo_kv_cache_on_cpu_is_sized_by_the_run(smollm2_path):
    from reinforge.preflight import kv_cache_plan

    cfg = _walkthrough()
    length = 200  # prompt + rollout.rollout_max_response_len
    cpu = torch.device("cpu")
    before = kv_cache_plan(
        dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, rollout_function_path="x:y")),
        smollm2_path,
        length,
        cpu,
    )  # uncapped: 1024 slots
    now = kv_cache_plan(cfg, smollm2_path, length, cpu)
    generate = kv_cache_plan(cfg, smollm2_path, length, cpu, max_seqs=1)
    assert before.slots == 1024 and now.slots == 4 and generate.slots == 1
    # 46080 bytes per token (2 x 30 layers x 3 KV heads x 64 x fp32) x 200 tokens x (slots + a spare block)
    assert before.bytes == 46080 * 200 * 1025 and before.bytes > 8 << 30  # 8.8 GiB
    assert now.bytes == 46080 * 200 * 5 and generate.bytes == 46080 * 200 * 2  # 44 MiB, 18 MiB


def test_the_built_engine_allocates_for_the_run_not_for_max_num_seqs(tiny_model_path):
    from reinforge.models.loading import load_tokenizer
    from reinforge.rollout.backends import build_engine, engine_spec

    cfg = _walkthrough(f"model.path={tiny_model_path}")
    tok = load_tokenizer(tiny_model_path)
    engine = build_engine(engine_spec(cfg, tiny_model_path, tok, torch.device("cpu"), 256))
    try:
        kv = engine.runner.kv_bytes()
        assert engine.num_slots == 4
        per_slot = 2 * 2 * 2 * 16 * 256 * 4  # K and V x 2 layers x 2 KV heads x head dim 16 x 256 tokens x fp32
        assert kv <= 5 * per_slot  # 4 slots and the spare block, not 1024 slots (256 MiB)
    finally:
        engine.shutdown()


# ----------------------------------------------------------------------------- checkpoints and exports


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _bf16_labelled_source(tmp_path: Path, tiny_model_path: Path) -> Path:
    """The tiny model's folder with a config saying bfloat16 (as SmolLM2's does) and private files."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(tiny_model_path, src)
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("dtype", None)
    cfg["torch_dtype"] = "bfloat16"
    (src / "config.json").write_text(json.dumps(cfg))
    for f in src.iterdir():
        f.chmod(0o600)
    return src


def _modes(folder: Path) -> set[tuple[str, int]]:
    return {(p.relative_to(folder).as_posix(), stat.S_IMODE(p.stat().st_mode)) for p in [folder, *folder.rglob("*")]}


def test_checkpoint_model_folder_states_its_dtype_and_is_readable(tmp_path, tiny_model_path, umask_022):
    from reinforge.checkpoint import save_checkpoint
    from reinforge.models.loading import build_model, save_hf_folder

    src = _bf16_labelled_source(tmp_path, tiny_model_path)
    model = build_model(src, torch.float32)

    def write(d: Path) -> None:
        save_hf_folder(model, d / "model", src)

    ckpt = save_checkpoint(tmp_path / "checkpoints", 3, write, {"rollout_id": 3})
    saved = json.loads((ckpt / "model" / "config.json").read_text())
    assert saved["dtype"] == "float32" and "torch_dtype" not in saved  # the weights are fp32
    from safetensors import safe_open

    with safe_open(str(ckpt / "model" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}
    for name, mode in _modes(ckpt):
        want = 0o755 if (ckpt / name).is_dir() else 0o644
        assert mode == want, (name, oct(mode))
    assert stat.S_IMODE((tmp_path / "checkpoints" / "latest").stat().st_mode) == 0o644


def test_convert_writes_the_dtype_it_was_asked_for_into_readable_files(tmp_path, tiny_model_path, umask_022):
    from reinforge.checkpoint import save_checkpoint
    from reinforge.models.loading import build_model, save_hf_folder

    src = _bf16_labelled_source(tmp_path, tiny_model_path)

    def write(tmp):  # a checkpoint's parts as the trainer writes them (convert refuses a damaged one)
        save_hf_folder(build_model(src, torch.float32), tmp / "model", src)
        (tmp / "dcp" / "actor").mkdir(parents=True)
        (tmp / "dcp" / "actor" / ".metadata").write_bytes(b"")
        torch.save({}, tmp / "trainer_state.pt")

    ckpt = save_checkpoint(
        tmp_path / "checkpoints", 0, write, {"rollout_id": 0, "weight_version": 0, "data": {}, "config": {}}
    )
    for dtype, name in (("bfloat16", "bfloat16"), ("fp32", "float32")):
        out = tmp_path / f"hf-{dtype}"
        assert cli.main(["convert", "--checkpoint", str(ckpt), "--out", str(out), "--dtype", dtype]) == 0
        assert json.loads((out / "config.json").read_text())["dtype"] == name
        assert {m for _, m in _modes(out)} <= {0o755, 0o644}
        assert stat.S_IMODE(out.stat().st_mode) == 0o755


# ----------------------------------------------------------------------------- reward-model scores


def test_reward_model_scores_above_the_threshold_are_not_called_accuracy(monkeypatch):
    from reinforge.eval import evaluate as ev
    from reinforge.records import Sample, Status

    def fake_groups(ctx, prompts, n, params):
        return [
            [Sample(prompt=p, tokens=[1], response_length=1, status=Status.COMPLETED) for _ in range(n)]
            for p in prompts
        ]

    class Reward:
        def score(self, samples):
            for i, s in enumerate(samples):
                s.reward = 0.9 if i % 2 else 0.1
            return {}

    class Ctx:
        reward = Reward()

        def __init__(self, cfg):
            self.config = cfg

        def sampling_params(self, **kw):
            return None

    monkeypatch.setattr(ev, "generate_groups", fake_groups)
    model = load_config(
        None,
        [
            "reward.type=model",
            "reward.model_path=/rm",
            "reward.correct_threshold=0.5",
            "eval.n_samples_per_eval_prompt=2",
            "eval.pass_k=[1,2]",
        ],
    )
    metrics, _ = ev.evaluate(Ctx(model), ["a", "b"])
    assert {"eval/greedy_score_above_threshold", "eval/score_above_threshold@1", "eval/score_above_threshold@2"} <= set(
        metrics
    )
    assert not any("accuracy" in k or "pass@" in k for k in metrics)
    assert metrics["eval/greedy_score_above_threshold"] == 0.5
    table = ev.format_table([("policy", metrics)])
    assert "greedy_score_above_threshold" in table and "accuracy" not in table
    assert ev.eval_plot_keys("model") == ("eval/greedy_score_above_threshold", "eval/score_above_threshold@1")
    verifier, _ = ev.evaluate(
        Ctx(load_config(None, ["eval.n_samples_per_eval_prompt=2", "eval.pass_k=[1,2]"])), ["a", "b"]
    )
    assert {"eval/greedy_accuracy", "eval/pass@1", "eval/pass@2"} <= set(verifier)
