"""Attention for packed rows: several sequences side by side in one row, each attending only to
itself (causally), with positions restarting at 0 for each sequence.

Used by the trainer for sequence packing (no padding between sequences): the row's tokens are
``[seq_0 | seq_1 | ... | pad]``, ``doc_ids`` numbers the sequence of each position (padding gets
its own number) and ``position_ids`` restart per sequence, so the packed row computes exactly
what each sequence alone would (up to floating-point reassociation).

With ``shared`` positions (a prompt), a row ``[prompt | response_a | response_b]`` computes the
prompt once for both responses: each response attends to the prompt and to itself, and its
positions continue from the prompt's (shared-prefix packing of preference pairs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class PackedAttention:
    """An attention context (``CausalLM.forward(..., ctx=...)``): causal attention restricted to
    each position's own sequence.

    Args:
        doc_ids: [B, T] int64, the sequence index of every position (equal ids attend to each other).
        shared: [B, T] bool, positions every later position of the row attends to (a shared prompt).
    """

    def __init__(self, doc_ids: torch.Tensor, shared: torch.Tensor | None = None):
        T = doc_ids.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()
        same = doc_ids[:, :, None] == doc_ids[:, None, :]
        if shared is not None:
            same = same | shared[:, None, :]
        self.mask = same & causal  # [B, T, T]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [B, T, H, D]; k, v: [B, T, KVH, D] -> [B, T, H, D]."""
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=self.mask[:, None], enable_gqa=q.shape[2] != k.shape[2])
        return o.transpose(1, 2)
