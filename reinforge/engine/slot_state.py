"""A decode step's bookkeeping of the engine's per-slot state, once its tokens are sampled.

For every slot ``b < B`` that is not done: the sampled token and its log-prob go to the output buffers
at column ``gen_lens[b]`` (clamped to the last column), the generated and sequence lengths grow by
one, the token becomes the next step's input, and the slot finishes with code ``STOP`` (the token is
one of its stop ids) or ``LENGTH`` (``max_new`` tokens generated, or the sequence reached
``max_model_len``). Done slots are left as they are.

:func:`advance_slots` is the reference in PyTorch (about 30 small kernels on a GPU);
:func:`advance_slots_fused` does the same in one Triton program per 128 slots, which matters at small
models, where a decode step is a few hundred short kernels (``bench/decode_profile.py``).
"""

from __future__ import annotations

import torch

from ..utils.triton import tl, triton

STOP, LENGTH = 1, 2  # finish codes on the device (0: not finished)


def advance_slots(
    tok: torch.Tensor, lp: torch.Tensor, state: dict[str, torch.Tensor], max_model_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's bookkeeping for slots ``[0, B)``, ``B = len(tok)``, in place (PyTorch ops).

    Args:
        tok: [B] int64 sampled tokens; lp: [B] fp32 their log-probs.
        state: the runner's per-slot buffers, each with at least B rows: ``done`` bool, ``gen_lens``,
            ``seq_lens``, ``last_token``, ``max_new`` int64, ``stop_ids`` [S, n] int64 (-1: none),
            ``finish_code`` int8, ``out_tokens`` [S, L] int64, ``out_logprobs`` [S, L] fp32.
        max_model_len: L, the output buffers' width.

    Returns:
        ``active`` [B] bool (the slots that took the token) and ``w`` [B] int64 (the column written).
    """
    B = tok.shape[0]
    done, g, pos = state["done"][:B], state["gen_lens"][:B], state["seq_lens"][:B]
    active = ~done
    w = g.clamp(max=max_model_len - 1)
    for out, new in ((state["out_tokens"][:B], tok), (state["out_logprobs"][:B], lp)):  # column w of each row
        out.scatter_(1, w[:, None], torch.where(active, new, out.gather(1, w[:, None])[:, 0])[:, None])
    new_g = g + active
    is_stop = active & (tok[:, None] == state["stop_ids"][:B]).any(-1)
    hit_len = active & ~is_stop & ((new_g >= state["max_new"][:B]) | (pos + 1 >= max_model_len))
    code = torch.where(is_stop, STOP, torch.where(hit_len, LENGTH, 0)).to(torch.int8)
    fc = state["finish_code"][:B]
    fc.copy_(torch.where(is_stop | hit_len, code, fc))
    done |= is_stop | hit_len
    g.copy_(new_g)
    pos.add_(active)
    last = state["last_token"][:B]
    last.copy_(torch.where(active, tok, last))
    return active, w


if triton is not None:

    @triton.jit
    def _advance_kernel(
        TOK,
        LP,
        DONE,
        GEN,
        SEQ,
        LAST,
        MAXNEW,
        STOPS,
        CODE,
        OUT_T,
        OUT_LP,
        B,
        L,
        s_stop,
        s_out_t,
        s_out_lp,
        N_STOP: tl.constexpr,
        BLOCK: tl.constexpr,
        STOP_CODE: tl.constexpr,
        LENGTH_CODE: tl.constexpr,
    ):
        r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = r < B
        done = tl.load(DONE + r, mask=ok, other=1) != 0
        active = ok & ~done
        tok = tl.load(TOK + r, mask=ok, other=0)
        lp = tl.load(LP + r, mask=ok, other=0.0)
        g = tl.load(GEN + r, mask=ok, other=0)
        pos = tl.load(SEQ + r, mask=ok, other=0)
        w = tl.minimum(g, L - 1)
        tl.store(OUT_T + r.to(tl.int64) * s_out_t + w, tok, mask=active)
        tl.store(OUT_LP + r.to(tl.int64) * s_out_lp + w, lp, mask=active)
        step = active.to(tl.int64)
        new_g = g + step
        j = tl.arange(0, N_STOP)
        stops = tl.load(STOPS + r[:, None] * s_stop + j[None, :], mask=ok[:, None], other=-1)
        is_stop = active & (tl.max((stops == tok[:, None]).to(tl.int32), 1) > 0)
        max_new = tl.load(MAXNEW + r, mask=ok, other=0)
        hit_len = active & ~is_stop & ((new_g >= max_new) | (pos + 1 >= L))
        code = tl.load(CODE + r, mask=ok, other=0)
        code = tl.where(is_stop, STOP_CODE, tl.where(hit_len, LENGTH_CODE, code.to(tl.int32)))
        tl.store(CODE + r, code.to(tl.int8), mask=ok)
        tl.store(DONE + r, (done | is_stop | hit_len).to(tl.int8), mask=ok)
        tl.store(GEN + r, new_g, mask=ok)
        tl.store(SEQ + r, pos + step, mask=ok)
        last = tl.load(LAST + r, mask=ok, other=0)
        tl.store(LAST + r, tl.where(active, tok, last), mask=ok)


_BLOCK = 128


def advance_slots_fused(
    tok: torch.Tensor, lp: torch.Tensor, state: dict[str, torch.Tensor], max_model_len: int
) -> None:
    """:func:`advance_slots` in one Triton kernel (CUDA, or the Triton interpreter): the same
    arguments and results in ``state``, nothing returned. The stop ids' width must be a power of two."""
    B = tok.shape[0]
    stops, out_t, out_lp = state["stop_ids"], state["out_tokens"], state["out_logprobs"]
    _advance_kernel[(triton.cdiv(B, _BLOCK),)](
        tok,
        lp,
        state["done"].view(torch.int8),
        state["gen_lens"],
        state["seq_lens"],
        state["last_token"],
        state["max_new"],
        stops,
        state["finish_code"],
        out_t,
        out_lp,
        B,
        max_model_len,
        stops.stride(0),
        out_t.stride(0),
        out_lp.stride(0),
        N_STOP=stops.shape[1],
        BLOCK=_BLOCK,
        STOP_CODE=STOP,
        LENGTH_CODE=LENGTH,
        num_warps=4,
    )
