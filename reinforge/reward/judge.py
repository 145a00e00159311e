"""LLM-as-judge rewards (``reward.type: judge``): an OpenAI-compatible endpoint, or the embedded engine.

Two transports, one way of scoring: the judge is either an endpoint (``judge.url``, below) or a
model run by the embedded engine in this process (``judge.model_path``:
:class:`~reinforge.reward.judge_engine.EngineJudge`, which answers a whole scoring call in one batched
generation, :meth:`JudgeReward.judge_many`). The template, the score's parsing, the cache and the failure
kinds are this module's for both.

Each sample's question, response and label fill ``judge.template``; the filled prompt is sent
to ``POST {judge.url}/chat/completions`` (``judge.model``, temperature 0); the score is
parsed from the answer (``judge.score_regex``, default the last number; a verdict word it captures
is scored by ``judge.verdicts``) and divided by
``judge.max_score``. Samples are judged concurrently by the reward manager's threads
(``reward.concurrency`` requests in flight). A failed request (connection error, timeout, HTTP 429 or
5xx) is retried ``judge.retries`` times; each request waits at most ``reward.timeout`` s.

A judge that cannot be reached or answers something without a score in ``[0, judge.max_score]``
raises :class:`JudgeFailure`: the manager counts it (``reward/judge_errors``,
``reward/judge_unparseable``) and leaves the sample out of its group's statistics and of the loss
(status ``failed``), instead of scoring it 0 as if the model were wrong.

The endpoint is checked when the run starts (:func:`check_endpoint`, before the policy is built): one
short request, so a judge that is down or a wrong model name is said in one line at once, not after
the first rollout.

Successful scores are cached in memory (the same question, response and label are not judged
twice; at most ``judge.cache_size`` entries, least recently used dropped first). An API key, if
the endpoint needs one, is read from the environment variable ``REINFORGE_JUDGE_API_KEY``.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from ..records import Sample
from ..rollout.infra_guard import InfraFailing
from .functions import answer_text

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = (
    "You are grading a response to a question.\n\n"
    "Question:\n{question}\n\n"
    "Reference answer:\n{label}\n\n"
    "Response:\n{response}\n\n"
    "How correct is the response, judged against the reference answer? Give a score from 0 "
    "(wrong) to 10 (fully correct), alone on the last line of your reply."
)
LAST_NUMBER = r"-?\d+(?:\.\d+)?"


class JudgeFailure(Exception):
    """The judge gave no score for a sample: ``kind`` is ``judge_errors`` (no answer: connection
    error, timeout, HTTP error, a malformed reply) or ``judge_unparseable`` (an answer without a score
    in range). Not the model's fault: the manager leaves the sample out instead of scoring it 0."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def question_text(sample: Sample) -> str:
    """The question a judge reads: the prompt, or for chat messages the last user message."""
    p = sample.prompt
    if isinstance(p, list):
        users = [m for m in p if isinstance(m, dict) and m.get("role") == "user"]
        last = users[-1] if users else (p[-1] if p else {})
        return str(last.get("content", "")) if isinstance(last, dict) else str(last)
    return str(p)


def fill_template(template: str, question: str, response: str, label: str) -> str:
    """``{question}``, ``{response}``, ``{label}`` replaced (other braces are left as they are)."""
    return template.replace("{question}", question).replace("{response}", response).replace("{label}", label)


class JudgeReward:
    """A reward function ``judge(sample) -> float`` in [0, 1], thread-safe (see the module doc).

    With ``engine`` (an :class:`~reinforge.reward.judge_engine.EngineJudge`) the judge is the embedded
    engine: :attr:`batched` is true and the manager calls :meth:`judge_many` once per scoring call;
    ``url``, ``model``, ``timeout`` and ``retries`` are then unused.
    """

    def __init__(
        self,
        url: str | None,
        model: str | None,
        template: str | None = None,
        score_regex: str | None = None,
        max_score: float = 10.0,
        timeout: float = 10.0,
        retries: int = 2,
        cache_size: int = 4096,
        engine: Any = None,
        verdicts: dict[str, float] | None = None,
    ):
        self.engine = engine
        self.url = (url or "").rstrip("/") + "/chat/completions"
        self.model = model
        self.template = template or DEFAULT_TEMPLATE
        self.regex = re.compile(score_regex or LAST_NUMBER)
        self.max_score = float(max_score)
        self.verdicts = {str(k).strip().lower(): float(v) for k, v in (verdicts or {}).items()}
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.cache_size = int(cache_size)
        self._cache: collections.OrderedDict[tuple[str, str, str], float] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.requests = 0  # HTTP requests sent (retries included), or prompts the embedded engine answered
        self._session = None

    @property
    def batched(self) -> bool:
        """Whether the judge answers a whole scoring call at once (the embedded engine)."""
        return self.engine is not None

    @property
    def name(self) -> str:
        """The judge in words, for logs: ``judge M at URL`` or ``embedded judge PATH``."""
        return (
            f"embedded judge {self.engine.spec.path}"
            if self.engine is not None
            else f"judge {self.model} at {self.url}"
        )

    def budget(self) -> float:
        """The longest one sample can take: every try timing out, plus the waits between them."""
        return (self.retries + 1) * self.timeout + sum(self._backoff(i) for i in range(self.retries)) + 1.0

    @staticmethod
    def _backoff(attempt: int) -> float:
        return min(0.25 * 2**attempt, 4.0)

    @staticmethod
    def key(sample: Sample) -> tuple[str, str, str]:
        """What the judge reads of ``sample`` (and the cache's key): question, response, label."""
        label = "" if sample.label is None else str(sample.label)
        return question_text(sample), answer_text(sample), label

    def _cached(self, key: tuple[str, str, str]) -> float | None:
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        return None

    def _store(self, key: tuple[str, str, str], score: float) -> None:
        if self.cache_size > 0:
            with self._lock:
                self._cache[key] = score
                self._cache.move_to_end(key)
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)

    def __call__(self, sample: Sample) -> float:
        """One sample through the endpoint (or the engine, as a call of one).

        Raises:
            JudgeFailure: no answer, or no score in it.
        """
        if self.engine is not None:
            (out,) = self.judge_many([sample])
            if isinstance(out, JudgeFailure):
                raise out
            return out
        key = self.key(sample)
        hit = self._cached(key)
        if hit is not None:
            return hit
        answer = self._ask(fill_template(self.template, *key))
        score = self.parse(answer)
        sample.reward_info["judge_answer"] = answer[-500:]
        self._store(key, score)
        return score

    def judge_many(self, samples: list[Sample]) -> list[float | JudgeFailure]:
        """Scores of ``samples`` in order (a :class:`JudgeFailure` where there is none), from the cache or
        from one batched call of the embedded engine for the rest (each distinct question, response and
        label judged once). The answer is kept in ``sample.reward_info["judge_answer"]`` (its last 500
        characters). Only for the embedded engine (:attr:`batched`)."""
        out: list[float | JudgeFailure | None] = [None] * len(samples)
        todo: dict[tuple[str, str, str], list[int]] = {}
        for i, s in enumerate(samples):
            key = self.key(s)
            hit = self._cached(key)
            if hit is None:
                todo.setdefault(key, []).append(i)
            else:
                out[i] = hit
        if todo:
            answers = self.engine.answer([fill_template(self.template, *k) for k in todo])
            with self._lock:
                self.requests += len(todo)
            for (key, where), answer in zip(todo.items(), answers):
                result: float | JudgeFailure = answer if isinstance(answer, JudgeFailure) else 0.0
                if not isinstance(answer, JudgeFailure):
                    for i in where:
                        samples[i].reward_info["judge_answer"] = answer[-500:]
                    try:
                        result = self.parse(answer)
                        self._store(key, result)
                    except JudgeFailure as e:
                        result = e
                for i in where:
                    out[i] = result
        return out  # type: ignore[return-value]

    def parse(self, answer: str) -> float:
        """The score in ``answer`` divided by ``max_score``: the last match of the regex (its last group
        that matched, if it has groups), a number or a verdict word of ``verdicts`` (without case).

        Raises:
            JudgeFailure: (``judge_unparseable``) no match, a match that is neither a number nor a
                verdict, or a score outside ``[0, max_score]``.
        """
        matches = list(self.regex.finditer(answer))
        if not matches:
            raise JudgeFailure("judge_unparseable", f"no score in the judge's answer {answer[-200:]!r}")
        m = matches[-1]
        text = next((g for g in reversed(m.groups()) if g is not None), m.group(0)) if m.groups() else m.group(0)
        try:
            value = float(text)
        except ValueError:
            verdict = self.verdicts.get(text.strip().lower())
            if verdict is None:
                known = f" nor a verdict of judge.verdicts {sorted(self.verdicts)}" if self.verdicts else ""
                raise JudgeFailure("judge_unparseable", f"judge score {text!r} is not a number{known}") from None
            value = verdict
        if not 0.0 <= value <= self.max_score:
            raise JudgeFailure(
                "judge_unparseable", f"judge score {value:g} outside [0, judge.max_score={self.max_score:g}]"
            )
        return value / self.max_score

    def close(self) -> None:
        """Free the embedded judge's engine (nothing to do for an endpoint)."""
        if self.engine is not None:
            self.engine.close()

    def _ask(self, prompt: str) -> str:
        import requests

        if self._session is None:
            self._session = requests.Session()
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}], "temperature": 0}

        def counted() -> None:
            with self._lock:
                self.requests += 1

        r, last, _ = post_retrying(self._session.post, self.url, body, self.timeout, self.retries, counted)
        if r is None:
            raise JudgeFailure("judge_errors", f"judge {self.url} failed {self.retries + 1} times; last: {last}")
        if r.status_code != 200:
            raise JudgeFailure("judge_errors", f"judge {self.url} answered HTTP {r.status_code}: {r.text[:200]}")
        try:
            content = r.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeFailure("judge_errors", f"judge {self.url} sent a malformed reply: {r.text[:200]}") from None
        if not isinstance(content, str):
            raise JudgeFailure("judge_errors", f"judge {self.url} sent no text content: {r.text[:200]}")
        return content


def judge_from_config(judge: Any, timeout: float, engine: Any = None) -> JudgeReward:
    """A :class:`JudgeReward` from a ``JudgeConfig`` (the ``judge`` section) and ``reward.timeout`` (seconds
    per request); ``engine``: the embedded judge's :class:`~reinforge.reward.judge_engine.EngineJudge`
    (``judge.model_path``), else the endpoint."""
    return JudgeReward(
        judge.url,
        judge.model,
        judge.template,
        judge.score_regex,
        judge.max_score,
        timeout,
        judge.retries,
        judge.cache_size,
        engine=engine,
        verdicts=judge.verdicts,
    )


class JudgeUnreachable(InfraFailing):
    """The judge endpoint did not answer the start-up request (connection refused, timeouts, HTTP 429 /
    5xx after ``judge.retries`` retries): the run does not start (exit status 1)."""


def _api_headers() -> dict[str, str]:
    key = os.environ.get("REINFORGE_JUDGE_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def post_retrying(
    post: Callable[..., Any],
    url: str,
    body: dict[str, Any],
    timeout: float,
    retries: int,
    on_attempt: Callable[[], None] | None = None,
) -> tuple[Any | None, str, float]:
    """POST ``body`` to ``url`` (``post``: ``requests.post`` or a session's) up to ``retries + 1`` times with
    :meth:`JudgeReward._backoff` between, retrying a connection error, a timeout, HTTP 429 and 5xx; the API key
    header from ``REINFORGE_JUDGE_API_KEY``. ``on_attempt`` is called before each try.

    Returns:
        (the first other response, "", the seconds that try took), or (None, the last error, 0.0) when every
        try failed.
    """
    import requests

    last = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(JudgeReward._backoff(attempt - 1))
        if on_attempt is not None:
            on_attempt()
        start = time.perf_counter()
        try:
            r = post(url, json=body, headers=_api_headers(), timeout=timeout)
        except requests.RequestException as e:  # connection refused, read timeout, ...
            last = f"{type(e).__name__}: {e}"
            continue
        if r.status_code == 429 or r.status_code >= 500:
            last = f"HTTP {r.status_code}: {r.text[:200]}"
            continue
        return r, "", time.perf_counter() - start
    return None, last, 0.0


def check_endpoint(cfg: Any, timeout: float) -> float:
    """Check the endpoint of the ``judge`` section ``cfg`` (``timeout``: ``reward.timeout``) when the run
    starts: one chat completion of at most one token for ``judge.model`` at ``judge.url``, tried as a scoring request is
    (``reward.timeout`` s each, ``judge.retries`` retries of a connection error, timeout or HTTP
    429 / 5xx). Logs one line when it answers. Does nothing without ``judge.url`` (the embedded judge
    is checked by :func:`reinforge.preflight.check_rl`).

    Returns:
        the seconds the answer took (0.0 when there is no endpoint to check).
    Raises:
        JudgeUnreachable: no answer (the message names ``judge.url`` and the last error).
        ValueError: an answer that refuses the request (HTTP 4xx: a wrong ``judge.model`` or API
            key) or is not an OpenAI-compatible chat completion.
    """
    if not cfg.url:
        return 0.0
    import requests

    url = cfg.url.rstrip("/") + "/chat/completions"
    body = {
        "model": cfg.model,
        "messages": [{"role": "user", "content": "Reply with the number 1."}],
        "max_tokens": 1,
        "temperature": 0,
    }
    where = f"judge.url={cfg.url} (judge.model={cfg.model!r})"
    tries = cfg.retries + 1
    r, last, seconds = post_retrying(requests.post, url, body, timeout, cfg.retries)
    if r is not None:
        if r.status_code != 200:
            raise ValueError(
                f"{where}: the judge refused the start-up request with HTTP {r.status_code}: {r.text[:200]}. "
                f"Set judge.model to the name the server serves (GET {cfg.url.rstrip('/')}/models "
                f"lists them) and REINFORGE_JUDGE_API_KEY if it needs a key"
            )
        try:
            r.json()["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ValueError(
                f"{where}: POST {url} answered, but not with an OpenAI chat completion ({r.text[:200]!r}): "
                f"judge.url is the base URL of an OpenAI-compatible server (its /v1)"
            ) from None
        log.info("reward: the judge answers at %s (%.2f s)", where, seconds)
        return seconds
    raise JudgeUnreachable(
        f"{where}: the judge does not answer ({tries} {'try' if tries == 1 else 'tries'} of reward.timeout="
        f"{timeout:g} s; last: {last}). "
        f"Start the judge server (e.g. `vllm serve <model>`) or fix judge.url; nothing was built yet"
    )
