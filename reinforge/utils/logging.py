"""Metrics sinks: ``metrics.jsonl`` and TensorBoard event files in the run directory, and
optionally Weights & Biases, all with the same metric names and steps."""

from __future__ import annotations

import importlib
import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class MetricsLogger:
    """Writes one JSON line per logged step (``{"step": ..., "time": ..., **metrics}``), the same
    scalars to TensorBoard (``<out_dir>/tensorboard``) when enabled, and to a W&B run when a
    project is given (``run.wandb_project``, else the ``WANDB_PROJECT`` environment variable;
    :func:`wandb_target`). ``wandb_mode`` ``None`` leaves the mode to W&B (``WANDB_MODE``, else
    online); ``"offline"`` writes under ``<out_dir>/wandb`` with no network, for ``wandb sync`` later.

    ``start_step`` (a resumed or restarted run): the first step this run will log. Rows of an
    earlier attempt at that step or later are dropped from ``metrics.jsonl``, TensorBoard purges
    its events from that step on (``SummaryWriter(purge_step=...)``), and W&B continues the same
    run (its id is kept in ``<out_dir>/wandb/run_id``) rewound to that step (``resume_from``,
    W&B's run rewind, online runs) so each step appears once. Where W&B cannot rewind (offline
    mode, or a server without it), it resumes the run and ignores steps it already has (the
    earlier attempt's values stay there for the redone steps; ``metrics.jsonl`` and TensorBoard
    hold the new ones). ``None`` appends to whatever is there.

    Raises:
        ImportError: a W&B project is set but ``wandb`` is not installed (``pip install wandb``).
    """

    def __init__(
        self,
        out_dir: Path,
        tensorboard: bool = True,
        *,
        wandb_project: str | None = None,
        wandb_group: str | None = None,
        wandb_mode: str | None = None,
        config: dict[str, Any] | None = None,
        start_step: int | None = None,
    ):
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "metrics.jsonl"
        if start_step is not None:
            dropped = truncate_metrics(self.path, start_step)
            if dropped:
                log.info(
                    "dropped %d row(s) of %s at step %d or later (logged by an earlier attempt; redone now)",
                    dropped,
                    self.path,
                    start_step,
                )
        else:
            drop_torn_last_row(self.path)  # appending after a cut row would glue the next row onto it
        self._file = self.path.open("a")
        self._tb = None
        self._wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(out_dir / "tensorboard"), purge_step=start_step)
            except ImportError as e:  # tensorboard is a dependency, but keep training if it breaks
                log.warning("TensorBoard disabled: %s", e)
        project, mode = wandb_target(wandb_project, wandb_mode)
        if project:
            try:
                import wandb
            except ImportError as e:
                raise ImportError(
                    f"W&B logging is on (project {project!r}) but wandb is not installed: pip install wandb"
                ) from e
            # the mode resolved here (run.wandb_mode, else WANDB_MODE, else online) is passed explicitly: W&B
            # reads its environment once per process, so a later WANDB_MODE would be missed
            self._wandb = _wandb_init(
                wandb,
                out_dir,
                start_step,
                mode,
                project=project,
                group=wandb_group,
                name=out_dir.name,
                dir=str(out_dir),
                config=config,
                mode=mode,
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Append one row (and the same scalars to TensorBoard / W&B).

        Raises:
            DiskFullError: the disk is full (the row was not written; the file keeps its whole rows).
        """
        row = json.dumps({"step": step, "time": time.time(), **metrics}) + "\n"
        try:
            self._file.write(row)
            self._file.flush()
        except OSError as e:
            self._disk_full(e, step)
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def _disk_full(self, e: OSError, step: int) -> None:
        import errno

        from .fs import DiskFullError

        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise e
        try:  # drop what was buffered, and cut the file back to its last whole row
            self._file.close()
        except OSError:
            pass
        with open(self.path, "rb+") as f:
            data = f.read()
            f.truncate(data.rfind(b"\n") + 1)
        self._file = self.path.open("a")
        raise DiskFullError(
            errno.ENOSPC,
            f"disk full: the metrics of step {step} could not be appended to {self.path} "
            f"(the rows before it are intact). Free space or move run.output_dir to a "
            f"larger disk, then resume with --load {self.path.parent} (or "
            f"run.recover=auto)",
        ) from e

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:  # a full disk: the buffered row is lost, the file keeps its whole rows
            pass
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _torn(path: Path, lineno: int, last: bool) -> str:
    where = "its last line" if last else f"line {lineno}, not the last,"
    return (
        f"{path}:{lineno}: {where} is not a whole JSON row (cut short: the file was truncated, or a write "
        f"was torn by a crash or a full disk)"
    )


def read_metrics(path: Path, warn: Any = log.warning) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``, in file order. A line that is not a whole JSON object (a
    row cut short) is skipped and reported through ``warn`` naming the file and line; blank lines
    are skipped.

    Raises:
        FileNotFoundError: no such file.
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        else:
            warn(_torn(path, i, i == len(lines)) + ": skipped")
    return rows


def drop_torn_last_row(path: Path) -> bool:
    """Cut ``path`` (a ``metrics.jsonl``) back to its last whole line when its last line has no
    newline and is not a whole JSON row (a row cut short), with a warning naming the file and
    line. Returns whether anything was cut."""
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb+") as f:
        data = f.read()
        if not data or data.endswith(b"\n"):
            return False
        keep = data.rfind(b"\n") + 1
        try:
            if isinstance(json.loads(data[keep:]), dict):
                f.write(b"\n")  # a whole row that only lacks its newline
                return False
        except ValueError:
            pass
        f.truncate(keep)
    log.warning("%s: dropped (the run goes on after the rows before it)", _torn(path, data.count(b"\n") + 1, True))
    return True


def truncate_metrics(path: Path, start_step: int) -> int:
    """Drop the rows of ``metrics.jsonl`` whose ``step`` is ``start_step`` or later (atomically:
    a rewritten copy replaces the file). Lines that are not whole rows (cut short by a crash or a
    truncated file) are dropped too, each with a warning naming the file and line; a resumed run
    (``start_step`` > 1) whose file lacks the rows of earlier steps is warned about (those metrics
    are lost: the steps ran, and are not redone).

    Returns:
        How many whole rows were dropped (rows cut short not counted).
    """
    from .fs import atomic_write_text

    path = Path(path)
    if not path.is_file():
        return 0
    kept, dropped, torn = [], 0, []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            torn.append(i)
            continue
        step = row.get("step")
        if isinstance(step, (int, float)) and step >= start_step:
            dropped += 1
        else:
            kept.append((step, line))
    for i in torn:
        log.warning("%s: dropped", _torn(path, i, i == len(lines)))
    if dropped or torn:
        atomic_write_text(path, "".join(f"{x}\n" for _, x in kept))
    have = {int(step) for step, _ in kept if isinstance(step, (int, float))}
    missing = [s for s in range(1, start_step) if s not in have]
    if missing:
        log.warning(
            "%s holds no rows for step(s) %s, which ran before the checkpoint this run resumes from (the file was "
            "cut or edited?): their metrics are lost and the curves will have a gap there; the run goes on from "
            "step %d",
            path,
            _ranges(missing),
            start_step,
        )
    return dropped


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> "1-3, 7"."""
    out: list[str] = []
    for s in steps:
        if out and s == int(out[-1].rsplit("-", 1)[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{s}"
        else:
            out.append(str(s))
    return ", ".join(out)


class WandbSetupError(ValueError):
    """W&B logging is asked for but cannot start (not installed, an unknown mode, no API key when
    online); the message names the key or environment variable and the fix. A usage error:
    ``reinforge`` exits with status 2 before anything is built."""


WANDB_MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")  # wandb.Settings.mode


def wandb_target(project: str | None, mode: str | None) -> tuple[str | None, str]:
    """The W&B project and mode a run logs with: ``run.wandb_project``, else the ``WANDB_PROJECT``
    environment variable (``None``: no W&B logging); ``run.wandb_mode``, else ``WANDB_MODE``, else
    ``online`` (W&B's own default). Returns ``(project, mode)``."""
    project = project or os.environ.get("WANDB_PROJECT") or None
    return project, (mode or os.environ.get("WANDB_MODE") or "online").strip().lower()


def _has_wandb_credentials() -> bool:
    """Whether W&B will find an API key without asking: ``WANDB_API_KEY``, an identity token file
    (``WANDB_IDENTITY_TOKEN_FILE``), or a netrc entry (``NETRC`` or ``~/.netrc``, as ``wandb login``
    writes it) for the host of ``WANDB_BASE_URL`` (default ``api.wandb.ai``)."""
    import netrc
    from urllib.parse import urlsplit

    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    for path in (os.environ.get("NETRC"), os.path.expanduser("~/.netrc"), os.path.expanduser("~/_netrc")):
        if path and os.path.isfile(path):
            try:
                if netrc.netrc(path).authenticators(host):
                    return True
            except (netrc.NetrcParseError, OSError):
                continue
    return False


def check_wandb(run: Any) -> None:
    """Check the W&B set-up of the ``run`` config section before anything is built (the logger
    starts W&B only after the engine and trainers exist): ``wandb`` importable, a mode W&B knows
    (``WANDB_MODE`` included), and for ``online`` an API key W&B can find. Nothing is checked when
    no project is set (:func:`wandb_target`).

    Raises:
        WandbSetupError: naming the key or environment variable and the fix.
    """
    project, mode = wandb_target(run.wandb_project, run.wandb_mode)
    if not project:
        return
    source = "run.wandb_project" if run.wandb_project else "the WANDB_PROJECT environment variable"
    try:
        importlib.import_module("wandb")
    except ImportError as e:
        raise WandbSetupError(
            f"{source} asks for W&B logging (project {project!r}) but wandb cannot be imported "
            f"({e}): pip install wandb, or unset {source}"
        ) from None
    if mode not in WANDB_MODES:
        where = "run.wandb_mode" if run.wandb_mode else "WANDB_MODE (environment variable)"
        raise WandbSetupError(f"{where}: {mode!r} is not a W&B mode; use one of {', '.join(WANDB_MODES[:3])}")
    if mode in ("online", "shared", "run") and not _has_wandb_credentials():
        raise WandbSetupError(
            f"W&B logging to project {project!r} is online but no W&B API key was found "
            f"(WANDB_API_KEY, or ~/.netrc from `wandb login`): run `wandb login`, or log without "
            f"network with WANDB_MODE=offline (or run.wandb_mode=offline; `wandb sync` later)"
        )


def _wandb_init(wandb: Any, out_dir: Path, start_step: int | None, effective_mode: str, **kwargs: Any) -> Any:
    """``wandb.init`` that continues this run directory's W&B run: the same id (kept in
    ``<out_dir>/wandb/run_id``), rewound to ``start_step`` when resuming (``resume_from``);
    falls back to ``resume="allow"`` where rewinding is not available (``effective_mode``: the mode
    W&B will run in, :func:`wandb_target`; ``kwargs`` go to ``wandb.init``)."""
    id_file = out_dir / "wandb" / "run_id"
    id_file.parent.mkdir(parents=True, exist_ok=True)
    run_id = id_file.read_text().strip() if id_file.is_file() else ""
    if not run_id:
        gen = getattr(getattr(wandb, "util", None), "generate_id", None)  # gone from wandb.util in 0.2x+
        run_id = gen() if callable(gen) else secrets.token_hex(4)  # 8 characters [0-9a-f], as W&B's own ids
        id_file.write_text(run_id + "\n")
    if start_step and effective_mode == "online":
        try:
            return wandb.init(resume_from=f"{run_id}?_step={start_step}", **kwargs)
        except Exception as e:  # noqa: BLE001 - an older client or a server without run rewind
            log.warning(
                "W&B could not rewind run %s to step %d (%s): resuming it; steps it already has are kept there",
                run_id,
                start_step,
                e,
            )
    return wandb.init(id=run_id, resume="allow", **kwargs)


def setup_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "urllib3", "transformers", "filelock", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
