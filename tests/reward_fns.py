"""Reward functions for tests (loaded through reward.function_path)."""


def even_first_token(sample):
    """1 when the first response token id is even: learnable by a tiny random model."""
    ids = sample.response_ids
    return float(bool(ids) and ids[0] % 2 == 0)


def even_token_share(sample):
    """The share of even response token ids: varies between samples of any prompt."""
    ids = sample.response_ids
    return sum(i % 2 == 0 for i in ids) / max(len(ids), 1)
