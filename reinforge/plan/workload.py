"""The planner's workload: one RL step on one GPU as :mod:`.model` sees it (:class:`Workload`), a phase's memory
by part (:class:`Breakdown`) and the memory a phase may take (:data:`CUDA_CONTEXT`, :data:`USABLE_FRACTION`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .arch import Arch
from .hardware import GPU

GIB = 1 << 30
CUDA_CONTEXT = GIB  # the CUDA context and cuBLAS / NCCL workspaces, outside the allocator's count
USABLE_FRACTION = 0.90  # of the rest: the allocator's fragmentation (docs/results/grpo_long: 13 GiB reserved unused)


@dataclass
class Workload:
    """One RL step on one GPU (a trainer rank and, colocated, its engine). Lengths in tokens.

    Attributes:
        prompt_len, response_len: the longest prompt and ``rollout.rollout_max_response_len``.
        num_seqs: sequences per rollout (``rollout_batch_size x n_samples_per_prompt``).
        slots: the engine's ``max_num_seqs`` (capped at ``num_seqs``).
        ray: the trainers and engines are Ray actors (``cluster.mode=ray``).
        engines: rollout engines sharing the rollout (Ray: ``rollout_num_gpus / rollout_num_gpus_per_engine``);
            each decodes its share (:func:`.model.per_engine`).
        kv_elem_bytes, engine_elem_bytes: KV cache and engine weight dtype bytes.
        kv_fraction: ``engine.kv_cache_memory_fraction``; ``num_kv_blocks``: its cap (0: none).
        micro_tokens: ``train.max_tokens_per_gpu``; ``recompute``: layers recomputed (0 .. layers).
        log_prob_chunk: ``train.log_prob_chunk_size``.
        colocated: the engine shares this GPU (local mode, Ray ``colocate``).
        offload_rollout: the KV cache is freed while training (``cluster.offload_rollout``; Ray colocated).
        offload_engine_weights: the engine's weights are freed too (the weight sync writes them again).
        reference: a frozen reference model on the trainer; ``critic``: a value model like the policy.
        dp, tp, cp: data / tensor / context parallel sizes of the trainer ranks.
        ep, pp, vpp: expert / pipeline parallel sizes and model chunks per pipeline rank (:mod:`.parallel`).
        engine_tp: GPUs per rollout engine (Ray's ``cluster.rollout_num_gpus_per_engine``; 1 in local mode): the
            engine's weights, KV cache and decode bytes per GPU are divided by it.
        node_gpus: trainer GPUs per node (``cluster.actor_num_gpus_per_node``): expert parallelism beyond them runs
            its all-to-all over the network (:func:`.parallel.expert_link`).
        eager_norms: the trainer's RMSNorms are eager PyTorch (:data:`.model.EAGER_NORM_BYTES` more per kept norm).
        fused_logprobs: the log-probs run as Triton kernels (``model.fused_kernels`` on a GPU,
            ``algo/fused_logprobs.py``): no fp32 log-softmax chunks.
        optimizer_offload: AdamW's moments in host memory (``train.optimizer_offload``).
        fsdp_offload: weights, gradients and AdamW in host memory, a layer at a time on the GPU
            (``train.fsdp_cpu_offload``).
        lora: only adapters train (no gradients or AdamW state for the base).
        train_bf16: the trainer's forward runs under bf16 autocast (``model.train_dtype``); with ``lora``
            the frozen base is held in bf16 (:func:`~reinforge.models.lora.hold_frozen_weights`).
        logprob_passes: forward passes without gradient before training (old, reference log-probs).
        teacher_params, teacher_flop_params: on-policy distillation's checkpoint teachers (``distill``),
            summed: their parameters (held frozen like the reference) and their matmul parameters per token
            (their log-prob passes, before training); 0 without.
        steps_per_rollout: optimizer steps per rollout.
        prefill_tokens: ``engine.max_prefill_tokens``.
        engine_fp8: the engine's attention and MLP projections in fp8, 1 B / parameter
            (``engine.quantization=fp8``; embeddings, LM head, norms and routed experts stay
            ``engine_elem_bytes``: :func:`.model.fp8_saved_bytes`).
    """

    arch: Arch
    gpu: GPU
    prompt_len: int
    response_len: int
    num_seqs: int
    slots: int
    micro_tokens: int
    recompute: int
    kv_elem_bytes: float = 2
    engine_elem_bytes: int = 2
    kv_fraction: float = 0.3
    num_kv_blocks: int = 0
    log_prob_chunk: int = 2048
    colocated: bool = True
    offload_rollout: bool = False
    offload_engine_weights: bool = False
    reference: bool = False
    critic: bool = False
    dp: int = 1
    tp: int = 1
    cp: int = 1
    ep: int = 1
    pp: int = 1
    vpp: int = 1
    engine_tp: int = 1
    node_gpus: int = 8
    lora: bool = False
    train_bf16: bool = True
    eager_norms: bool = False
    fused_logprobs: bool = False
    optimizer_offload: bool = False
    fsdp_offload: bool = False
    logprob_passes: int = 0
    teacher_params: int = 0
    teacher_flop_params: int = 0
    steps_per_rollout: int = 1
    prefill_tokens: int = 16384
    ray: bool = False
    engines: int = 1
    engine_fp8: bool = False

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    @property
    def shards(self) -> int:
        """The ranks that shard one pipeline stage's state (data x context x tensor parallel)."""
        return self.dp * self.cp * self.tp

    @property
    def trainer_gpus(self) -> int:
        """The trainer ranks sharing the training's work: :attr:`shards` x the pipeline stages ``pp``."""
        return self.shards * self.pp

    @property
    def usable(self) -> float:
        """Bytes the planner lets a phase allocate: (memory - CUDA context) x :data:`USABLE_FRACTION`."""
        return (self.gpu.memory - CUDA_CONTEXT) * USABLE_FRACTION


@dataclass
class Breakdown:
    """A phase's memory: named parts in bytes."""

    phase: str
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def words(self, top: int = 4) -> str:
        big = sorted(self.parts.items(), key=lambda kv: -kv[1])[:top]
        shown = ", ".join(f"{k} {v / GIB:.1f}" for k, v in big if v >= GIB / 20)
        return f"{shown} GiB" if shown else "every part < 0.05 GiB"


def with_(w: Workload, **changes: Any) -> Workload:
    """A copy of ``w`` with some fields changed."""
    return replace(w, **changes)
