"""Endpoint teachers: an OpenAI-compatible server scoring the student's tokens with prompt log-probs.

Two request forms (``distill.teacher_api``):

* ``vllm``: ``POST {url}/completions`` with the token ids as ``prompt`` (a list of lists: one request per
  batch of ``distill.batch_size`` samples), ``max_tokens: 1`` and ``prompt_logprobs: 0``; each choice's
  ``prompt_logprobs`` is a list with one entry per prompt token (None for the first), a dict from the token
  id (as a string) to ``{"logprob", "rank", "decoded_token"}`` that always holds the prompt's own token.
* ``sglang``: ``POST {url}/generate`` with ``input_ids`` (a list of lists), ``max_new_tokens: 0``,
  ``return_logprob: true`` and ``logprob_start_len: 0``; each answer's ``meta_info.input_token_logprobs``
  holds ``[logprob, token_id, text]`` per input token (None for the first).

Requests go through the judge's retrying POST (:func:`~reinforge.reward.judge.post_retrying`: a connection
error, a timeout, HTTP 429 and 5xx are retried with back-off). A batch that still fails marks its samples
``failed`` with kind ``teacher`` (:func:`~reinforge.rollout.infra_guard.mark_failed`): left out of the loss
and counted by the infrastructure guard, never scored as the model's fault. The log-probs are those of the
teacher's distribution (temperature 1), as a checkpoint teacher's.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..config import ConfigError
from ..config.distill import DistillConfig
from ..records import Sample, Status
from ..rollout.infra_guard import mark_failed
from .teachers import TEACHER_LOG_PROBS, teacher_name

log = logging.getLogger(__name__)

FAILURE_KIND = "teacher"


class TeacherEndpointError(ConfigError):
    """An endpoint teacher that cannot be used: unreachable, no prompt log-probs, another tokenizer (at start:
    the run is refused in one line, as a configuration error; during the run: its samples counted failed)."""


def _post(url: str, body: dict[str, Any], d: DistillConfig) -> Any:
    """The parsed JSON answer of ``url`` to ``body`` (retried), or raises :class:`TeacherEndpointError`."""
    import requests

    from ..reward.judge import post_retrying

    r, error, _ = post_retrying(requests.post, url, body, d.timeout, d.retries)
    if r is None:
        raise TeacherEndpointError(f"no answer from {url} after {d.retries + 1} tries ({error})")
    if r.status_code >= 400:
        raise TeacherEndpointError(f"{url} refused the request: HTTP {r.status_code}: {r.text[:300]}")
    try:
        return r.json()
    except ValueError:
        raise TeacherEndpointError(f"{url} answered something that is not JSON: {r.text[:200]!r}") from None


def request_log_probs(url: str, sequences: list[list[int]], d: DistillConfig, model: str | None) -> list[list[float]]:
    """The endpoint's log-prob of each token of each sequence after the first (``len(seq) - 1`` per sequence).

    Raises:
        TeacherEndpointError: no answer after the retries, an HTTP error, or an answer without prompt
            log-probs (the message says which field was missing and what the server needs).
    """
    base = url.rstrip("/")
    if d.teacher_api == "sglang":
        body = {
            "input_ids": sequences,
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": 0,
        }
        answer = _post(base + "/generate", body, d)
        answers = answer if isinstance(answer, list) else [answer]
        out = []
        for seq, a in zip(sequences, answers, strict=True):
            entries = (a.get("meta_info") or {}).get("input_token_logprobs") if isinstance(a, dict) else None
            if not entries or len(entries) < len(seq):
                raise TeacherEndpointError(
                    f"{base}/generate returned no meta_info.input_token_logprobs for every input token: the teacher "
                    f"endpoint must be an SGLang server honouring return_logprob with logprob_start_len=0"
                )
            out.append([float(e[0]) for e in entries[1 : len(seq)]])
        return out
    body = {"prompt": sequences, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
    if model:
        body["model"] = model
    answer = _post(base + "/completions", body, d)
    choices = sorted(answer.get("choices") or [], key=lambda c: c.get("index", 0)) if isinstance(answer, dict) else []
    if len(choices) != len(sequences):
        raise TeacherEndpointError(
            f"{base}/completions returned {len(choices)} choices for {len(sequences)} prompts (an OpenAI-compatible "
            f"completions endpoint answering token-id prompts is needed: vLLM's)"
        )
    out = []
    for seq, c in zip(sequences, choices):
        entries = c.get("prompt_logprobs")
        if not entries or len(entries) < len(seq):
            raise TeacherEndpointError(
                f"{base}/completions returned no prompt_logprobs: the teacher endpoint must return prompt "
                f"log-probs (vLLM's OpenAI server with `prompt_logprobs`; for SGLang set distill.teacher_api=sglang)"
            )
        out.append([_vllm_logprob(entries[j], tok) for j, tok in enumerate(seq) if j > 0])
    return out


def _vllm_logprob(entry: dict[str, Any], token: int) -> float:
    got = entry.get(str(token), entry.get(token)) if isinstance(entry, dict) else None  # type: ignore[call-overload]
    if not isinstance(got, dict) or "logprob" not in got:
        raise TeacherEndpointError(f"the endpoint's prompt_logprobs lack the prompt's own token {token}")
    return float(got["logprob"])


def first_model(url: str, d: DistillConfig) -> str | None:
    """The first model ``GET {url}/models`` lists (vLLM needs the ``model`` field), None if it lists none."""
    import requests

    try:
        r = requests.get(url.rstrip("/") + "/models", timeout=d.timeout)
        data = r.json().get("data") or []
        return str(data[0]["id"]) if data else None
    except (requests.RequestException, ValueError, KeyError, TypeError):
        return None


def check_endpoint(url: str, d: DistillConfig, tokenizer: Any, model: str | None) -> None:
    """At start: one request scoring a short text, which must return prompt log-probs; with vLLM the tokens
    it decodes must be the student tokenizer's (another tokenizer is refused in words).

    Raises:
        TeacherEndpointError: unreachable, no prompt log-probs, or a tokenizer mismatch.
    """
    ids = tokenizer.encode("The teacher checks: 12 + 30 = 42, naïve café!", add_special_tokens=False)
    try:
        request_log_probs(url, [ids], d, model)
    except TeacherEndpointError as e:
        raise TeacherEndpointError(f"distill teacher endpoint {url}: {e}") from None
    if d.teacher_api != "vllm":
        return
    body: dict[str, Any] = {"prompt": [ids], "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
    if model:
        body["model"] = model
    entries = _post(url.rstrip("/") + "/completions", body, d)["choices"][0]["prompt_logprobs"]
    for j, tok in enumerate(ids[1:], start=1):
        theirs = (entries[j].get(str(tok)) or {}).get("decoded_token")
        ours = tokenizer.convert_ids_to_tokens(tok)
        plain = tokenizer.decode([tok])
        if theirs is not None and theirs not in (ours, plain):
            raise TeacherEndpointError(
                f"distill teacher endpoint {url} decodes token id {tok} as {theirs!r}, the student's tokenizer as "
                f"{plain!r}: the teacher's tokenizer differs from the student's (model.path), and on-policy "
                f"distillation scores the student's token ids with the teacher; serve a teacher with the same tokenizer"
            )


class EndpointTeachers:
    """The endpoint teachers of ``distill`` (by name), checked at start, scoring rollouts from the driver.

    Args:
        d: the ``distill`` section; tokenizer: the student's (for the start-up check).
    Raises:
        TeacherEndpointError: an endpoint fails its start-up check (:func:`check_endpoint`).
    """

    def __init__(self, d: DistillConfig, tokenizer: Any):
        self.d = d
        self.urls = d.endpoint_teachers()
        self.models = {
            n: d.teacher_model or (first_model(u, d) if d.teacher_api == "vllm" else None) for n, u in self.urls.items()
        }
        for name, url in self.urls.items():
            check_endpoint(url, d, tokenizer, self.models[name])
            log.info("distill: endpoint teacher %s answers with prompt log-probs", url)

    def __bool__(self) -> bool:
        return bool(self.urls)

    def score(self, groups: list[list[Sample]]) -> dict[str, float]:
        """Put each endpoint-scored sample's teacher log-probs in ``metadata["teacher_log_probs"]``; a batch
        that fails after the retries marks its samples failed (kind ``teacher``, the reason in words).

        Returns:
            ``distill/teacher_failed_samples`` and ``distill/teacher_endpoint_seconds``.
        """
        start = time.perf_counter()
        batches: list[tuple[str, list[Sample]]] = []
        for name in self.urls:
            mine = [
                s for g in groups for s in g if s.status != Status.FAILED and teacher_name(s.metadata, self.d) == name
            ]
            for i in range(0, len(mine), self.d.batch_size):
                batches.append((name, mine[i : i + self.d.batch_size]))
        failed = 0

        def run(job: tuple[str, list[Sample]]) -> int:
            name, samples = job
            url = self.urls[name]
            try:
                scored = request_log_probs(url, [s.tokens for s in samples], self.d, self.models[name])
            except TeacherEndpointError as e:
                for s in samples:
                    mark_failed(s, FAILURE_KIND, f"distill teacher endpoint {url}: {e}")
                return len(samples)
            for s, lps in zip(samples, scored):
                s.metadata[TEACHER_LOG_PROBS] = lps[len(lps) - s.response_length :] if s.response_length else []
            return 0

        with ThreadPoolExecutor(max_workers=4) as pool:
            failed = sum(pool.map(run, batches))
        return {
            "distill/teacher_failed_samples": float(failed),
            "distill/teacher_endpoint_seconds": time.perf_counter() - start,
        }
