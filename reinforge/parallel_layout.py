"""The trainer's parallel layout: how many ranks each dimension takes, and every rule about it.

This is the one place the rules live (torchtitan's ``ParallelDims``): the config checks
(:meth:`reinforge.config.Config.validate`), the up-front checks (:func:`reinforge.preflight.parallel_problems`),
the placement's words (:mod:`reinforge.cluster.resources`) and the device mesh
(:mod:`reinforge.train.mesh`) all read :class:`Layout`. Torch-free, below ``config``.

The dimensions, outermost first, with their keys (slime's / Megatron's names):

======  ===============================================  =============================================
``pp``  ``train.pipeline_model_parallel_size``           consecutive decoder layers per stage
        (``train.virtual_pipeline_model_parallel_size``  model chunks per pipeline rank: interleaved 1F1B)
``dp``  (the rest)                                       the samples; FSDP2 shards the weights over it
``cp``  ``train.context_parallel_size``                  each micro-batch's positions (Ulysses)
``tp``  ``train.tensor_model_parallel_size``             each layer's projections (DTensor)
``ep``  ``train.expert_model_parallel_size``             the experts, carved out of ``dp``
======  ===============================================  =============================================

``train.sequence_parallel`` (Megatron's ``--sequence-parallel``) is not a dimension: with ``tp`` it
splits the positions of what tensor parallelism leaves whole (norms, residual stream) over the same ranks.

``world size = pp x dp x cp x tp``; ``ep`` divides ``dp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KEYS = {
    "pp": "train.pipeline_model_parallel_size",
    "vpp": "train.virtual_pipeline_model_parallel_size",
    "tp": "train.tensor_model_parallel_size",
    "cp": "train.context_parallel_size",
    "ep": "train.expert_model_parallel_size",
    "sp": "train.sequence_parallel",
}
WORLD = "cluster.actor_num_nodes x cluster.actor_num_gpus_per_node, or torchrun's WORLD_SIZE"


def _ranks(n: int) -> str:
    return f"{n} trainer rank{'s' if n != 1 else ''}"


def size_problems(tp: int = 1, cp: int = 1, ep: int = 1, pp: int = 1, vpp: int = 1, sp: bool = False) -> list[str]:
    """What the sizes alone do not allow (empty: fine), whatever the world size: a size below 1,
    virtual stages without pipeline parallelism, sequence parallelism without tensor parallelism,
    expert parallelism with tensor / context / pipeline parallelism and sequence parallelism with
    context / pipeline parallelism (not supported yet)."""
    sizes = {"tp": tp, "cp": cp, "ep": ep, "pp": pp, "vpp": vpp}
    low = [f"{KEYS[k]}={v}" for k, v in sizes.items() if v < 1]
    if low:
        return [f"{', '.join(low)}: every parallel size must be >= 1"]
    out = []
    if vpp > 1 and pp == 1:
        out.append(
            f"{KEYS['vpp']}={vpp} splits each pipeline rank's layers into model chunks: it needs "
            f"{KEYS['pp']} > 1 (set it, or {KEYS['vpp']}=1)"
        )
    if ep > 1 and (tp > 1 or cp > 1):
        out.append(
            f"{KEYS['ep']}={ep} with {KEYS['tp']}={tp} / {KEYS['cp']}={cp}: expert parallelism "
            f"combines with data parallelism (FSDP) only for now; set the other two to 1"
        )
    if sp and tp == 1:
        out.append(f"{KEYS['sp']}=true splits what tensor parallelism leaves whole: it needs {KEYS['tp']} > 1")
    for key, size in (("cp", cp), ("pp", pp)):
        if sp and size > 1:
            out.append(f"{KEYS['sp']}=true does not combine with {KEYS[key]}={size} yet: set one of them off")
    if ep > 1 and pp > 1:
        out.append(
            f"{KEYS['ep']}={ep} with {KEYS['pp']}={pp}: expert parallelism does not combine with "
            f"pipeline parallelism yet; set one of them to 1"
        )
    return out


@dataclass(frozen=True)
class Layout:
    """How many trainer ranks each dimension takes: ``pp * dp * cp * tp`` = the world size; ``ep``
    (expert parallelism) divides ``dp``: its ranks are data-parallel ranks too. ``vpp``: model chunks
    (virtual stages) per pipeline rank, ``pp * vpp`` stages in all."""

    dp: int = 1
    cp: int = 1
    tp: int = 1
    ep: int = 1
    pp: int = 1
    vpp: int = 1
    sp: bool = False

    @property
    def edp(self) -> int:
        """The data-parallel ranks that hold the same experts (FSDP shards the experts over them)."""
        return self.dp // self.ep

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def stages(self) -> int:
        """Pipeline stages in all (``pp * vpp``; 1 without pipeline parallelism)."""
        return self.pp * self.vpp

    @classmethod
    def for_world(
        cls,
        world_size: int,
        tp: int = 1,
        cp: int = 1,
        ep: int = 1,
        pp: int = 1,
        vpp: int = 1,
        sp: bool = False,
        world: str = WORLD,
    ) -> Layout:
        """The layout of ``world_size`` ranks with ``pp x cp x tp`` ranks per model replica and the
        experts split over ``ep`` of the data-parallel ranks. ``world``: where the world size comes
        from, for the message.

        Raises:
            ValueError: :func:`size_problems`, ``pp * cp * tp`` does not divide ``world_size``, or ``ep``
                does not divide the data-parallel ranks; one line naming the keys and the world size.
        """
        problems = size_problems(tp, cp, ep, pp, vpp, sp)
        if problems:
            raise ValueError(problems[0])
        per_replica = pp * tp * cp
        if world_size % per_replica:
            named = [(k, v) for k, v in (("pp", pp), ("tp", tp), ("cp", cp)) if v > 1 or k != "pp"]
            product = " x ".join(f"{KEYS[k]}={v}" for k, v in named)
            raise ValueError(
                f"{product} = {per_replica} does not divide the {_ranks(world_size)} ({world}): choose "
                f"sizes whose product divides it"
            )
        dp = world_size // per_replica
        if dp % ep:
            raise ValueError(
                f"{KEYS['ep']}={ep} does not divide the {dp} data-parallel rank(s) of the {_ranks(world_size)} "
                f"({world}): experts are split over data-parallel ranks; choose a divisor of {dp}"
            )
        return cls(dp, cp, tp, ep, pp, vpp, sp)

    @classmethod
    def of_train(cls, train: Any, world_size: int, world: str = WORLD) -> Layout:
        """:meth:`for_world` with the sizes of a ``train`` config section."""
        return cls.for_world(world_size, *train_sizes(train), world=world)

    def words(self) -> str:
        """E.g. ``"4 trainer ranks = 2 data x 2 tensor"``, ``"4 trainer ranks = 4 data (experts over 2)"``,
        ``"4 trainer ranks = 2 pipeline (4 stages) x 2 data"`` (sizes of 1 left out, but data)."""
        parts = [f"{self.pp} pipeline" + (f" ({self.stages} stages)" if self.vpp > 1 else "")] if self.pp > 1 else []
        parts.append(f"{self.dp} data" + (f" (experts over {self.ep})" if self.ep > 1 else ""))
        parts += [f"{n} {name}" for n, name in ((self.cp, "context"), (self.tp, "tensor")) if n > 1]
        if self.sp:
            parts[-1] += " (sequence parallel)"
        return f"{_ranks(self.world_size)} = {' x '.join(parts)}"

    def expert_problems(self, num_experts: int) -> list[str]:
        """What the model's experts do not allow (empty: fine): ``ep`` must divide ``num_experts``
        (0 for a dense model, which expert parallelism does not apply to)."""
        if self.ep == 1:
            return []
        if num_experts == 0:
            from .models.families import moe_models

            return [f"{KEYS['ep']}={self.ep} needs {moe_models()}; this one is dense: set {KEYS['ep']}=1"]
        if num_experts % self.ep:
            return [
                f"{KEYS['ep']}={self.ep} must divide the model's num_experts={num_experts} (each expert-parallel "
                f"rank holds num_experts / {KEYS['ep']} experts)"
            ]
        return []

    def model_problems(
        self, num_heads: int, num_kv_heads: int, intermediate_size: int, num_layers: int | None = None
    ) -> list[str]:
        """What the model's shape does not allow (empty: fine). Tensor parallelism splits the query
        heads, the key/value heads and the MLP columns; context parallelism (Ulysses) splits each
        rank's query heads again. Key/value heads that ``cp`` does not divide are repeated to one per
        query head before the all-to-all (more traffic, same result), so only the query heads must
        divide. Pipeline parallelism gives each of the ``pp * vpp`` stages as many decoder layers."""
        out = []
        tp, cp = self.tp, self.cp
        for name, n in (
            ("num_attention_heads", num_heads),
            ("num_key_value_heads", num_kv_heads),
            ("intermediate_size", intermediate_size),
        ):
            if n % tp:
                out.append(f"{KEYS['tp']}={tp} must divide the model's {name}={n}")
        if not out and (num_heads // tp) % cp:
            out.append(
                f"{KEYS['cp']}={cp} must divide the query heads per tensor-parallel rank "
                f"(num_attention_heads={num_heads} / {KEYS['tp']}={tp} = {num_heads // tp})"
            )
        if num_layers is not None and num_layers % self.stages:
            stages = f"{KEYS['pp']}={self.pp}" + (f" x {KEYS['vpp']}={self.vpp}" if self.vpp > 1 else "")
            out.append(
                f"{stages} = {self.stages} pipeline stages must divide the model's num_hidden_layers={num_layers} "
                f"(each stage holds as many decoder layers)"
            )
        return out

    def config_problems(self, model_config: dict[str, Any]) -> list[str]:
        """What a ``config.json`` dict does not allow: tensor, context or pipeline parallelism need
        reinforge's own model code (a registered family) and :meth:`model_problems`; expert
        parallelism a mixture-of-experts model whose experts it divides (:meth:`expert_problems`)."""
        from .models.families import is_moe_type, is_native_type, native_models
        from .models.shape import num_experts

        cfg = model_config.get("text_config", model_config)
        out = self.expert_problems(num_experts(cfg)) if self.ep > 1 else []
        if self.tp * self.cp * self.pp == 1:
            return out
        if self.sp and is_moe_type(cfg.get("model_type")):
            out.append(
                f"{KEYS['sp']}=true: a mixture-of-experts layer's MLP is not split by tensor parallelism, so "
                f"sequence parallelism does not apply to {cfg.get('model_type')} yet; set it to false"
            )
        if not is_native_type(cfg.get("model_type")):
            named = " / ".join(f"{KEYS[k]}={getattr(self, k)}" for k in ("tp", "cp", "pp") if getattr(self, k) > 1)
            return out + [f"{named} need {native_models()}, not model_type {cfg.get('model_type')!r}"]
        if cfg.get("kv_lora_rank") and self.tp * self.cp > 1:
            return out + [latent_attention_problem(cfg.get("model_type"))]
        heads = cfg["num_attention_heads"]
        return out + self.model_problems(
            heads,
            cfg.get("num_key_value_heads") or heads,
            int(cfg.get("intermediate_size") or 0),
            cfg["num_hidden_layers"],
        )


def latent_attention_problem(model_type: str | None) -> str:
    """Why tensor / context parallelism above 1 is refused for a multi-head latent attention model."""
    return (
        f"{KEYS['tp']} / {KEYS['cp']} above 1: multi-head latent attention ({model_type}) is not split over "
        f"tensor- or context-parallel ranks yet (its shared latent projections need their own gradient reduction); "
        f"set them to 1 and shard with FSDP and {KEYS['ep']} (expert parallelism)"
    )


def microbatch_count(n: int, pp: int, vpp: int) -> int:
    """The smallest count >= ``n`` micro-batches the schedule runs: at least ``pp``; interleaved
    (``vpp`` > 1), a multiple of its rounds (``max(1, count // pp)``, torch's flexible interleaved 1F1B)."""
    n = max(n, pp)
    while vpp > 1 and n % max(1, n // pp):
        n += 1
    return n


def train_sizes(train: Any) -> tuple[int, int, int, int, int, bool]:
    """(tp, cp, ep, pp, vpp, sp) of a ``train`` config section, in :meth:`Layout.for_world`'s order."""
    return (
        train.tensor_model_parallel_size,
        train.context_parallel_size,
        train.expert_model_parallel_size,
        train.pipeline_model_parallel_size,
        train.virtual_pipeline_model_parallel_size,
        train.sequence_parallel,
    )
