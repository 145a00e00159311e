"""The offline loop (``reinforge offline``): SFT, reward models, DPO and its family, KTO.

One process per trainer rank: run it directly for one rank, or under ``torchrun`` for several
(``torchrun --nproc-per-node 2 -m reinforge offline -c cfg.yaml``; ranks share the work of every
step, FSDP2-sharded as in the RL trainer). Steps take ``offline.global_batch_size`` examples in
a seeded order per epoch; evaluation runs on the held-out examples before training, every
``eval.eval_interval`` steps and at the end; checkpoints (atomic, exact resume) are written every
``run.save_interval`` steps and at the end. :class:`OfflineLoop` is a job of the run driver
(:class:`reinforge.run.Driver`: logging, progress, cadence, ``run.recover=auto`` and SIGTERM
checkpoints, the summary); ``reinforge offline --max-restarts N`` relaunches it after a crash.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import checkpoint as ckpt
from .config import Config, ConfigError, dump_config
from .data.offline import OfflineDataset, load_offline_datasets
from .models.hub import resolve_model_path
from .models.loading import load_tokenizer, save_hf_state_dict
from .models.reward_model import save_reward_model
from .parallel_layout import Layout
from .preflight import check_offline, longest_example
from .recover import OFFLINE_RESUME_KEYS
from .rollout.generate import model_stop_token_ids
from .run import Driver, RunSpec, load_first, read_state, resume_candidates
from .train.collectives import ParallelContext
from .train.export import read_trainer_state, write_trainers
from .train.offline import OfflineTrainer, RefLogps
from .train.on_policy import is_on_policy_step, student_examples
from .utils import trace
from .utils.device import resolve_device

log = logging.getLogger(__name__)


def _rank_env() -> tuple[int, int, str, int, int]:
    """(rank, world size, master address, master port, local rank) from torchrun's variables."""
    env = os.environ
    return (
        int(env.get("RANK", 0)),
        int(env.get("WORLD_SIZE", 1)),
        env.get("MASTER_ADDR", "127.0.0.1"),
        int(env.get("MASTER_PORT", 29500)),
        int(env.get("LOCAL_RANK", 0)),
    )


class OfflineLoop:
    """Owns one offline run: data, the trainer (and reference log-probs), logging, checkpoints.

    Args:
        cfg: the run's config (``offline`` section, plus ``model``, ``train``, ``data``, ``eval``, ``run``).
        rank, world_size, master_addr, master_port: this process's place among the ranks (defaults:
            torchrun's environment, else one rank).
    """

    def __init__(
        self,
        cfg: Config,
        rank: int | None = None,
        world_size: int | None = None,
        master_addr: str | None = None,
        master_port: int | None = None,
    ):
        env_rank, env_world, env_addr, env_port, local = _rank_env()
        rank = env_rank if rank is None else rank
        world = env_world if world_size is None else world_size
        self.cfg, o = cfg, cfg.offline
        self.out = Path(cfg.run.output_dir)
        self.device = resolve_device(cfg.train.device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", local)
            torch.cuda.set_device(self.device)
        self.parallel = ParallelContext.init(
            rank,
            world,
            master_addr or env_addr,
            master_port or env_port,
            self.device,
            layout=Layout.of_train(cfg.train, world),
            single_rank_fsdp=cfg.train.fsdp_cpu_offload,
        )
        self.is_main = self.parallel.rank == 0
        torch.manual_seed(cfg.train.seed)
        self.base_path = resolve_model_path(cfg.model.path)
        self.tokenizer = load_tokenizer(self.base_path)
        d = cfg.data
        self.train_set, self.eval_set = load_offline_datasets(
            o, self.tokenizer, d.system_prompt, d.seed, d.apply_chat_template
        )
        sets = [self.train_set] + ([self.eval_set] if self.eval_set else [])  # lengths and budget, before the trainer
        sampled = o.gkd_max_new_tokens if o.method == "gkd" and o.gkd_lmbda > 0 else 0  # the student's samples
        check_offline(cfg, self.base_path, max(longest_example(s.examples, sampled) for s in sets))
        self.steps_per_epoch = math.ceil(len(self.train_set.examples) / o.global_batch_size)
        self.total_steps = self.steps_per_epoch * o.num_epochs
        self.trainer = OfflineTrainer(
            cfg, self.base_path, self.device, self.total_steps, self.parallel, pad_id=self.tokenizer.pad_token_id or 0
        )
        self.start_step = 0
        self.stop_ids: list[int] | None = None  # the model's EOS ids, when GKD first samples the student
        self.evals: list[tuple[str, dict[str, float]]] = []
        candidates = self._candidates()
        if candidates and cfg.run.recover != "auto":  # (auto: the method is among the keys compared)
            self._check_method(candidates[0])
        resume = load_first(cfg, candidates, self._load)
        if resume is not None:
            self._restore(resume)
        self.ref = self._reference(self.train_set, "train")
        self.eval_ref = self._reference(self.eval_set, "eval") if self.eval_set else None
        if self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            dump_config(cfg, self.out / "config.yaml")
        main, parallel = self.is_main, self.parallel
        several = parallel.world_size > 1
        self.driver = Driver(
            self,
            cfg,
            RunSpec(
                command="offline",
                unit="step",
                position_key="step",
                total=self.total_steps,
                trace_title=f"reinforge offline {o.method}",
                progress_desc=o.method,
                progress_unit="step",
                postfix=lambda m: {"loss": f"{m['train/loss']:.4f}"},
                summary={
                    "more_key": "offline.num_epochs",
                    "curve_key": "train/loss",
                    "eval_keys": ("eval/loss", "eval/rewards/accuracy"),
                    "x_label": "optimizer step",
                    "policy": not self.trainer.is_reward,
                },
                first_row={
                    "data/num_examples": float(len(self.train_set.examples)),
                    **{f"data/{k}": float(v) for k, v in self.train_set.counts.items()},
                },
                is_main=main,
                agree=(lambda due: parallel.sum_floats({"due": float(due)})["due"] > 0)
                if several
                else (lambda due: due),
                barrier=parallel.barrier,
            ),
        )

    def _candidates(self) -> list[Path]:
        """The checkpoints to resume from (:func:`~reinforge.run.resume_candidates`), chosen on rank 0
        (which removes the leftovers of interrupted saves) and told to the other ranks."""
        mine = resume_candidates(self.cfg, self.base_path, "step", OFFLINE_RESUME_KEYS) if self.is_main else None
        if self.parallel.distributed:
            mine = self.parallel.gather_objects([str(p) for p in mine] if mine is not None else None)[0]
        return [Path(p) for p in mine or []]

    # ------------------------------------------------------------------ reference log-probs
    def _reference(self, dataset: OfflineDataset | None, name: str) -> RefLogps | None:
        """Precomputed reference log-probs, cached in ``<output_dir>/ref_logps_<name>.pt`` (a resumed
        run reads them back; they are computed with the initial weights, before any step)."""
        if dataset is None or not self.trainer.needs_reference or not self.cfg.offline.precompute_ref_log_probs:
            return None
        path = self.out / f"ref_logps_{name}.pt"
        if path.is_file():
            data = torch.load(path, map_location="cpu", weights_only=True)
            if len(data["sums"]) == len(dataset.examples):
                return RefLogps(**data)
            log.warning(
                "%s holds %d examples, the data has %d: recomputing", path, len(data["sums"]), len(dataset.examples)
            )
        if self.start_step > 0:
            raise RuntimeError(
                f"{path} is missing: a resumed run cannot recompute the reference log-probs (the "
                f"weights have changed); start the run again or set "
                f"offline.precompute_ref_log_probs=false"
            )
        with trace.span("ref_log_probs", "train", examples=len(dataset.examples)) as s:
            ref = self.trainer.reference_logps(dataset.examples)
        log.info("reference log-probs of %d %s examples in %.1f s", len(dataset.examples), name, s.seconds)
        if self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            torch.save(ref.to_dict(), path)
        return ref

    # ------------------------------------------------------------------ steps
    def step_ids(self, step: int) -> list[int]:
        """Example indices of optimizer step ``step`` (a seeded permutation per epoch)."""
        epoch, k = divmod(step, self.steps_per_epoch)
        n, b = len(self.train_set.examples), self.cfg.offline.global_batch_size
        order = (
            np.random.RandomState(self.cfg.data.seed + epoch).permutation(n).tolist()
            if self.cfg.offline.shuffle
            else list(range(n))
        )
        return order[k * b : (k + 1) * b]

    @property
    def start(self) -> int:
        """The first step to run (the driver's :class:`~reinforge.run.Job` protocol)."""
        return self.start_step

    def evaluate(self, label: str, i: int) -> dict[str, float] | None:
        """Loss and reward metrics on the held-out examples (no update), averaged over them."""
        if self.eval_set is None:
            return None
        n, b = len(self.eval_set.examples), self.cfg.offline.global_batch_size
        totals: dict[str, float] = {}
        with trace.span("eval", "eval", label=label) as s:
            for start in range(0, n, b):
                ids = list(range(start, min(start + b, n)))
                for k, v in self.trainer.step(self.eval_set.examples, ids, self.eval_ref, train=False).items():
                    totals[k] = totals.get(k, 0.0) + v * len(ids) / n
        metrics = {f"eval/{k}": v for k, v in totals.items()}
        metrics["eval/num_examples"] = float(n)
        metrics["time/eval"] = s.seconds
        return metrics

    def step(self, i: int) -> dict[str, float]:
        """Optimizer step ``i`` on the examples of :meth:`step_ids` (GKD's on-policy steps, ``offline.gkd_lmbda``:
        on the student's samples for their prompts); its ``train/*`` metrics."""
        examples, ids = self.train_set.examples, self.step_ids(i)
        o, seed = self.cfg.offline, self.cfg.data.seed
        on_policy = self.trainer.teacher is not None and is_on_policy_step(o.gkd_lmbda, seed, i)
        if on_policy:
            if self.stop_ids is None:
                self.stop_ids = model_stop_token_ids(self.tokenizer, str(self.base_path), [])
            with trace.span("student_samples", "train", step=i):
                examples = student_examples(
                    self.trainer, examples, ids, o.gkd_max_new_tokens, o.gkd_temperature, self.stop_ids, seed + i
                )
            ids = list(range(len(examples)))
        with trace.span("train", "train", step=i) as s:
            metrics = {f"train/{k}": v for k, v in self.trainer.step(examples, ids, self.ref).items()}
        if self.trainer.teacher is not None:
            metrics["train/on_policy"] = float(on_policy)
        metrics["time/step"] = s.seconds
        metrics["epoch"] = i / self.steps_per_epoch
        return metrics

    def begin(self) -> None:
        pass

    def finish(self) -> str | None:
        return None

    def cleanup(self) -> None:
        pass

    def train(self) -> list[tuple[str, dict[str, float]]]:
        """Run the remaining steps (:class:`~reinforge.run.Driver`); returns the evaluations (label, metrics).

        Raises:
            Preempted: SIGTERM / SIGINT arrived; a checkpoint holds the last step finished."""
        self.driver.run()
        return self.evals

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory: Path | None, i: int) -> None:
        """Write this rank's part of the checkpoint of step ``i`` (``directory`` None except on rank 0,
        which tells the others): the trainer as ``dcp/model``, the model (or reward model) folder."""
        d = Path(self.parallel.gather_objects(str(directory) if directory else None)[0])
        t = self.trainer

        def write_hf(full: dict[str, torch.Tensor], folder: Path) -> None:
            if t.is_reward:
                hf = {n.removeprefix("backbone."): v for n, v in full.items() if not n.startswith("backbone.lm_head")}
                save_reward_model(hf, folder, self.base_path, self.tokenizer.pad_token_id)
            else:
                save_hf_state_dict(full, folder, self.base_path)

        write_trainers(d, {"model": t}, self.base_path, self.cfg.run.save_optimizer != "none", write_hf=write_hf)

    def state(self) -> dict[str, Any]:
        """``state.json``'s entries besides the step, config and evaluations."""
        return {"method": self.cfg.offline.method}

    def _check_method(self, path: Path) -> None:
        saved = ckpt.load_checkpoint_state(path)[0].get("method")
        if saved != self.cfg.offline.method:
            raise ConfigError(
                f"{path} is a checkpoint of offline.method={saved!r}, not {self.cfg.offline.method!r}: "
                f"set offline.method={saved} to resume it, or choose another run.load / run.output_dir"
            )

    def _load(self, path: Path) -> list[str]:
        """The trainer's weights, optimizer and scheduler state of checkpoint ``path``; ``["model"]``
        when it holds no optimizer state."""
        return [] if self.trainer.load(str(path / "dcp" / "model"), read_trainer_state(path, "model")) else ["model"]

    def _restore(self, path: Path) -> None:
        state, _ = read_state(path, self.cfg)  # (a changed train.lr is named: issue 38)
        self.start_step = state["step"] + 1
        self.evals = [(ckpt.resumed_label(e[0], self.start_step, "step"), e[1]) for e in state.get("evals", [])]
        if self.start_step >= self.total_steps:
            log.warning(
                "checkpoint %s is at step %d of %d (offline.num_epochs=%d x %d steps): nothing left to train "
                "(raise offline.num_epochs to continue)",
                path,
                self.start_step,
                self.total_steps,
                self.cfg.offline.num_epochs,
                self.steps_per_epoch,
            )
        else:
            log.info("resumed from %s at step %d of %d", path, self.start_step, self.total_steps)

    def close(self) -> None:
        self.parallel.close()


def run_offline(cfg: Config, **rank_kwargs: Any) -> list[tuple[str, dict[str, float]]]:
    """Run ``cfg``'s offline method to the end (or from its checkpoint); returns the evaluations."""
    loop = OfflineLoop(cfg, **rank_kwargs)
    try:
        return loop.train()
    finally:
        loop.close()
