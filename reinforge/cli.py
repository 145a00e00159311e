"""Command line: ``reinforge train | offline | make-data | eval | generate | models | convert | plan | config``."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path

from .config import SECTIONS, ConfigError, load_config
from .run_dir import check_output_dir
from .startup import StartupInterrupted, startup
from .utils.logging import check_wandb

log = logging.getLogger("reinforge")

# Usage errors: exit status 2, one line, no relaunch. A ValueError / KeyError / FileNotFoundError becomes
# one (UsageError, a ConfigError) only when raised before the run starts (reinforge/startup.py).
USAGE_ERRORS = (ConfigError,)
MAX_RESTARTS_HELP = "relaunch after a crash up to N times (run.max_restarts; resumes with run.recover=auto)"


def train_config(args: argparse.Namespace):
    """The config ``reinforge train`` runs with: ``--config``, then overrides, ``--load``, ``--max-restarts``."""
    overrides = list(args.overrides)
    if args.load:
        overrides.append(f"run.load={args.load}")
    if args.max_restarts is not None:
        overrides.append(f"run.max_restarts={args.max_restarts}")
    return load_config(args.config, overrides), overrides


def _train(args: argparse.Namespace) -> int:
    with startup():
        cfg, overrides = train_config(args)
        check_output_dir(cfg.run)
        check_wandb(cfg.run)
        _check_user_functions(cfg)  # a syntax error in a second, not after the model is built (nor at each restart)
        from .rollback import follow_load_once

        follow_load_once(cfg.run)  # (a supervised relaunch resumes the line chosen here)
    if cfg.run.max_restarts > 0:
        from .supervisor import supervise_command

        return supervise_command("train", args.config, overrides, cfg.run)
    with startup():
        plan = _preflight_rl(cfg)
    from .loop import RLLoop
    from .supervisor import watch_parent
    from .utils.fs import lock_directory

    watch_parent()  # supervised: stop (after a recover checkpoint) if the supervisor dies
    with lock_directory(Path(cfg.run.output_dir)):
        with startup():  # datasets, model, engine, the checkpoint to resume: a bad input is a usage error
            loop = RLLoop(cfg, plan=plan)
        try:  # the run: an error is a fault or a bug (traceback, relaunched by the supervisor)
            loop.train()
        finally:
            loop.close()
    return 0


def _check_user_functions(cfg) -> None:
    """The files of the config's ``module:function`` paths compile (utils/imports.check_function_source)."""
    from .utils.imports import check_function_source

    r = cfg.rollout
    for key, path in (
        ("reward.function_path", cfg.reward.function_path),
        ("rollout.rollout_function_path", r.rollout_function_path),
        ("rollout.custom_generate_function_path", r.custom_generate_function_path),
    ):
        check_function_source(path, key)


def _preflight_rl(cfg):
    """The ``auto`` keys resolved once and every up-front check in a second, before datasets load
    (:func:`reinforge.preflight.plan_rl`); the plan it returns is handed to ``RLLoop``."""
    from .models.hub import resolve_model_path
    from .preflight import plan_rl

    return plan_rl(cfg, resolve_model_path(cfg.model.path))


def _resolved(cfg, offline: bool = False):
    """``cfg`` with its ``auto`` keys chosen by the planner for this machine (reinforge/plan; ``train``
    and ``eval`` do it in ``RLLoop``, where the plan is logged)."""
    from .models.hub import resolve_model_path
    from .plan import auto_keys, resolve_config

    if not auto_keys(cfg):
        return cfg
    return resolve_config(cfg, resolve_model_path(cfg.model.path), offline=offline, log_plan=True)[0]


def _plan(args: argparse.Namespace) -> int:
    """``reinforge plan`` (:func:`reinforge.plan.command.plan_command`)."""
    from .plan.command import plan_command

    return plan_command(load_config(args.config, list(args.overrides)), args)


def offline_config(args: argparse.Namespace):
    """The config ``reinforge offline`` runs with: ``--config``, then overrides, ``--load``, ``--max-restarts``."""
    overrides = list(args.overrides)
    if args.load:
        overrides.append(f"run.load={args.load}")
    if getattr(args, "max_restarts", None) is not None:
        overrides.append(f"run.max_restarts={args.max_restarts}")
    return load_config(args.config, overrides), overrides


def _offline(args: argparse.Namespace) -> int:
    main_rank = os.environ.get("RANK", "0") == "0"  # under torchrun every rank runs this; rank 0 deletes, locks
    with startup():
        cfg, overrides = offline_config(args)
        check_output_dir(cfg.run, rank=int(os.environ.get("RANK", "0")))  # (before the model is looked for)
        cfg = _resolved(cfg, offline=True)
        if main_rank:
            check_wandb(cfg.run)
            from .rollback import follow_load_once

            follow_load_once(cfg.run, "step")  # (a supervised relaunch resumes the line chosen here)
    if cfg.run.max_restarts > 0:
        from .supervisor import supervise_command

        return supervise_command("offline", args.config, overrides, cfg.run)
    from .offline_loop import OfflineLoop
    from .supervisor import watch_parent
    from .utils.fs import lock_directory

    watch_parent()  # supervised: stop (after a recover checkpoint) if the supervisor dies
    with lock_directory(Path(cfg.run.output_dir)) if main_rank else contextlib.nullcontext():
        with startup():
            loop = OfflineLoop(cfg)
        try:
            loop.train()
        finally:
            loop.close()


def _make_data(args: argparse.Namespace) -> None:
    if args.kind == "swe":  # program-made repositories: no config, no model
        from .envs.swe_data import write_swe_data

        counts = write_swe_data(args.out, args.num_prompts, args.seed)
        kinds = ", ".join(f"{k} {int(v)}" for k, v in counts.items() if k != "examples")
        print(f"wrote {int(counts['examples'])} verified repositories (seed {args.seed}; {kinds}) to {args.out}")
        return
    cfg = _resolved(load_config(args.config, list(args.overrides)))
    from .make_data import make_data

    counts = make_data(
        cfg,
        args.kind,
        args.out,
        args.num_prompts,
        answer_format=args.answer_format,
        pairs_per_prompt=args.pairs_per_prompt,
    )
    print(
        f"wrote {int(counts['examples'])} {args.kind} examples from {int(counts['prompts'])} prompts to {args.out}"
        + (
            f" ({int(counts['prompts_without_pair'])} prompts had no correct/incorrect mix)"
            if counts["prompts_without_pair"]
            else ""
        )
    )


def eval_config(args: argparse.Namespace):
    """The config ``reinforge eval`` runs with: ``--config``, overrides, ``--model``, ``--data``,
    ``--output-dir``; no training rollouts, no recovery."""
    overrides = list(args.overrides)
    if args.model:
        overrides.append(f"model.path={args.model}")
    if args.data:
        overrides += [f"data.eval_prompt_data={args.data}", f"data.prompt_data={args.data}"]
    if args.output_dir:
        overrides.append(f"run.output_dir={args.output_dir}")
    return load_config(args.config, overrides + ["train.num_rollout=0", "run.recover=off", "run.max_restarts=0"])


def _eval(args: argparse.Namespace) -> None:
    with startup():
        cfg = eval_config(args)
        _check_user_functions(cfg)
        plan = _preflight_rl(cfg)
    from .eval.evaluate import format_table, model_label
    from .loop import RLLoop
    from .utils.logging import MetricsLogger

    with startup():
        loop = RLLoop(cfg, plan=plan)
    try:
        if loop.eval_data is None:
            raise ConfigError(
                "no evaluation prompts: pass --data (reasoning_gym:<task>, or a .jsonl / .json / "
                ".parquet file or saved `datasets` folder of prompts), or data.n_eval_prompts > 0"
            )
        logger = MetricsLogger(loop.out, tensorboard=False)
        metrics = loop.run_eval("eval", 0, logger)
        logger.close()
        print(format_table([(model_label(loop.base_path), metrics)]))
        print(f"\ncompletions: {loop.out / 'eval' / 'eval.jsonl'}")
        loop.reward.check_run()  # every reward failed: the table's zeros measure the reward, not the model
        loop.infra.check_run()  # every sample failed by infrastructure: nothing was measured
    finally:
        loop.close()


def _generate(args: argparse.Namespace) -> None:
    cfg = _resolved(load_config(args.config, [f"model.path={args.model}"] if args.model else []))
    from .data import render_prompt
    from .models.hub import resolve_model_path
    from .models.loading import load_tokenizer
    from .preflight import check_generate
    from .records import GenerateRequest
    from .rollout.backends import build_engine, engine_spec
    from .rollout.generate import RolloutContext, model_stop_token_ids
    from .utils.device import resolve_device

    path = resolve_model_path(cfg.model.path)
    tok = load_tokenizer(path)
    text = render_prompt(tok, args.prompt, cfg.data.apply_chat_template, args.system or cfg.data.system_prompt)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    check_generate(cfg, path, len(ids), args.max_new_tokens, args.n)
    engine = build_engine(
        engine_spec(cfg, path, tok, resolve_device(cfg.train.device), len(ids) + args.max_new_tokens, max_seqs=args.n)
    )  # the KV cache for --n sequences, not engine.max_num_seqs
    ctx = RolloutContext(cfg, engine, tok, None, model_stop_token_ids(tok, str(path), []))
    params = ctx.sampling_params(greedy=args.temperature == 0)
    params.max_new_tokens = args.max_new_tokens
    if args.temperature > 0:
        params.temperature = args.temperature
    for i, r in enumerate(engine.generate([GenerateRequest(ids, params, n=args.n)])[0]):
        print(f"--- sample {i} ({r.finish_reason.value}, {len(r.token_ids)} tokens)")
        print(tok.decode(r.token_ids, skip_special_tokens=True))


def _models(args: argparse.Namespace) -> None:
    from .models.hub import KNOWN_MODELS, cache_dir, is_hf_folder, pull_model

    if args.action == "list":
        for name, spec in KNOWN_MODELS.items():
            folder = cache_dir() / "models" / name
            state = f"pulled: {folder}" if is_hf_folder(folder) else "not pulled"
            print(f"{name:28s} {spec.description} ({state})")
        return
    if not args.name:
        raise ValueError("usage: reinforge models pull <name>")
    print(pull_model(args.name, force=args.force))


def _convert(args: argparse.Namespace) -> None:
    import shutil

    from .checkpoint import newest_intact
    from .models.loading import build_model, parse_dtype, save_hf_folder
    from .models.reward_model import build_reward_model, is_reward_model_folder, save_reward_model
    from .utils.fs import atomic_directory

    ckpt = newest_intact(args.checkpoint, warn=log.warning)  # a damaged one: the one before it, or refused in words
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.force:
        raise FileExistsError(f"{out} exists and is not empty (pass --force to replace it)")
    dtype = parse_dtype(args.dtype)
    src = ckpt / "model"
    with atomic_directory(out) as tmp:
        if is_reward_model_folder(src):  # a reward model (reinforge offline, offline.method=rm)
            rm = build_reward_model(src, dtype, "cpu")
            save_reward_model(rm.hf_state_dict(), tmp, src, rm.pad_token_id, dtype=dtype)
        else:
            save_hf_folder(build_model(src, dtype, "cpu"), tmp, src, dtype=dtype)
    if args.adapter_out:  # a LoRA run's adapter, as a PEFT folder
        if not (ckpt / "adapter").is_dir():
            raise FileNotFoundError(f"{ckpt} has no adapter/ (the run did not use LoRA: model.lora_rank=0)")
        with atomic_directory(Path(args.adapter_out)) as tmp:
            shutil.copytree(ckpt / "adapter", tmp, dirs_exist_ok=True)
        print(f"wrote the LoRA adapter {args.adapter_out} (load with peft.PeftModel.from_pretrained)")
    print(f"wrote {out} ({args.dtype}) from {ckpt}")


def _config(args: argparse.Namespace) -> None:
    """Print the config a command would run with, as YAML that ``-c`` accepts again."""
    cfg = load_config(args.config, list(args.overrides))
    if args.section:
        unknown = [x for x in args.section if x not in SECTIONS]
        if unknown:
            raise ConfigError(f"--section {', '.join(unknown)}: no such section; sections: {', '.join(SECTIONS)}")
    import dataclasses

    import yaml

    from .config import config_dict

    d = config_dict(cfg, changed_only=args.changed)
    if args.section:
        d = {k: v for k, v in d.items() if k in args.section}
        for name in (x for x in args.section if x not in d and not args.changed):  # left out: unread
            print(
                f"# {name}: not read by this config (e.g. critic.* without algo.advantage_estimator=gae), so left "
                f"out of the resolved config; its values would be:"
            )
            print(yaml.safe_dump({name: dataclasses.asdict(getattr(cfg, name))}, sort_keys=False), end="")
        if not d:
            return
    print(yaml.safe_dump(d, sort_keys=False) if d else "{}", end="" if d else "\n")


def _check_model(args) -> int:
    import tempfile

    from .check_model import check_model, failed, format_table, write_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        path = args.path
        if args.random_tiny:
            path = write_tiny_model(args.path, args.out or tmp, seed=args.seed)
            print(f"tiny random model of {args.path}: {path}")
        elif not Path(path, "config.json").exists():
            raise FileNotFoundError(f"check-model: {path} has no config.json (a Hugging Face folder is needed)")
        rows = check_model(path, tokens=args.tokens, seed=args.seed, speed=not args.no_speed)
    print(format_table(rows))
    bad = failed(rows)
    if bad:
        print(f"check-model: {len(bad)} check(s) failed: {', '.join(r.name for r in bad)}")
    return 1 if bad else 0


def build_parser() -> argparse.ArgumentParser:
    from .cli_hints import config_help

    epilog = config_help()
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="reinforge", description="RL post-training of language models", epilog=epilog, formatter_class=fmt
    )
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="run RL training (GRPO) from a YAML config", epilog=epilog, formatter_class=fmt)
    t.add_argument("--config", "-c", help="YAML config file")
    t.add_argument("--load", help="checkpoint (or run directory) to resume from")
    t.add_argument("--max-restarts", type=int, metavar="N", help=MAX_RESTARTS_HELP)
    t.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.lr=1e-6")
    t.set_defaults(func=_train)

    o = sub.add_parser(
        "offline",
        help="offline post-training: SFT, reward model, DPO / IPO / CPO / SimPO / ORPO "
        "/ KTO (offline.method) on a jsonl / parquet dataset",
        epilog=epilog,
        formatter_class=fmt,
    )
    o.add_argument("--config", "-c", help="YAML config file")
    o.add_argument("--load", help="checkpoint (or run directory) to resume from")
    o.add_argument("--max-restarts", type=int, metavar="N", help=MAX_RESTARTS_HELP)
    o.add_argument("overrides", nargs="*", help="key=value overrides, e.g. offline.method=dpo offline.beta=0.1")
    o.set_defaults(func=_offline)

    md = sub.add_parser(
        "make-data",
        help="build offline data from data.prompt_data with the policy: preference "
        "pairs, KTO examples, or SFT targets from reference answers",
    )
    md.add_argument(
        "kind",
        choices=["pairs", "kto", "sft", "tool-sft", "kd", "swe"],
        help="tool-sft: tool-use conversations (call, tool output, answer) written from the task's data; "
        "kd: model.path (a teacher) samples rollout.n_samples_per_prompt answers per prompt, written as SFT chats "
        "(sequence-level distillation); "
        "swe: synthetic Python repositories with one injected bug each, for agent.environment=swe "
        "(--num-prompts of them, --seed; no config or model)",
    )
    md.add_argument("--config", "-c", help="YAML config (model, data, rollout sampling, reward)")
    md.add_argument("--out", required=True, help="output .jsonl (swe: output folder)")
    md.add_argument(
        "--num-prompts", type=int, default=1000, help="prompts of data.prompt_data to use (default: %(default)s)"
    )
    md.add_argument(
        "--pairs-per-prompt",
        type=int,
        default=1,
        help="pairs: preference pairs written per prompt at most (default: %(default)s)",
    )
    md.add_argument("--seed", type=int, default=0, help="swe: the generator's seed")
    md.add_argument(
        "--answer-format",
        default="<answer>{answer}</answer>",
        help="sft: how the reference answer is written ({answer} is replaced)",
    )
    md.add_argument("overrides", nargs="*", help="key=value overrides, e.g. rollout.n_samples_per_prompt=8")
    md.set_defaults(func=_make_data)

    e = sub.add_parser("eval", help="evaluate a model on held-out prompts", epilog=epilog, formatter_class=fmt)
    e.add_argument("--model", help="HF folder, checkpoint model/ folder or known model name")
    e.add_argument(
        "--data",
        help="reasoning_gym:<task>, or a .jsonl / .json / .parquet file or saved `datasets` "
        "folder of prompts (docs/data.md); default: the config's held-out prompts",
    )
    e.add_argument("--config", "-c", help="YAML config (eval settings, task kwargs)")
    e.add_argument("--output-dir", help="where to write eval results (default run.output_dir)")
    e.add_argument(
        "overrides", nargs="*", help="key=value overrides, e.g. eval.n_samples_per_eval_prompt=8 data.n_eval_prompts=50"
    )
    e.set_defaults(func=_eval)

    g = sub.add_parser("generate", help="sample completions for one prompt")
    g.add_argument(
        "--model",
        help="HF folder, checkpoint model/ folder, known model name or cached hub id "
        "(default: the config's model.path)",
    )
    g.add_argument("--config", "-c", help="YAML config (model, engine, data.apply_chat_template / system_prompt)")
    g.add_argument("--prompt", required=True, help="the user message (rendered with the chat template)")
    g.add_argument("--system", help="system message (default: data.system_prompt)")
    g.add_argument("--n", type=int, default=1, help="completions to sample (default: %(default)s)")
    g.add_argument(
        "--max-new-tokens", type=int, default=128, help="new tokens per completion at most (default: %(default)s)"
    )
    g.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature; 0 is greedy (default: %(default)s)"
    )
    g.set_defaults(func=_generate)

    m = sub.add_parser(
        "models", help="list the known models or pull one into the cache (model.path then takes its name)"
    )
    m.add_argument(
        "action", choices=["list", "pull"], help="list: each known model and whether it is pulled; pull: fetch one"
    )
    m.add_argument("name", nargs="?", help="pull: the model's name, as `reinforge models list` prints it")
    m.add_argument("--force", action="store_true", help="pull: fetch and convert again even when already pulled")
    m.set_defaults(func=_models)

    c = sub.add_parser(
        "convert",
        help="export a checkpoint as a Hugging Face folder (bf16 by default; --dtype float32 keeps the weights)",
        description="Export a checkpoint's model as a Hugging Face folder that transformers and vLLM load. The "
        "weights are written in bfloat16 by default: half the size, but rounded from the fp32 weights the run "
        "trained and evaluated, so the exported model can score differently from the run's own evaluation "
        "table; --dtype float32 keeps them as trained.",
    )
    c.add_argument("--checkpoint", required=True, help="checkpoint dir, checkpoints/ dir or run dir (its newest)")
    c.add_argument("--out", required=True, help="the Hugging Face folder to write (config, weights, tokenizer)")
    c.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["bfloat16", "bf16", "float32", "fp32", "float16", "fp16"],
        help="weight dtype of the export (default: %(default)s, half the size; float32 keeps the trained "
        "weights exactly, as the run evaluated them)",
    )
    c.add_argument("--force", action="store_true", help="replace --out when it exists and is not empty")
    c.add_argument("--adapter-out", help="also write the LoRA adapter (a PEFT folder) of a LoRA run here")
    c.set_defaults(func=_convert)

    pl = sub.add_parser(
        "plan",
        help="each phase's memory and predicted time on a GPU, and the value of each `auto` key (docs/planner.md)",
        epilog=epilog,
        formatter_class=fmt,
    )
    pl.add_argument("--config", "-c", help="YAML config file")
    pl.add_argument(
        "--gpu", help="plan for this GPU (h100, h200, a100, a100 80gb, l40s, 4090) instead of this machine's"
    )
    pl.add_argument(
        "--prompt-len",
        type=int,
        help="the longest prompt in tokens (default: data.rollout_max_prompt_len; the datasets are not read)",
    )
    pl.add_argument(
        "--gpus",
        type=int,
        help="plan the layout over this many GPUs (Ray: colocated or disaggregated, docs/planner.md)",
    )
    pl.add_argument("--nodes", type=int, default=1, help="with --gpus: nodes the GPUs are spread over")
    pl.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.max_tokens_per_gpu=auto")
    pl.set_defaults(func=_plan)

    ck = sub.add_parser(
        "check-model",
        help="compare a model family against transformers: logits, engine log-probs, greedy tokens, weight sync, "
        "export, LoRA targets, speed (docs/design.md#adding-a-model-family)",
    )
    ck.add_argument(
        "path", help="a Hugging Face folder (config.json + safetensors), or a config.json with --random-tiny"
    )
    ck.add_argument(
        "--random-tiny",
        action="store_true",
        help="check a tiny random model of PATH's config (2-4 layers of width 64) instead of PATH's weights",
    )
    ck.add_argument("--out", help="with --random-tiny: keep the tiny model in this folder (default: a temporary one)")
    ck.add_argument("--tokens", type=int, default=64, help="greedy tokens compared (default 64)")
    ck.add_argument("--seed", type=int, default=0)
    ck.add_argument("--no-speed", action="store_true", help="skip the forward+backward speed row")
    ck.set_defaults(func=_check_model)

    from .eval.compare_cli import add_compare_parser

    add_compare_parser(sub)

    cf = sub.add_parser(
        "config",
        help="print the resolved config (defaults, -c file, key=value overrides) as YAML",
        epilog=epilog,
        formatter_class=fmt,
    )
    cf.add_argument("--config", "-c", help="YAML config file")
    cf.add_argument("--changed", action="store_true", help="only the keys whose value differs from the default")
    cf.add_argument("--section", action="append", metavar="NAME", help="only this section (repeatable)")
    cf.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.lr=1e-6")
    cf.set_defaults(func=_config)
    return p


def interrupted_line(command: str, e: KeyboardInterrupt) -> str:
    """The line ``reinforge`` ends with on a Ctrl-C that is not handled at a rollout boundary:
    during start-up (:class:`~reinforge.startup.StartupInterrupted`: nothing was trained or written
    yet), during a command without a run, or a second Ctrl-C during a run."""
    if isinstance(e, StartupInterrupted):
        return f"reinforge {command}: interrupted (Ctrl-C) during start-up, before the run began: nothing was trained"
    if command not in ("train", "offline", "eval"):
        return f"reinforge {command}: interrupted (Ctrl-C)"
    return (
        f"reinforge {command}: interrupted ({str(e) or 'Ctrl-C'}); no checkpoint was written at this point (the "
        f"newest one is kept)"
    )


def main(argv: list[str] | None = None) -> int:
    from .utils.logging import setup_logging

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may follow options (`make-data pairs --out f.jsonl train.seed=1`)
    if extra and hasattr(args, "overrides") and all("=" in x and not x.startswith("-") for x in extra):
        args.overrides = list(args.overrides) + extra
    elif extra:
        from .cli_hints import option_hint

        parser.error(f"unrecognized arguments: {' '.join(extra)}{option_hint(parser, args, extra)}")
    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    from .reward.manager import RewardFunctionFailing
    from .rollout.infra_guard import InfraFailing
    from .supervisor import DISK_FULL, record_failure
    from .utils.fs import DirectoryLocked, DiskFullError, NotWritableError
    from .weights.errors import WeightSyncMismatch

    phased = args.func in (_train, _offline, _eval)  # these mark their start-up themselves; others are all start-up
    try:
        with contextlib.nullcontext() if phased else startup(interrupt=False):
            code = args.func(args)
    except (*USAGE_ERRORS, DirectoryLocked) as e:
        record_failure(e)
        if args.verbose:
            raise
        print(f"reinforge {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (RewardFunctionFailing, InfraFailing) as e:  # one line: the function, a sample, the exception (no traceback)
        if args.verbose:
            raise
        print(f"reinforge {args.command}: error: {e}", file=sys.stderr)
        return 1
    except WeightSyncMismatch as e:  # one line: bucket, parameter, transport (docs/reliability.md)
        record_failure(e)
        if args.verbose:
            raise
        print(f"reinforge {args.command}: error: {e}", file=sys.stderr)
        return 1
    except DiskFullError as e:  # one message in words; the supervisor does not relaunch it
        record_failure(e)
        if args.verbose:
            raise
        print(f"reinforge {args.command}: error: {e.strerror or e}", file=sys.stderr)
        return DISK_FULL
    except NotWritableError as e:  # a checkpoint folder turned read-only: one line naming it; relaunched once
        record_failure(e)
        if args.verbose:
            raise
        print(f"reinforge {args.command}: error: {e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # a Ctrl-C outside a rollout boundary (or a second one)
        print(interrupted_line(args.command, e), file=sys.stderr)
        return 130
    except Exception as e:
        record_failure(e)
        raise
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
