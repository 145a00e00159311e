"""Atomic checkpoints that resume a run exactly.

Layout of ``<output_dir>/checkpoints/rollout_000012/``::

    model/              the policy as a Hugging Face folder (fp32 safetensors, config, tokenizer)
    dcp/actor/          the policy's trainable weights, torch.distributed.checkpoint (sharded: loads
                        on any number of trainer ranks; with LoRA the adapters only); when every
                        parameter trains, only ``hf_weights.json``: the weights are ``model/``'s
    dcp/actor_optim/    its AdamW state (``run.save_optimizer``: in every checkpoint, the newest only,
                        or none)
    dcp/critic/, dcp/critic_optim/   the same for the critic (PPO with a critic only)
    trainer_state.pt    LR schedulers and skipped-step counters
    rng.pt              the driver's Python, NumPy, torch CPU and CUDA generator states
    state.json          rollout_id, weight_version, data iterator position, config, metric history
    manifest.json       size and CRC-32 of every other file, written last (see :func:`verify_manifest`)

A checkpoint is written into a hidden temporary directory beside its final place (every
trainer rank writes its shards there: multi-node runs need a shared filesystem) and renamed
into place only when complete; ``checkpoints/latest`` (the name of the newest one) is replaced
atomically afterwards, so an interrupted save never damages an existing checkpoint. A save
that runs out of disk space raises :class:`DiskFullError` naming the checkpoint that was not
written and the newest intact one.

Before a checkpoint is loaded, :func:`checkpoint_problem` checks its required files, the keys of
``state.json`` and the manifest (sizes, and CRC-32 of the contents unless ``deep=False``), so a
missing ``model.safetensors`` or a shard with overwritten bytes is found before training
resumes (a checkpoint without its manifest is damaged too: nothing in it could be verified);
:func:`load_candidates` falls back to an older checkpoint of a run directory when the newest is
damaged, and :func:`check_model_shape` refuses a checkpoint of a differently shaped model. After a
save, :func:`prune_checkpoints` keeps the new checkpoint and the newest intact older ones
(``run.keep_last_n_checkpoints``) and can drop the optimizer state of the older ones
(``run.save_optimizer: newest``).

Loading an older checkpoint of the run itself is a rollback (:mod:`reinforge.rollback`).
"""

from __future__ import annotations

import errno
import json
import logging
import pickle
import random
import shutil
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checkpoint_faults import disk_full_message, not_writable_error
from .checkpoint_line import LATEST, finish_retiring
from .checkpoint_size import OPTIM_SUFFIX as OPTIM_SUFFIX  # dcp/actor_optim: the optimizer state of dcp/actor
from .checkpoint_size import size_summary as size_summary  # the checkpoint line's sizes
from .utils import faults
from .utils.fs import (
    DiskFullError,
    NotWritableError,
    atomic_directory,
    atomic_write_text,
    held_by_another,
    is_disk_full,
)

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


class CheckpointError(ValueError):
    """A checkpoint cannot be used (damaged, or of another model); the message says why and what to do."""


def checkpoint_name(index: int, prefix: str = "rollout") -> str:
    """``rollout_000012`` (RL: the rollout id) or ``step_000012`` (offline: the optimizer step)."""
    return f"{prefix}_{index:06d}"


def resumed_label(label: str, start: int, unit: str) -> str:
    """An evaluation label of the run before a resume at ``start``: ``before`` stays, the earlier
    ``after`` becomes ``after <unit> N (earlier run)`` so the table says which run each row is."""
    return f"after {unit} {start} (earlier run)" if label in ("after", "final") else label


def rng_state() -> dict[str, Any]:
    """The driver's generator states in types ``torch.load(weights_only=True)`` accepts
    (the NumPy key array as a tensor)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    np.random.set_state((name, keys.astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: Path,
    index: int,
    write: Callable[[Path], None],
    state: dict[str, Any],
    keep_last: int | None = None,
    prefix: str = "rollout",
    drop_older_optimizer: bool = False,
) -> Path:
    """Write checkpoint ``root/<prefix>_<index>`` atomically and point ``root/latest`` at it.

    Args:
        root: the run's ``checkpoints`` directory.
        write: fills the temporary directory with the trainers' part (model, dcp/, trainer_state.pt).
        state: JSON-serialisable loop state (rollout_id or step, data position, config...).
        keep_last: how many checkpoints of this prefix to keep (:func:`prune_checkpoints`; None keeps all).
        drop_older_optimizer: delete the optimizer state of the other checkpoints (``run.save_optimizer: newest``).
    Returns:
        the checkpoint directory.
    Raises:
        DiskFullError: the filesystem filled during the save (nothing already written changed).
        NotWritableError: ``root`` is not writable (read-only filesystem, permissions), in words.
    """
    root = Path(root)
    final = root / checkpoint_name(index, prefix)
    try:
        _save(root, final, write, state, prefix)
    except (DiskFullError, NotWritableError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        error = not_writable_error(e, root, final.name, _newest_other(root, final.name, prefix, intact=False))
        if error is None:
            raise
        raise error from e
    prune_checkpoints(root, final, keep_last, prefix, drop_older_optimizer)
    return final


def _newest_other(root: Path, name: str, prefix: str, intact: bool) -> Path | None:
    """The newest checkpoint of ``root`` other than ``name`` (``intact``: files and sizes checked), or None."""
    others = (p for p in list_checkpoints(root, prefix) if p.name != name)
    return next((p for p in others if not intact or checkpoint_problem(p, deep=False) is None), None)


def _save(root: Path, final: Path, write: Callable[[Path], None], state: dict[str, Any], prefix: str) -> None:
    """:func:`save_checkpoint` without the pruning and the unwritable-folder message."""
    try:
        with atomic_directory(final) as tmp:
            try:
                write(tmp)
                faults.hit("ckpt_write")  # fault injection (tests): the model is written, rng / state not yet
                torch.save(rng_state(), tmp / "rng.pt")
                (tmp / "state.json").write_text(json.dumps(state, indent=1))
                write_manifest(tmp)
            except BaseException as e:  # measure the free space before the partial folder is deleted
                if is_disk_full(e, tmp):
                    previous = _newest_other(root, final.name, prefix, intact=True)
                    raise DiskFullError(errno.ENOSPC, disk_full_message(root, final.name, previous, tmp)) from e
                raise
        atomic_write_text(root / LATEST, final.name + "\n")
    except OSError as e:
        if isinstance(e, DiskFullError) or not is_disk_full(e, root):
            raise
        raise DiskFullError(
            errno.ENOSPC,
            f"disk full: checkpoint {final} was written but {root / LATEST} could "
            f"not be updated (run.recover=auto and --load of the run directory still "
            f"find it); free space before the next save",
        ) from e


def prune_checkpoints(
    root: Path, newest: Path, keep_last: int | None, prefix: str = "rollout", drop_optimizer: bool = False
) -> list[Path]:
    """After ``newest`` was written: keep it and the ``keep_last - 1`` intact checkpoints of
    ``prefix`` with the highest index below it; delete older ones and damaged ones (files missing
    or of another size: :func:`checkpoint_problem` without CRC-32; ``keep_last=None`` deletes nothing).
    Checkpoints with a higher index
    than ``newest`` are left alone when intact (an earlier point of the run was resumed; they are
    not counted). With ``drop_optimizer`` the kept older ones lose their optimizer state
    (:func:`drop_optimizer_state`). Returns the checkpoints deleted."""
    index = int(newest.name[len(prefix) + 1 :])
    others = [p for p in list_checkpoints(root, prefix) if p != newest]
    kept, gone = [], []
    for p in others:
        broken = keep_last is not None and checkpoint_problem(p, deep=False) is not None
        if broken or (int(p.name[len(prefix) + 1 :]) < index and keep_last is not None and len(kept) >= keep_last - 1):
            gone.append(p)
        elif int(p.name[len(prefix) + 1 :]) < index:
            kept.append(p)
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    if drop_optimizer:
        for p in kept:
            drop_optimizer_state(p)
    return gone


def drop_optimizer_state(ckpt: Path) -> int:
    """Delete the optimizer state (``dcp/*_optim``) of checkpoint ``ckpt``; returns the bytes freed.
    The manifest is rewritten first (an interruption leaves intact, unlisted optimizer files)."""
    ckpt = Path(ckpt)
    folders = [d for d in (ckpt / "dcp").glob(f"*{OPTIM_SUFFIX}") if d.is_dir()]
    if not folders:
        return 0
    entries = manifest_entries(ckpt)
    if entries is not None:
        names = {d.relative_to(ckpt).as_posix() + "/" for d in folders}
        kept = {k: v for k, v in entries.items() if not any(k.startswith(n) for n in names)}
        atomic_write_text(ckpt / MANIFEST, json.dumps({"version": 1, "checksum": "crc32", "files": kept}, indent=1))
    freed = sum(f.stat().st_size for d in folders for f in d.rglob("*") if f.is_file())
    for d in folders:
        shutil.rmtree(d, ignore_errors=True)
    return freed


def has_optimizer_state(ckpt: Path) -> bool:
    """Whether checkpoint ``ckpt`` holds optimizer state (in ``dcp/*_optim``, or in the older
    layout inside ``dcp/actor`` / ``dcp/model``)."""
    ckpt = Path(ckpt)
    return any((ckpt / "dcp").glob(f"*{OPTIM_SUFFIX}/.metadata")) or _old_layout(ckpt)


def _old_layout(ckpt: Path) -> bool:
    meta = next((p for p in ((ckpt / "dcp" / n / ".metadata") for n in ("actor", "model")) if p.is_file()), None)
    if meta is None:
        return False
    try:
        from torch.distributed.checkpoint import FileSystemReader

        return any(
            k.startswith("optim.") for k in FileSystemReader(str(meta.parent)).read_metadata().state_dict_metadata
        )
    except Exception:  # noqa: BLE001 - unreadable: checkpoint_problem reports it
        return False


# --------------------------------------------------------------------------- manifest (integrity)


def _crc32(path: Path) -> str:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(directory: Path) -> dict[str, Any]:
    """Write ``directory/manifest.json``: the size in bytes and the CRC-32 (zlib, hex) of every
    other file under ``directory``, by path relative to it. CRC-32 detects accidental damage
    (truncation, overwritten bytes), not deliberate tampering; it runs at about 4 GB/s per core
    (the files are hashed by up to 4 threads, right after they were written: from the page cache)."""
    directory = Path(directory)
    files = _files(directory)
    with ThreadPoolExecutor(max_workers=min(4, len(files) or 1)) as pool:
        crcs = list(pool.map(_crc32, files))
    manifest = {
        "version": 1,
        "checksum": "crc32",
        "files": {
            p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "crc32": c} for p, c in zip(files, crcs)
        },
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def manifest_entries(directory: Path) -> dict[str, Any] | None:
    """The ``files`` of ``directory/manifest.json`` (None: missing or unreadable)."""
    try:
        entries = json.loads((Path(directory) / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return entries if isinstance(entries, dict) else None


def verify_manifest(directory: Path, deep: bool = True, required: tuple[str, ...] = ()) -> str | None:
    """Why ``directory`` does not match its ``manifest.json`` (the manifest missing or unreadable,
    a file of ``required`` not listed in it, a listed file missing, a different size, a different
    CRC-32 when ``deep``), or None when it matches. A missing manifest is damage: it is written last,
    so its absence means an unfinished save or a deleted file, and nothing could be verified."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        return f"{MANIFEST} is missing (every save writes it last; without it no file can be verified against damage)"
    entries = manifest_entries(directory)
    if entries is None:
        return f"{MANIFEST} is unreadable (not a JSON object with 'files')"
    unlisted = [n for n in required if n not in entries]
    if unlisted:
        return f"{unlisted[0]} is not listed in {MANIFEST} (the manifest was emptied or is of another checkpoint)"
    for name, entry in entries.items():
        f = directory / name
        if not f.is_file():
            return f"{name} is missing (listed in {MANIFEST})"
        if f.stat().st_size != entry["size"]:
            return f"{name} has {f.stat().st_size} bytes, {entry['size']} were written"
    if deep:
        names = list(entries)
        with ThreadPoolExecutor(max_workers=min(4, len(names) or 1)) as pool:
            for name, crc in zip(names, pool.map(lambda n: _crc32(directory / n), names)):
                if crc != entries[name]["crc32"]:
                    return f"{name} is damaged (CRC-32 {crc}, {entries[name]['crc32']} was written)"
    return None


def resolve_checkpoint(path: str | Path, flag: str = "run.load") -> Path:
    """A checkpoint directory from ``run.load``: the checkpoint itself, a ``checkpoints``
    directory (its ``latest``) or a run directory (its ``checkpoints/latest``).

    Raises:
        FileNotFoundError: nothing resumable there.
    """
    p = Path(path)
    for candidate in (p, p / "checkpoints"):
        if (candidate / "state.json").is_file():
            return candidate
        latest = candidate / LATEST
        if latest.is_file():
            ckpt = candidate / latest.read_text().strip()
            if (ckpt / "state.json").is_file():
                return ckpt
    raise FileNotFoundError(
        f"{flag}={str(path)!r}: no checkpoint there (expected state.json, or a 'latest' file naming one)"
    )


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run directory, or ``None`` when it has none."""
    try:
        return resolve_checkpoint(run_dir)
    except FileNotFoundError:
        return None


def load_checkpoint_state(ckpt: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state.json, driver rng state) of a checkpoint directory."""
    state = json.loads((ckpt / "state.json").read_text())
    try:
        rng = torch.load(ckpt / "rng.pt", map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # written before rng_state() stored NumPy's keys as a tensor
        with torch.serialization.safe_globals(_NUMPY_RNG_GLOBALS):
            rng = torch.load(ckpt / "rng.pt", map_location="cpu", weights_only=True)
    return state, rng


# What an older rng.pt (NumPy's state as an ndarray) needs beyond weights_only's defaults:
# array reconstruction only, still through torch's restricted unpickler.
_NUMPY_RNG_GLOBALS = [
    np.ndarray,
    np.dtype,
    type(np.dtype(np.uint32)),
    (np._core if hasattr(np, "_core") else np.core).multiarray._reconstruct,
]


# Files every complete RL checkpoint has (``dcp/actor/.metadata`` is written last by DCP; a policy whose
# weights are model/'s has ``dcp/actor/hf_weights.json`` instead); offline checkpoints (``step_*``) hold
# ``dcp/model`` instead.
REQUIRED_FILES = ("state.json", "rng.pt", "trainer_state.pt", "model/config.json", "dcp/actor/.metadata")
WEIGHTS_ELSEWHERE = {"dcp/actor/.metadata": "dcp/actor/hf_weights.json"}  # the one required file that may be this
# Keys of state.json that resuming reads.
STATE_KEYS = {"rollout": ("rollout_id", "weight_version", "data", "config"), "step": ("step", "config")}


def checkpoint_problem(ckpt: Path, deep: bool = True) -> str | None:
    """Why ``ckpt`` cannot be resumed from, or None when it is intact: a required file or
    ``model/*.safetensors`` missing, ``state.json`` / ``rng.pt`` / ``trainer_state.pt``
    unreadable, a key of ``state.json`` missing, or a file that differs from ``manifest.json``
    (size; CRC-32 of the contents when ``deep``: reads every file, about 1 s per 2 GB), or no
    ``manifest.json`` (or one that does not list the required files)."""
    ckpt = Path(ckpt)
    kind = "step" if ckpt.name.startswith("step_") else "rollout"
    required = (
        REQUIRED_FILES if kind == "rollout" else tuple(n.replace("dcp/actor", "dcp/model") for n in REQUIRED_FILES)
    )
    required = tuple(
        WEIGHTS_ELSEWHERE[n] if n in WEIGHTS_ELSEWHERE and (ckpt / WEIGHTS_ELSEWHERE[n]).is_file() else n
        for n in required
    )
    for name in required:
        if not (ckpt / name).is_file():
            return f"{name} is missing"
    weights = sorted(p.relative_to(ckpt).as_posix() for p in (ckpt / "model").glob("*.safetensors"))
    if not weights:
        return "model/model.safetensors is missing"
    problem = verify_manifest(ckpt, deep=deep, required=(*required, *weights))
    if problem is not None:
        return problem
    try:
        state, _ = load_checkpoint_state(ckpt)
        torch.load(ckpt / "trainer_state.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # any damage: truncated pickle, bad JSON, unsupported type
        return f"unreadable ({type(e).__name__}: {e})"
    if not isinstance(state, dict):
        return "state.json is not a JSON object"
    missing = [k for k in STATE_KEYS[kind] if k not in state]
    if missing:
        return f"state.json has no {', '.join(map(repr, missing))} entry"
    return None


def list_checkpoints(root: Path, prefix: str = "rollout") -> list[Path]:
    """Checkpoint directories ``<prefix>_NNNNNN`` under ``root``, newest (highest index) first;
    hidden temporary folders of interrupted saves are not listed."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.is_dir() and p.name.startswith(f"{prefix}_") and p.name[len(prefix) + 1 :].isdigit()
    ]
    return sorted(found, key=lambda p: int(p.name[len(prefix) + 1 :]), reverse=True)


def remove_partial_saves(root: Path) -> list[str]:
    """Delete the hidden temporary folders interrupted saves left in ``root`` (``.rollout_*``,
    ``.old-*``); returns their names."""
    root = Path(root)
    if not root.is_dir():
        return []
    gone = [p.name for p in root.iterdir() if p.is_dir() and p.name.startswith(".")]
    for name in gone:
        shutil.rmtree(root / name, ignore_errors=True)
    return gone


def find_resumable(root: Path, prefix: str = "rollout", warn: Callable[[str], None] | None = None) -> list[Path]:
    """Complete checkpoints under ``root`` to resume from, newest first. Incomplete or damaged
    ones are skipped with a warning through ``warn`` naming the damaged file (the caller falls
    back to the next one if loading the first still fails). Checksums are verified until the
    first intact checkpoint; older ones get the cheap checks (files, sizes, state keys) only."""
    good = []
    for p in list_checkpoints(root, prefix):
        problem = checkpoint_problem(p, deep=not good)
        if problem is None:
            good.append(p)
        elif warn is not None:
            warn(f"checkpoint {p} is not usable ({problem}): falling back to an older one")
    return good


def load_candidates(
    path: str | Path,
    prefix: str = "rollout",
    warn: Callable[[str], None] | None = None,
    model_path: str | Path | None = None,
    flag: str = "run.load",
) -> list[Path]:
    """Checkpoints to try for ``run.load=path``, in order. A run directory or a ``checkpoints``
    directory gives its intact checkpoints newest first (damaged ones skipped with a warning
    through ``warn``, as ``run.recover=auto`` does; the hidden folders of interrupted saves are
    deleted unless another live process holds the run directory); a checkpoint directory gives itself.

    Args:
        model_path: the run's ``model.path`` folder; when given, the checkpoint's model must
            have its shape (:func:`check_model_shape`).
        flag: the key or flag the errors name (``--checkpoint`` for ``reinforge convert``).
    Raises:
        FileNotFoundError: nothing resumable at ``path``.
        CheckpointError: the checkpoint named is damaged, every checkpoint of the run directory
            is, or the model's shape differs.
    """
    p = Path(path)
    roots = [r for r in (p, p / "checkpoints") if list_checkpoints(r, prefix)]
    if (p / "state.json").is_file() or not roots:
        one = resolve_checkpoint(p, flag)
        problem = checkpoint_problem(one)
        if problem is not None:
            raise CheckpointError(
                f"{flag}={str(path)!r}: checkpoint {one} is damaged ({problem}); load an older "
                f"checkpoint of its run, or its run directory to fall back automatically"
            )
        found = [one]
    else:
        root = roots[0]
        if not held_by_another(root.parent if root.name == "checkpoints" else root):  # never a live run's save
            finish_retiring(root)  # a rollback interrupted by a crash: its abandoned line is not resumed
            gone = remove_partial_saves(root)
            if gone:
                (warn or log.warning)(
                    f"removed {len(gone)} interrupted checkpoint save(s) in {root}: {', '.join(gone)}"
                )
        found = find_resumable(root, prefix, warn=warn)
        if not found:
            raise CheckpointError(
                f"{flag}={str(path)!r}: every checkpoint in {root} is damaged (see the warnings "
                f"above); nothing to resume from"
            )
    if model_path is not None:
        check_model_shape(found[0], model_path)
    return found


def describe_load_error(e: BaseException) -> str:
    """``Type: first line`` of an error raised while loading a checkpoint; for DCP's
    ``CheckpointException`` (``ranks:dict_keys([0])``) that of the first rank's own error."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        inner = inner[0] if isinstance(inner, tuple) and inner else inner  # (exception, traceback frames)
        if isinstance(inner, BaseException):
            e = inner
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:500]


def newest_intact(path: str | Path, warn: Callable[[str], None] | None = None) -> Path:
    """The checkpoint ``reinforge convert`` exports: ``path`` itself when it is a checkpoint, else
    the newest intact one of the run (or ``checkpoints``) directory, RL or offline.

    Raises:
        FileNotFoundError: nothing resumable at ``path``.
        CheckpointError: the checkpoint is damaged, or every one of the run directory is.
    """
    p = Path(path)
    prefix = "step" if any(list_checkpoints(r, "step") for r in (p, p / "checkpoints")) else "rollout"
    return load_candidates(p, prefix, warn=warn, flag="--checkpoint")[0]


# config.json keys that fix the shapes of a checkpoint's tensors.
SHAPE_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "head_dim",
    "num_experts",
    "moe_intermediate_size",
    "n_routed_experts",
)


def check_model_shape(ckpt: Path, model_path: str | Path) -> None:
    """Refuse to load ``ckpt`` into a model of ``model_path`` whose shape differs (a checkpoint
    loads only the tensors the model has, so a 30-layer checkpoint would silently fill 2 layers).

    Raises:
        CheckpointError: naming each differing ``config.json`` key and both values.
    """
    saved_cfg, model_cfg = Path(ckpt) / "model" / "config.json", Path(model_path) / "config.json"
    if not saved_cfg.is_file() or not model_cfg.is_file():
        return
    a, b = json.loads(saved_cfg.read_text()), json.loads(model_cfg.read_text())
    diff = [
        f"{k}={a[k]} in the checkpoint, {b[k]} in the model" for k in SHAPE_KEYS if k in a and k in b and a[k] != b[k]
    ]
    if diff:
        raise CheckpointError(
            f"checkpoint {ckpt} is of a different model than model.path={model_path} "
            f"({'; '.join(diff)}): set model.path to the model the checkpoint was trained from "
            f"(its state.json: config.model.path), or load another checkpoint"
        )
