"""The ``run`` section: the run directory, checkpoints, logging, tracing and the stall doctor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .fields import Section, opt


@dataclass
class RunConfig(Section):
    name = "run"
    output_dir: str = opt(
        "runs/default", "run directory: config.yaml, metrics.jsonl, tensorboard/, eval/, eval_table.txt, checkpoints/"
    )
    save_interval: int | None = opt(None, "rollouts (offline: optimizer steps) between checkpoints", ge=1)
    save_final: bool = opt(True, "checkpoint after the last rollout")
    keep_last_n_checkpoints: int | None = opt(
        2,
        "keep the new checkpoint and the newest intact older ones, this many in "
        "all; delete older and damaged ones (`null` keeps all)",
        ge=1,
    )
    save_optimizer: Literal["all", "newest", "none"] = opt(
        "newest",
        "AdamW's state (8 bytes per trained parameter) in checkpoints (slime's `--no-save-optim`, TRL's "
        "`save_only_model`): in `all`, in the `newest` only, or `none`; a resume without it says it is not exact",
    )
    load: str | None = opt(
        None, "resume from a checkpoint, a `checkpoints/` directory or a run directory (`--load` on the CLI)"
    )
    overwrite: bool = opt(
        False,
        "`reinforge train` / `offline` refuse an `output_dir` that already holds a run "
        "(`metrics.jsonl` or `checkpoints/`) unless they resume it (`recover: auto`, "
        "`--max-restarts`, `load` inside it); `true` deletes that directory first",
    )
    tensorboard: bool = opt(True, "write TensorBoard event files")
    wandb_project: str | None = opt(
        None,
        "log the same metrics to this Weights & Biases project (`null`: the "
        "`WANDB_PROJECT` environment variable if set, else no W&B; `pip install wandb`)",
    )
    wandb_group: str | None = opt(None, "W&B run group")
    wandb_mode: Literal["online", "offline", "disabled"] | None = opt(
        None,
        "`offline` writes the W&B run under `<output_dir>/wandb` without network (`wandb sync` later); `null`: "
        "W&B's own choice (the `WANDB_MODE` environment variable, else `online`). Checked before anything is built",
    )
    progress: bool = opt(True, "console progress bar with ETA")
    dump_rollouts: bool = opt(False, "write every rollout's samples to `rollouts/<id>.jsonl`")
    trace: bool = opt(
        False,
        "write a timeline of the run (generation, reward, log-probs, training, weight sync, "
        "checkpoints, eval) to `trace.json` in the Chrome / Perfetto trace format; open it in "
        "ui.perfetto.dev ([tracing.md](tracing.md))",
    )
    recover: Literal["off", "auto"] = opt(
        "off",
        "`auto`: resume from the newest complete checkpoint in `output_dir` (falling back to older ones if "
        "it is damaged; `load` only when there is none), write recover checkpoints every `recover_interval_s` and on "
        "SIGTERM ([reliability.md](reliability.md)); `off`: start from scratch unless `load` is set",
    )
    recover_interval_s: float = opt(
        600.0,
        "`recover: auto`: seconds between recover checkpoints (written at the "
        "end of the first rollout, offline: optimizer step, past the interval)",
        gt=0,
    )
    max_restarts: int = opt(
        0,
        "relaunch training after a crash up to this many times, resuming with "
        "`recover: auto` (`--max-restarts` of `reinforge train` and `reinforge offline`); 0: no supervisor",
        ge=0,
    )
    stall_timeout_s: float | None = opt(1800.0, "seconds without progress before the stall doctor acts", gt=0)
    stall_action: Literal["fail", "restart"] = opt(
        "fail", "after a stall: `fail` (exit status 124, not relaunched) or `restart` (75: `--max-restarts` relaunches)"
    )
