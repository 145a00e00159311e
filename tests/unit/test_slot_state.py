"""The decode step's per-slot bookkeeping (reinforge/engine/slot_state.py): the one-kernel version
against the PyTorch reference, and the reference against the rules written out per slot. The kernel
runs on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1``); otherwise it skips."""

import torch

from reinforge.engine.slot_state import LENGTH, STOP, advance_slots, advance_slots_fused
from tests.unit.test_paged_attention import KERNEL_DEVICE, needs_kernel

S, L = 300, 12


def _state(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    gen = torch.randint(0, L + 2, (S,), generator=g)  # some at / past the last column
    st = {
        "done": torch.rand(S, generator=g) < 0.3,
        "gen_lens": gen,
        "seq_lens": gen + torch.randint(1, 6, (S,), generator=g),
        "last_token": torch.randint(0, 50, (S,), generator=g),
        "max_new": torch.randint(1, L + 3, (S,), generator=g),
        "stop_ids": torch.where(torch.rand(S, 8, generator=g) < 0.5, torch.randint(0, 50, (S, 8), generator=g), -1),
        "finish_code": torch.randint(0, 3, (S,), generator=g).to(torch.int8),
        "out_tokens": torch.randint(0, 50, (S, L), generator=g),
        "out_logprobs": torch.randn(S, L, generator=g),
    }
    tok, lp = torch.randint(0, 50, (S,), generator=g), torch.randn(S, generator=g)
    return {k: v.to(device) for k, v in st.items()}, tok.to(device), lp.to(device)


def test_reference_follows_the_rules_slot_by_slot():
    st, tok, lp = _state("cpu")
    B = 257  # slots past B are untouched
    before = {k: v.clone() for k, v in st.items()}
    active, w = advance_slots(tok[:B], lp[:B], st, L)
    for b in range(S):
        was = {k: v[b] for k, v in before.items()}
        now = {k: v[b] for k, v in st.items()}
        if b >= B or was["done"]:
            assert all(torch.equal(was[k], now[k]) for k in was), b
            continue
        col = min(int(was["gen_lens"]), L - 1)
        assert now["out_tokens"][col] == tok[b] and now["out_logprobs"][col] == lp[b]
        assert now["gen_lens"] == was["gen_lens"] + 1 and now["seq_lens"] == was["seq_lens"] + 1
        assert now["last_token"] == tok[b]
        stop = bool((was["stop_ids"] == tok[b]).any())
        length = int(was["gen_lens"]) + 1 >= int(was["max_new"]) or int(was["seq_lens"]) + 1 >= L
        want = STOP if stop else LENGTH if length else int(was["finish_code"])
        assert int(now["finish_code"]) == want and bool(now["done"]) == (stop or length)
    assert active.tolist() == (~before["done"][:B]).tolist()
    assert w.tolist() == before["gen_lens"][:B].clamp(max=L - 1).tolist()


@needs_kernel
def test_kernel_equals_the_reference():
    for B in (1, 128, 257, S):
        ref, tok, lp = _state(KERNEL_DEVICE, seed=B)
        fused = {k: v.clone() for k, v in ref.items()}
        advance_slots(tok[:B], lp[:B], ref, L)
        advance_slots_fused(tok[:B], lp[:B], fused, L)
        for k in ref:
            assert torch.equal(fused[k], ref[k]), (B, k)
