"""reinforge/utils/ragged.py: ragged per-sample data to dense tensors and back, against the per-sample
loops they replace."""

import pickle

import numpy as np
import pytest
import torch

from reinforge.utils.ragged import flat_tensor, prefix_mask, right_padded, split_owned, unpad_rows


def test_flat_tensor_concatenates_in_order():
    assert flat_tensor([[1, 2], [], [3]]).tolist() == [1, 2, 3]
    assert flat_tensor([[1, 2], [], [3]]).dtype == torch.long
    x = flat_tensor([[0.5, -1.25], [3.0]], np.float32)
    assert x.dtype == torch.float32 and x.tolist() == [0.5, -1.25, 3.0]
    assert flat_tensor([]).shape == (0,)


def test_right_padded_and_unpad_rows_match_the_loops():
    g = torch.Generator().manual_seed(0)
    lengths = [3, 0, 5, 1]
    vectors = [torch.randn(n, generator=g) for n in lengths]
    grid = right_padded(vectors)
    ref = torch.zeros(4, 5)
    for i, v in enumerate(vectors):
        ref[i, : len(v)] = v
    assert torch.equal(grid, ref)
    assert torch.equal(right_padded([v.tolist() for v in vectors]), ref)  # lists of numbers
    assert torch.equal(right_padded([vectors[0], vectors[2].tolist()]), ref[[0, 2]])  # mixed
    rows = unpad_rows(grid, lengths)
    assert [r.shape[0] for r in rows] == lengths and all(torch.equal(r, v) for r, v in zip(rows, vectors))
    assert right_padded([[], []]).shape == (2, 1) and right_padded([]).shape == (0, 1)
    assert prefix_mask([2, 0, 1]).tolist() == [[True, True], [False, False], [True, False]]
    assert prefix_mask([1], width=3).tolist() == [[True, False, False]] and prefix_mask([0, 0]).shape == (2, 1)
    with pytest.raises(ValueError, match="1-D"):
        right_padded([torch.zeros(2, 2)])


def test_split_owned_pieces_pickle_alone():
    flat = torch.arange(10_000.0)
    pieces = split_owned(flat, [3, 9_997])
    assert pieces[0].tolist() == [0.0, 1.0, 2.0]
    # a view would pickle with the whole 40 kB storage (rows moved to another rank, to a Ray actor)
    assert len(pickle.dumps(pieces[0])) < 2_000 < len(pickle.dumps(flat[:3]))
