"""How far the trainer's log-probs are from the engine's on the tokens the engine sampled.

The engine samples with its own kernels and precision (bf16, a different attention or sampler),
so the trainer's log-prob of a sampled token, ``log pi_train``, differs from the one the engine
reported, ``log pi_rollout``. The token importance weight ``w = pi_train / pi_rollout =
exp(log pi_train - log pi_rollout)`` is what truncated / masked importance sampling corrects with
(Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"); its
mean hides the few tokens where the two disagree badly, so :func:`mismatch_stats` reports the tail
of the distribution too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .losses import safe_ratio

__all__ = ["MISMATCH_QUANTILES", "mismatch_stats", "quantiles", "token_log_ratios"]

MISMATCH_QUANTILES = (0.5, 0.9, 0.99)
"""The quantiles :func:`mismatch_stats` reports (as ``_p50``, ``_p90``, ``_p99``)."""


def token_log_ratios(
    train_log_probs: Sequence[torch.Tensor],
    rollout_log_probs: Sequence[torch.Tensor],
    masks: Sequence[Sequence[int] | torch.Tensor],
) -> torch.Tensor:
    """``log pi_train - log pi_rollout`` at every token where the mask is 1, all samples concatenated.

    Args:
        train_log_probs: per sample, the trainer's log-probs of its response tokens ``[T_i]``.
        rollout_log_probs: per sample, the engine's log-probs of the same tokens ``[T_i]``.
        masks: per sample, the loss mask ``[T_i]`` (0/1; 0 on tool outputs and filtered samples).

    Returns:
        fp32 ``[N]`` on the CPU, N the number of masked-in tokens, in sample order.

    Raises:
        ValueError: the three lists differ in length, or a sample's three vectors do (the message
            names the sample).
    """
    if not len(train_log_probs) == len(rollout_log_probs) == len(masks):
        raise ValueError(
            f"token_log_ratios: {len(train_log_probs)} trainer, {len(rollout_log_probs)} rollout "
            f"log-prob vectors and {len(masks)} masks: one of each per sample"
        )
    parts = []
    for i, (t, r, m) in enumerate(zip(train_log_probs, rollout_log_probs, masks)):
        t, r = torch.as_tensor(t, dtype=torch.float32).cpu(), torch.as_tensor(r, dtype=torch.float32).cpu()
        m = torch.as_tensor(m).cpu().bool()
        if not t.shape == r.shape == m.shape:
            raise ValueError(
                f"token_log_ratios: sample {i} has {tuple(t.shape)} trainer log-probs, "
                f"{tuple(r.shape)} rollout log-probs and a {tuple(m.shape)} mask"
            )
        parts.append((t - r)[m])
    return torch.cat(parts) if parts else torch.zeros(0)


def quantiles(values: torch.Tensor, qs: Sequence[float]) -> list[float]:
    """Quantiles of a 1-D tensor with linear interpolation between order statistics (numpy's default
    ``method="linear"``, Hyndman & Fan 1996 definition 7): ``q`` lies at position ``q * (n - 1)``
    of the sorted values. Exact for any n (``torch.quantile`` refuses inputs over 2**24 elements).

    Raises:
        ValueError: ``values`` is empty or a ``q`` is outside [0, 1].
    """
    if values.numel() == 0:
        raise ValueError("quantiles of an empty tensor")
    if any(not 0.0 <= q <= 1.0 for q in qs):
        raise ValueError(f"quantiles: every q must lie in [0, 1], got {list(qs)}")
    s = values.detach().double().flatten().sort().values
    n = s.numel()
    out = []
    for q in qs:
        pos = q * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        a, b = float(s[lo]), float(s[hi])
        out.append(a if a == b or pos == lo else a + (b - a) * (pos - lo))  # a == b: inf stays inf
    return out


def mismatch_stats(log_ratio: torch.Tensor) -> dict[str, float]:
    """Tail statistics of the trainer-vs-engine log-prob difference over tokens.

    Args:
        log_ratio: ``log pi_train - log pi_rollout`` per token, ``[N]`` (:func:`token_log_ratios`).

    Returns:
        ``logprob_abs_diff_{p50,p90,p99,max}`` of ``|log_ratio|`` and ``importance_weight_{min,p50,p90,
        p99,max}`` of ``w = exp(log_ratio)``, the log-ratio clamped to [-20, 20] as the loss clamps it
        (:func:`~reinforge.algo.losses.safe_ratio`); quantiles by :func:`quantiles`. Empty ``{}`` when
        N = 0.
    """
    if log_ratio.numel() == 0:
        return {}
    x = log_ratio.detach().double().flatten()
    names = [f"p{round(q * 100)}" for q in MISMATCH_QUANTILES]
    diff = x.abs()
    out = dict(zip((f"logprob_abs_diff_{n}" for n in names), quantiles(diff, MISMATCH_QUANTILES)))
    out["logprob_abs_diff_max"] = float(diff.max())
    w = safe_ratio(x)
    out["importance_weight_min"] = float(w.min())
    out.update(zip((f"importance_weight_{n}" for n in names), quantiles(w, MISMATCH_QUANTILES)))
    out["importance_weight_max"] = float(w.max())
    return out
