"""Reward functions for tests (loaded through reward.function_path)."""


def even_first_token(sample):
    """1 when the first response token id is even: learnable by a tiny random model."""
    ids = sample.response_ids
    return float(bool(ids) and ids[0] % 2 == 0)
