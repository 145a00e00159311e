"""Evaluation statistics."""

from __future__ import annotations


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from n samples of which c are correct.

    1 - C(n - c, k) / C(n, k), computed as a running product for numerical stability
    (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", fig. 3).

    Raises:
        ValueError: k > n, c > n or a negative count.
    """
    if not (0 <= c <= n) or k < 1 or k > n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong
