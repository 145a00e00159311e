"""Metrics sinks: ``metrics.jsonl`` and TensorBoard event files in the run directory."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)


class MetricsLogger:
    """Writes one JSON line per logged step (``{"step": ..., "time": ..., **metrics}``) and
    the same scalars to TensorBoard (``<out_dir>/tensorboard``) when enabled."""

    def __init__(self, out_dir: Path, tensorboard: bool = True):
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "metrics.jsonl"
        self._file = self.path.open("a")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(out_dir / "tensorboard"))
            except ImportError as e:  # tensorboard is a dependency, but keep training if it breaks
                log.warning("TensorBoard disabled: %s", e)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._file.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def setup_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "urllib3", "transformers", "filelock", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
