"""The log-prob probe: after a weight sync, a fixed prompt through engine and trainer.

Checksums (:mod:`.verify`) prove the engine holds the bytes the trainer sent; the probe proves the
bytes are the model the trainer trains: the engine samples :data:`PROBE_TOKENS` tokens after a fixed
prompt (at the rollout temperature, no top-k / top-p, ignoring EOS) with their log-probs, the trainer
scores the same tokens, and the largest per-token absolute difference is ``sync/probe_logprob_diff``.
It catches what checksums cannot: weights the trainer never meant to send (LoRA adapters not
merged), a layout the engine reads differently (a fused or repacked matrix, fp8 scales), an engine
that does not expose checksums (SGLang), stale rollouts after sleep. Cost: one request of
:data:`PROBE_TOKENS` tokens and one trainer forward of ~40 tokens.

The tolerance depends on the lowest precision in play (:func:`probe_tolerance`): an fp32 engine and
trainer agree to ~1e-5 per token, a bf16 engine to a mean of ~0.035 (docs/engines.md), fp8 weights to
~0.11 (max ~1); a weight sync that did not happen moves a trained model's log-probs by more.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from ..records import GenerateRequest, Sample, SamplingParams
from .verify import WeightSyncMismatch

log = logging.getLogger(__name__)
PROBE_TEXT = "Weight sync probe. Count from one to ten, then name three primary colours:"
PROBE_TOKENS = 16
TOLERANCE = {"fp32": 1e-3, "fp16": 0.5, "bf16": 1.0, "fp8": 2.0}


def probe_tolerance(override: float | None, engine_dtype: torch.dtype, train_bf16: bool, fp8: bool) -> float:
    """``override`` (``cluster.weight_sync_probe_tolerance``), or (None) :data:`TOLERANCE` of the lowest
    precision among the engine's dtype, the trainer's bf16 autocast (``train_bf16``) and fp8 engine
    weights or KV cache (``fp8``)."""
    if override is not None:
        return float(override)
    kinds = {"fp32"}
    if engine_dtype == torch.bfloat16 or train_bf16:
        kinds.add("bf16")
    if engine_dtype == torch.float16:
        kinds.add("fp16")
    if fp8:
        kinds.add("fp8")
    return max(TOLERANCE[k] for k in kinds)


def probe_logprob_diff(
    engine: Any, log_probs: Callable[[list[Sample]], list[torch.Tensor]], prompt_ids: list[int], temperature: float
) -> float:
    """The largest |engine - trainer| log-prob over the probe's sampled tokens.

    Args:
        engine: a ``RolloutEngine`` (any backend: only ``generate`` is used).
        log_probs: the trainer's log-probs of each sample's response tokens at the rollout
            temperature (``Cluster.probe_log_probs``).
        prompt_ids: the fixed prompt's token ids.
        temperature: the rollout temperature (both sides score that distribution).
    """
    params = SamplingParams(max_new_tokens=PROBE_TOKENS, temperature=temperature, ignore_eos=True)
    result = engine.generate([GenerateRequest(list(prompt_ids), params)])[0][0]
    n = len(result.token_ids)
    if n == 0:
        return 0.0
    sample = Sample(
        prompt="",
        tokens=list(prompt_ids) + list(result.token_ids),
        response_length=n,
        loss_mask=[1] * n,
        routed_experts=getattr(result, "routed_experts", None),  # (routing replay: the trainer uses the engine's)
    )
    trainer = log_probs([sample])[0].detach().float().cpu()
    return float((torch.tensor(result.log_probs, dtype=torch.float32) - trainer).abs().max())


def check_probe(diff: float, tolerance: float, version: int, transport: str) -> None:
    """Raises:
    WeightSyncMismatch: ``diff`` above ``tolerance`` (one line: the numbers, what it means, the keys)."""
    if not diff <= tolerance:  # (NaN fails too)
        raise WeightSyncMismatch(
            f"weight sync ({transport}) of version {version}: the engine's log-probs of the probe prompt differ "
            f"from the trainer's by {diff:.3g} > {tolerance:.3g}: the engine does not compute with the trained "
            f"model (a sync that did not land, LoRA not merged, a layout read differently); "
            f"cluster.weight_sync_probe_tolerance sets the bound, cluster.weight_sync_probe_interval=0 turns "
            f"the probe off"
        )


class SyncProbe:
    """The probe on its schedule (``cluster.weight_sync_probe_interval``) for the RL loop.

    Args:
        cfg: the run's config.
        tokenizer: encodes :data:`PROBE_TEXT` once.
        cluster: the ``Cluster`` (its ``engine``, ``probe_log_probs``, ``weight_transport`` and
            ``diagnose_weights``, which names the first tensor that differs when the probe fails).
        tolerance: the largest allowed difference (:func:`probe_tolerance`; built by
            :func:`reinforge.cluster.sync_probe.build_probe`).
    """

    def __init__(self, cfg: Any, tokenizer: Any, cluster: Any, tolerance: float):
        self.cfg, self.cluster, self.tolerance = cfg, cluster, tolerance
        self.interval = cfg.cluster.weight_sync_probe_interval
        self.prompt_ids = list(tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"])

    def due(self, version: int) -> bool:
        return self.interval > 0 and version % self.interval == 0

    def __call__(self, version: int, start: bool = False) -> dict[str, float]:
        """Probe after the sync of ``version`` when due (``start``: the sync at start-up, always unless
        the interval is 0): ``{"sync/probe_logprob_diff": d}`` (else {}).

        Raises:
            WeightSyncMismatch: the difference exceeds the tolerance (one line; the first tensor the
                engine holds differently from the trainer named where one does).
        """
        if not (self.due(version) or (start and self.interval > 0)):
            return {}
        from ..utils import trace

        t0 = time.perf_counter()
        with trace.span("probe", "sync", version=version):
            diff = probe_logprob_diff(
                self.cluster.engine, self.cluster.probe_log_probs, self.prompt_ids, self.cfg.rollout.rollout_temperature
            )
        transport = getattr(self.cluster, "weight_transport", "weight sync")
        try:
            check_probe(diff, self.tolerance, version, transport)
        except WeightSyncMismatch as e:
            where = self.cluster.diagnose_weights() if hasattr(self.cluster, "diagnose_weights") else None
            if where:
                raise WeightSyncMismatch(f"{e}; {where}") from None
            raise
        log.info(
            "weight sync probe (version %d): max |engine - trainer| log-prob %.3g (tolerance %.3g)",
            version,
            diff,
            self.tolerance,
        )
        return {"sync/probe_logprob_diff": diff, "sync/probe_seconds": time.perf_counter() - t0}
