"""The RL loop (single controller): take (rollout, reward) -> score (log-probs, advantages) -> train -> sync.

:class:`RLLoop` owns one run's parts: the prompt datasets, the :class:`~reinforge.cluster.base.Cluster`
(trainer ranks and rollout engine, local or Ray, behind one interface), the reward manager and
the rollout function; :meth:`RLLoop.rollout_step` is one iteration, :meth:`RLLoop.train` the loop.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import checkpoint as ckpt
from .cluster.base import ClusterSpec, build_cluster
from .cluster.resources import check_placement, machine_resources
from .cluster.sync_probe import build_probe
from .config import Config, ConfigError, dump_config
from .data import load_datasets
from .eval.evaluate import eval_plot_keys, evaluate, write_eval
from .models.hub import resolve_model_path
from .models.loading import load_tokenizer
from .plan.planner import Plan
from .plan.report import PlanReport
from .records import ReplicatedEngine, Sample, Status
from .reward import RewardManager
from .reward.manager import reward_info_metrics
from .rollout.agent import env_prompt_bound, prompt_tools
from .rollout.generate import RolloutContext, RolloutFn, default_rollout, model_stop_token_ids, rollout_stats
from .rollout.infra_guard import InfraGuard
from .rollout.source import AsyncRollouts, Rollout, RolloutSource, SyncRollouts
from .run import Driver, RunSpec, load_first, read_state, resume_candidates
from .train.rollout_advantages import apply_overlong_filter
from .train.rollout_share import RolloutBatch
from .utils import seeds, stall, trace
from .utils.imports import load_function
from .utils.logging import MetricsLogger

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rollout_metrics(cfg: Config, groups: list[list[Sample]]) -> dict[str, float]:
    """Reward and length statistics of the groups trained on (the advantages' come from the trainer
    ranks, ``Cluster.score``), over the scored samples: a failed one (infrastructure: status
    ``failed``) is counted in ``rollout/infra_failed_samples``, never averaged in with its placeholder
    reward. When every sample failed, the reward statistics are NaN (nothing was scored) and the
    lengths are those of every sample."""
    every = [s for g in groups for s in g]
    flat = [s for s in every if s.status != Status.FAILED]
    nan = float("nan")
    rewards = torch.tensor([s.reward for s in flat], dtype=torch.float32)
    lens = torch.tensor([s.response_length for s in flat or every], dtype=torch.float32)
    same = [len({s.reward for s in g if s.status != Status.FAILED}) <= 1 for g in groups]
    return {
        "rollout/reward_mean": float(rewards.mean()) if flat else nan,
        "rollout/reward_std": float(rewards.std()) if len(flat) > 1 else 0.0 if flat else nan,
        "rollout/correct": float((rewards >= cfg.reward.correct_threshold).float().mean()) if flat else nan,
        "rollout/zero_std_groups": sum(same) / len(groups),
        "rollout/response_len_mean": float(lens.mean()),
        "rollout/response_len_max": float(lens.max()),
        "rollout/truncated_ratio": sum(s.status == Status.TRUNCATED for s in flat) / len(flat) if flat else nan,
        "rollout/num_samples": float(len(flat)),
        "rollout/infra_failed_samples": float(len(every) - len(flat)),
    }


def _starts_ray_here(cfg: Config) -> bool:
    """Whether the run will start a Ray cluster on this machine (not one given by address or
    already running in this process: those are checked against their own resources)."""
    ray = sys.modules.get("ray")
    return cfg.cluster.mode == "ray" and not cfg.cluster.ray_address and not (ray is not None and ray.is_initialized())


@dataclass
class RunResult:
    """What a finished run reports (also used by tests)."""

    output_dir: Path
    last_rollout_id: int
    evals: list[tuple[str, dict[str, float]]] = field(default_factory=list)
    history: list[dict[str, float]] = field(default_factory=list)
    prompts: list[list[str]] = field(default_factory=list)  # each rollout's prompts, in order


class RLLoop:
    """Owns the components of one run and drives the loop (docs/design.md)."""

    def __init__(self, cfg: Config, plan: Plan | None = None):
        """``plan``: the plan ``reinforge train`` resolved and checked (:func:`reinforge.preflight.check_rl`),
        taken as it is; None: the ``auto`` keys are resolved here and every check runs once the datasets load."""
        self.cfg = cfg
        r = cfg.rollout
        self.out = Path(cfg.run.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        seed_everything(cfg.train.seed)
        self.base_path = resolve_model_path(cfg.model.path)
        from .plan import format_plan, resolve_config  # `auto` keys chosen for this GPU (docs/planner.md)

        checked = plan is not None
        if plan is None:
            cfg, self.plan = resolve_config(cfg, self.base_path, log_plan=True)
        else:
            cfg, self.plan = plan.cfg, plan
            log.info("plan:\n%s", format_plan(plan))
        self.cfg, self.plan_report = cfg, PlanReport(self.plan)  # plan/* metrics, the end line
        if _starts_ray_here(cfg):  # fail fast, before datasets load or Ray starts
            check_placement(cfg, machine_resources(), self.base_path)
        self.tokenizer = load_tokenizer(self.base_path)
        tools = prompt_tools(cfg, self.tokenizer)  # MCP servers: started once, listed, stopped (docs/agents.md)
        if cfg.reward.properties.get("judge"):  # the judge endpoint answers, before the policy is built
            from .reward.judge import check_endpoint

            check_endpoint(cfg.judge, cfg.reward.timeout)
        self.train_data, self.eval_data = load_datasets(  # (a custom rollout may score samples itself)
            cfg.data,
            self.tokenizer,
            tools.schemas,
            tools.system_text,
            reward=None if r.rollout_function_path or r.custom_generate_function_path else cfg.reward,
        )
        self._check_lengths(checked)  # the datasets' longest prompt, before anything is built
        from .distill.start import start_teachers  # on-policy distillation: teachers checked before anything runs

        self.endpoint_teachers = start_teachers(cfg, self.tokenizer, str(self.base_path), self.train_data.prompts)
        self.start_rollout = 0
        self.weight_version = 0
        self.data_digest = prompts_digest(self.train_data.prompts)
        self.doctor = stall.doctor_for(cfg.run, self.out)  # before any process starts: they join its reports
        candidates = resume_candidates(cfg, self.base_path)  # recover=auto: the run's own; else run.load's
        self.cluster = build_cluster(
            cfg,
            ClusterSpec(
                base_path=self.base_path,
                critic_path=resolve_model_path(cfg.critic.path) if cfg.critic.path else None,
                tokenizer=self.tokenizer,
                pad_id=self.tokenizer.pad_token_id or 0,
                max_model_len=self._max_model_len(),
            ),
        )
        self.engine = self.cluster.engine
        resume = load_first(cfg, candidates, self.cluster.load)  # newest first; a damaged one falls back
        self.cluster.sync_weights(self.weight_version)
        self.probe = build_probe(cfg, self.tokenizer, self.cluster)  # the log-prob probe (docs/reliability.md)
        self.reward = RewardManager(cfg.reward, pad_id=self.tokenizer.pad_token_id or 0, run=cfg)
        stops = model_stop_token_ids(self.tokenizer, str(self.base_path), r.rollout_stop_token_ids)
        self.ctx = RolloutContext(cfg, self.engine, self.tokenizer, self.reward, stops)
        self.rollout_fn: RolloutFn = (
            load_function(r.rollout_function_path, "rollout.rollout_function_path")
            if r.rollout_function_path
            else default_rollout
        )
        self.history: list[dict[str, float]] = []
        self.prompts: list[list[str]] = []  # each rollout's prompts, in order (RunResult.prompts)
        self._data_state: dict | None = None  # the rollout source's position, written by save()
        self._source_started = False
        self.infra = InfraGuard()  # infrastructure failures: counted, warned, and a run of nothing else stopped
        self.evals: list[tuple[str, dict[str, float]]] = []
        if resume is not None:
            self._restore(resume)
        # where rollouts come from: generated now, or ahead by a producer thread (rollout.max_staleness > 0)
        self.source: RolloutSource = (
            AsyncRollouts(
                cfg,
                self.rollout_fn,
                lambda gate: RolloutContext(cfg, gate, self.tokenizer, self.reward, stops),
                self.train_data,
                self.reward,
                self.engine,
            )
            if r.max_staleness > 0
            else SyncRollouts(cfg, self.rollout_fn, self.ctx, self.train_data, self.reward)
        )
        if resume is not None:
            self.source.load_data_state(self._resume_data, resume)
        dump_config(cfg, self.out / "config.yaml")
        self.driver = Driver(
            self,
            cfg,
            RunSpec(
                command="train",
                unit="rollout",
                position_key="rollout_id",
                total=cfg.train.num_rollout,
                trace_title="reinforge train",
                progress_desc="rollouts",
                progress_unit="rollout",
                postfix=lambda m: {
                    "reward": f"{m['rollout/reward_mean']:.3f}",
                    "len": f"{m['rollout/response_len_mean']:.0f}",
                    "step_s": f"{m['time/rollout_step']:.1f}",
                },
                summary={
                    "more_key": "train.num_rollout",
                    "curve_key": "rollout/reward_mean",
                    "eval_keys": eval_plot_keys(cfg.reward.type),
                    "x_label": "rollout",
                },
                first_row={
                    "data/num_prompts": float(len(self.train_data)),
                    "data/dropped_prompts": float(self.train_data.num_dropped),
                },
            ),
        )

    def _check_lengths(self, checked: bool) -> None:
        """The up-front checks at the datasets' longest prompt (reinforge/preflight.py): those that depend on it
        when ``reinforge train`` checked the rest (``checked``), else all of them, on the run's plan (resolved once)."""
        from .preflight import check_lengths, check_rl, prompt_tokens_of

        prompt = prompt_tokens_of(self.cfg, self._max_model_len())
        if checked:
            check_lengths(self.plan, self.base_path, prompt)
        else:
            check_rl(self.cfg, self.base_path, prompt, plan=self.plan)

    def _max_model_len(self) -> int:
        """Longest prompt of the datasets (or of an environment's ``reset()``) plus the longest
        response of training or evaluation."""
        max_prompt = self.train_data.max_prompt_tokens
        if self.eval_data is not None:
            max_prompt = max(max_prompt, self.eval_data.max_prompt_tokens)
        env_bound = env_prompt_bound(self.cfg)  # an environment's reset() may give prompts of its own
        if env_bound is not None:
            max_prompt = max(max_prompt, env_bound[0])
        return max_prompt + max(self.cfg.rollout.rollout_max_response_len, self.cfg.eval.eval_max_response_len or 0)

    # ------------------------------------------------------------------ state
    @property
    def start(self) -> int:
        """The first rollout to run (the driver's :class:`~reinforge.run.Job` protocol)."""
        return self.start_rollout

    def _restore(self, path: Path) -> None:
        state, rng = read_state(path, self.cfg)
        saved_digest = state.get("data_digest")
        if saved_digest is not None and saved_digest != self.data_digest:
            what = (
                f"the prompts of data.prompt_data={self.cfg.data.prompt_data} differ from those checkpoint {path} "
                f"was trained on (same count, other contents)"
            )
            if self.cfg.run.recover == "auto":
                raise ConfigError(
                    f"run.recover=auto cannot resume: {what}. Restore the file, choose a new "
                    f"run.output_dir, or resume explicitly with run.load={path} (and run.recover=off) "
                    f"to continue on the new prompts"
                )
            log.warning("%s: continuing at the saved position of the new prompts", what)
        self._resume_data = state["data"]  # loaded by the rollout source (RolloutSource.load_data_state)
        ckpt.set_rng_state(rng)
        self.start_rollout = state["rollout_id"] + 1
        self.weight_version = state["weight_version"]
        self.engine.weight_version = self.weight_version
        self.history = state.get("history", [])
        self.evals = [(ckpt.resumed_label(e[0], self.start_rollout, "rollout"), e[1]) for e in state.get("evals", [])]
        if self.start_rollout >= self.cfg.train.num_rollout:
            log.warning(
                "checkpoint %s is at rollout %d of train.num_rollout=%d: nothing left to train (raise "
                "train.num_rollout to continue)",
                path,
                state["rollout_id"] + 1,
                self.cfg.train.num_rollout,
            )
        else:
            log.info(
                "resumed at rollout %d of %d (data epoch %d, offset %d)",
                self.start_rollout,
                self.cfg.train.num_rollout,
                state["data"]["epoch"],
                state["data"]["offset"],
            )

    def save(self, directory: Path | None, rollout_id: int) -> None:
        """Write the trainers' part of the checkpoint of rollout ``rollout_id`` into ``directory``, then
        the rollout source's position (asynchronous: the rollouts in flight finish meanwhile and are
        kept in ``directory``); :meth:`state` returns it."""
        self.cluster.save(directory, optimizer=self.cfg.run.save_optimizer != "none")
        self._data_state = self.source.data_state(rollout_id, directory)

    def state(self) -> dict:
        """``state.json``'s entries besides the rollout id, config and evaluations (after :meth:`save`)."""
        return {
            "weight_version": self.weight_version,
            "data": self._data_state,
            "history": self.history,
            "data_digest": self.data_digest,
        }

    # ------------------------------------------------------------------ phases
    def sync_weights(self) -> dict[str, float]:
        """Push the policy to the engine(s) as the next version (asynchronous: through the gate,
        which lets the generation in flight finish or interrupts it, ``rollout.partial_rollout``)."""
        self.weight_version += 1
        version = self.weight_version
        out = self.source.sync_weights(lambda: self.cluster.sync_weights(version), version)
        if self.probe.due(version):
            with self.source.exclusive():  # asynchronous: the producer's generation pauses meanwhile
                out.update(self.probe(version))
        return out

    def run_eval(self, label: str, step: int, logger: MetricsLogger) -> dict[str, float] | None:
        """:meth:`evaluate`, logged at ``step`` and kept in :attr:`evals` (``reinforge eval``)."""
        metrics = self.evaluate(label, step)
        if metrics is not None:
            logger.log(step, metrics)
            self.evals.append((label, metrics))
        return metrics

    def evaluate(self, label: str, step: int) -> dict[str, float] | None:
        """Evaluate the policy on the evaluation prompts after ``step`` rollouts (written to
        ``<output_dir>/eval``; the caller logs the metrics); None without evaluation prompts."""
        if self.eval_data is None:
            return None
        with trace.span("eval", "eval", label=label) as s:
            with self.source.exclusive():  # asynchronous: the producer's generation pauses meanwhile
                self._seed_engine(seeds.EVAL_OFFSET + step)
                metrics, samples = evaluate(self.ctx, self.eval_data.prompts, label)
        metrics["time/eval"] = s.seconds
        self.infra.observe_eval(label, samples)  # a warning per kind; reinforge eval: all failed -> exit 1
        write_eval(self.out, label, metrics, samples)
        return metrics

    def _seed_engine(self, value: int) -> None:
        self.engine.reseed(seeds.derive(self.cfg.rollout.seed, seeds.ENGINE_ROLLOUT, value))

    def rollout_step(self, rollout_id: int) -> tuple[dict[str, float], list[list[Sample]]]:
        """One RL iteration: take -> score -> train -> sync. Returns the metrics and every group
        generated (including those dynamic sampling dropped).

        * take: the rollout, generated and rewarded (:class:`~reinforge.rollout.source.RolloutSource`;
          asynchronous, ``rollout.max_staleness`` > 0: from the producer thread, generated meanwhile
          by policy versions ``>= rollout_id - max_staleness``), the over-long filter applied;
        * score: the rollout goes to the trainer ranks once; each computes the old / reference
          log-probs, values and advantages of its share and keeps them (``Cluster.score``);
        * train: the critic's and the policy's optimizer steps on the ranks (``Cluster.train``);
        * sync: the new weights into the engine(s).

        From the trainer ranks only metrics come back to this process."""
        cl = self.cluster
        rollout = self.source.take(rollout_id)
        teachers = self.endpoint_teachers.score(rollout.groups) if self.endpoint_teachers else {}  # (distill)
        infra = self.infra.observe(rollout_id, [s for g in rollout.generated for s in g])  # all failed: stop
        flat = [s for g in rollout.groups for s in g]
        filtered = apply_overlong_filter(self.cfg.algo, flat)
        with trace.span("offload", "train", to="host") as sleeping:  # the engine's cache (and weights) freed
            cl.before_train()
        with trace.span("score", "train", rollout_id=rollout_id) as scoring:
            scored = cl.score(RolloutBatch(rollout.groups, rollout_id))
        with trace.span("train", "train", rollout_id=rollout_id, samples=len(flat)) as training:
            trained = cl.train(rollout_id)
        with trace.span("offload", "train", to="device") as waking:
            cl.after_train()
        with trace.span("weight_sync", "sync", version=self.weight_version + 1):
            sync = self.sync_weights()
        timings = {k: rollout.metrics[k] for k in ("time/generate", "time/reward") if k in rollout.metrics}
        timings["time/logprob"] = scoring.seconds
        if "time/train_critic" in trained:  # (measured on the trainer: the critic's part of the call)
            timings["time/train_critic"] = trained.pop("time/train_critic")
        timings["time/train"] = training.seconds - timings.get("time/train_critic", 0.0)
        timings["time/sync"] = sync.pop("time/sync")
        timings["time/offload"] = sleeping.seconds + waking.seconds
        metrics = {**scored, **trained, **sync, **infra, **teachers, "rollout/overlong_filtered": float(filtered)}
        return self._step_metrics(rollout, flat, metrics, timings), rollout.generated

    def _step_metrics(
        self, rollout: Rollout, flat: list[Sample], metrics: dict[str, float], timings: dict[str, float]
    ) -> dict[str, float]:
        """One step's metrics: the trainers' (``metrics``), the rollout's own, the rewards, lengths and
        throughput computed here, the plan's prediction against the ``timings``."""
        generated = [s for g in rollout.generated for s in g]
        out = rollout_metrics(self.cfg, rollout.groups)
        out.update(metrics)
        rewards = [s.reward for s in generated if s.status != Status.FAILED]
        out["rollout/generated_reward_mean"] = (
            float(torch.tensor(rewards, dtype=torch.float32).mean()) if rewards else float("nan")
        )
        out.update({k: v for k, v in rollout.metrics.items() if k not in timings})
        out.update(rollout_stats(generated))
        out.update(reward_info_metrics(generated))  # a custom reward's extra numbers
        out["perf/generate_tokens_per_s"] = sum(s.response_length for s in generated) / max(rollout.generate_s, 1e-9)
        out["perf/train_tokens_per_s"] = sum(len(s.tokens) for s in flat) / max(timings["time/train"], 1e-9)
        out["weight_version"] = float(self.weight_version)
        restarts = self.engine.restarts if isinstance(self.engine, ReplicatedEngine) else 0  # Ray: replaced engines
        out["rollout/engine_restarts"] = float(restarts)
        out.update(timings)
        out["time/rollout_step"] = sum(timings.values())
        out.update(self.plan_report.rollout(out, rollout.generated, flat))  # predicted vs measured
        return out

    # ------------------------------------------------------------------ the driver's job
    def step(self, rollout_id: int) -> dict[str, float]:
        """:meth:`rollout_step`, its prompts and history kept, its rollouts dumped (``run.dump_rollouts``)."""
        if not self._source_started:  # after the evaluation before training (the producer would race it)
            self.source.start(self.start_rollout, self.cfg.train.num_rollout)
            self._source_started = True
        with trace.span("rollout_step", rollout_id=rollout_id):
            metrics, groups = self.rollout_step(rollout_id)
        self.prompts.append([str(g[0].prompt) for g in groups])
        metrics["rollout_id"] = float(rollout_id)
        self.history.append({k: metrics[k] for k in ("rollout/reward_mean", "rollout/correct")})
        if self.cfg.run.dump_rollouts:
            self._dump(rollout_id, groups)
        return metrics

    def begin(self) -> None:
        if self.doctor is not None:
            self.doctor.start()  # no progress for run.stall_timeout_s: one line, every stack, exit
        self.probe(self.weight_version, start=True)  # the weights at start-up (or resume), proven once

    def finish(self) -> str | None:
        self.reward.check_run()  # every reward failed: exit non-zero however short the run
        self.infra.check_run()  # every sample failed by infrastructure: the same
        self.source.close()
        return self.plan_report.finish(log_line=False)  # the phase furthest from its limit (printed by the driver)

    def cleanup(self) -> None:
        if self.doctor is not None:
            self.doctor.stop()
        self.source.close()

    def train(self) -> RunResult:
        """Run the remaining rollouts (:class:`~reinforge.run.Driver`: evaluations, checkpoints, logging,
        the summary).

        Raises:
            Preempted: SIGTERM / SIGINT arrived; a checkpoint holds the last rollout finished."""
        last = self.driver.run()
        return RunResult(self.out, last, list(self.evals), list(self.history), self.prompts)

    def _dump(self, rollout_id: int, groups: list[list[Sample]]) -> None:
        import json

        d = self.out / "rollouts"
        d.mkdir(exist_ok=True)
        with (d / f"{rollout_id:06d}.jsonl").open("w") as f:
            for g in groups:
                for s in g:
                    f.write(json.dumps(s.to_dict(), default=str) + "\n")

    def close(self) -> None:
        if self.doctor is not None:
            self.doctor.stop()
        self.source.shutdown()
        self.ctx.close()
        self.reward.close()
        self.cluster.shutdown()


def prompts_digest(prompts: list) -> str:
    """SHA-256 of the prompts' contents and labels, in order (a checkpoint stores it, so a resume on
    a file whose rows changed but whose count did not is noticed)."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps([p.prompt, p.label], sort_keys=True, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def run_training(cfg: Config) -> RunResult:
    """Run the RL loop of ``cfg`` to the end (or from its checkpoint) and release everything."""
    loop = RLLoop(cfg)
    try:
        return loop.train()
    finally:
        loop.close()
