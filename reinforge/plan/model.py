"""The planner's memory and time model: pure functions of a model's shape, a GPU and a workload.

Memory (bytes), per phase of a colocated RL step on one GPU:

* **trainer, resident**: fp32 master weights (4 B / parameter), fp32 gradients (4 B, freed after each
  optimizer step: ``zero_grad(set_to_none=True)``), AdamW's two fp32 moments (8 B), all divided by the
  FSDP shards (data x context parallel ranks) and the tensor-parallel size; LoRA: the adapters only.
  A frozen reference model adds 2 B / parameter (bf16; 4 B and sharded under FSDP).
  ``train.optimizer_offload``: no AdamW on the GPU; ``train.fsdp_cpu_offload``: none of it, but two
  layers (and the embedding / head) in flight, 10 B / parameter (fp32 in, bf16 cast, fp32 gradient).
* **activations of one micro-batch of N tokens** (bf16 autocast over fp32 weights, flash / varlen
  attention, so no [T, T] term), counted per token and per decoder layer after Korthikanti et al.
  2022, "Reducing Activation Recomputation in Large Transformer Models" (sec. 4.1: 34 h bytes per token
  per layer for a GPT layer with dropout, 5 a s / h more without flash attention), re-derived for a
  Llama / Qwen2 layer as reinforge's trainer runs it:

  - a layer whose activations are kept: ``18 h + 4 q + 4 kv + 6 I`` bytes: the fp32 residual input of
    each RMSNorm (2 x 4 h), the bf16 casts autocast makes of the normed input for q, k, v, gate and up
    (5 x 2 h), q and the attention output (2 x 2 q), k and v (2 x 2 kv), gate, up and SiLU-mul outputs
    (3 x 2 I); q = heads x head_dim, kv = kv_heads x head_dim, I = intermediate size. A MoE layer
    replaces ``4 h + 6 I`` by its router (2 h + 8 E), the k routed copies of the input and output
    (2 x 2 h k) and the experts' gate, up and SiLU-mul (6 I_moe k), plus a shared expert (4 h + 6 I_s);
  - a recomputed layer (``model.recompute_num_layers``): its fp32 input only, ``4 h``;
  - the LM head: the last hidden states (fp32 norm input and output, bf16 cast: 14 h) and the bf16
    logits of the response tokens with their gradient (2 x 2 V), plus
    :data:`LOGIT_CHUNK_TEMPS` fp32 [chunk, V] temporaries of the chunked log-softmax backward
    (``algo/logprobs.py``; ``train.log_prob_chunk_size``; none where the fused log-prob kernels
    run: 18.6 GiB measured at 8k on the 1.5B against 18.0 modelled);
  - the bf16 copies of the kept layers' weights (and the LM head's) that autocast makes and the
    backward pass holds (2 B / parameter; under FSDP two layers' unsharded weights instead).

  Calibrated against docs/benchmarks.md (bench/liger_train.py, Qwen2.5-1.5B's shape, 151,936
  vocabulary, peak of parameters + gradients + activations): every layer recomputed 23.9 / 30.0 /
  42.1 GiB at 8k / 16k / 32k tokens, none 44.0 / 67.7 GiB at 8k / 16k; this model gives 23.8 / 30.0 /
  42.2 and 43.9 / 67.6 (tests/unit/test_plan.py). The log-prob pass (no gradient) holds the logits and
  :data:`LOGIT_CHUNK_TEMPS_FORWARD` chunks: 8.1 GiB above the weights at 16k, as measured.
* **engine**: its weights (``engine.dtype``: 2 B / parameter on a GPU), its KV cache: 2 x layers x
  kv_heads x head_dim x dtype bytes per token, in blocks of 16, for ``slots`` sequences of
  ``max_model_len`` tokens, capped at ``engine.kv_cache_memory_fraction`` of the memory free when it
  is allocated (``engine/kv_cache.py: plan_kv_layout``); a prefill workspace. With
  ``cluster.offload_rollout`` the cache is freed while the trainer trains.

Time (seconds), at assumed efficiencies (:data:`DECODE_EFFICIENCY`, :data:`TRAIN_MFU`, :data:`FORWARD_MFU`):

* generation: bandwidth-bound decode; every step reads the weights (a MoE model: the experts the
  step's tokens select, in expectation) and the KV cache of every running sequence, so a wave of
  sequences of lengths L_i reads ``max L_i x W + sum_i kv x (P L_i + L_i^2 / 2)`` bytes (the bound of
  docs/benchmarks.md, "What 9k tok/s per GPU at 16k would take"), over HBM bandwidth x efficiency,
  plus the host's work per decode step (:data:`DECODE_STEP_HOST_S`);
* log-probs: ``2 x active parameters x tokens + 2 x layers x q x sum L_i^2`` FLOPs (causal attention
  forward), at the forward MFU;
* training: 3 x that (forward and backward) plus the recomputed layers' forward again, at the
  training MFU (Kaplan et al. 2020's 6 N FLOPs per token, attention as in bench/liger_train.py); a MoE model's
  routed experts at :data:`EXPERT_MATMUL_EFFICIENCY` of it (:func:`paced_flops`);
* weight sync: the fp32 weights read and bf16 written on the device (local / colocated), or the
  fp32 buckets over the network (disaggregated, :data:`BROADCAST_BYTES_PER_S`).

Pipeline and expert parallelism (``Workload.pp`` / ``vpp`` / ``ep``) add the terms of :mod:`.parallel`: a stage's
weights, the interleaved schedule's extra activations, the layer FSDP gathers with ``E / ep`` experts and the
all-to-all buffers in memory; the pipeline bubble and the all-to-all's bytes over the GPUs' link in time.
"""

from __future__ import annotations

import math

from . import parallel as P
from .arch import Arch as Arch  # (re-exported: the planner's names are read from here)
from .hardware import GPU as GPU
from .workload import CUDA_CONTEXT, Breakdown, Workload, with_
from .workload import GIB as GIB
from .workload import USABLE_FRACTION as USABLE_FRACTION

BLOCK = 16  # tokens per KV block on a GPU (engine.kv_block_size: 0)
LOGIT_CHUNK_TEMPS = 5.0  # fp32 [chunk, V] buffers alive at once in the log-softmax backward (calibrated, see above)
LOGIT_CHUNK_TEMPS_FORWARD = 3.0  # ... in the forward without gradient (the log-prob pass: 8.1 GiB at 16k, measured)
DECODE_EFFICIENCY = 0.60  # share of the bandwidth bound the decode kernels reach, host work apart (fit below)
DECODE_STEP_HOST_S = 1.0e-3  # host work per decode step: scheduling, sampling, graph launch (fit below)
# Fit to the recorded rollouts of docs/benchmarks.md (H100, 1.39B, 64-128 sequences, 2k-16k responses, bf16 and fp8
# caches): one efficiency for every length left 2k at 1.53x its prediction and 16k at 0.92x (the host's share falls
# with length); with the per-step term every recorded rollout is within 0.93-1.14x, 2k at 1.23x (one-step runs: the
# first step's compilation and graph capture, ~2 s, are in it). tests/unit/test_plan.py holds the points.
# ... but a MoE engine's routed experts, read whole by the grouped GEMMs, stream at this share of the bandwidth. Fit
# (2026-12-08) to the two MoE rollouts recorded (docs/benchmarks.md): the 15B-A1.8B shape on 4 H200s (14.45-14.62 s
# against 19.5 at the dense efficiency) and Qwen3-30B-A3B on one H200 (72.8-78.1 s against 99). The 2.6B-A0.5B shape
# (0.6-5 GB a step) stays below it: fixed per-kernel costs dominate its steps (its prediction is optimistic).
EXPERT_DECODE_EFFICIENCY = 0.85
FORWARD_MFU = 0.35  # log-prob pass
TRAIN_MFU = 0.38  # forward + backward + recomputation (34-41% measured at 16k, docs/benchmarks.md)
BROADCAST_BYTES_PER_S = 25e9  # NCCL broadcast of the weights to disaggregated engines (assumed)
SYNC_EFFICIENCY = 0.5  # share of HBM bandwidth the on-device fp32 -> bf16 weight copy reaches (assumed)
# Ray colocated weight sync (each rank all-gathers its FSDP shards and hands the engine CUDA IPC handles, bucket by
# bucket): a fixed cost and fp32 bytes per second, fit (2026-11-28) to the two such runs of docs/benchmarks.md:
# 135M parameters on 2 GPUs 0.159 s, a 7.6B Qwen2.5-7B shape on 4 H200s 0.686 s (the on-device copy alone: 0.02 s).
RAY_SYNC_S = 0.15
RAY_IPC_BYTES_PER_S = 56e9
HOST_LINK_BYTES_PER_S = 25e9  # host <-> GPU copies of offloaded state (PCIe Gen5 x16 at ~40% of its 64 GB/s; assumed)
HOST_ADAMW_BYTES_PER_S = 10e9  # a CPU AdamW step (FSDP2's CPU offload) streams 32 B / parameter (assumed)
OFFLOAD_COPY_BYTES = 10  # per parameter of a layer in flight under FSDP2 CPU offload: fp32 in, bf16 cast, fp32 grad
# Eager PyTorch RMSNorm (no Liger kernels, no torch.compile) keeps fp32 intermediates for its backward that the fused
# norm does not: bytes per hidden element per norm. Fit (2026-11-27) to issue 37's H100 runs, which had no Liger:
# their one-step training peaks were 12-13 GiB above this model without the term at 14-18k tokens of 22-28 kept
# layers, and a second step at 2k (AdamW resident) ran out of memory; 8 keeps the configurations known to run.
EAGER_NORM_BYTES = 8
# ... and their time: the eager element-wise kernels of a layer (norms, RoPE, SiLU-and-multiply in fp32, forward and
# backward), bytes per token and hidden element moved at the HBM bandwidth. Fit (2026-11-29): one H100 workload at 2k
# trained in 8.9 s eager and 5.2 s with Liger (docs/results/planner/h100_2k_two_steps*.txt); half that difference as
# the term puts every recorded eager run (H100 and H200, 2k-16k) at 0.90-1.19x its prediction, from 1.07-1.55x
# without it (docs/benchmarks.md, "Eager training's time in the plan").
EAGER_TRAIN_BYTES = 545
# The routed experts' grouped GEMMs (a few hundred to a few thousand tokens per expert a micro-batch, the tokens
# permuted to them and back) reach this share of the dense MFU. Fit (2026-12-08) to the two MoE trainings recorded
# (docs/benchmarks.md): Qwen3-30B-A3B with LoRA on one H200, 38.1-46.4 s measured in three runs against 23.8 s at the
# dense MFU (41.4 with the term), and the 15B-A1.8B shape with FSDP over 4 H200s, 3.92 s against 2.13 (3.93).
EXPERT_MATMUL_EFFICIENCY = 0.35


# ----------------------------------------------------------------------------------------- memory


def trainer_state(
    params: float,
    shards: int = 1,
    *,
    lora: bool = False,
    bf16: bool = True,
    optimizer: bool = True,
    grads: bool = True,
    reference: bool = False,
    critic: bool = False,
    teacher_params: float = 0,
) -> dict[str, float]:
    """A trainer rank's memory outside a forward pass, bytes by part, each divided by the FSDP ``shards``: fp32
    weights (LoRA under bf16 autocast, ``bf16``: the frozen base in bf16), AdamW's two fp32 moments of the trained
    parameters (``optimizer``), their fp32 gradients (``grads``), a frozen reference (none with LoRA: the base is
    it) and checkpoint teachers held as ``Actor._frozen`` holds them (bf16 on one rank when the forward runs in
    bf16, else fp32 shards), a critic like the policy. The planner (:func:`trainer_resident`) and the CPU
    placement's estimate (:func:`reinforge.cluster.resources.estimate_memory`) both count with it."""
    p, trained = params, 0 if lora else params  # adapters: negligible here
    out = {"weights bf16": 2 * p / shards} if lora and bf16 else {"weights fp32": 4 * p / shards}
    if optimizer:
        out["AdamW"] = 8 * trained / shards
    if grads:
        out["gradients"] = 4 * trained / shards
    frozen = lambda n: 2 * n if bf16 and shards == 1 else 4 * n / shards  # noqa: E731
    if reference and not lora:
        out["reference"] = frozen(p)
    if critic:
        out["critic"] = 16 * p / shards
    if teacher_params:
        out["teachers"] = frozen(teacher_params)
    return out


def trainer_resident(w: Workload, grads: bool = True) -> dict[str, float]:
    """The trainer's memory outside a forward pass (:func:`trainer_state`): fp32 weights, gradients (``grads``),
    AdamW, reference, critic, teachers. ``fsdp_offload``: none of it (it is all in host memory; the layers in
    flight are :func:`train_breakdown`'s); ``optimizer_offload``: no AdamW (its step brings a chunk of moments
    at a time, after the activations are freed)."""
    if w.fsdp_offload:
        return {}
    return trainer_state(
        P.stage_params(w.arch, w.pp),
        w.shards,
        lora=w.lora,
        bf16=w.train_bf16,
        optimizer=not w.optimizer_offload,
        grads=grads,
        reference=w.reference,
        critic=w.critic,
        teacher_params=w.teacher_params,
    )


def fp8_saved_bytes(w: Workload) -> float:
    """Engine weight bytes ``engine.quantization=fp8`` saves: its layers' projections at 1 B instead of
    ``engine_elem_bytes`` (routed MoE experts, embeddings, the LM head and norms are not quantized)."""
    if not w.engine_fp8:
        return 0.0
    a = w.arch
    routed = a.moe_layers * a.experts * 3 * a.hidden * a.moe_intermediate
    return (a.layers_params - routed) * (w.engine_elem_bytes - 1) / w.engine_tp


def engine_weights(w: Workload) -> float:
    """The engine's weights on one GPU: every parameter at ``engine_elem_bytes`` over ``tp``, less fp8's saving."""
    return w.arch.weight_bytes(w.engine_elem_bytes, w.engine_tp) - fp8_saved_bytes(w)


def kv_need(w: Workload) -> float:
    """Bytes of the KV cache for ``slots`` full-length sequences (blocks of 16, one spare block)."""
    per_seq = math.ceil(w.seq_len / BLOCK)
    blocks = w.slots * per_seq
    if w.num_kv_blocks:
        blocks = min(blocks, max(w.num_kv_blocks, per_seq))
    states = w.slots * w.arch.state_bytes_per_seq(w.engine_elem_bytes)  # a hybrid's linear-attention states
    return ((blocks + 1) * BLOCK * w.arch.kv_bytes_per_token(w.kv_elem_bytes, w.seq_len) + states) / w.engine_tp


def kv_pool(w: Workload, after_training: bool = True) -> float:
    """The KV cache the engine allocates: :func:`kv_need` capped at ``kv_fraction`` of the memory free
    then. Built beside the trainer's fp32 weights (first rollout); with ``offload_rollout`` it is
    allocated again after every training step, beside AdamW's state too (``after_training``)."""
    taken = CUDA_CONTEXT + engine_weights(w)
    if w.colocated:
        resident = trainer_resident(w, grads=False)
        if not (w.offload_rollout and after_training):
            resident.pop("AdamW", None)
        taken += sum(resident.values())
    free = max(w.gpu.memory - taken, 0)
    return min(kv_need(w), w.kv_fraction * free)


def engine_workspace(w: Workload) -> float:
    """The engine's transient prefill (``max_prefill_tokens`` x (4 h + 3 I) bf16) and sampler buffers."""
    a = w.arch
    width = a.intermediate if not a.moe_layers else a.moe_intermediate * a.experts_per_tok + a.shared_intermediate
    return (
        min(w.prefill_tokens, w.num_seqs * w.seq_len) * (4 * a.hidden + 3 * width) * 2 / w.engine_tp
        + 2 * w.slots * a.vocab_size * 4
    )


def engine_during_training(w: Workload) -> dict[str, float]:
    """What the colocated engine holds while the trainer runs."""
    if not w.colocated:
        return {}
    out = {}
    if not (w.offload_rollout and w.offload_engine_weights):
        out["engine weights"] = engine_weights(w)
    if not w.offload_rollout:
        out["KV cache"] = kv_pool(w, after_training=False)
    return out


def activation_bytes_per_token(w: Workload, recompute: int | None = None) -> float:
    """Bytes per micro-batch token of the layers' kept activations and the LM head (module doc)."""
    a = w.arch
    k = w.recompute if recompute is None else recompute
    sparse = [a.experts > 0 and i >= a.num_layers - a.moe_layers for i in range(a.num_layers)]
    norm = EAGER_NORM_BYTES * a.hidden if w.eager_norms else 0  # per RMSNorm whose activations are kept
    layers = sum(4 * a.hidden if i < k else a.kept_layer_bytes(sparse[i], w.tp) + 2 * norm for i in range(a.num_layers))
    return layers * P.pipeline_activation_factor(w.pp, w.vpp) + 14 * a.hidden + norm + 4 * a.vocab_size


def train_breakdown(w: Workload, tokens: int | None = None, recompute: int | None = None) -> Breakdown:
    """Peak of a training micro-batch of ``tokens`` (default ``micro_tokens``) beside everything else."""
    a = w.arch
    n = (w.micro_tokens if tokens is None else tokens) / w.cp
    k = w.recompute if recompute is None else recompute
    kept_params = sum(
        a.layer_params(a.experts > 0 and i >= a.num_layers - a.moe_layers) for i in range(k, a.num_layers)
    )
    sharded = w.shards > 1
    bf16 = 2 * 2 * P.gathered_layer_params(a, w.ep) if sharded else 2 * (kept_params / w.tp / w.pp + a.head_params)
    copies = {"bf16 weight copies": bf16}
    if w.fsdp_offload:  # two layers (one prefetched) and the root module's embedding / head visit the GPU
        outer = a.head_params * (1 if a.tied else 2)
        copies = {"offloaded layers in flight": OFFLOAD_COPY_BYTES * (2 * a.layers_params / a.num_layers + outer)}
    parts = {
        **trainer_resident(w),
        **engine_during_training(w),
        "activations": n * activation_bytes_per_token(w, k),
        **copies,
        "all-to-all buffers": P.alltoall_buffer_bytes(n, a, w.ep),
        "log-softmax chunks": log_softmax_chunks(w, LOGIT_CHUNK_TEMPS, n),
    }
    return Breakdown("training", parts)


def log_softmax_chunks(w: Workload, temps: float, n: float) -> float:
    """Bytes of the chunked log-softmax's fp32 [chunk, V] temporaries (none with the fused kernels)."""
    return 0.0 if w.fused_logprobs else temps * min(w.log_prob_chunk, n) * w.arch.vocab_size * 4


def logprob_breakdown(w: Workload) -> Breakdown:
    """Peak of a log-prob pass (no gradient) over one micro-batch."""
    a = w.arch
    n = w.micro_tokens / w.cp
    head = {"logits": 2 * n * a.vocab_size, "log-softmax chunks": log_softmax_chunks(w, LOGIT_CHUNK_TEMPS_FORWARD, n)}
    layer = n * a.kept_layer_bytes(a.moe_layers > 0, w.tp)  # one layer's transient, before the logits exist
    top = head if sum(head.values()) >= layer else {"layer activations": layer}
    return Breakdown("log-probs", {**trainer_resident(w, grads=False), **engine_during_training(w), **top})


def generation_breakdown(w: Workload) -> Breakdown:
    """The engine generating, the trainer's state beside it when colocated (gradients freed)."""
    parts = {"engine weights": engine_weights(w), "KV cache": kv_pool(w), "engine workspace": engine_workspace(w)}
    if w.colocated:
        parts.update(trainer_resident(w, grads=False))
    return Breakdown("generation", parts)


def setup_breakdown(w: Workload) -> Breakdown | None:
    """A sharded trainer's start where each rank builds the whole model on its GPU before FSDP (and tensor /
    expert / pipeline parallelism) shard it (``train/actor.py``: ``build_model``, then ``ModelTrainer``'s
    parallelize), in fp32, or with LoRA under bf16 autocast its frozen matmul weights in bf16. The
    engines start after the trainers. None on one rank, where the whole model is what trains, and where
    each rank loads only its shard (plain FSDP2 without LoRA or ``train.fsdp_cpu_offload``:
    ``train/shard_load.py``; the shard is the training step's resident weights)."""
    shard_wise = w.tp == w.cp == w.ep == w.pp == 1 and not w.lora and not w.fsdp_offload
    if w.shards == 1 or shard_wise:
        return None
    p = w.arch.num_params
    return Breakdown("setup", {"whole model before sharding": 2 * p if w.lora and w.train_bf16 else 4 * p})


def memory_plan(w: Workload) -> list[Breakdown]:
    """Every phase's peak (the sharded trainer's start, generation, log-probs when run, training)."""
    setup = setup_breakdown(w)
    out = ([setup] if setup is not None else []) + [generation_breakdown(w)]
    if w.logprob_passes or w.teacher_params:
        out.append(logprob_breakdown(w))
    out.append(train_breakdown(w))
    return out


def fits(w: Workload, tokens: int, recompute: int, limit: float | None = None) -> bool:
    """Whether the training peak fits ``limit`` bytes (default :attr:`Workload.usable`)."""
    return train_breakdown(w, tokens, recompute).total <= (w.usable if limit is None else limit)


def max_tokens_that_fit(
    w: Workload, recompute: int | None = None, multiple: int = 256, limit: float | None = None
) -> int:
    """The largest micro-batch (a multiple of ``multiple`` tokens) whose training peak fits; 0 if none."""
    k = w.recompute if recompute is None else recompute
    limit = w.usable if limit is None else limit
    fixed = train_breakdown(w, 0, k).total
    per_token = activation_bytes_per_token(w, k) / w.cp
    room = limit - fixed
    if room <= 0:
        return 0
    n = int(room // per_token) // multiple * multiple
    while n > 0 and not fits(w, n, k, limit):  # the chunk term grows below one chunk
        n -= multiple
    return max(n, 0)


def min_recompute_that_fits(w: Workload, tokens: int, limit: float | None = None) -> int | None:
    """The fewest recomputed layers with which a micro-batch of ``tokens`` fits; None if none does."""
    for k in range(w.arch.num_layers + 1):
        if fits(w, tokens, k, limit):
            return k
    return None


# ------------------------------------------------------------------------------------------- time


def engine_slots(w: Workload, lengths: list[int] | None = None) -> int:
    """Sequences decoded at once: the slots, capped at what the KV pool holds at a sequence's mean
    footprint over its decode (the prompt and half the response: ``lengths``' mean, default
    ``response_len``). The engine grants blocks as sequences grow and preempts only when the pool runs
    dry, so a pool short of every sequence at full length still runs them together (Qwen3-30B-A3B on
    an H200, docs/benchmarks.md: a pool of 60 full-length sequences decoded 64 in one wave)."""
    mean = sum(lengths) / len(lengths) if lengths else w.response_len
    held = math.ceil((w.prompt_len + mean / 2) / BLOCK) * BLOCK
    footprint = w.arch.seq_kv_bytes(held, w.kv_elem_bytes, w.engine_elem_bytes) / w.engine_tp
    return max(1, min(w.slots, w.num_seqs, int(kv_pool(w) // footprint)))


def decode_weight_bytes(w: Workload, batch: int, expert_weight: float = 1.0) -> float:
    """Weight bytes one decode step reads: every dense weight; of a MoE layer's experts those the
    ``batch`` tokens select in expectation, ``E (1 - (1 - k/E)^batch)``, their bytes times ``expert_weight``."""
    a = w.arch
    b = w.engine_elem_bytes
    if not a.moe_layers:
        return engine_weights(w)
    used = a.experts * (1 - (1 - a.experts_per_tok / a.experts) ** batch)
    expert = 3 * a.hidden * a.moe_intermediate
    routed = a.moe_layers * used * expert * b / w.engine_tp
    rest = (a.num_params - a.moe_layers * a.experts * expert) * b / w.engine_tp - fp8_saved_bytes(w)
    return rest + routed * expert_weight


def generation_seconds(
    w: Workload,
    lengths: list[int] | None = None,
    efficiency: float = DECODE_EFFICIENCY,
    mfu: float = FORWARD_MFU,
    host_step_s: float = DECODE_STEP_HOST_S,
) -> float | None:
    """Decode time of one rollout (``lengths``: the response lengths; default all ``response_len``:
    the longest rollout), in waves of :func:`engine_slots` sequences at ``efficiency`` of the
    bandwidth plus ``host_step_s`` per decode step, and the prefill at ``mfu`` of the peak (1, 1 and
    0: the hardware limit, :mod:`.report`). Preemption's recomputation is not counted: a pool short
    of the slots' peak footprint (full length) but not of their mean one is taken as one wave."""
    if not w.gpu.knows_speed:
        return None
    a = w.arch
    lengths = list(lengths) if lengths else [w.response_len] * w.num_seqs
    c = engine_slots(w, lengths)
    kv = a.kv_bytes_per_token(w.kv_elem_bytes) / w.engine_tp
    total = steps = 0.0
    for i in range(0, len(lengths), c):
        wave = lengths[i : i + c]
        steps += max(wave)
        total += max(wave) * decode_weight_bytes(w, len(wave), min(1.0, efficiency / EXPERT_DECODE_EFFICIENCY))
        total += sum(kv * (w.prompt_len * n + n * n / 2) for n in wave)
        total += (
            max(wave) * len(wave) * 2 * a.state_bytes_per_seq(w.engine_elem_bytes) / w.engine_tp
        )  # states read, written
    prefill = 2 * a.flop_params * w.prompt_len * len(lengths) / (w.gpu.bf16_flops * mfu * w.engine_tp)
    return total / (w.gpu.bandwidth * efficiency) + steps * host_step_s + prefill


def forward_flops(w: Workload, lengths: list[int] | None = None) -> float:
    """FLOPs of one forward pass over the rollout's sequences (all trainer ranks together)."""
    a = w.arch
    seqs = [w.prompt_len + n for n in lengths] if lengths else [w.seq_len] * w.num_seqs
    return 2 * a.flop_params * sum(seqs) + 2 * a.num_layers * a.q_dim * sum(s * s for s in seqs)


def paced_flops(w: Workload, lengths: list[int] | None = None) -> float:
    """:func:`forward_flops` with the routed experts' share at :data:`EXPERT_MATMUL_EFFICIENCY` of the MFU: the
    FLOPs a dense model would take as long for."""
    a = w.arch
    if not a.moe_layers:
        return forward_flops(w, lengths)
    routed = 2 * a.moe_layers * a.experts_per_tok * 3 * a.hidden * a.moe_intermediate * rollout_tokens(w, lengths)
    return forward_flops(w, lengths) + routed * (1 / EXPERT_MATMUL_EFFICIENCY - 1)


def rollout_tokens(w: Workload, lengths: list[int] | None = None) -> int:
    """Prompt and response tokens of the rollout (responses of ``lengths``, else all at the longest)."""
    return sum(w.prompt_len + n for n in lengths) if lengths else w.seq_len * w.num_seqs


def micro_batches(w: Workload, lengths: list[int] | None = None) -> int:
    """Micro-batches of ``micro_tokens`` one pass over the rollout takes, per trainer rank."""
    return max(1, math.ceil(rollout_tokens(w, lengths) / (w.micro_tokens * w.dp)))


def pipeline_factor(w: Workload, lengths: list[int] | None = None) -> float:
    """:func:`.parallel.pipeline_time_factor` of the micro-batches each optimizer step's schedule runs."""
    return P.pipeline_time_factor(math.ceil(micro_batches(w, lengths) / w.steps_per_rollout), w.pp, w.vpp)


def alltoall_seconds(w: Workload, passes: float, lengths: list[int] | None = None) -> float:
    """:func:`.parallel.alltoall_seconds` of a data-parallel rank's tokens of the rollout."""
    link = P.expert_link(w.ep, w.node_gpus, w.gpu.link)
    return P.alltoall_seconds(rollout_tokens(w, lengths) / w.dp, w.arch, w.ep, passes, link)


def host_copy_seconds(w: Workload, passes: float, lengths: list[int] | None = None) -> float:
    """Seconds of ``fsdp_offload``'s host-to-GPU weight copies (fp32) for ``passes`` per micro-batch."""
    if not w.fsdp_offload:
        return 0.0
    return passes * micro_batches(w, lengths) * 4 * w.arch.num_params / w.shards / HOST_LINK_BYTES_PER_S


def logprob_seconds(w: Workload, lengths: list[int] | None = None) -> float | None:
    """The forward passes without gradient; with ``fsdp_offload`` no faster than the weights' copies in."""
    if not w.gpu.knows_speed:
        return None
    compute = paced_flops(w, lengths) / (w.gpu.bf16_flops * FORWARD_MFU * w.trainer_gpus)
    compute *= pipeline_factor(w, lengths)  # (the bubble: pipeline parallelism)
    # the teachers' passes: the same tokens through their matmuls (attention's share scaled alike)
    teachers = compute * w.teacher_flop_params / max(w.arch.flop_params, 1)
    compute += alltoall_seconds(w, 1, lengths)  # (expert parallelism's dispatch and combine)
    return w.logprob_passes * max(compute, host_copy_seconds(w, 1, lengths)) + teachers


def train_seconds(w: Workload, lengths: list[int] | None = None) -> float | None:
    """Forward + backward (3 x forward) + the recomputed layers' forward, at :data:`TRAIN_MFU`; with
    ``eager_norms`` (no Liger kernels, no compile) plus :data:`EAGER_TRAIN_BYTES` per token, hidden element
    and layer (recomputed layers' forward a third again) at the HBM bandwidth; ``optimizer_offload`` adds
    the moments' copies (16 B / parameter a step over :data:`HOST_LINK_BYTES_PER_S`), ``fsdp_offload`` is no
    faster than its weight copies (3 x 4 B / parameter a micro-batch) and adds the CPU step
    (:data:`HOST_ADAMW_BYTES_PER_S`)."""
    if not w.gpu.knows_speed:
        return None
    f = paced_flops(w, lengths)
    flops = 3 * f + f * w.recompute / w.arch.num_layers
    if w.critic:
        flops *= 2
    compute = flops / (w.gpu.bf16_flops * TRAIN_MFU * w.trainer_gpus)
    if w.eager_norms:
        a = w.arch
        passes = (1 + w.recompute / a.num_layers / 3) * (2 if w.critic else 1)
        per_token = EAGER_TRAIN_BYTES * a.hidden * a.num_layers * passes
        compute += rollout_tokens(w, lengths) * per_token / (w.gpu.bandwidth * w.trainer_gpus)
    compute = compute * pipeline_factor(w, lengths) + alltoall_seconds(w, 2 + w.recompute / w.arch.num_layers, lengths)
    trained = 0 if w.lora else w.arch.num_params / w.shards
    if w.optimizer_offload:  # the moments in and out at every step, overlapped with nothing else
        compute += w.steps_per_rollout * 16 * trained / HOST_LINK_BYTES_PER_S
    if w.fsdp_offload:  # weights in for the forward and the backward, gradients out; the step on the CPU
        copies = host_copy_seconds(w, 3, lengths)
        compute = max(compute, copies) + w.steps_per_rollout * 32 * trained / HOST_ADAMW_BYTES_PER_S
    return compute


def sync_seconds(w: Workload, bound: bool = False) -> float | None:
    """Weight sync. Colocated: fp32 read + bf16 write on the device at :data:`SYNC_EFFICIENCY` of the
    bandwidth (``bound``: all of it, the hardware limit), and in Ray mode the ranks' hand-off besides
    (:data:`RAY_SYNC_S` + the fp32 bytes at :data:`RAY_IPC_BYTES_PER_S`; not in the bound).
    Disaggregated: fp32 over the network (``bound``: None)."""
    if not w.gpu.knows_speed:
        return None
    p = w.arch.num_params
    if not w.colocated:
        return None if bound else 4 * p / BROADCAST_BYTES_PER_S
    copy = 6 * p / (w.gpu.bandwidth * (1.0 if bound else SYNC_EFFICIENCY))
    return copy + (RAY_SYNC_S + 4 * p / RAY_IPC_BYTES_PER_S if w.ray and not bound else 0.0)


def per_engine(w: Workload, lengths: list[int] | None = None) -> tuple[Workload, list[int] | None]:
    """One engine's share of the rollout: ``w`` with its number of sequences, and every ``engines``-th of
    ``lengths`` (in order; the engines take turns). ``(w, lengths)`` itself with one engine."""
    if w.engines <= 1:
        return w, lengths
    n = len(lengths) if lengths else w.num_seqs
    return with_(w, num_seqs=max(1, math.ceil(n / w.engines))), (lengths[:: w.engines] if lengths else None)


def share_text(w: Workload) -> str:
    """The sequences one engine decodes, in words: "the 32 sequences of each of 4 engines", "the 128 sequences"."""
    n = per_engine(w)[0].num_seqs
    return f"the {n} sequences of each of {w.engines} engines" if w.engines > 1 else f"the {n} sequences"


def times(w: Workload, lengths: list[int] | None = None) -> dict[str, float | None]:
    """Predicted seconds of each phase of one rollout step (None: the GPU's speed is unknown); the
    engines generate in parallel, each its share (:func:`per_engine`)."""
    return {
        "generation": generation_seconds(*per_engine(w, lengths)),
        "log-probs": logprob_seconds(w, lengths),
        "training": train_seconds(w, lengths),
        "weight sync": sync_seconds(w),
    }
