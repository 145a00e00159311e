"""Which teacher scores each sample, and the teachers' log-probs of a trainer rank's samples.

A sample goes to the teacher its data row names in ``metadata.teacher`` (a key of ``distill.teachers``),
else to ``distill.teacher_path`` (the name ``""``). Checkpoint teachers are scored on the trainer ranks
(:meth:`~reinforge.train.actor.Actor.compute_log_probs` with ``teacher=``); endpoint teachers from the
driver before the rollout reaches the ranks (:mod:`.endpoint`), their log-probs carried in
``sample.metadata[TEACHER_LOG_PROBS]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..config import ConfigError
from ..config.distill import TEACHER_KEY, DistillConfig, is_endpoint
from ..records import Sample, Status

TEACHER_LOG_PROBS = "teacher_log_probs"
"""``sample.metadata`` key: an endpoint teacher's log-prob of each response token (set by the driver)."""


def teacher_name(metadata: dict[str, Any], d: DistillConfig) -> str:
    """The name in :meth:`DistillConfig.all_teachers` of the teacher of a sample or prompt with ``metadata``.

    Raises:
        ConfigError: the row names a teacher that ``distill.teachers`` does not have, or names none and
            there is no ``distill.teacher_path``.
    """
    name = metadata.get(TEACHER_KEY) if isinstance(metadata, dict) else None
    teachers = d.all_teachers()
    key = str(name) if name else ""
    if key not in teachers:
        if key:
            raise ConfigError(
                f"a data row's metadata.teacher={key!r} is not a key of distill.teachers ({sorted(d.teachers)}): "
                f"add it there or fix the row"
            )
        raise ConfigError(
            "a data row names no teacher (metadata.teacher) and distill.teacher_path is not set: set it, or "
            "name a teacher of distill.teachers in every row"
        )
    return key


def check_teacher_names(metadatas: Iterable[dict[str, Any]], d: DistillConfig) -> None:
    """Every prompt's teacher exists (at start, before anything is generated). Raises :class:`ConfigError`."""
    if d.enabled:
        for m in metadatas:
            teacher_name(m or {}, d)


def rank_teacher_log_probs(actor: Any, samples: list[Sample], owned: list[int], d: DistillConfig) -> list[torch.Tensor]:
    """The teacher log-probs ([response_length] fp32 CPU each, in ``owned`` order) of this rank's samples:
    an endpoint teacher's from the sample's metadata, a checkpoint teacher's computed now. Every checkpoint
    teacher runs on every rank in the same order, with no samples if this rank has none of its own (its
    forward passes are collectives under FSDP).

    Raises:
        RuntimeError: a sample of an endpoint teacher carries no log-probs, or not one per response token.
    """
    out: dict[int, torch.Tensor] = {}
    local: dict[str, list[int]] = {name: [] for name in sorted(actor.teachers)}
    for i in owned:
        s = samples[i]
        given = s.metadata.get(TEACHER_LOG_PROBS)
        if given is not None:
            if len(given) != s.response_length:
                raise RuntimeError(
                    f"sample {i}: the endpoint teacher gave {len(given)} log-probs for {s.response_length} tokens"
                )
            out[i] = torch.tensor(given, dtype=torch.float32)
            continue
        name = teacher_name(s.metadata, d)
        if name not in local and s.status == Status.FAILED:  # (an infrastructure failure: not trained on)
            out[i] = torch.zeros(s.response_length)
            continue
        if name not in local:
            raise RuntimeError(
                f"sample {i}: teacher {name or 'distill.teacher_path'!r} is an endpoint but the sample carries "
                f"no log-probs from it (it was not scored before training)"
            )
        local[name].append(i)
    for name, rows in local.items():
        scored = actor.compute_log_probs(samples, owned=rows, teacher=name)
        for i in rows:
            out[i] = scored[i]
    return [out[i] for i in owned]


def student_log_probs(
    samples: list[Sample], owned: list[int], old_log_probs: list[torch.Tensor | None] | None
) -> list[torch.Tensor]:
    """The student's log-probs of this rank's samples (in ``owned`` order) that the reverse KL compares with
    the teacher's: the trainer's old log-probs when computed (``Config.needs_old_log_probs``), else the
    engine's (``sample.rollout_log_probs``, what the student sampled with)."""
    if old_log_probs is not None:
        return [old_log_probs[i] for i in owned]  # type: ignore[misc]
    return [torch.tensor(samples[i].rollout_log_probs, dtype=torch.float32) for i in owned]


def check_tokenizers(d: DistillConfig, tokenizer: Any, student_path: str) -> None:
    """Every checkpoint teacher's tokenizer is the student's (the same vocabulary: token -> id) and its
    embedding has a row for every id of it; refused at start otherwise.

    Raises:
        ConfigError: naming the teacher, the first differing token, and what to do.
    """
    from ..models.hub import resolve_model_path
    from ..models.loading import load_tokenizer

    ours = tokenizer.get_vocab()
    for name, where in d.local_teachers().items():
        key = f"distill.teachers.{name}" if name else "distill.teacher_path"
        path = resolve_model_path(where)
        theirs = load_tokenizer(path).get_vocab()
        if theirs != ours:
            diff = sorted(set(ours.items()) ^ set(theirs.items()), key=lambda kv: kv[1])
            example = f"e.g. {diff[0][0]!r} -> id {diff[0][1]}" if diff else ""
            raise ConfigError(
                f"{key}={where}: the teacher's tokenizer differs from the student's (model.path={student_path}): "
                f"{len(theirs)} vs {len(ours)} tokens, {len(diff)} (token, id) pairs differ ({example}); on-policy "
                f"distillation scores the student's token ids with the teacher, so both need one tokenizer: "
                f"choose a teacher of the student's family"
            )
        vocab = _config_vocab_size(path)
        if vocab is not None and vocab <= max(ours.values()):
            raise ConfigError(
                f"{key}={where}: the teacher's vocab_size={vocab} has fewer rows than the student's tokenizer "
                f"(ids up to {max(ours.values())}): choose a teacher with the student's vocabulary"
            )


def _config_vocab_size(path: Any) -> int | None:
    import json
    from pathlib import Path

    f = Path(path) / "config.json"
    if not f.exists():
        return None
    c = json.loads(f.read_text())
    v = c.get("vocab_size", (c.get("text_config") or {}).get("vocab_size"))
    return int(v) if v is not None else None


def gkd_teacher_path(cfg: Any) -> Any:
    """The teacher folder of ``offline.method: gkd``: ``distill.teacher_path``, a checkpoint (its logits are needed,
    which an endpoint does not give), with the student's tokenizer.

    Raises:
        ConfigError: no teacher, an endpoint, or another tokenizer (in words).
    """
    from ..models.hub import resolve_model_path
    from ..models.loading import load_tokenizer

    where = cfg.distill.teacher_path
    if not where or is_endpoint(where):
        raise ConfigError(
            f"offline.method=gkd needs a checkpoint teacher in distill.teacher_path (a Hugging Face folder or hub "
            f"name; got {where!r}): GKD matches the teacher's whole next-token distribution, which an endpoint does "
            f"not return"
        )
    student = resolve_model_path(cfg.model.path)
    check_tokenizers(DistillConfig(teacher_path=where), load_tokenizer(student), str(student))
    return resolve_model_path(where)
