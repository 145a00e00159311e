"""The ``distill`` section: on-policy distillation (OPD) on the RL loop, a teacher scoring the student's own
tokens (docs/distillation.md). Key names follow slime's OPD flags (``--opd-kl-coef``, ``--opd-teacher-load``,
``--opd-type sglang``) and Tinker's recipe (``discount``); several teachers chosen per sample as AReaL's and
NeMo-RL's multi-teacher OPD do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .fields import ConfigError, Section, opt

TEACHER_KEY = "teacher"
"""``sample.metadata`` key (a data row's ``metadata.teacher``) naming the teacher of ``distill.teachers``
that scores the sample."""


def is_endpoint(where: str) -> bool:
    """Whether a teacher given as ``where`` is an HTTP endpoint (else a checkpoint folder or hub name)."""
    return where.startswith(("http://", "https://"))


@dataclass
class DistillConfig(Section):
    """On-policy distillation: the student samples, a frozen teacher scores each sampled token, and
    `kl_coef * (log p_teacher - log p_student)` is added to the token's advantage (beside the task reward's,
    or alone with `use_task_reward: false`); the usual clipped loss and TIS apply. A teacher is a local
    checkpoint (scored on the trainer ranks like the reference model: bf16, FSDP-sharded or CPU-offloaded
    with `train.fsdp_cpu_offload`) or an OpenAI-compatible endpoint returning prompt log-probs. The teacher's
    tokenizer must be the student's. [distillation.md](distillation.md)"""

    name = "distill"
    teacher_path: str | None = opt(
        None,
        "the teacher: a Hugging Face folder or hub name loaded on the trainer ranks (slime's `--opd-teacher-load`), "
        "or an endpoint URL `http://host:port/v1` (vLLM; slime's `--opd-type sglang`: see `teacher_api`); "
        "`null`: no distillation",
    )
    teachers: dict[str, str] = opt(
        {},
        "several teachers by name (`{math: /ckpt/math, code: http://host:8000/v1}`), each sample scored by the "
        "one its data row names in `metadata.teacher` (multi-teacher OPD, as AReaL / NeMo-RL); a row without "
        "one goes to `teacher_path`",
    )
    teacher_api: Literal["vllm", "sglang"] = opt(
        "vllm",
        "endpoint teachers: `vllm` (`/completions` with `prompt_logprobs`) or `sglang` (`/generate` with "
        "`return_logprob`)",
    )
    teacher_model: str | None = opt(
        None, "endpoint teachers: the `model` field of the requests (`null`: the first model the endpoint lists)"
    )
    kl_coef: float = opt(
        1.0,
        "weight of the reverse-KL advantage `log p_teacher - log p_student` beside the task reward's advantage "
        "(slime's `--opd-kl-coef`, TRL / Tinker's `kl_coef`)",
        gt=0,
    )
    discount: float = opt(
        0.0,
        "discount of the reverse-KL rewards over the student's later tokens: 0 (Tinker's default) makes each "
        "token's advantage its own reverse KL",
        ge=0,
        le=1,
    )
    use_task_reward: bool = opt(
        True,
        "add the advantage of `algo.advantage_estimator` on the task reward; `false`: the reverse KL alone (the "
        "rewards are still computed and logged, and `rollout.n_samples_per_prompt` may be 1)",
    )
    timeout: float = opt(60.0, "endpoint teachers: seconds per request", gt=0)
    retries: int = opt(3, "endpoint teachers: retries of a connection error, timeout, HTTP 429 or 5xx", ge=0)
    batch_size: int = opt(16, "endpoint teachers: samples per request", ge=1)

    @property
    def enabled(self) -> bool:
        """Whether the run distills (a teacher is set)."""
        return bool(self.teacher_path or self.teachers)

    def all_teachers(self) -> dict[str, str]:
        """Every teacher by name: ``teachers`` plus ``teacher_path`` under the name ``""`` (the default)."""
        out = dict(self.teachers)
        if self.teacher_path:
            out[""] = self.teacher_path
        return out

    def local_teachers(self) -> dict[str, str]:
        """The checkpoint teachers (scored on the trainer ranks) by name."""
        return {k: v for k, v in self.all_teachers().items() if not is_endpoint(v)}

    def endpoint_teachers(self) -> dict[str, str]:
        """The endpoint teachers (scored from the driver) by name."""
        return {k: v for k, v in self.all_teachers().items() if is_endpoint(v)}

    def check(self) -> None:
        for name in self.teachers:
            if not name or not isinstance(self.teachers[name], str) or not self.teachers[name]:
                raise ConfigError(
                    f"distill.teachers: entry {name!r}: {self.teachers[name]!r} must be a non-empty name mapped to a "
                    f"checkpoint folder or an http(s):// endpoint"
                )
        if not self.use_task_reward and not self.enabled:
            raise ConfigError("distill.use_task_reward=false trains on the reverse KL alone: set distill.teacher_path")
