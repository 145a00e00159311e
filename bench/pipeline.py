"""Pipeline parallelism against FSDP2 alone on the same ranks (issue 36 item 2): loss, gradient norm,
weights, time per step, tokens/s and peak memory of a few actor steps on bench/fsdp_two_gpus.py's
synthetic GRPO-shaped data.

Layouts (``--world`` ranks, default 4), each a name ``[pp<P>][-vpp<V>][-tp<T>][-sp]``: ``P`` pipeline
stages (``train.pipeline_model_parallel_size``), ``V`` model chunks per stage rank (interleaved 1F1B),
``T`` tensor-parallel ranks, ``sp`` sequence parallelism with them (``train.sequence_parallel``), the
rest data parallel (FSDP2); ``fsdp``: FSDP2 over all ranks, the reference.
Random weights of ``--arch`` (default Qwen3-dense-0.5B's shape: 24 layers). Per layout: the last step's
loss and gradient norm, the weights' distance from the reference's (bench/tp_fsdp.py's fingerprints:
the largest relative difference of a weight's norm, the largest difference along a seeded random
direction relative to the norm), the median s/step, the step's tokens per second and the largest
peak memory of any rank (``torch.cuda.max_memory_allocated``).

    PYTHONPATH=.:bench python bench/pipeline.py --world 4 --layouts fsdp pp2 pp2-vpp2 pp4 pp2-tp2   # 4 GPUs
    PYTHONPATH=.:bench python bench/pipeline.py --world 4 --layouts fsdp tp2 tp2-sp tp4 tp4-sp      # sequence parallel
    PYTHONPATH=.:bench python bench/pipeline.py --world 4 --tiny --device cpu --steps 2 --samples 8   # gloo
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from archs import ARCHS, tiny_overrides, write_random_model  # noqa: E402
from fsdp_two_gpus import make_data  # noqa: E402
from tp_fsdp import projection_diff, rel, worker  # noqa: E402

from tests.ranks import spawn_ranks  # noqa: E402


def parse(layout: str) -> dict[str, int]:
    """``pp2-vpp2-tp2``, ``tp2-sp`` -> the train keys; ``fsdp`` -> {}."""
    if layout == "fsdp":
        return {}
    sizes = dict(re.findall(r"(vpp|pp|tp)(\d+)", layout))
    keys = {
        "pp": "train.pipeline_model_parallel_size",
        "vpp": "train.virtual_pipeline_model_parallel_size",
        "tp": "train.tensor_model_parallel_size",
    }
    out: dict[str, int | str] = {keys[k]: int(v) for k, v in sizes.items()}
    if layout.endswith("-sp"):
        out["train.sequence_parallel"] = "true"
    return out


def main(argv: list[str] | None = None) -> list[tuple]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="qwen3-dense-0.5b")
    ap.add_argument("--tiny", action="store_true", help="shrink the architecture (CPU dry run; 4 layers)")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--layouts", nargs="+", default=["fsdp", "pp2", "pp2-vpp2", "pp4", "pp2-tp2"])
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--device", default="cuda", help="cpu: gloo ranks")
    ap.add_argument("--adam-eps", type=float, default=1e-3, help="train.adam_eps (bench/tp_fsdp.py says why 1e-3)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        raise SystemExit(f"needs {args.world} GPUs, found {torch.cuda.device_count()}")
    folder = Path(tempfile.mkdtemp()) / args.arch
    write_random_model(
        args.arch, folder, **({**tiny_overrides(args.arch), "num_hidden_layers": 4} if args.tiny else {})
    )
    data = make_data(args.samples, ARCHS[args.arch]["vocab_size"])
    tokens = sum(len(s.tokens) for group in data for s in group)
    base = [
        f"model.path={folder}",
        "train.lr=1e-5",
        f"train.adam_eps={args.adam_eps}",
        f"train.max_tokens_per_gpu={args.max_tokens}",
        "train.packing=sequences",
    ]
    rows = []
    for layout in args.layouts:
        overrides = base + [f"{k}={v}" for k, v in parse(layout).items()]
        m, step_s, prints, peaks = spawn_ranks(
            worker, args.world, (overrides, str(folder), data, args.steps, args.device), timeout=1800
        )
        rows.append((layout, m["train/loss"], m["train/grad_norm"], step_s, prints, max(peaks)))
        print(
            f"{layout}: loss {m['train/loss']:.6f} grad norm {m['train/grad_norm']:.4f} {step_s:.3f} s/step", flush=True
        )
    ref = rows[0][4]
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu (gloo)"
    print(
        f"\n{args.arch}{' (tiny)' if args.tiny else ''}, {args.samples} samples ({tokens} tokens), {args.steps} "
        f"actor steps, {args.world} ranks, {where}; reference: {args.layouts[0]}"
    )
    print(
        "| layout | loss (last step) | grad norm | max rel. diff of a weight norm | max weight diff along a random "
        "direction / norm | s/step | tokens/s | peak GiB (max rank) |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    for layout, loss, gn, step_s, prints, peak in rows:
        dn = max(rel(prints[k][0], ref[k][0]) for k in ref)
        dp, _ = projection_diff(prints, ref)
        cells = [
            layout,
            f"{loss:.6f}",
            f"{gn:.4f}",
            f"{dn:.2e}",
            f"{dp:.2e}",
            f"{step_s:.3f}",
            f"{tokens / step_s:.0f}",
        ]
        print(f"| {' | '.join(cells)} | {peak:.2f} |")
    return rows


if __name__ == "__main__":
    main()
