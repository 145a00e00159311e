"""Turning samples into micro-batches: the layouts of the trainer's forward pass.

A :class:`MicroBatch` has two views of its sequences:

* the **model input**: rows of token ids ``[R, T]``. How sequences sit in rows is the layout
  (``train.packing``):

  - ``none``: one sequence per row, right-padded to the longest (any model, Hugging Face's too);
  - ``sequences``: several whole sequences side by side in a row of at most
    ``train.max_tokens_per_gpu`` real tokens, no padding between them (slime's dynamic batch;
    varlen attention on the GPU);
  - ``shared_prompt``: one row per group of samples with the same prompt, ``[prompt | response_1
    | ... | response_n]``: the prompt is computed once for all its responses (each response
    attends to the prompt and to itself, its positions continue from the prompt's).

* the **response grid** ``[S, L]``: one row per sequence, its response tokens left-aligned, ``L``
  the longest response. Masks, targets, advantages and every per-token input live here, so the
  losses never see the layout. ``logit_rows`` / ``logit_cols`` name the model-input position
  whose logits predict each response token, in the grid's row-major order.

The layouts compute the same log-probs up to floating-point reassociation (tests/unit/test_packing.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from ..models.packing import PackedAttention, cu_seqlens
from ..utils.ragged import flat_tensor, prefix_mask

LAYOUTS = ("none", "sequences", "shared_prompt")


@dataclass
class MicroBatch:
    """Model-input rows and the response grid of a few sequences.

    Attributes:
        input_ids: [R, T] int64 token ids, padded with ``pad_id``.
        attention_mask: [R, T] int64, 1 at real tokens.
        logit_rows, logit_cols: [N] int64, the input position whose logits predict each of the N
            response tokens (row-major order of ``response_mask``; a position may repeat: a shared
            prompt's last position predicts the first token of every response).
        response_mask: [S, L] bool, True at the response tokens of each sequence.
        loss_mask: [S, L] float32, ``response_mask`` minus tokens excluded from the loss (tool output).
        targets: [S, L] int64, the response token ids (0 elsewhere).
        fields: name -> [S, L] float32 per-token inputs (advantages, old / rollout / reference log-probs).
        indices: the sample index of each of the S grid rows.
        position_ids: [R, T] int64 when a row holds several sequences (positions restart per
            sequence, or continue from the shared prompt), else None (0..T-1).
        doc_ids: [R, T] int64 when a row holds several sequences: equal ids attend to each other
            (causally); padding is -1. None for one sequence per row.
        shared: [R, T] bool, the shared prompt that every later position of its row attends to.
        response_index: [N] int64, the flat positions of ``response_mask``'s True entries (row-major), or
            None: computed by :meth:`to` on the host (:meth:`response_positions`).
        cu_seqlens: :func:`~reinforge.models.packing.cu_seqlens` of ``doc_ids`` (packed rows), or None:
            likewise computed by :meth:`to` on the host.

    The last two exist so that the trainer never reads the GPU back inside a micro-batch: a boolean
    mask index or the varlen kernel's longest sequence, taken on the device, waits for all queued work
    (the host could not queue the next micro-batch's forward while the GPU runs this one's backward).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    logit_rows: torch.Tensor
    logit_cols: torch.Tensor
    response_mask: torch.Tensor
    loss_mask: torch.Tensor
    targets: torch.Tensor
    fields: dict[str, torch.Tensor]
    indices: list[int]
    position_ids: torch.Tensor | None = None
    doc_ids: torch.Tensor | None = None
    shared: torch.Tensor | None = None
    response_index: torch.Tensor | None = None
    cu_seqlens: tuple[torch.Tensor, int] | None = None

    @property
    def packed(self) -> bool:
        """Whether rows hold several sequences (needs reinforge's own model code)."""
        return self.doc_ids is not None

    def attention(self) -> PackedAttention | None:
        """The attention context of the rows (``CausalLM.forward(..., ctx=...)``): None for one
        sequence per row (plain causal attention)."""
        return PackedAttention(self.doc_ids, self.shared, cu=self.cu_seqlens) if self.packed else None

    def response_positions(self) -> torch.Tensor:
        """[N] int64: the flat positions of the response tokens in the [S, L] grid (row-major), so that
        ``grid.view(-1)[positions]`` are the N response values (no boolean mask: no read-back)."""
        if self.response_index is None:
            self.response_index = torch.nonzero(self.response_mask.reshape(-1)).flatten()
        return self.response_index

    def to(self, device: torch.device) -> MicroBatch:
        """A copy on ``device``: one host-to-device copy per dtype, from pinned memory without waiting
        for the device (a copy from pageable memory waits for all queued GPU work). The response
        positions and the packed rows' ``cu_seqlens`` are computed here first, on the host."""
        self.response_positions()
        if self.packed and self.cu_seqlens is None and self.doc_ids.device.type == "cpu":
            self.cu_seqlens = cu_seqlens(self.doc_ids)
        named = [
            (f.name, None, getattr(self, f.name))
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        ]
        named += [("fields", k, t) for k, t in self.fields.items()]
        if self.cu_seqlens is not None:
            named.append(("cu_seqlens", None, self.cu_seqlens[0]))
        if all(t.device == torch.device(device) for _, _, t in named):
            return self  # already there (the CPU trainer): nothing to copy
        by_dtype: dict[torch.dtype, list[tuple[str, str | None, torch.Tensor]]] = {}
        for item in named:
            by_dtype.setdefault(item[2].dtype, []).append(item)
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["fields"] = {}
        pin = torch.device(device).type == "cuda"
        for items in by_dtype.values():
            flat = torch.cat([t.reshape(-1) for _, _, t in items])
            flat = flat.pin_memory().to(device, non_blocking=True) if pin and flat.is_cpu else flat.to(device)
            for (name, key, t), part in zip(items, flat.split([t.numel() for _, _, t in items])):
                moved = part.view(t.shape)
                if key is None:
                    out[name] = moved
                else:
                    out["fields"][key] = moved
        out["fields"] = {k: out["fields"][k] for k in self.fields}  # (the original key order)
        if self.cu_seqlens is not None:
            out["cu_seqlens"] = (out["cu_seqlens"], self.cu_seqlens[1])
        return MicroBatch(**out)


def split_by_token_budget(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Group indices into micro-batches whose padded size fits ``max_tokens``.

    Items are sorted by length (longest first) and packed greedily while
    ``len(batch) * longest_in_batch <= max_tokens`` (right padding to the longest counts). An
    item longer than ``max_tokens`` gets a micro-batch of its own. The order inside the returned
    batches is by decreasing length.

    Args:
        lengths: token count of each item (a sequence, or a row of the shared-prompt layout).
        max_tokens: budget per micro-batch (``train.max_tokens_per_gpu``).
    Returns:
        lists of indices into ``lengths``; every index appears exactly once.
    Raises:
        ValueError: ``max_tokens < 1``.
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


def first_fit(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins of indices whose lengths sum to at most ``capacity`` (first-fit decreasing; an item
    longer than ``capacity`` gets a bin of its own)."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        b = next((b for b in range(len(bins)) if room[b] >= lengths[i]), None)
        if b is None:
            bins.append([i])
            room.append(capacity - lengths[i])
        else:
            bins[b].append(i)
            room[b] -= lengths[i]
    return bins


def prompt_groups(tokens: list[list[int]], response_lengths: list[int], indices: list[int]) -> list[list[int]]:
    """``indices`` grouped by identical prompt tokens (groups in order of first appearance)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in indices:
        groups.setdefault(tuple(tokens[i][: len(tokens[i]) - response_lengths[i]]), []).append(i)
    return list(groups.values())


def plan_rows(
    tokens: list[list[int]], response_lengths: list[int], indices: list[int], layout: str, max_tokens: int
) -> list[list[list[int]]]:
    """Micro-batches of ``indices`` for ``layout``: each a list of model-input rows, each row a list
    of sample indices.

    * ``none``: one sample per row, micro-batches within ``max_tokens`` padded tokens;
    * ``sequences``: one row per micro-batch, at most ``max_tokens`` real tokens (first-fit decreasing);
    * ``shared_prompt``: a row per prompt group (split when ``prompt + responses`` exceeds
      ``max_tokens``), rows batched within ``max_tokens`` padded tokens.

    Raises:
        ValueError: unknown layout, or ``max_tokens < 1``.
    """
    if layout == "none":
        return [[[indices[j]] for j in g] for g in split_by_token_budget([len(tokens[i]) for i in indices], max_tokens)]
    if layout == "sequences":
        return [[[indices[j] for j in b]] for b in first_fit([len(tokens[i]) for i in indices], max_tokens)]
    if layout != "shared_prompt":
        raise ValueError(f"unknown train.packing {layout!r}; choose one of {', '.join(LAYOUTS)}")
    rows: list[list[int]] = []
    for group in prompt_groups(tokens, response_lengths, indices):
        prompt = len(tokens[group[0]]) - response_lengths[group[0]]
        bins = first_fit([response_lengths[i] for i in group], max(1, max_tokens - prompt))
        rows += [[group[j] for j in b] for b in bins]
    lengths = [row_length(tokens, response_lengths, row, True) for row in rows]
    return [[rows[j] for j in g] for g in split_by_token_budget(lengths, max_tokens)]


def row_length(tokens: list[list[int]], response_lengths: list[int], row: list[int], shared_prompt: bool) -> int:
    """Tokens of one model-input row."""
    if not shared_prompt:
        return sum(len(tokens[i]) for i in row)
    return len(tokens[row[0]]) - response_lengths[row[0]] + sum(response_lengths[i] for i in row)


def build(
    tokens: list[list[int]],
    response_lengths: list[int],
    loss_masks: list[list[int]],
    rows: list[list[int]],
    pad_id: int,
    per_token: dict[str, list[torch.Tensor]] | None = None,
    shared_prompt: bool = False,
) -> MicroBatch:
    """Lay out the samples of ``rows`` (model-input rows, each a list of sample indices) as a
    :class:`MicroBatch`.

    Args:
        tokens: prompt + response ids of every sample.
        response_lengths: response token count of every sample.
        loss_masks: per-response-token 0/1 of every sample.
        rows: which samples go into each model-input row (see :func:`plan_rows`).
        per_token: name -> per-sample [response_length] float tensors to lay out on the grid.
        shared_prompt: the samples of each row share their prompt, laid out once.
    Raises:
        ValueError: a shared-prompt row whose samples have different prompts, or an empty prompt.
    """
    seqs = [i for row in rows for i in row]
    packed = shared_prompt or any(len(row) > 1 for row in rows)
    row_ids, row_pos, row_doc, row_shared = [], [], [], []
    # per sample: its row, and the input column predicting its response token j: base + j, except that
    # the first is predicted from ``first`` (a shared prompt's last position)
    sample_row: list[int] = []
    base: list[int] = []
    first: list[int] = []
    for r, row in enumerate(rows):
        ids: list[int] = []
        pos: list[int] = []
        doc: list[int] = []
        P = len(tokens[row[0]]) - response_lengths[row[0]]
        if shared_prompt:
            prompt = tokens[row[0]][:P]
            if P < 1 or any(tokens[i][: len(tokens[i]) - response_lengths[i]] != prompt for i in row):
                raise ValueError("a shared-prompt row needs samples with the same, non-empty prompt")
            ids += prompt
            pos += range(P)
            doc += [0] * P
        for k, i in enumerate(row):
            R, start = response_lengths[i], len(ids)
            if shared_prompt:
                piece = tokens[i][P:]
                base.append(start - 1)
                first.append(P - 1)
                pos += range(P, P + R)
            else:
                piece = tokens[i]
                base.append(start + len(piece) - R - 1)
                first.append(base[-1])
                pos += range(len(piece))
            ids += piece
            doc += [k + 1] * len(piece)
            sample_row.append(r)
        row_ids.append(ids)
        row_pos.append(pos)
        row_doc.append(doc)
        row_shared.append(P if shared_prompt else 0)
    # one host tensor per field, written through the mask of the cells it fills (row-major, as the lists
    # run; reinforge/utils/ragged.py)
    R, T = len(rows), max(len(ids) for ids in row_ids)
    filled = prefix_mask([len(ids) for ids in row_ids], T)  # [R, T]
    input_ids = torch.full((R, T), pad_id, dtype=torch.long)
    input_ids[filled] = flat_tensor(row_ids)
    position_ids = torch.zeros(R, T, dtype=torch.long)
    position_ids[filled] = flat_tensor(row_pos)
    doc_ids = torch.full((R, T), -1, dtype=torch.long)
    doc_ids[filled] = flat_tensor(row_doc)
    shared = prefix_mask(row_shared, T)
    S, L = len(seqs), max([response_lengths[i] for i in seqs] + [1])
    resp = prefix_mask([response_lengths[i] for i in seqs], L)  # [S, L]
    n = resp.sum(1)
    lmask = torch.zeros(S, L, dtype=torch.float32)
    lmask[resp] = flat_tensor([loss_masks[i] for i in seqs], np.float32)
    targets = torch.zeros(S, L, dtype=torch.long)
    targets[resp] = flat_tensor([tokens[i][len(tokens[i]) - response_lengths[i] :] for i in seqs])
    grids = {k: torch.zeros(S, L, dtype=torch.float32) for k in (per_token or {})}
    for k, values in (per_token or {}).items():
        grids[k][resp] = torch.cat([values[i].reshape(-1) for i in seqs]).float()
    offsets = torch.cumsum(n, 0) - n  # each sample's first position on the flattened grid
    lrows = torch.repeat_interleave(torch.tensor(sample_row), n)
    lcols = torch.repeat_interleave(torch.tensor(base) - offsets, n) + torch.arange(int(n.sum()))
    lcols[offsets[n > 0]] = torch.tensor(first)[n > 0]
    return MicroBatch(
        input_ids,
        filled.long(),
        lrows,
        lcols,
        resp,
        lmask,
        targets,
        grids,
        seqs,
        position_ids if packed else None,
        doc_ids if packed else None,
        shared if shared_prompt else None,
    )
