"""The distillation's start-up: every check before anything is generated, and the endpoint teachers' client."""

from __future__ import annotations

from typing import Any

from ..config import Config
from .endpoint import EndpointTeachers
from .teachers import check_teacher_names, check_tokenizers


def start_teachers(cfg: Config, tokenizer: Any, student_path: str, prompts: list[Any]) -> EndpointTeachers | None:
    """Check the ``distill`` section against the run (each prompt's ``metadata.teacher`` exists, each
    checkpoint teacher's tokenizer is the student's, each endpoint answers with prompt log-probs decoded
    by the student's tokenizer) and return the endpoint teachers' client (None when there are none or
    the run does not distill).

    Raises:
        ConfigError: a teacher name or tokenizer that does not fit (in words, naming the key).
        TeacherEndpointError: an endpoint teacher that does not answer as needed.
    """
    d = cfg.distill
    if not d.enabled:
        return None
    check_teacher_names((p.metadata for p in prompts), d)
    check_tokenizers(d, tokenizer, student_path)
    teachers = EndpointTeachers(d, tokenizer)
    return teachers if teachers else None
