"""Masked selection shared by the advantage estimators and the losses."""

from __future__ import annotations

import torch


def masked_select(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` where ``mask`` is non-zero, 0 elsewhere.

    A selection (``torch.where``), not a product: a non-finite value outside the mask (an inf
    KL on a tool token, a NaN in padding) gives 0 instead of ``inf * 0 = NaN``, and when
    ``values`` is a leaf its gradient there is 0.

    Args:
        values: float tensor.
        mask: tensor broadcastable to ``values`` (bool or 0/1 of any dtype).
    Returns:
        a tensor of ``values``' shape and dtype.
    """
    return torch.where(mask != 0, values, torch.zeros((), dtype=values.dtype, device=values.device))
