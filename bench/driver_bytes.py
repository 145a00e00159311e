"""The driver's bytes per rollout step in Ray mode: what it sends to and receives from the actors.

Issue 36 item 4 ("the data moves once"): the rollout should reach the trainer ranks once (the
object store), and per-token data (log-probs, values, advantages) should stay on the ranks. This
script measures it. It runs ``RLLoop.rollout_step`` in Ray mode on the CPU (2 trainer ranks, FSDP2
over gloo, 1 engine, disaggregated) on a tiny random model with SmolLM2's tokenizer, and counts in
the driver, while a rollout step runs:

* **sent**: every actor call's arguments (``ActorMethod._remote``), each serialised as Ray
  serialises it (``SerializationContext.serialize(...).total_bytes``; an ``ObjectRef`` argument
  counts its id, 28 bytes: Ray passes it by reference), plus every ``ray.put``;
* **received**: the value of every ``ObjectRef`` the driver ``ray.get``\\ s, once per reference.

Rows are the trainer ranks' methods (``TrainerActor.call``'s worker method), ``ray.put`` and the
engines' methods, per rollout step (averaged over ``--steps``). Two workloads: GRPO with KL (the
loss and the reward, two optimizer steps per rollout: old and reference log-probs) and PPO (GAE
with a critic, KL loss, two steps). The code measured is whatever ``reinforge`` imports: run it from
a checkout of the commit before and after a change.

    PYTHONPATH=.:bench python bench/driver_bytes.py --output-dir /tmp/driver_bytes
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

WORKLOADS = {
    "grpo+kl": [
        "algo.advantage_estimator=grpo",
        "algo.use_kl_loss=true",
        "algo.kl_loss_coef=0.01",
        "algo.use_kl_in_reward=true",
        "algo.kl_coef=0.01",
    ],
    "ppo": ["algo.advantage_estimator=gae", "algo.use_kl_loss=true", "algo.kl_loss_coef=0.01"],
}


class Meter:
    """Counts the driver's actor-call arguments, ``ray.put`` values and ``ray.get`` results while on."""

    def __init__(self):
        import ray

        self.on = False
        self.sent: dict[str, int] = defaultdict(int)
        self.received: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)
        self._label: dict[bytes, str] = {}  # ObjectRef id -> the call that returns it
        self._seen: set[bytes] = set()
        self._ray = ray
        meter = self

        def size(value) -> int:
            if isinstance(value, ray.ObjectRef):
                return len(value.binary())
            return ray._private.worker.global_worker.get_serialization_context().serialize(value).total_bytes

        method = ray.actor.ActorMethod
        remote, get, put = method._remote, ray.get, ray.put

        def counted_remote(self, args=None, kwargs=None, **options):
            ref = remote(self, args=args, kwargs=kwargs, **options)
            if meter.on:
                args, kwargs = list(args or []), dict(kwargs or {})
                name = self._method_name
                if name == "call" and args:  # TrainerActor.call(worker method, ...)
                    name = f"trainer.{args[0]}"
                elif name in ("sync_colocated", "sync_broadcast", "send_weights"):
                    name = f"trainer.{name}"
                else:
                    name = f"engine.{name}" if name not in ("address", "setup") else name
                meter.calls[name] += 1
                meter.sent[name] += sum(size(a) for a in args) + sum(size(v) for v in kwargs.values())
                for r in ref if isinstance(ref, list) else [ref]:
                    meter._label[r.binary()] = name
            return ref

        def counted_get(refs, *a, **k):
            out = get(refs, *a, **k)
            if meter.on:
                many = isinstance(refs, list)
                for r, v in zip(refs if many else [refs], out if many else [out]):
                    key = r.binary()
                    if key not in meter._seen:
                        meter._seen.add(key)
                        meter.received[meter._label.get(key, "other")] += size(v)
            return out

        def counted_put(value, *a, **k):
            if meter.on:
                meter.calls["ray.put"] += 1
                meter.sent["ray.put"] += size(value)
            return put(value, *a, **k)

        method._remote, ray.get, ray.put = counted_remote, counted_get, counted_put


def run(name: str, overrides: list[str], model: Path, data: Path, out: Path, args) -> dict:
    from reinforge.config import load_config
    from reinforge.loop import RLLoop

    cfg = load_config(
        None,
        [
            f"model.path={model}",
            f"data.prompt_data={data}",
            "data.n_eval_prompts=0",
            f"rollout.rollout_batch_size={args.prompts}",
            f"rollout.n_samples_per_prompt={args.n}",
            f"rollout.rollout_max_response_len={args.length}",
            "rollout.rollout_top_k=8",
            f"engine.max_num_seqs={args.prompts * args.n}",
            "reward.type=custom",
            "reward.function_path=grpo_long:random_reward",
            "train.num_steps_per_rollout=2",
            "train.max_tokens_per_gpu=4096",
            "train.lr=1e-4",
            f"train.num_rollout={args.steps}",
            "cluster.mode=ray",
            "cluster.actor_num_gpus_per_node=2",
            "cluster.rollout_num_gpus=1",
            "cluster.colocate=false",
            "cluster.num_cpus_per_worker=0.5",
            f"run.output_dir={out / name}",
            "run.progress=false",
            "run.tensorboard=false",
            "run.save_final=false",
            "eval.eval_before_train=false",
            *overrides,
        ],
    )
    meter = Meter()
    loop = RLLoop(cfg)
    rows = []
    try:
        for i in range(args.steps):
            meter.on = True
            metrics, _ = loop.rollout_step(i)
            meter.on = False
            rows.append(metrics)
    finally:
        loop.close()
    tokens = sum(r["rollout/num_samples"] * r["rollout/response_len_mean"] for r in rows) / len(rows)
    per_step = {
        k: {
            "calls": meter.calls[k] / args.steps,
            "sent": meter.sent.get(k, 0) / args.steps,
            "received": meter.received.get(k, 0) / args.steps,
        }
        for k in sorted(meter.calls)
    }
    return {"workload": name, "response_tokens": tokens, "per_step": per_step, "last": rows[-1]}


def table(result: dict) -> str:
    lines = [
        f"{result['workload']}: {result['response_tokens']:.0f} response tokens per rollout",
        "| call | calls / step | sent KiB / step | received KiB / step |",
        "| --- | ---: | ---: | ---: |",
    ]
    trainer = [0.0, 0.0, 0.0]
    for k, v in result["per_step"].items():
        lines.append(f"| {k} | {v['calls']:.0f} | {v['sent'] / 1024:.1f} | {v['received'] / 1024:.1f} |")
        if not k.startswith("engine."):
            for j, key in enumerate(("calls", "sent", "received")):
                trainer[j] += v[key]
    sent, received = trainer[1] / 1024, trainer[2] / 1024
    lines.append(f"| **trainer ranks + ray.put** | {trainer[0]:.0f} | **{sent:.1f}** | **{received:.1f}** |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8, help="rollout.rollout_batch_size")
    ap.add_argument("--n", type=int, default=4, help="rollout.n_samples_per_prompt")
    ap.add_argument("--length", type=int, default=64, help="rollout.rollout_max_response_len")
    ap.add_argument("--steps", type=int, default=2, help="rollout steps measured")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--tokenizer", type=Path, default=None, help="SmolLM2's tokenizer folder (default: the cache's)")
    ap.add_argument("--output-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    from async_long import build_model
    from grpo_long import write_prompts

    from reinforge.models.hub import resolve_model_path

    args.output_dir.mkdir(parents=True, exist_ok=True)
    model, data = args.output_dir / "model", args.output_dir / "prompts.jsonl"
    if not (model / "config.json").exists():
        tokenizer = args.tokenizer or resolve_model_path("smollm2-135m-instruct")
        build_model(model, "smollm2", tokenizer, 1024, tiny=True)
    write_prompts(data, 64)
    results = []
    for name in args.workloads:
        r = run(name, WORKLOADS[name], model, data, args.output_dir, args)
        results.append(r)
        print(table(r), flush=True)
    with (args.output_dir / "results.jsonl").open("a") as f:
        for r in results:
            f.write(json.dumps(r, default=float) + "\n")
    return results


if __name__ == "__main__":
    main()
