"""Token-budget micro-batching, collation and the LR schedule."""

import pytest
import torch

from reinforge.train.batching import build, split_by_token_budget
from reinforge.train.schedule import lr_multiplier


def test_split_by_token_budget_respects_budget_and_covers_all():
    lengths = [10, 50, 20, 30, 5, 60, 100]
    batches = split_by_token_budget(lengths, 120)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 120 or len(b) == 1
    assert batches[0] == [6]  # 100 alone: 2 x 100 > 120


def test_oversized_sample_gets_own_batch():
    assert split_by_token_budget([500, 10], 100) == [[0], [1]]
    with pytest.raises(ValueError):
        split_by_token_budget([1], 0)


def test_global_batch_arithmetic():
    from reinforge.config import load_config

    cfg = load_config(None, ["rollout_batch_size=32", "n_samples_per_prompt=8", "num_steps_per_rollout=4"])
    assert cfg.global_batch_size == 64


def test_collate_positions():
    tokens = [[1, 2, 3, 4, 5], [7, 8, 9]]
    mb = build(
        tokens,
        [2, 1],
        [[1, 0], [1]],
        [[0], [1]],
        pad_id=0,
        per_token={"adv": [torch.tensor([0.5, 0.6]), torch.tensor([-1.0])]},
    )
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 0, 0]]
    assert mb.position_ids is None and mb.doc_ids is None and not mb.packed
    # response grid [2 sequences, 2 tokens]; row 0's tokens 4, 5 are predicted at positions 2, 3
    assert mb.response_mask.tolist() == [[True, True], [True, False]]
    assert mb.logit_rows.tolist() == [0, 0, 1] and mb.logit_cols.tolist() == [2, 3, 1]
    assert mb.loss_mask.tolist() == [[1, 0], [1, 0]]
    assert mb.targets[mb.response_mask].tolist() == [4, 5, 9]
    assert mb.fields["adv"][mb.response_mask].tolist() == [0.5, 0.6000000238418579, -1.0]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]


def test_lr_schedule():
    assert lr_multiplier(0, 4, 100, "constant", 0.0) == 0.25
    assert lr_multiplier(3, 4, 100, "constant", 0.0) == 1.0
    assert lr_multiplier(50, 0, 100, "constant", 0.0) == 1.0
    assert lr_multiplier(0, 0, 100, "cosine", 0.1) == pytest.approx(1.0)
    assert lr_multiplier(50, 0, 100, "cosine", 0.0) == pytest.approx(0.5)
    assert lr_multiplier(100, 0, 100, "cosine", 0.1) == pytest.approx(0.1)
    assert lr_multiplier(75, 0, 100, "linear", 0.0) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        lr_multiplier(1, 0, 10, "step", 0.0)


def test_to_computes_response_positions_and_cu_seqlens_on_the_host():
    """The trainer never reads the GPU back inside a micro-batch: ``to`` gives it the response positions
    (instead of a boolean mask index) and the packed rows' cu_seqlens (with the longest as a host int)."""
    tokens = [[1, 2, 3, 4, 5], [7, 8, 9], [6, 6]]
    mb = build(tokens, [2, 1, 1], [[1, 0], [1], [1]], [[0, 1], [2]], pad_id=0)
    assert mb.packed and mb.response_index is None and mb.cu_seqlens is None
    assert mb.to(torch.device("cpu")) is mb  # already there: the same object, now with both
    assert mb.response_index.tolist() == torch.nonzero(mb.response_mask.flatten()).flatten().tolist()
    assert mb.targets.reshape(-1)[mb.response_positions()].tolist() == mb.targets[mb.response_mask].tolist()
    cu, longest = mb.cu_seqlens
    assert cu.tolist() == [0, 5, 8, 10, 16] and longest == 6  # rows of 8: [seq 0 | seq 1], [seq 2 | padding]
    assert mb.attention().cu_seqlens() is mb.cu_seqlens
    moved = mb.to(torch.device("meta"))  # every tensor copied, the host int kept
    assert moved.cu_seqlens[0].device.type == "meta" and moved.cu_seqlens[1] == 6
    assert moved.response_index.device.type == "meta" and moved.response_index.shape == mb.response_index.shape
