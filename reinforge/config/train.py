"""The ``train`` section: the trainer (optimizer steps, micro-batches, precision, parallel sizes after
slime's / Megatron's flags: ``tensor_model_parallel_size``...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .fields import ConfigError, Section, opt


@dataclass
class TrainConfig(Section):
    name = "train"
    num_rollout: int = opt(10, "rollouts (RL iterations) to run", ge=0)
    num_steps_per_rollout: int = opt(1, "optimizer steps per rollout", ge=1)
    max_tokens_per_gpu: int | Literal["auto"] = opt(
        "auto",
        "tokens per micro-batch (with padding for `packing: none` and `shared_prompt`; real tokens for "
        "`sequences`); `auto`: the largest that fits the GPU's memory beside everything else, at most 32768 and at "
        "least one sequence ([planner.md](planner.md)). A value that cannot fit is refused with the one that does",
        ge=1,
        unplanned=8192,
    )
    packing: Literal["none", "sequences", "shared_prompt", "auto"] = opt(
        "auto",
        "the RL trainer's forward pass (docs/packing.md): `none` a padded row per sample (any model); `sequences` "
        "samples side by side, no padding; `shared_prompt` a row per prompt group, its prompt once. The last two: "
        "reinforge's own model code, same log-probs; `auto`: `sequences` for it in bf16 on a GPU",
        unplanned="none",
    )
    log_prob_chunk_size: int = opt(
        2048,
        "response tokens per chunk of the log-prob / entropy computation over "
        "the vocabulary in PyTorch (bounds its fp32 memory: ~3 x chunk x vocab x 4 bytes); "
        "unused where the fused log-prob kernels run (`model.fused_kernels` on a GPU)",
        ge=1,
    )
    lr: float = opt(1e-6, "peak learning rate (AdamW)", gt=0)
    lr_warmup_iters: int = opt(0, "optimizer steps of linear warm-up", ge=0)
    lr_decay_style: Literal["constant", "cosine", "linear"] = opt(
        "constant", "`constant`, `linear` or `cosine` decay to `min_lr` at the last step"
    )
    min_lr: float = opt(0.0, "final learning rate of a decay", ge=0)
    weight_decay: float = opt(0.0, "AdamW weight decay", ge=0)
    adam_beta1: float = opt(0.9, "AdamW beta1", ge=0, lt=1)
    adam_beta2: float = opt(0.999, "AdamW beta2", ge=0, lt=1)
    adam_eps: float = opt(1e-8, "AdamW epsilon", gt=0)
    clip_grad: float = opt(1.0, "gradient-norm clipping", gt=0)
    moe_aux_loss_coeff: float = opt(
        0.0,
        "coefficient of the mixture-of-experts load-balancing loss (Switch "
        "Transformer's, over the layers as transformers pools it) added to the policy "
        "loss; needs a `qwen3_moe` / `qwen2_moe` model (slime's `--moe-aux-loss-coeff`)",
        ge=0,
    )
    seed: int = opt(1234, "torch / numpy / python seed, and the seed of mini-batch shuffling")
    device: str = opt("auto", "`auto` (cuda when available), `cpu`, `cuda`, `cuda:1`, ...")
    fsdp_cpu_offload: bool = opt(
        False,
        "FSDP2 CPU offload (`CPUOffloadPolicy`) of parameters, gradients and AdamW's state: each decoder layer "
        "visits the GPU for its forward and backward, the step runs on the CPU; one trainer rank (local mode) "
        "too, on a process group of its own ([parallelism.md](parallelism.md#offload))",
    )
    optimizer_offload: bool = opt(
        False,
        "AdamW's moments in page-locked CPU memory; the step runs on the GPU a chunk of parameters at a "
        "time, the moments copied in and out (verl's `optimizer_offload`): the GPU keeps fp32 parameters and "
        "gradients, 8 of 16 bytes per parameter ([parallelism.md](parallelism.md#offload))",
    )
    tensor_model_parallel_size: int = opt(
        1,
        "trainer ranks that split each decoder layer's projections (DTensor tensor parallelism; docs/parallelism.md)",
        ge=1,
    )
    context_parallel_size: int = opt(
        1,
        "trainer ranks that split each micro-batch's positions (Ulysses "
        "all-to-all attention over heads; docs/parallelism.md)",
        ge=1,
    )
    expert_model_parallel_size: int = opt(
        1,
        "data-parallel trainer ranks that split each mixture-of-experts layer's "
        "experts (num_experts / size each; tokens sent to their experts by "
        "all-to-all; must divide num_experts and the data-parallel ranks; "
        "docs/parallelism.md)",
        ge=1,
    )
    pipeline_model_parallel_size: int = opt(
        1,
        "trainer ranks that each hold a stage of consecutive decoder layers (torch.distributed.pipelining, "
        "1F1B schedule; must divide num_hidden_layers; Megatron's `--pipeline-model-parallel-size`; "
        "[parallelism.md](parallelism.md#pipeline-parallelism))",
        ge=1,
    )
    virtual_pipeline_model_parallel_size: int = opt(
        1,
        "model chunks (virtual stages) per pipeline rank: above 1 the interleaved 1F1B schedule, "
        "pipeline_model_parallel_size x this stages in all (Megatron's `--virtual-pipeline-model-parallel-size`)",
        ge=1,
    )
    sequence_parallel: bool = opt(
        False,
        "with tensor_model_parallel_size > 1: the norms and the residual stream split by positions over the "
        "tensor-parallel ranks (all-gather before, reduce-scatter after each layer's attention and MLP instead of "
        "an all-reduce; activations / tp between them); Megatron's `--sequence-parallel` "
        "([parallelism.md](parallelism.md#sequence-parallelism))",
    )

    def check(self) -> None:
        from ..parallel_layout import size_problems, train_sizes

        problems = size_problems(*train_sizes(self))
        if problems:
            raise ConfigError(problems[0])
