"""The ``judge`` section: the LLM judge of ``reward.type: judge`` (docs/agents.md#llm-as-judge-rewards).

Its keys were ``reward.judge_*`` until issue 54; those spellings are still read, with a warning naming the
new key (``config/loader.py``: ``MOVED_KEYS``). Whether a judge is used at all is ``reward.type``'s choice,
so the checks that need both sections are :func:`check_judge`, called by ``Config.validate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fields import ConfigError, Section, opt


@dataclass
class JudgeConfig(Section):
    """The LLM judge of `reward.type: judge`: an OpenAI-compatible endpoint (`url` + `model`) or a judge model
    run by the embedded engine in the trainer's process (`model_path`). Each request waits at most
    `reward.timeout` seconds; `reward.concurrency` requests are in flight at once. These keys were
    `reward.judge_*` (`reward.judge_url` is `judge.url`): the old spellings are still read, with a warning."""

    name = "judge"
    url: str | None = opt(None, "an OpenAI-compatible base URL (`http://127.0.0.1:8000/v1`)")
    model: str | None = opt(None, "the model name sent to the judge at `judge.url`")
    model_path: str | None = opt(
        None,
        "without `judge.url`: a judge run by the embedded engine in the trainer's process, on its device, asleep "
        "except while it scores: a Hugging Face folder or a known name (`smollm2-135m-instruct`)",
    )
    max_num_seqs: int = opt(
        16, "embedded judge: answers generated at once (its engine's slots; capped at one rollout's samples)", ge=1
    )
    max_len: int = opt(
        0,
        "embedded judge: tokens of one judge prompt (chat template applied) + its answer; a longer prompt is a "
        "judge error (counted). 0: the judge model's context window, at most 2048",
        ge=0,
    )
    max_new_tokens: int = opt(256, "embedded judge: tokens of its answer at most (greedy)", ge=1)
    offload_weights: bool = opt(
        False, "embedded judge on a GPU: its weights wait on the CPU while it sleeps (freed GPU memory, slower wake)"
    )
    template: str | None = opt(
        None,
        "prompt with `{question}`, `{response}`, `{label}` (unset: asks for a score from 0 to 10 on the last line)",
    )
    score_regex: str | None = opt(None, "the last match is the score (its last group, if any); unset: the last number")
    max_score: float = opt(10.0, "the score is divided by this (in [0, 1])", gt=0)
    verdicts: dict[str, float] = opt(
        {},
        "scores of verdict words the regex may capture instead of a number, matched without case: "
        "`{'yes': 1, 'no': 0}` (quoted: YAML reads yes / no as booleans) with "
        '`judge.score_regex: "(?i)\\b(yes|no)\\b"` and `judge.max_score: 1`',
    )
    retries: int = opt(2, "retries of a failed request (error, timeout, HTTP 429 / 5xx)", ge=0)
    cache_size: int = opt(4096, "scores kept in memory (same question/response/label)", ge=0)

    def check(self) -> None:
        if any(not isinstance(k, str) for k in self.verdicts):
            raise ConfigError(
                f"judge.verdicts={self.verdicts}: its keys must be words; YAML reads yes, no, on, off, "
                f"true and false unquoted as booleans: quote them ({{'yes': 1, 'no': 0}})"
            )
        bad = {k: v for k, v in self.verdicts.items() if isinstance(v, bool) or not isinstance(v, (int, float))}
        if bad or any(not 0 <= v <= self.max_score for v in self.verdicts.values()):
            raise ConfigError(
                f"judge.verdicts={self.verdicts}: each verdict's score must be a number in "
                f"[0, judge.max_score={self.max_score:g}]"
            )
        if self.template is not None and "{response}" not in self.template:
            raise ConfigError(
                "judge.template has no {response}: the judge would not see what it grades; put {response} "
                "(and {question}, {label}) in the template"
            )


def check_judge(reward: Any, judge: JudgeConfig) -> None:
    """The judge against ``reward.type`` (``reward``: the ``RewardConfig``): a judge model for a reward that
    is no judge is refused (it would be loaded for nothing), and a judge reward needs an endpoint or a model.

    Raises:
        ConfigError: naming the keys and the fix.
    """
    if not reward.properties.get("judge"):
        if judge.model_path:
            raise ConfigError(
                f"judge.model_path is set but reward.type={reward.type!r}: set reward.type=judge or unset it"
            )
        return
    if judge.url and judge.model_path:
        raise ConfigError(
            "judge.url and judge.model_path are both set: a judge is either an endpoint (judge.url + judge.model) "
            "or the embedded engine with its own model (judge.model_path); unset one"
        )
    if not judge.model_path and not (judge.url and judge.model):
        raise ConfigError(
            f"reward.type={reward.type} needs judge.url (OpenAI-compatible) and judge.model, or judge.model_path "
            f"(a judge model run by the embedded engine)"
        )
