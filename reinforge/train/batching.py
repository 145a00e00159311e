"""Turning samples into micro-batches: token-budget packing and right-padded collation."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def split_by_token_budget(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Group sample indices into micro-batches whose padded size fits ``max_tokens``.

    Samples are sorted by length (longest first) and packed greedily while
    ``len(batch) * longest_in_batch <= max_tokens`` (right padding to the longest sample
    counts). A sample longer than ``max_tokens`` gets a micro-batch of its own. Sorting keeps
    padding small; the order inside the returned batches is by decreasing length.

    Args:
        lengths: token count of each sample.
        max_tokens: budget per micro-batch (``train.max_tokens_per_gpu``).
    Returns:
        lists of indices into ``lengths``; every index appears exactly once.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]
        if current and (len(current) + 1) * longest > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


@dataclass
class MicroBatch:
    """Right-padded token ids and per-position response tensors.

    ``input_ids`` is [B, T]. Every other tensor is [B, T - 1] and indexed by the position
    whose logits predict the next token: position t scores token t + 1. ``response_mask``
    marks the positions that predict response tokens; ``loss_mask`` additionally removes
    response tokens excluded from the loss (e.g. tool outputs). Per-token float inputs
    (advantages, old / rollout / reference log-probs) sit at the same positions, 0 elsewhere.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    loss_mask: torch.Tensor
    targets: torch.Tensor
    indices: list[int]
    fields: dict[str, torch.Tensor]
    position_ids: torch.Tensor | None = None  # [B, T], packed rows only (restart per sequence)
    doc_ids: torch.Tensor | None = None  # [B, T], packed rows only (sequence index per position)

    def to(self, device: torch.device) -> "MicroBatch":
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return MicroBatch(
            self.input_ids.to(device), self.attention_mask.to(device), self.response_mask.to(device),
            self.loss_mask.to(device), self.targets.to(device), self.indices,
            {k: v.to(device) for k, v in self.fields.items()}, move(self.position_ids), move(self.doc_ids),
        )


def collate(
    tokens: list[list[int]],
    response_lengths: list[int],
    loss_masks: list[list[int]],
    indices: list[int],
    pad_id: int,
    per_token: dict[str, list[torch.Tensor]] | None = None,
) -> MicroBatch:
    """Build a :class:`MicroBatch` from the samples ``indices``.

    Args:
        tokens: prompt + response ids of every sample.
        response_lengths: response token count of every sample.
        loss_masks: per-response-token 0/1 of every sample.
        indices: which samples go into this micro-batch.
        per_token: name -> per-sample [response_length] float tensors to lay out on the grid.
    """
    B = len(indices)
    T = max(len(tokens[i]) for i in indices)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.long)
    resp = torch.zeros(B, T - 1, dtype=torch.bool)
    lmask = torch.zeros(B, T - 1, dtype=torch.float32)
    fields = {k: torch.zeros(B, T - 1, dtype=torch.float32) for k in (per_token or {})}
    for row, i in enumerate(indices):
        L, R = len(tokens[i]), response_lengths[i]
        ids[row, :L] = torch.as_tensor(tokens[i], dtype=torch.long)
        attn[row, :L] = 1
        start = L - R - 1  # logits at start..L-2 predict the response tokens
        resp[row, start:L - 1] = True
        lmask[row, start:L - 1] = torch.as_tensor(loss_masks[i], dtype=torch.float32)
        for k, values in (per_token or {}).items():
            fields[k][row, start:L - 1] = values[i]
    targets = ids[:, 1:].clone()
    return MicroBatch(ids, attn, resp, lmask, targets, list(indices), fields)


def pack(tokens: list[list[int]], response_lengths: list[int], loss_masks: list[list[int]], indices: list[int],
         max_tokens: int, pad_id: int) -> list[MicroBatch]:
    """Sequences ``indices`` packed side by side into rows of at most ``max_tokens`` tokens
    (first-fit decreasing; a longer sequence gets a row of its own), one :class:`MicroBatch` per
    row with ``position_ids`` / ``doc_ids`` for :class:`~reinforge.models.packing.PackedAttention`.

    Within a row, sequence k's response positions are those of the same sequence collated alone,
    shifted by its offset; the position before the next sequence predicts nothing. ``indices`` of
    a packed micro-batch lists its sequences in row order.
    """
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(indices, key=lambda i: -len(tokens[i])):
        n = len(tokens[i])
        r = next((r for r in range(len(rows)) if room[r] >= n), None)
        if r is None:
            rows.append([i])
            room.append(max_tokens - n)
        else:
            rows[r].append(i)
            room[r] -= n
    out = []
    for row in rows:
        T = sum(len(tokens[i]) for i in row)
        ids = torch.full((1, T), pad_id, dtype=torch.long)
        pos = torch.zeros(1, T, dtype=torch.long)
        doc = torch.zeros(1, T, dtype=torch.long)
        resp = torch.zeros(1, T - 1, dtype=torch.bool)
        lmask = torch.zeros(1, T - 1, dtype=torch.float32)
        off = 0
        for k, i in enumerate(row):
            L, R = len(tokens[i]), response_lengths[i]
            ids[0, off:off + L] = torch.as_tensor(tokens[i], dtype=torch.long)
            pos[0, off:off + L] = torch.arange(L)
            doc[0, off:off + L] = k
            start = off + L - R - 1
            resp[0, start:off + L - 1] = True
            lmask[0, start:off + L - 1] = torch.as_tensor(loss_masks[i], dtype=torch.float32)
            off += L
        out.append(MicroBatch(ids, torch.ones(1, T, dtype=torch.long), resp, lmask, ids[:, 1:].clone(), list(row),
                              {}, pos, doc))
    return out
