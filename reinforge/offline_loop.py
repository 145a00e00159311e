"""The offline loop (``reinforge offline``): SFT, reward models, DPO and its family, KTO.

One process per trainer rank: run it directly for one rank, or under ``torchrun`` for several
(``torchrun --nproc-per-node 2 -m reinforge offline -c cfg.yaml``; ranks share the work of every
step, FSDP2-sharded as in the RL trainer). Steps take ``offline.global_batch_size`` examples in
a seeded order per epoch; evaluation runs on the held-out examples before training, every
``eval.eval_interval`` steps and at the end; checkpoints (atomic, exact resume) are written every
``run.save_interval`` steps and at the end.
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
from .config import Config, dump_config
from .data.offline import OfflineDataset, load_offline_datasets
from .eval.summary import print_run_summary
from .models.hub import resolve_model_path
from .models.loading import load_tokenizer, save_hf_state_dict
from .models.lora import adapter_state_dict, has_lora, merged_named_weights, save_adapter
from .models.reward_model import save_reward_model
from .parallel_layout import Layout
from .preflight import check_offline, longest_example
from .recover import changed_settings
from .train.offline import OfflineTrainer, RefLogps
from .train.parallel import ParallelContext, full_tensor
from .utils import trace
from .utils.device import resolve_device
from .utils.logging import MetricsLogger

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
        check_offline(cfg, self.base_path, max(longest_example(s.examples) for s in sets))
        self.steps_per_epoch = math.ceil(len(self.train_set.examples) / o.global_batch_size)
        self.total_steps = self.steps_per_epoch * o.num_epochs
        self.trainer = OfflineTrainer(
            cfg, self.base_path, self.device, self.total_steps, self.parallel, pad_id=self.tokenizer.pad_token_id or 0
        )
        self.start_step = 0
        self.evals: list[tuple[str, dict[str, float]]] = []
        if cfg.run.load:
            self._restore(
                ckpt.load_candidates(cfg.run.load, prefix="step", warn=log.warning, model_path=self.base_path)[0]
            )
        self.ref = self._reference(self.train_set, "train")
        self.eval_ref = self._reference(self.eval_set, "eval") if self.eval_set else None
        if self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            dump_config(cfg, self.out / "config.yaml")

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

    def evaluate(self, label: str, step: int, logger: MetricsLogger | None) -> dict[str, float] | None:
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
        if logger is not None:
            logger.log(step, metrics)
        self.evals.append((label, metrics))
        return metrics

    def train(self) -> list[tuple[str, dict[str, float]]]:
        """Run the remaining steps; returns the evaluations (label, metrics)."""
        cfg = self.cfg
        r, e = cfg.run, cfg.eval
        logger = None
        if self.is_main:
            logger = MetricsLogger(
                self.out,
                r.tensorboard,
                wandb_project=r.wandb_project,
                wandb_group=r.wandb_group,
                wandb_mode=r.wandb_mode,
                config=cfg.to_dict(),
                start_step=self.start_step + 1 if self.start_step else 0,  # drop redone rows (and a row cut short)
            )
            if self.start_step == 0:
                counts = {f"data/{k}": float(v) for k, v in self.train_set.counts.items()}
                logger.log(0, {"data/num_examples": float(len(self.train_set.examples)), **counts})
        bar = None
        if r.progress and self.is_main:
            from tqdm.auto import tqdm

            bar = tqdm(
                total=self.total_steps,
                initial=self.start_step,
                desc=cfg.offline.method,
                unit="step",
                dynamic_ncols=True,
            )
        if r.trace and self.is_main:
            trace.start_trace(self.out / trace.TRACE_FILE, f"reinforge offline {cfg.offline.method}")
        try:
            if e.eval_before_train and self.start_step == 0:
                self.evaluate("before", 0, logger)
            for step in range(self.start_step, self.total_steps):
                with trace.span("train", "train", step=step) as s:
                    metrics = {
                        f"train/{k}": v
                        for k, v in self.trainer.step(self.train_set.examples, self.step_ids(step), self.ref).items()
                    }
                metrics["time/step"] = s.seconds
                metrics["epoch"] = step / self.steps_per_epoch
                if logger is not None:
                    logger.log(step + 1, metrics)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{metrics['train/loss']:.4f}")
                last = step == self.total_steps - 1
                if e.eval_interval and (step + 1) % e.eval_interval == 0 and not last:
                    self.evaluate(f"step_{step + 1}", step + 1, logger)
                if r.save_interval and (step + 1) % r.save_interval == 0 and not last:
                    self.save(step)
            if self.start_step < self.total_steps:
                self.evaluate("after", self.total_steps, logger)
                if r.save_final:
                    self.save(self.total_steps - 1)
        finally:
            trace.stop_trace()
            if bar is not None:
                bar.close()
            if logger is not None:
                logger.close()
        if self.is_main:
            print_run_summary(
                self.out,
                self.evals,
                command="offline",
                checkpoint=ckpt.latest_checkpoint(self.out),
                more_key="offline.num_epochs",
                curve_key="train/loss",
                eval_keys=("eval/loss", "eval/rewards/accuracy"),
                x_label="optimizer step",
                policy=not self.trainer.is_reward,
            )
        return self.evals

    # ------------------------------------------------------------------ checkpoints
    def save(self, step: int) -> Path | None:
        """Checkpoint after optimizer step ``step`` (every rank takes part; rank 0 renames it into place)."""
        state = {"step": step, "config": self.cfg.to_dict(), "evals": self.evals, "method": self.cfg.offline.method}
        with trace.span("checkpoint", "io", step=step):
            keep = self.cfg.run.save_optimizer
            if self.is_main:
                path = ckpt.save_checkpoint(
                    self.out / "checkpoints",
                    step,
                    self._write,
                    state,
                    keep_last=self.cfg.run.keep_last_n_checkpoints,
                    prefix="step",
                    drop_older_optimizer=keep == "newest",
                )
                log.info("saved checkpoint %s (%s)", path, ckpt.size_summary(path))
            else:
                self._write(None)
                path = None
            self.parallel.barrier()
        return path

    def _write(self, directory: Path | None) -> None:
        d = Path(self.parallel.gather_objects(str(directory) if directory else None)[0])
        t = self.trainer
        trainer_state = t.save(str(d / "dcp" / "model"), optimizer=self.cfg.run.save_optimizer != "none")
        lora = has_lora(t.model)
        if lora:  # the merged policy, and the adapter alone
            full = {n: v.cpu() for n, v in merged_named_weights(t.model, full_tensor)}
            adapter = adapter_state_dict(t.model, full_tensor)
        else:
            full = t.full_state_dict()
        if self.is_main:
            if t.is_reward:
                hf = {n.removeprefix("backbone."): v for n, v in full.items() if not n.startswith("backbone.lm_head")}
                save_reward_model(hf, d / "model", self.base_path, self.tokenizer.pad_token_id)
            else:
                save_hf_state_dict(full, d / "model", self.base_path)
            if lora:
                save_adapter(adapter, t.model.lora_config, d / "adapter", self.base_path)
            torch.save(trainer_state, d / "trainer_state.pt")
        self.parallel.barrier()

    def _restore(self, path: Path) -> None:
        state, _ = ckpt.load_checkpoint_state(path)
        if state.get("method") != self.cfg.offline.method:
            raise ValueError(
                f"{path} is a checkpoint of offline.method={state.get('method')!r}, not {self.cfg.offline.method!r}"
            )
        changed = changed_settings(state["config"], self.cfg)  # (train.lr included: issue 38)
        if changed:
            log.warning(
                "resuming %s with settings that differ from the checkpoint's: %s; the run will not continue exactly",
                path,
                "; ".join(changed),
            )
        trainer_state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=True)
        try:
            restored = self.trainer.load(str(path / "dcp" / "model"), trainer_state)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # a damaged shard (DCP's CheckpointException is a BaseException)
            raise ckpt.CheckpointError(
                f"run.load: checkpoint {path} does not load ({ckpt.describe_load_error(e)}); "
                f"load an older checkpoint of its run"
            ) from e
        if not restored:
            log.warning(
                "checkpoint %s holds no optimizer state (run.save_optimizer): AdamW's moments restart from "
                "zero, so the run does not continue exactly",
                path,
            )
        self.start_step = state["step"] + 1
        self.evals = [(ckpt.resumed_label(e[0], self.start_step, "step"), e[1]) for e in state.get("evals", [])]
        self.out = Path(self.cfg.run.output_dir)
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
