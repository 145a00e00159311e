"""The judge of ``reward.type: judge`` run by the embedded engine with its own model (``judge.model_path``).

The judge model (a Hugging Face folder or a known name) gets an :class:`~reinforge.engine.EmbeddedEngine` of
its own in the trainer's process, on the trainer's device (``train.device``), colocated with the trainer
and the policy's engine. It **sleeps** (KV cache freed; with ``judge.offload_weights`` its weights
on the CPU) except while it scores: :meth:`EngineJudge.answer` wakes it, generates every answer of one
scoring call (one rollout's samples, or one evaluation's) as one batched ``generate`` (greedy, at most
``judge.max_new_tokens`` tokens, the judge model's chat template around each prompt, its EOS ids as
stop tokens) and puts it back to sleep. So it holds no KV cache while the trainer trains or the policy
generates (in asynchronous mode, ``rollout.max_staleness`` > 0, scoring overlaps training: the judge's
cache then coexists with the trainer's memory).

Its engine is sized to its work: ``judge.max_num_seqs`` slots (capped at the sequences one rollout
or evaluation holds, :func:`~reinforge.plan.sequences.run_max_seqs`) of ``judge.max_len`` tokens
(prompt + answer; 0: the judge model's context window, at most :data:`DEFAULT_MAX_LEN`); the other
``engine.*`` settings (dtype, KV block size, CUDA graphs) are the policy engine's. :func:`judge_problems`
checks it before anything is built (:func:`reinforge.preflight.check_rl`): the path, the model family, the
length against the judge's context window, and its memory beside the policy's engine.

Parsing, the cache and the failure counts are :class:`~reinforge.reward.judge.JudgeReward`'s, the same as
for an endpoint (``judge.url``); this module is only the transport. A prompt longer than
``judge.max_len`` allows, or an engine error, is a judge error (counted, the sample left out), never a
score of 0. Greedy decoding is deterministic, so nothing is retried, and the answer length is bounded, so no
timeout applies (``reward.timeout`` and ``judge.retries`` are the endpoint's).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..config.fields import ConfigError
from .judge import JudgeFailure

if TYPE_CHECKING:
    from ..config import Config, EngineConfig
    from ..plan.kv_plan import KVCachePlan

log = logging.getLogger(__name__)

DEFAULT_MAX_LEN = 2048  # judge.max_len=0: the judge's context window, at most this many tokens
GIB, MIB = 1 << 30, 1 << 20


@dataclass
class JudgeSpec:
    """What the judge's engine is built with (:func:`judge_spec`).

    Attributes:
        path: the judge model's Hugging Face folder.
        engine: the ``engine`` section with the judge's slots (``max_num_seqs``) and no block cap.
        device: where it runs (the trainer's device).
        dtype: weights and KV-cache dtype (``engine.dtype``: bf16 on CUDA, fp32 elsewhere by default).
        max_len: tokens of prompt + answer per sequence.
        max_new_tokens: tokens of an answer at most.
        offload_weights: weights to the CPU while asleep.
    """

    path: Path
    engine: EngineConfig
    device: torch.device
    dtype: torch.dtype
    max_len: int
    max_new_tokens: int
    offload_weights: bool


def resolve_judge_path(name: str) -> Path:
    """``judge.model_path`` as a local folder (as ``model.path`` is resolved: a folder, a known
    name converted on first use, a Hugging Face id in the local cache).

    Raises:
        ConfigError: not found (the message names ``judge.model_path`` and where it looked).
    """
    from ..models.hub import resolve_model_path

    try:
        return resolve_model_path(name)
    except FileNotFoundError as e:
        raise ConfigError(str(e).replace("model.path", "judge.model_path")) from None


def _window(path: Path) -> tuple[dict[str, Any], Any]:
    from ..models.context import context_window

    config = json.loads((path / "config.json").read_text())
    return config, context_window(config)


def judge_spec(cfg: Config) -> JudgeSpec:
    """The judge engine's :class:`JudgeSpec` for a run's config.

    Raises:
        ConfigError: ``judge.model_path`` not found.
    """
    from ..plan.sequences import run_max_seqs
    from ..rollout.backends import engine_dtype
    from ..utils.device import resolve_device

    j = cfg.judge
    path = resolve_judge_path(str(j.model_path))
    device = resolve_device(cfg.train.device)
    need = run_max_seqs(cfg)
    slots = min(j.max_num_seqs, need) if need else j.max_num_seqs
    # the policy engine's settings, but never its fp8 weights (a judge's scores are not the policy's to trade)
    engine = dataclasses.replace(cfg.engine, max_num_seqs=slots, num_kv_blocks=0, quantization=None)
    _, window = _window(path)
    max_len = j.max_len or min(DEFAULT_MAX_LEN, window.tokens if window else DEFAULT_MAX_LEN)
    dtype = engine_dtype(cfg.engine.dtype, device)
    return JudgeSpec(path, engine, device, dtype, max_len, j.max_new_tokens, j.offload_weights)


def _size(b: float) -> str:
    return f"{b / GIB:.1f} GiB" if b >= GIB else f"{b / MIB:.0f} MiB"


def engine_plan(folder: Path, engine: EngineConfig, max_len: int, device: torch.device) -> KVCachePlan:
    """The memory of an embedded engine on ``folder``'s model built with ``engine`` for ``max_len`` tokens per
    sequence (:func:`reinforge.engine.kv_cache.kv_cache_plan`, the count the policy's up-front check reads:
    the engine's own layout without the GPU's free-memory cap, the sink block, sliding-window rings and a
    hybrid's states included; weights at ``engine.dtype``)."""
    from ..engine.kv_cache import kv_cache_plan
    from ..models.shape import model_shape
    from ..rollout.backends import engine_dtype

    return kv_cache_plan(model_shape(folder), engine, max_len, device, engine_dtype(engine.dtype, device))


def judge_problems(
    cfg: Config, policy_folder: Path, policy_max_len: int, device: torch.device, memory: float | None = None
) -> list[str]:
    """What stops the embedded judge of ``cfg`` from running, in words (empty: none, or no embedded judge).

    Checked: ``cluster.mode=local`` (a Ray run is refused: serve the judge and set ``judge.url``);
    ``judge.model_path`` resolves to a model of a registered family; ``judge.max_len`` within
    the judge's context window and above ``judge.max_new_tokens``; memory: on a CPU the judge's
    weights and its whole KV cache (slots x ``judge.max_len`` x 2 x layers x kv_heads x head_dim x dtype
    bytes), beside the policy's embedded engine (weights + cache at ``policy_max_len``), against
    ``memory`` (default: MemAvailable); on a GPU its weights and one sequence's cache against the free
    memory (its engine takes at most ``engine.kv_cache_memory_fraction`` of what is free when it wakes).
    """
    from ..models.families import is_native_type, native_models

    r, j = cfg.reward, cfg.judge
    if not r.properties.get("judge") or not j.model_path:
        return []
    if cfg.cluster.mode != "local":
        return [
            f"judge.model_path={j.model_path} (a judge run by the embedded engine in the trainer's "
            f"process) needs cluster.mode=local; with cluster.mode={cfg.cluster.mode} serve the judge model with "
            f"vLLM or SGLang and set judge.url and judge.model instead"
        ]
    try:
        spec = judge_spec(cfg)
    except ConfigError as e:
        return [str(e)]
    config, window = _window(spec.path)
    key = f"judge.model_path={j.model_path}"
    if not is_native_type(config.get("model_type")):
        return [
            f"{key}: model_type {config.get('model_type')!r} is not one the embedded engine runs (it needs "
            f"{native_models()}): serve this judge with vLLM or SGLang and set judge.url"
        ]
    if window is not None and spec.max_len > window.tokens:
        return [
            f"judge.max_len={spec.max_len} but the judge model {spec.path.name} holds {window.tokens} "
            f"positions ({window.source}): set judge.max_len to at most {window.tokens} (0: its window)"
        ]
    if spec.max_new_tokens >= spec.max_len:
        return [
            f"judge.max_new_tokens={spec.max_new_tokens} leaves no room for the judge's prompt in "
            f"judge.max_len={spec.max_len}: raise judge.max_len or lower judge.max_new_tokens"
        ]
    plan = engine_plan(spec.path, spec.engine, spec.max_len, spec.device)
    kv, weights, per_slot = plan.bytes + plan.state_bytes, plan.weight_bytes, plan.bytes_per_slot
    slots = spec.engine.max_num_seqs
    what = (
        f"the embedded judge ({key}) needs its weights {_size(weights)} plus "
        f"{{cache}} ({slots} slots of judge.max_len={spec.max_len} tokens, {_size(per_slot)} each)"
    )
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if weights + per_slot <= free:
            return []
        return [
            what.format(cache=f"one sequence's KV cache {_size(per_slot)}")
            + f", but {_size(free)} are free on {device}: lower judge.max_len or use a smaller judge"
        ]
    if memory is None:
        from ..utils.machine import machine_resources

        memory = machine_resources()["memory"]
    other = 0
    if cfg.engine.backend == "embedded" and is_native_type(
        json.loads((policy_folder / "config.json").read_text()).get("model_type")
    ):
        from ..rollout.backends import engine_config_for

        other = engine_plan(policy_folder, engine_config_for(cfg), policy_max_len, device).total
    if weights + kv + other <= memory:
        return []
    fit = int((memory - other - weights) // per_slot) - 1
    fix = (
        f"lower judge.max_num_seqs to at most {fit} or judge.max_len"
        if fit >= 1
        else "lower judge.max_len, or use a smaller judge or policy"
    )
    return [
        what.format(cache=f"its KV cache {_size(kv)}")
        + f", beside the policy's engine ({_size(other)}), but this machine has {_size(memory)} of memory "
        f"available: {fix}"
    ]


class EngineJudge:
    """The judge's engine (see the module doc): :meth:`answer` turns judge prompts into answers, one
    batched ``generate`` per call, awake only meanwhile. Thread-safe (one call at a time).

    Args:
        spec: from :func:`judge_spec`.

    Raises:
        ConfigError: the model is not of a registered family, or its KV cache does not fit in the
            memory (names ``judge.max_num_seqs`` / ``judge.max_len``).
    """

    def __init__(self, spec: JudgeSpec):
        from ..engine import EmbeddedEngine
        from ..models.families import native_models
        from ..models.loading import build_model, is_native, load_tokenizer
        from ..rollout.generate import model_stop_token_ids

        self.spec = spec
        self.tokenizer = load_tokenizer(spec.path)
        model = build_model(spec.path, spec.dtype, spec.device)
        if not is_native(model):
            raise ConfigError(
                f"judge.model_path={spec.path}: the embedded engine needs {native_models()}; serve this "
                f"judge with vLLM or SGLang and set judge.url"
            )
        try:
            self.engine = EmbeddedEngine(model, spec.engine, max_model_len=spec.max_len, tokenizer=self.tokenizer)
        except (MemoryError, torch.OutOfMemoryError) as e:
            raise ConfigError(
                f"the embedded judge's KV cache (judge.model_path={spec.path}) does not fit: {e}; lower "
                f"judge.max_num_seqs or judge.max_len"
            ) from None
        self.stop_ids = model_stop_token_ids(self.tokenizer, str(spec.path), [])
        self.engine.sleep(offload_weights=spec.offload_weights)
        self._lock = threading.Lock()
        self.calls = 0  # batched generate calls
        self.prompt_tokens = self.answer_tokens = 0  # tokens prefilled and generated over all calls
        log.info(
            "embedded judge %s on %s: %d slots of %d tokens (answers of at most %d), asleep between scorings",
            spec.path,
            spec.device,
            spec.engine.max_num_seqs,
            spec.max_len,
            spec.max_new_tokens,
        )

    @property
    def asleep(self) -> bool:
        """Whether the KV cache is freed (between scorings)."""
        return self.engine.scheduler is None

    def encode(self, prompt: str) -> list[int]:
        """Token ids of ``prompt`` as one user message in the judge's chat template (with the assistant's
        generation prompt); the plain text when the tokenizer has no template."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            return list(tok(text, add_special_tokens=False)["input_ids"])
        return list(tok(prompt)["input_ids"])

    def answer(self, prompts: list[str]) -> list[str | JudgeFailure]:
        """The judge's answer to each prompt (decoded text), in order, or a :class:`JudgeFailure`
        (``judge_errors``) for a prompt too long for ``judge.max_len`` or an engine error."""
        from ..records import GenerateRequest, SamplingParams
        from ..utils import trace

        s = self.spec
        room = s.max_len - s.max_new_tokens
        out: list[str | JudgeFailure | None] = [None] * len(prompts)
        requests, where = [], []
        params = SamplingParams(max_new_tokens=s.max_new_tokens, temperature=0.0, stop_token_ids=self.stop_ids)
        for i, p in enumerate(prompts):
            ids = self.encode(p)
            if len(ids) > room:
                out[i] = JudgeFailure(
                    "judge_errors",
                    f"the judge prompt has {len(ids)} tokens (its chat template applied) but judge.max_len="
                    f"{s.max_len} leaves {room} beside judge.max_new_tokens={s.max_new_tokens}: raise "
                    f"judge.max_len, or shorten judge.template or the responses",
                )
                continue
            requests.append(GenerateRequest(ids, params, request_id=f"judge-{i}"))
            where.append(i)
        if requests:
            with self._lock, trace.span("judge_generate", "reward", prompts=len(requests)):
                self.calls += 1
                try:
                    self.engine.wake_up()  # (its KV cache may not fit now: a failure of the call like any)
                    results = self.engine.generate(requests)
                except Exception as e:  # noqa: BLE001 - every answer of the call failed: counted, not scored
                    self.engine.shutdown()  # drops what is queued
                    msg = f"the embedded judge's engine failed: {type(e).__name__}: {e}"
                    for i in where:
                        out[i] = JudgeFailure("judge_errors", msg)
                    return out  # type: ignore[return-value]
                finally:  # asleep until the next call, its weights where judge.offload_weights keeps them
                    self.engine.sleep(offload_weights=s.offload_weights)
            self.prompt_tokens += sum(len(r.prompt_ids) for r in requests)
            for i, res in zip(where, results):
                out[i] = self.tokenizer.decode(res[0].token_ids, skip_special_tokens=True)
                self.answer_tokens += len(res[0].token_ids)
        return out  # type: ignore[return-value]

    def close(self) -> None:
        self.engine.shutdown()


def build_engine_judge(judge: Any, run: Config | None = None) -> EngineJudge:
    """The embedded judge of ``judge`` (a ``JudgeConfig`` with ``model_path``), built now and asleep,
    placed by ``run``, the run's whole config (trainer's device, ``engine`` section, rollout size; ``None``:
    the defaults of a config with this judge section).

    Raises:
        ConfigError: the judge model is not found, not one the engine runs, or its cache does not fit.
    """
    if run is None:
        from ..config import Config

        run = Config(judge=judge)
    return EngineJudge(judge_spec(run))
