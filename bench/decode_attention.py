"""Decode attention kernels over a paged KV cache at long context: our single-pass and split-K
Triton kernel (``reinforge/engine/paged_attention.py``), PyTorch ``flex_attention`` decoding with a
paged block mask, and FlashInfer's batch decode (when importable). One layer of Qwen2.5-1.5B's
attention shape by default: 12 query heads, 2 KV heads, head_dim 128, bf16, engine block size 16.

For each ``--seqs`` x ``--contexts`` every sequence attends to ``context`` keys (the new token
included; our kernel also stores the new token's K/V, as in the engine). Each kernel is timed
as ``--iters`` back-to-back calls captured in one CUDA graph (eager if capture fails; the table
says which), median of ``--reps`` replays. Columns: time per call, that time x ``--layers`` (the
attention share of one decode step), K+V bytes read (``seqs x context x kv_heads x head_dim x 2
x bytes per element``), the bandwidth that implies and its share of ``--peak-tbs`` (3.35 TB/s:
H100 SXM HBM3), and the largest difference from our single-pass kernel's output (all kernels
read the same keys and values).

* ``ours 1``: one program per (sequence, KV head); ``ours auto``: the split count the engine
  would use (``decode_splits`` from the batch, KV heads, context and the SM count); ``ours S``:
  the ``--splits`` sweep; ``... fp8``: the same kernel over a copy of the cache in float8 e4m3
  (``engine.kv_cache_dtype: fp8``; half the K+V bytes; ``--no-fp8`` leaves these rows out).
* ``flex``: ``torch.compile(flex_attention)`` on ``q [B, H, 1, D]`` against one flat cache
  ``[1, KVH, pages * P, D]`` (``--flex-page`` tokens per page, pages scattered), with a
  ``BlockMask`` listing each sequence's pages (full pages unmasked, the last one through a
  ``mask_mod``), as in ``torch.nn.attention.experimental._paged_attention``. The block-mask build
  (needed again whenever lengths change) is timed apart and not in the kernel time.
* ``flashinfer``: ``BatchDecodeWithPagedKVCacheWrapper`` (HND layout: our cache tensors as they
  are), ``plan`` outside the timing; with and without ``use_tensor_cores``.

    PYTHONPATH=. python bench/decode_attention.py                 # on a GPU: 16, 64 x 4k, 16k, 32k
    PYTHONPATH=. python bench/decode_attention.py --seqs 16 --contexts 32768 --splits 2,4,8,16,32,64
    TRITON_INTERPRET=1 PYTHONPATH=. python bench/decode_attention.py --device cpu   # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback

import torch

from reinforge.engine.kv_cache import to_cache
from reinforge.engine.paged_attention import decode_splits, gather_blocks, paged_decode_attention_triton
from reinforge.utils.triton import num_sms


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Case:
    """One batch: our paged cache (scattered blocks), queries, the new token, lengths."""

    def __init__(
        self, B: int, L: int, H: int, KVH: int, D: int, BS: int, dtype: torch.dtype, device: torch.device, seed: int = 0
    ):
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.B, self.L, self.H, self.KVH, self.D, self.BS = B, L, H, KVH, D, BS
        self.mb = cdiv(L, BS)
        n = B * self.mb
        self.table = torch.randperm(n, generator=g).view(B, self.mb).to(device=device, dtype=torch.int32)
        self.k = torch.empty(n + 1, KVH, BS, D, device=device, dtype=dtype).normal_()
        self.v = torch.empty_like(self.k).normal_()
        self.q = torch.randn(B, H, D, generator=g).to(device=device, dtype=dtype)
        self.kn = torch.randn(B, KVH, D, generator=g).to(device=device, dtype=dtype)
        self.vn = torch.randn(B, KVH, D, generator=g).to(device=device, dtype=dtype)
        self.lens = torch.full((B,), L, device=device, dtype=torch.int64)
        pos = self.lens - 1
        self.w_blk = self.table.long().gather(1, (pos // BS)[:, None])[:, 0]
        self.w_off = pos % BS

    def ours(self, num_splits: int | None, fp8: bool = False, fn=paged_decode_attention_triton, **kw):
        if fp8 and not hasattr(self, "k8"):
            self.k8, self.v8 = to_cache(self.k, torch.float8_e4m3fn), to_cache(self.v, torch.float8_e4m3fn)
        k, v = (self.k8, self.v8) if fp8 else (self.k, self.v)
        return lambda: fn(
            self.q, self.kn, self.vn, k, v, self.table, self.lens, self.w_blk, self.w_off, num_splits=num_splits, **kw
        )

    def kv_bytes(self, elem: int | None = None) -> int:
        return int(self.lens.sum()) * self.KVH * self.D * 2 * (elem or self.k.element_size())


def load_baseline(path: str):
    """``paged_decode_attention_triton`` of the file at ``path`` (imports absolute)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("baseline_paged_attention", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.paged_decode_attention_triton


def flex_setup(c: Case, page: int, compiled: bool):
    """(call, seconds to build the block mask): flex_attention over a flat copy of ``c``'s cache
    in pages of ``page`` tokens (scattered), holding the same keys and values."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    dev = c.q.device
    B, KVH, D = c.B, c.KVH, c.D
    npg = cdiv(c.L, page)
    pages = B * npg
    g = torch.Generator(device="cpu").manual_seed(1)
    ptable = torch.randperm(pages, generator=g).view(B, npg).to(dev)
    kf = torch.zeros(1, KVH, pages * page, D, device=dev, dtype=c.k.dtype)
    vf = torch.zeros_like(kf)
    for b in range(B):  # same keys: sequence b's positions [j * page, (j + 1) * page) go to page ptable[b, j]
        for src, dst in ((c.k, kf), (c.v, vf)):
            keys = gather_blocks(src, c.table[b : b + 1], c.mb)[0, :, : c.L]  # [KVH, L, D]
            padded = torch.zeros(KVH, npg * page, D, device=dev, dtype=src.dtype)
            padded[:, : c.L] = keys
            dst.view(KVH, pages, page, D)[:, ptable[b]] = padded.view(KVH, npg, page, D)
    owner = torch.empty(pages, device=dev, dtype=torch.int64)
    logical = torch.empty_like(owner)
    owner[ptable] = torch.arange(B, device=dev)[:, None].expand(B, npg)
    logical[ptable] = torch.arange(npg, device=dev)[None, :].expand(B, npg)
    lens = c.lens

    def mask_mod(b, h, q_idx, kv_idx):  # physical key -> (owner, logical position) < the owner's length
        p = kv_idx // page
        return (owner[p] == b) & (logical[p] * page + kv_idx % page < lens[b])

    def build():
        n_full = (lens // page).to(torch.int32)  # pages every key of which is visible
        has_part = (lens % page != 0).to(torch.int32)
        # index rows as wide as the whole pool (the compiled kernel wants the mask to cover the
        # flat cache); only the first n_full (full) and has_part (partial) entries are read
        full_idx = torch.zeros(B, pages, device=dev, dtype=torch.int32)
        full_idx[:, :npg] = ptable
        part_idx = torch.zeros_like(full_idx)
        part_idx[:, :1] = ptable.gather(1, n_full.long().clamp(max=npg - 1)[:, None])
        return BlockMask.from_kv_blocks(
            has_part.view(B, 1, 1),
            part_idx.view(B, 1, 1, pages),
            n_full.view(B, 1, 1),
            full_idx.view(B, 1, 1, pages),
            BLOCK_SIZE=(128, page),
            mask_mod=mask_mod,
            seq_lengths=(1, pages * page),
            compute_q_blocks=False,
        )

    sync(dev)
    t0 = time.perf_counter()
    mask = build()
    sync(dev)
    build_s = time.perf_counter() - t0
    fn = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention
    q4 = c.q[:, :, None]

    def call():
        return fn(q4, kf, vf, block_mask=mask, enable_gqa=True)[:, :, 0]

    return call, build_s


def flashinfer_setup(c: Case, tensor_cores: bool):
    import flashinfer

    dev = c.q.device
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "HND", use_tensor_cores=tensor_cores)
    nb = cdiv(c.L, c.BS)
    indptr = torch.arange(c.B + 1, device=dev, dtype=torch.int32) * nb
    indices = c.table[:, :nb].reshape(-1).contiguous()
    last = ((c.lens - 1) % c.BS + 1).to(torch.int32)
    w.plan(indptr, indices, last, c.H, c.KVH, c.D, c.BS, q_data_type=c.q.dtype, kv_data_type=c.k.dtype)
    return lambda: w.run(c.q, (c.k, c.v))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, iters: int, reps: int) -> tuple[float, str]:
    """(seconds per call, how): a CUDA graph of ``iters`` calls, median of ``reps`` replays."""
    if device.type != "cuda":
        fn()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts), "eager"
    fn()
    sync(device)
    how = "graph"
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream(device).wait_stream(side)
        sync(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(iters):
                fn()
        run = graph.replay
    except Exception as e:  # noqa: BLE001 - a library that cannot be captured is timed eagerly
        how = f"eager ({type(e).__name__})"
        sync(device)

        def run():
            for _ in range(iters):
                fn()

    run()
    sync(device)
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3 / iters)
    return statistics.median(ts), how


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda")
    p.add_argument("--seqs", default=None, help="comma-separated batch sizes (GPU default 16,64)")
    p.add_argument("--contexts", default=None, help="comma-separated keys per sequence (GPU default 4096,16384,32768)")
    p.add_argument("--splits", default="", help="comma-separated split counts to time besides 1 and auto")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--flex-page", type=int, default=128)
    p.add_argument("--layers", type=int, default=28, help="decoder layers, for the per-step column")
    p.add_argument("--peak-tbs", type=float, default=3.35, help="memory bandwidth limit, TB/s")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-flex", action="store_true")
    p.add_argument("--no-flashinfer", action="store_true")
    p.add_argument("--no-fp8", action="store_true", help="leave out the rows over an fp8 cache")
    p.add_argument(
        "--baseline",
        default="",
        help="a .py file with another paged_decode_attention_triton (e.g. "
        "the kernel of an earlier commit, `git show REV:reinforge/engine/paged_attention.py`): 'base' rows",
    )
    p.add_argument(
        "--tune",
        default="",
        help="comma-separated BLOCK_NxWARPS[xSTAGES] (e.g. 64x8,128x4x2): "
        "'ours auto' (and fp8) rows with these keys per iteration, warps and pipelining stages "
        "besides the defaults (64x4x3, fp8 128x4x3)",
    )
    args = p.parse_args()
    dev = torch.device(args.device)
    cpu = dev.type == "cpu"  # a smoke run under TRITON_INTERPRET=1: tiny sizes, fp32, eager flex
    seqs = [int(x) for x in (args.seqs or ("2" if cpu else "16,64")).split(",")]
    contexts = [int(x) for x in (args.contexts or ("40,300" if cpu else "4096,16384,32768")).split(",")]
    sweep = [int(x) for x in args.splits.split(",") if x]
    dtype = torch.float32 if cpu else torch.bfloat16
    if cpu:
        args.iters, args.reps = 1, 1
    print(
        f"device: {torch.cuda.get_device_name(dev) if not cpu else 'cpu (Triton interpreter)'}, torch "
        f"{torch.__version__}, H={args.heads} KVH={args.kv_heads} D={args.head_dim} {dtype}, "
        f"block {args.block_size}, SMs {num_sms(dev)}"
    )
    rows = []
    for B in seqs:
        for L in contexts:
            c = Case(B, L, args.heads, args.kv_heads, args.head_dim, args.block_size, dtype, dev)
            auto = decode_splits(B, args.kv_heads, c.mb * args.block_size, num_sms(dev))
            ref = c.ours(1)()  # also writes the new token's K/V: every kernel below sees the same cache
            kernels = [("ours", 1, c.ours(1)), ("ours auto", auto, c.ours(None))]
            kernels += [("ours", s, c.ours(s)) for s in sweep if s not in (1, auto)]
            if not args.no_fp8 and not cpu:
                kernels += [("ours fp8", 1, c.ours(1, fp8=True)), ("ours auto fp8", auto, c.ours(None, fp8=True))]
            if args.baseline:
                base = load_baseline(args.baseline)
                kernels.append(("base auto", auto, c.ours(None, fn=base)))
                if not args.no_fp8 and not cpu:
                    kernels.append(("base auto fp8", auto, c.ours(None, fp8=True, fn=base)))
            for knob in [x for x in args.tune.split(",") if x]:
                bn, nw, *st = map(int, knob.split("x"))
                for fp8 in [False] + ([True] if not args.no_fp8 and not cpu else []):
                    kernels.append(
                        (
                            f"ours auto{' fp8' if fp8 else ''} {knob}",
                            auto,
                            c.ours(None, fp8=fp8, block_n=bn, num_warps=nw, num_stages=st[0] if st else 3),
                        )
                    )
            extra = {}
            if not args.no_flex:
                try:
                    call, build_s = flex_setup(c, args.flex_page, compiled=not cpu)
                    kernels.append(("flex", "-", call))
                    extra["flex"] = f"block mask build {build_s * 1e3:.2f} ms"
                except Exception:  # noqa: BLE001
                    extra["flex"] = "setup failed: " + traceback.format_exc(limit=1).strip().splitlines()[-1]
            if not args.no_flashinfer and not cpu:
                for tc in (False, True):
                    name = "flashinfer" + (" tc" if tc else "")
                    try:
                        kernels.append((name, "-", flashinfer_setup(c, tc)))
                    except Exception:  # noqa: BLE001
                        extra[name] = "unavailable: " + traceback.format_exc(limit=1).strip().splitlines()[-1]
            for name, s, fn in kernels:
                gb = c.kv_bytes(1 if "fp8" in name else None) / 1e9
                try:
                    diff = (fn().float() - ref.float()).abs().max().item()
                    sec, how = timed(fn, dev, args.iters, args.reps)
                except Exception:  # noqa: BLE001
                    extra[name] = "failed: " + traceback.format_exc(limit=1).strip().splitlines()[-1]
                    continue
                tbs = gb / 1e3 / sec
                rows.append(
                    (B, L, name, s, sec * 1e6, sec * args.layers * 1e3, gb, tbs, tbs / args.peak_tbs, diff, how)
                )
            for name, note in extra.items():
                print(f"  {B} x {L} {name}: {note}")
            del c, kernels, ref
            if not cpu:
                torch.cuda.empty_cache()
    print()
    print(
        f"| seqs | context | kernel | splits | us / call | ms / step ({args.layers} layers) | K+V GB | TB/s | "
        f"share of {args.peak_tbs} TB/s | max diff vs ours 1 | timed |"
    )
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for B, L, name, s, us, step_ms, gb, tbs, share, diff, how in rows:
        print(
            f"| {B} | {L} | {name} | {s} | {us:.1f} | {step_ms:.2f} | {gb:.3f} | {tbs:.2f} | {share:.0%} | "
            f"{diff:.1e} | {how} |"
        )


if __name__ == "__main__":
    main()
