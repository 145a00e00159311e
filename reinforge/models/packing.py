"""Attention for packed rows: several sequences side by side in one row, each attending only to
itself (causally), with positions restarting at 0 for each sequence.

Used by the trainer for sequence packing (no padding between sequences): the row's tokens are
``[seq_0 | seq_1 | ... | pad]``, ``doc_ids`` numbers the sequence of each position (padding -1)
and ``position_ids`` restart per sequence, so the packed row computes exactly what each sequence
alone would (up to floating-point reassociation).

With ``shared`` positions (a prompt), a row ``[prompt | response_a | response_b | ...]`` computes
the prompt once for all responses: each response attends to the prompt and to itself, and its
positions continue from the prompt's (shared-prompt layout of RL groups and preference pairs).

Kernels: on CUDA in bf16 / fp16, flash attention over variable-length sequences
(``torch.nn.attention.varlen.varlen_attn``): no [T, T] mask, and the cost is that of the pairs that
attend rather than T^2. Each run of equal ``doc_ids`` is one query sequence. In a shared-prompt row a
response's keys are the prompt's followed by its own (gathered: :func:`shared_prompt_keys`), and the
causal mask of flash attention is aligned to the bottom right when there are more keys than queries,
so the response's i-th query sees the whole prompt and its own first i + 1 positions. Everything else
(CPU, fp32, shared positions that are not a prefix of their row) runs ``scaled_dot_product_attention``
with a boolean [B, 1, T, T] mask.

Attention kinds (``attend``'s keywords, :meth:`reinforge.models.transformer.Attention.attention_kind`):
a sliding ``window`` is flash attention's ``window_size=(window - 1, 0)`` (bottom-right aligned like its
causal mask, so a response's query sees the last ``window`` positions of prompt-then-itself) or, masked,
the band of each position's distance within its sequence (:attr:`PackedAttention.positions`); a
``scale`` goes to either kernel; attention ``sinks`` run masked (:func:`~reinforge.models.sdpa.sdpa`),
as the varlen kernel has no sink term.
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F


def shared_prompt_keys(
    doc_ids: torch.Tensor, shared: torch.Tensor, cu_q: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """The key positions of each query sequence of a shared-prompt layout, for ``varlen_attn``.

    Args:
        doc_ids: [B, T] int64, the sequence of each position (padding -1).
        shared: [B, T] bool, the shared prompt of each row: a prefix of the row (possibly empty).
        cu_q: [S + 1] int32, the starts of the query sequences (runs of equal ``doc_ids`` within a
            row) over the flattened [B * T] positions (:meth:`PackedAttention.cu_seqlens`).
    Returns:
        ``(index [M] int64, cu_k [S + 1] int32, longest)``: sequence s's keys are the flattened
        positions ``index[cu_k[s]:cu_k[s + 1]]``: its row's prompt then itself for a response (a
        non-prompt, non-padding run), itself alone otherwise; ``longest`` is the most keys of one
        sequence. None when ``shared`` is not a prefix of every row (the caller masks instead).
    """
    B, T = doc_ids.shape
    P = shared.sum(1)  # [B] prompt length of each row
    starts = cu_q[:-1].long()
    lengths = cu_q[1:].long() - starts
    row = starts // T
    response = ~shared.flatten()[starts] & (doc_ids.flatten()[starts] >= 0)
    prefix = torch.where(response, P[row], 0)
    klen = prefix + lengths
    cu_k = F.pad(klen.cumsum(0), (1, 0))
    is_prefix = (shared == (torch.arange(T, device=shared.device) < P[:, None])).all()
    M, longest, ok = torch.stack([cu_k[-1], klen.max(), is_prefix.long()]).tolist()
    if not ok:
        return None
    seq = torch.repeat_interleave(torch.arange(len(klen), device=klen.device), klen, output_size=M)
    off = torch.arange(M, device=klen.device) - cu_k[:-1][seq]
    pre = prefix[seq]
    index = torch.where(off < pre, row[seq] * T + off, starts[seq] + off - pre)
    return index, cu_k.to(torch.int32), longest


@functools.cache
def _varlen():
    """``varlen_attn`` and its keyword for causal attention (it changed across torch versions), or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    return varlen_attn, causal, "enable_gqa" in params, "window_size" in params, "scale" in params


def cu_seqlens(doc_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Cumulative sequence starts [N + 1] int32 over the flattened rows of ``doc_ids`` [B, T] (a row's
    first position and every change of id start a sequence), and the longest sequence's length (a host
    int: on a GPU tensor this reads back)."""
    change = torch.ones_like(doc_ids, dtype=torch.bool)
    change[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    starts = torch.nonzero(change.flatten()).flatten()
    cu = torch.cat([starts, starts.new_tensor([doc_ids.numel()])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


class PackedAttention:
    """An attention context (``CausalLM.forward(..., ctx=...)``): causal attention restricted to
    each position's own sequence (and the shared prompt).

    Args:
        doc_ids: [B, T] int64, the sequence index of every position (equal ids attend to each
            other; sequences are contiguous).
        shared: [B, T] bool, positions every later position of the row attends to (a shared prompt).
        varlen: allow the varlen flash kernel (CUDA, bf16 / fp16).
        cu: :func:`cu_seqlens` of ``doc_ids`` when the caller has it (computed on the host before the
            micro-batch moved: on the device it reads back, a wait for the GPU at every forward).
    """

    def __init__(
        self,
        doc_ids: torch.Tensor,
        shared: torch.Tensor | None = None,
        varlen: bool = True,
        cu: tuple[torch.Tensor, int] | None = None,
    ):
        self.doc_ids, self.shared = doc_ids, shared
        self.use_varlen = varlen and doc_ids.is_cuda and _varlen() is not None
        self._mask: torch.Tensor | None = None
        self._windowed: dict[int, torch.Tensor] = {}
        self._positions: torch.Tensor | None = None
        self._cu = cu
        self._keys: tuple[torch.Tensor, torch.Tensor, int] | None = None
        if self.use_varlen and shared is not None:  # shared positions that are not a prefix: masked
            self._keys = shared_prompt_keys(doc_ids, shared, self.cu_seqlens()[0])
            self.use_varlen = self._keys is not None

    @property
    def mask(self) -> torch.Tensor:
        """[B, T, T] bool: query position t may attend to key position s."""
        if self._mask is None:
            d = self.doc_ids
            T = d.shape[1]
            causal = torch.ones(T, T, dtype=torch.bool, device=d.device).tril()
            same = d[:, :, None] == d[:, None, :]
            if self.shared is not None:
                same = same | self.shared[:, None, :]
            self._mask = same & causal
        return self._mask

    @property
    def positions(self) -> torch.Tensor:
        """[B, T] int64: each position's place in its sequence (a response's continuing after its row's
        shared prompt), from ``doc_ids`` and ``shared``: what the sliding-window band measures."""
        if self._positions is None:
            d = self.doc_ids
            T = d.shape[1]
            idx = torch.arange(T, device=d.device).expand_as(d)
            change = torch.ones_like(d, dtype=torch.bool)
            change[:, 1:] = d[:, 1:] != d[:, :-1]
            start = torch.cummax(torch.where(change, idx, 0), dim=1).values
            pos = idx - start
            if self.shared is not None:
                pos = pos + torch.where(self.shared, 0, self.shared.sum(1, keepdim=True))
            self._positions = pos
        return self._positions

    def window_mask(self, window: int) -> torch.Tensor:
        """[B, T, T] bool: :attr:`mask` with query ``t`` seeing only keys within ``window`` positions of it
        (0: :attr:`mask` itself)."""
        if not window:
            return self.mask
        if window not in self._windowed:
            pos = self.positions
            self._windowed[window] = self.mask & (pos[:, None, :] > pos[:, :, None] - window)
        return self._windowed[window]

    def cu_seqlens(self) -> tuple[torch.Tensor, int]:
        """:func:`cu_seqlens` of the rows (given, or computed once)."""
        if self._cu is None:
            self._cu = cu_seqlens(self.doc_ids)
        return self._cu

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        window: int = 0,
        sinks: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        """q: [B, T, H, D]; k, v: [B, T, KVH, D] -> [B, T, H, D]. ``window``, ``sinks``, ``scale``: the
        layer's attention kind (module doc)."""
        gqa = q.shape[2] != k.shape[2]
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else q.dtype
        kernel = _varlen() if self.use_varlen else None
        fits = kernel is not None and sinks is None and (not window or kernel[3]) and (scale is None or kernel[4])
        if fits and dtype in (torch.bfloat16, torch.float16):  # (RoPE leaves q, k fp32 under autocast)
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
            varlen_attn, causal, has_gqa, _, _ = kernel
            if window:  # the last `window` positions, the query's own included (bottom-right aligned)
                causal = {"window_size": (window - 1, 0)}
            if scale is not None:
                causal = {**causal, "scale": scale}
            B, T, H, D = q.shape
            cu, longest = self.cu_seqlens()
            # grouped-query attention without repeating k and v: the flash kernel takes fewer key/value heads
            # (torch 2.11's varlen_attn has no enable_gqa flag and passes them through: the same output and
            # gradients as repeated heads, checked on an H200; later versions ask for the flag)
            extra = {"enable_gqa": True} if gqa and has_gqa else {}
            k, v = k.reshape(B * T, -1, D), v.reshape(B * T, -1, D)
            cu_k, longest_k = cu, longest
            if self._keys is not None:  # a response's keys: its row's prompt, then itself
                index, cu_k, longest_k = self._keys
                # (index_select, whose backward adds atomically, is slower: bench/shared_prompt_attention.py)
                k, v = k[index], v[index]
            o = varlen_attn(q.reshape(B * T, H, D), k, v, cu, cu_k, longest, longest_k, **causal, **extra)
            return o.view(B, T, H, D)
        if sinks is not None or scale is not None:
            from .sdpa import sdpa

            return sdpa(q, k, v, self.window_mask(window)[:, None], scale=scale, sinks=sinks)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=self.window_mask(window)[:, None],
            enable_gqa=gqa,
        )
        return o.transpose(1, 2)
