"""Metrics sinks: ``metrics.jsonl`` and TensorBoard event files in the run directory, and
optionally Weights & Biases, all with the same metric names and steps."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class MetricsLogger:
    """Writes one JSON line per logged step (``{"step": ..., "time": ..., **metrics}``), the same
    scalars to TensorBoard (``<out_dir>/tensorboard``) when enabled, and to a W&B run when a
    project is given (``run.wandb_project``; ``wandb_mode="offline"`` writes under
    ``<out_dir>/wandb`` with no network, for ``wandb sync`` later).

    Raises:
        ImportError: a W&B project is set but ``wandb`` is not installed (``pip install wandb``).
    """

    def __init__(self, out_dir: Path, tensorboard: bool = True, *, wandb_project: str | None = None,
                 wandb_group: str | None = None, wandb_mode: str = "online", config: dict[str, Any] | None = None):
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "metrics.jsonl"
        self._file = self.path.open("a")
        self._tb = None
        self._wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(out_dir / "tensorboard"))
            except ImportError as e:  # tensorboard is a dependency, but keep training if it breaks
                log.warning("TensorBoard disabled: %s", e)
        if wandb_project:
            try:
                import wandb
            except ImportError as e:
                raise ImportError("run.wandb_project is set but wandb is not installed: pip install wandb") from e
            self._wandb = wandb.init(project=wandb_project, group=wandb_group, mode=wandb_mode, name=out_dir.name,
                                     dir=str(out_dir), config=config, resume="allow")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._file.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")
        self._file.flush()
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def setup_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "urllib3", "transformers", "filelock", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
