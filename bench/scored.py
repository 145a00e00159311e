"""Random scored rollouts for the trainer benches: samples of given prompt / response lengths, random tokens and
random rewards, in GRPO groups of 2 (the trainer computes the advantages: RolloutBatch -> score -> train)."""

from __future__ import annotations

import torch


def random_groups(shapes: list[tuple[int, int]], vocab: int, seed: int = 0) -> list[list]:
    """One sample per (prompt length, response length) in ``shapes``, token ids in [10, vocab - 10), a N(0, 1)
    reward each, paired in order into groups of 2 (an odd last sample is a group of 1)."""
    from reinforge.records import Sample

    g = torch.Generator().manual_seed(seed)
    samples = []
    for P, R in shapes:
        tokens = torch.randint(10, vocab - 10, (P + R,), generator=g).tolist()
        reward = float(torch.randn(1, generator=g))
        samples.append(
            Sample(
                prompt="p",
                tokens=tokens,
                response_length=R,
                loss_mask=[1] * R,
                rollout_log_probs=[-1.0] * R,
                reward=reward,
            )
        )
    return [samples[i : i + 2] for i in range(0, len(samples), 2)]
