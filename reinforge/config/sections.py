"""The configuration sections: one dataclass per concern, each key with its help and bounds.

Key names follow slime's command-line flags where slime has one (``rollout_batch_size``,
``n_samples_per_prompt``, ``num_steps_per_rollout``, ``max_tokens_per_gpu``, ``eps_clip``...).
Each section checks its own keys (``validate``); checks across sections are in
:meth:`Config.validate`. ``docs/config.md`` is generated from this file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .fields import ConfigError, check_fields, opt, registered

DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

BACKENDS = registered("reinforge.rollout.backends:BACKENDS")


class Section:
    """Base of the sections: field checks from the declarations, then ``check()``."""

    name = ""

    def validate(self) -> None:
        check_fields(self.name, self)
        self.check()

    def check(self) -> None:
        """Combinations of this section's keys (override in sections that have them)."""


@dataclass
class ModelConfig(Section):
    name = "model"
    path: str = opt(
        "smollm2-135m-instruct",
        "Hugging Face folder, a known model name (`reinforge models list`, "
        "converted on first use), or a Hugging Face model id (`Qwen/Qwen2.5-0.5B-Instruct`, "
        "`Org/Name@revision`) already in the local hub cache (`HF_HUB_CACHE`; read offline)",
    )
    random_init: bool = opt(False, "ignore the stored weights and initialise randomly (tests, benchmarks)")
    gradient_checkpointing: bool = opt(
        False, "recompute layer activations in the backward pass (less memory, ~30% more compute)"
    )
    recompute_num_layers: int | Literal["auto"] | None = opt(
        "auto",
        "with `gradient_checkpointing`: recompute the first N decoder layers, keep the others' activations "
        "(Megatron-LM's `--recompute-num-layers`; reinforge's own model code); `null`: every layer; `0`: none; "
        "`auto`: the fewest that fit, `gradient_checkpointing` following ([planner.md](planner.md))",
        ge=0,
        unplanned=None,
    )
    torch_compile: bool = opt(
        False,
        "`torch.compile` each decoder layer of the trained model (fuses the elementwise "
        "kernels of the norms, RoPE and SiLU in forward and backward; the first steps "
        "compile); reinforge's own model code only, not with LoRA",
    )
    fused_kernels: bool = opt(
        True,
        "fused Triton kernels, forward and backward, in the trained models: RMSNorm, RoPE and "
        "SiLU-and-multiply from Liger-Kernel (`pip install liger-kernel`; without it a warning "
        "and eager PyTorch), the token log-probs and the MoE token permutation (reinforge's); "
        "GPU only, off with `torch_compile`; `false`: eager PyTorch",
    )
    train_dtype: Literal["auto", "fp32", "bf16"] = opt(
        "auto", "`auto`: bf16 autocast with fp32 master weights on GPU, fp32 on CPU; `fp32`; `bf16`"
    )
    lora_rank: int = opt(
        0,
        "LoRA rank r (`peft`); 0 trains every weight. Only the adapters are optimised; "
        "engines and exports get the merged weights; the reference model is the base (adapters "
        "off). Under bf16 autocast (`train_dtype`, on a GPU by default) the frozen base's linear and "
        "expert weights are held in bf16: half the memory, the same forward and backward",
        ge=0,
    )
    lora_alpha: float = opt(16.0, "LoRA alpha (the update is scaled by alpha / r)", gt=0)
    lora_dropout: float = opt(0.0, "dropout on the adapters' input", ge=0, lt=1)
    lora_target_modules: list[str] = opt(DEFAULT_LORA_TARGETS, "PEFT's target_modules (default: + a family's own)")

    @property
    def trains_fused_kernels(self) -> bool:
        """The trainer runs the fused kernels (``fused_kernels``, unless ``torch_compile`` compiles the
        layers instead)."""
        return self.fused_kernels and not self.torch_compile


@dataclass
class DataConfig(Section):
    name = "data"
    prompt_data: str = opt(
        "reasoning_gym:basic_arithmetic",
        "`reasoning_gym:<task>`, or a `.jsonl` / `.json` / `.parquet` file or saved `datasets` "
        "folder of prompts, slime's or verl's layout ([data.md](data.md)) (slime's `--prompt-data`)",
    )
    task_kwargs: dict[str, Any] = opt(
        {},
        "keyword arguments of `reasoning_gym.create_dataset` "
        "(e.g. `{min_terms: 2, max_digits: 2}`); ignored, with a warning, for a file",
    )
    num_prompts: int = opt(10000, "number of problems generated for a reasoning-gym training source", ge=1)
    eval_prompt_data: str | None = opt(
        None,
        "held-out prompts (a task or a file, as `prompt_data`); `null`: the "
        "training task with `eval_seed` (reasoning-gym), or `n_eval_prompts` rows of "
        "the `prompt_data` file drawn with `eval_seed` and left out of training (when "
        "it has at least twice as many; else no eval, with a warning)",
    )
    n_eval_prompts: int = opt(64, "held-out prompts evaluated (0 disables evaluation)", ge=0)
    eval_seed: int = opt(1_000_003, "seed of the held-out reasoning-gym problems (differs from `seed`)")
    input_key: str = opt(
        "prompt",
        "key of the prompt (a string or a list of chat messages); keys may be dotted paths into nested objects",
    )
    label_key: str | None = opt(
        "label",
        "key of the reference answer (`reward_model.ground_truth` is found in verl "
        "rows without `label`); a key that no row holds is refused; `null`: no labels",
    )
    metadata_key: str = opt("metadata", "key of per-prompt metadata (passed to reward functions)")
    apply_chat_template: bool = opt(True, "render prompts with the tokenizer's chat template and a generation prompt")
    system_prompt: str | None = opt(None, "system message added to prompts that have none")
    rollout_max_prompt_len: int = opt(
        512, "prompts longer than this many tokens are dropped (counted in the log)", ge=1
    )
    rollout_shuffle: bool = opt(True, "shuffle prompts each epoch (seeded: `seed + epoch`)")
    seed: int = opt(42, "shuffling and reasoning-gym generation seed")


@dataclass
class RolloutConfig(Section):
    name = "rollout"
    rollout_batch_size: int = opt(8, "prompts per rollout", ge=1)
    n_samples_per_prompt: int = opt(8, "completions per prompt (the GRPO group size)", ge=1)
    rollout_max_response_len: int = opt(256, "max new tokens per completion", ge=1)
    rollout_temperature: float = opt(
        1.0, "sampling temperature; the trainer scores tokens at the same temperature", ge=0
    )
    rollout_top_p: float = opt(1.0, "nucleus sampling (1 disables)", gt=0, le=1)
    rollout_top_k: int = opt(-1, "top-k sampling (<= 0 disables)")
    rollout_stop: list[str] = opt([], "stop strings (the completion ends with the token that completes one)")
    rollout_stop_token_ids: list[int] = opt([], "stop token ids, added to the model's EOS ids (at most 6)")
    rollout_function_path: str | None = opt(
        None, "`module:function` replacing the default rollout (see `RolloutContext`)"
    )
    custom_generate_function_path: str | None = opt(
        None,
        "`module:function`, `async def generate(ctx, sample, params) -> Sample`, producing each sample "
        "(slime's `--custom-generate-function-path`); `reinforge.rollout.agent:generate` is the tool-using agent "
        "(docs/agents.md)",
    )
    seed: int = opt(1234, "sampling seed (each rollout reseeds the engine from `seed` and the rollout id)")
    max_staleness: int = opt(
        0,
        "asynchronous RL ([design.md](design.md#asynchronous-rl)): engines generate rollout `i` with policy version "
        ">= `i - max_staleness` while the trainer trains (AReaL's `max_head_offpolicyness`). 0 is the synchronous "
        "loop; 1 is one-step off-policy",
        ge=0,
    )
    partial_rollout: bool = opt(
        False,
        "keep unfinished samples and continue them under newer weights, their tokens, log-probs and "
        "per-token policy versions kept (slime's `--partial-rollout`). With `max_staleness` > 0 a weight update "
        "interrupts the sequences in flight and continues them (AReaL's interruptible generation); false: they "
        "finish under the weights they started with. With `over_sampling_batch_size` the samples the early stop "
        "cuts are carried into the next rollout; false: their groups are dropped",
    )
    over_sampling_batch_size: int | None = opt(
        None,
        "synchronous loop, default rollout, embedded engine ([design.md](design.md#over-sampling-and-early-stop)"
        "): prompts in flight per rollout (slime's `--over-sampling-batch-size`, APRIL); generation stops once "
        "`rollout_batch_size` groups are complete and the rest are aborted (`partial_rollout`: carried into the next "
        "rollout). Must be >= `rollout_batch_size`; null: every prompt's samples finish",
        ge=1,
    )
    mode: str = opt(
        "default",
        "`default`, `over_sampling` (with `over_sampling_batch_size`: early stop) or `agent` (multi-turn episodes: "
        "[agents.md](agents.md)); the old switches (`custom_generate_function_path: reinforge.rollout.agent:generate`, "
        "`over_sampling_batch_size` alone) still read, with a note; `agent` keys switch `default` to `agent`",
        choices=registered("reinforge.rollout.kinds:ROLLOUT_KINDS"),
    )

    def check(self) -> None:
        if self.partial_rollout and self.max_staleness == 0 and self.over_sampling_batch_size is None:
            raise ConfigError(
                "rollout.partial_rollout=true needs rollout.max_staleness > 0 or "
                "rollout.over_sampling_batch_size (the synchronous loop otherwise never leaves a sample "
                "unfinished)"
            )
        o = self.over_sampling_batch_size
        if o is not None:
            if o < self.rollout_batch_size:
                raise ConfigError(
                    f"rollout.over_sampling_batch_size={o} is below rollout.rollout_batch_size="
                    f"{self.rollout_batch_size}: it counts all prompts in flight, the trained ones "
                    f"included; set it >= {self.rollout_batch_size} (or null)"
                )
            if self.max_staleness > 0:
                raise ConfigError(
                    f"rollout.over_sampling_batch_size is for the synchronous loop: it cannot be "
                    f"combined with rollout.max_staleness={self.max_staleness} (set one of them "
                    f"to null / 0)"
                )
        if len(self.rollout_stop_token_ids) > 6:
            raise ConfigError("rollout.rollout_stop_token_ids: at most 6 ids (the model's EOS ids take the rest of 8)")
        for key in ("rollout_function_path", "custom_generate_function_path"):
            _check_function_path(f"rollout.{key}", getattr(self, key))


@dataclass
class EngineConfig(Section):
    """The rollout engine: which one, its precision, sizes and scheduling. Split from ``rollout``
    (which keeps what is sampled and how rollouts are made); the old ``rollout.<key>`` spellings of
    these keys are still read (``config/loader.py``: ``MOVED_KEYS``)."""

    name = "engine"
    backend: str = opt(
        "embedded",
        "rollout engine (docs/engines.md): `embedded` (reinforge's engine), `hf` "
        "(transformers `generate`, any architecture), `vllm`, `sglang`",
        choices=BACKENDS,
    )
    dtype: Literal["auto", "fp32", "bf16"] = opt(
        "auto", "engine weights (and KV cache): `auto` = bf16 on GPU, fp32 on CPU"
    )
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = opt(
        "auto",
        "KV cache storage (vLLM's and SGLang's `kv_cache_dtype`): `auto` = `engine.dtype`; `fp8` (= "
        "`fp8_e4m3`, GPUs of compute capability 8.9+) or `fp8_e5m2`: 8-bit floats, scale 1, saturated: half the "
        "bytes per cached token, so long-context decode reads half as much and the cache holds twice the tokens; "
        "the engine's log-probs then differ more from the trainer's (`train/logprob_abs_diff`; "
        "`algo.use_tis` corrects for it). Embedded, vLLM and SGLang engines",
    )
    quantization: Literal["fp8"] | None = opt(
        None,
        "rollout weights (vLLM's and SGLang's `quantization`): `fp8` = the engine's attention and MLP projections "
        "in float8 e4m3 with one fp32 scale per 128x128 block (DeepSeek-V3's format), quantized at start and at "
        "every weight sync on the engine's device; embeddings, LM head, norms and routed MoE experts stay in "
        "`engine.dtype`. Half the weight bytes a decode step reads on a Hopper GPU (block-scaled "
        "`torch._scaled_mm`); GPUs of compute capability 8.9+; the engine's log-probs differ more from the "
        "trainer's (`algo.use_tis` corrects for it). Embedded, vLLM and SGLang engines ([engines.md](engines.md))",
    )
    max_num_seqs: int | Literal["auto"] = opt(
        "auto",
        "engine slots: sequences decoded at once (vLLM: `max_num_seqs`), at most; an engine is built with no "
        "more slots than the run holds at once (one rollout, `rollout_batch_size * n_samples_per_prompt`, or one "
        "evaluation pass, `n_eval_prompts * max(1, n_samples_per_eval_prompt)`; `reinforge generate`: `--n`), so "
        "the embedded engine's KV cache is sized by the run; `auto`: those, capped at what the cache holds at "
        "prompt + 3/4 of the response ([planner.md](planner.md))",
        ge=1,
        unplanned=256,
    )
    kv_cache_memory_fraction: float | Literal["auto"] = opt(
        "auto",
        "GPU: share of free memory the KV cache may take (vLLM: `gpu_memory_utilization`; SGLang: "
        "`--mem-fraction-static`); `auto`: the embedded engine's largest cache that fits beside every other "
        "phase, counting what `cluster.offload_rollout` frees ([planner.md](planner.md); other backends: 0.3)",
        gt=0,
        lt=1,
        unplanned=0.3,
    )
    max_prefill_tokens: int = opt(
        16384,
        "padded tokens per prefill batch (embedded engine); a longer prompt (or "
        "a preempted sequence's recompute) is prefilled in chunks of this many tokens",
        ge=1,
    )
    sync_interval: int = opt(8, "decode steps between host reads of finished sequences", ge=1)
    overlap_schedule: bool = opt(
        True,
        "embedded engine on a GPU: launch the next `sync_interval` decode steps before reading back the last "
        "ones, so the host's scheduling hides behind GPU work (SGLang's overlap scheduler, vLLM's "
        "`async_scheduling`); a sequence that stops early holds its slot one interval longer",
    )
    cuda_graph: bool = opt(True, "capture decode steps as CUDA graphs (GPU)")
    kv_block_size: int = opt(
        0,
        "tokens per block of the embedded engine's paged KV cache (vLLM: `block_size`); 0 = 16 on a GPU (Triton "
        "paged attention), one block of the whole sequence length elsewhere",
        ge=0,
    )
    num_kv_blocks: int = opt(
        0,
        "cap on the embedded engine's KV-cache blocks (vLLM: `num_gpu_blocks_override`); 0 = as many as "
        "`max_num_seqs` sequences of full length need, or as `kv_cache_memory_fraction` holds on a GPU",
        ge=0,
    )
    sglang_urls: list[str] = opt([], "`backend: sglang`: use these running servers instead of launching them")
    sglang_server_args: dict[str, Any] = opt(
        {},
        "extra `sglang.launch_server` flags: `{mem_fraction_static: 0.7}` "
        "-> `--mem-fraction-static 0.7` (slime's `--sglang-*`)",
    )
    sglang_router: bool = opt(False, "put `sglang-router` in front of several launched servers")
    sglang_weight_update: Literal["tensor", "distributed", "disk"] = opt(
        "tensor", "`tensor` (same machine, IPC handles), `distributed` (NCCL broadcast), `disk`"
    )
    sglang_host: str = opt("127.0.0.1", "host launched servers bind to")
    sglang_port_base: int = opt(15000, "launched servers take free ports from here up (never the same twice)")
    sglang_launch_timeout: float = opt(600.0, "seconds for a launched server to answer `/health_generate`", gt=0)

    def check(self) -> None:
        if self.backend != "sglang" and (self.sglang_urls or self.sglang_server_args or self.sglang_router):
            raise ConfigError(f"engine.sglang_* settings need engine.backend=sglang (it is {self.backend})")
        if self.kv_cache_dtype != "auto" and self.backend == "hf":
            raise ConfigError(
                f"engine.kv_cache_dtype={self.kv_cache_dtype}: the hf backend (transformers `generate`) "
                "keeps its cache in the model's dtype; use engine.backend=embedded, vllm or sglang, or "
                "engine.kv_cache_dtype=auto"
            )
        if self.quantization is not None and self.backend == "hf":
            raise ConfigError(
                f"engine.quantization={self.quantization}: the hf backend (transformers `generate`) keeps the "
                "model's weights as they are; use engine.backend=embedded, vllm or sglang, or engine.quantization=null"
            )


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


@dataclass
class EvalConfig(Section):
    name = "eval"
    eval_interval: int | None = opt(
        None, "rollouts (offline: optimizer steps) between evaluations (always before and after training)", ge=1
    )
    eval_before_train: bool = opt(True, "evaluate the initial policy")
    n_samples_per_eval_prompt: int = opt(4, "sampled completions per prompt for pass@1 / pass@k (0: greedy only)", ge=0)
    eval_max_response_len: int | None = opt(
        None, "max new tokens in evaluation (`null`: `rollout_max_response_len`)", ge=1
    )
    eval_temperature: float = opt(1.0, "sampling temperature of the sampled completions", ge=0)
    eval_top_p: float = opt(1.0, "nucleus sampling in evaluation", gt=0, le=1)
    pass_k: list[int] = opt([1, 4], "the k of each reported pass@k (each at most `n_samples_per_eval_prompt`)")

    def check(self) -> None:
        for k in self.pass_k:
            if k < 1 or k > max(self.n_samples_per_eval_prompt, 1):
                raise ConfigError(
                    f"eval.pass_k={self.pass_k}: each k must be in [1, eval.n_samples_per_eval_prompt="
                    f"{self.n_samples_per_eval_prompt}]"
                )


@dataclass
class ClusterConfig(Section):
    """Placement; see [design.md](design.md#scale-out). Names as slime's flags. On machines without
    GPUs the "GPU" counts are processes (gloo instead of NCCL)."""

    name = "cluster"
    mode: Literal["local", "ray"] = opt(
        "local", "`local`: one trainer and one engine in this process; `ray`: trainer ranks and engines as Ray actors"
    )
    actor_num_nodes: int = opt(1, "nodes with trainer ranks", ge=1)
    actor_num_gpus_per_node: int = opt(1, "trainer ranks (FSDP2 data parallel) per node", ge=1)
    rollout_num_gpus: int = opt(1, "GPUs for rollout engines (with `colocate`: shared with the trainers)", ge=1)
    rollout_num_gpus_per_engine: int = opt(
        1, "GPUs per engine (1 for the embedded engine; tensor parallelism with vLLM)", ge=1
    )
    colocate: bool = opt(
        False, "engines on the trainers' GPUs (they sleep while the trainers train) instead of their own"
    )
    ray_address: str | None = opt(
        None, "address of an existing Ray cluster (`auto`, `ray://host:10001`); `null` starts a local one"
    )
    num_cpus_per_worker: float = opt(1.0, "CPUs reserved per trainer rank and per engine", gt=0)
    weight_sync_bucket_mb: int = opt(256, "weight sync sends the policy in buckets of about this many MB", ge=1)
    offload_engine_weights: bool = opt(
        False,
        "colocate (or `offload_rollout`): free the engine's weights while the trainers train; the weight sync "
        "after training writes them again (no copy is kept: vLLM's sleep level 2; with `engine.quantization` "
        "the embedded engine moves them to host memory instead)",
    )
    offload_rollout: bool | Literal["auto"] = opt(
        "auto",
        "local mode: the engine frees its KV cache while the trainer trains (slime's `--offload-rollout`), for the "
        "trainer's activations, at the cost of reallocating the cache and its CUDA graphs each rollout (Ray `colocate` "
        "engines always do); `auto`: on where the trainer keeps more or the cache grows ([planner.md](planner.md))",
        unplanned=False,
    )
    memory_check: Literal["error", "warn", "off"] = opt(
        "error",
        "CPU-mode Ray placements: an estimate of the memory every process needs (docs/reliability.md) "
        "against the available memory: `error` refuses to start, `warn` logs, `off` skips (local mode only warns)",
    )
    max_engine_restarts: int = opt(
        3,
        "Ray: a rollout engine actor that dies during generation is replaced (new "
        "actor in its bundle, current weights re-synced, its requests re-queued) up to "
        "this many times per run; 0: the run fails",
        ge=0,
    )
    verify_weight_sync: bool = opt(True, "compare trainer and engine checksums of every synced tensor (reliability.md)")
    weight_sync_probe_interval: int = opt(10, "syncs between log-prob probes, the first included (0: none)", ge=0)
    weight_sync_probe_tolerance: float | None = opt(None, "max `sync/probe_logprob_diff`; null: by dtype", gt=0)

    @property
    def num_trainers(self) -> int:
        return self.actor_num_nodes * self.actor_num_gpus_per_node

    def check(self) -> None:
        if self.rollout_num_gpus % self.rollout_num_gpus_per_engine:
            raise ConfigError(
                f"cluster.rollout_num_gpus={self.rollout_num_gpus} is not a multiple of "
                f"cluster.rollout_num_gpus_per_engine={self.rollout_num_gpus_per_engine}"
            )
        if self.mode == "ray" and self.colocate and self.rollout_num_gpus > self.num_trainers:
            raise ConfigError(
                f"cluster.colocate=true puts engines on the trainers' GPUs: cluster.rollout_num_gpus="
                f"{self.rollout_num_gpus} exceeds actor_num_nodes * actor_num_gpus_per_node = "
                f"{self.num_trainers}"
            )
        if self.mode == "local" and (self.num_trainers > 1 or self.rollout_num_gpus > 1):
            raise ConfigError(
                "cluster.mode=local runs one trainer and one engine: set cluster.mode=ray for several GPUs or nodes"
            )


@dataclass
class RunConfig(Section):
    name = "run"
    output_dir: str = opt(
        "runs/default", "run directory: config.yaml, metrics.jsonl, tensorboard/, eval/, eval_table.txt, checkpoints/"
    )
    save_interval: int | None = opt(None, "rollouts (offline: optimizer steps) between checkpoints", ge=1)
    save_final: bool = opt(True, "checkpoint after the last rollout")
    keep_last_n_checkpoints: int | None = opt(
        2,
        "keep the new checkpoint and the newest intact older ones, this many in "
        "all; delete older and damaged ones (`null` keeps all)",
        ge=1,
    )
    save_optimizer: Literal["all", "newest", "none"] = opt(
        "newest",
        "AdamW's state (8 bytes per trained parameter) in checkpoints (slime's `--no-save-optim`, TRL's "
        "`save_only_model`): in `all`, in the `newest` only, or `none`; a resume without it says it is not exact",
    )
    load: str | None = opt(
        None, "resume from a checkpoint, a `checkpoints/` directory or a run directory (`--load` on the CLI)"
    )
    overwrite: bool = opt(
        False,
        "`reinforge train` / `offline` refuse an `output_dir` that already holds a run "
        "(`metrics.jsonl` or `checkpoints/`) unless they resume it (`recover: auto`, "
        "`--max-restarts`, `load` inside it); `true` deletes that directory first",
    )
    tensorboard: bool = opt(True, "write TensorBoard event files")
    wandb_project: str | None = opt(
        None,
        "log the same metrics to this Weights & Biases project (`null`: the "
        "`WANDB_PROJECT` environment variable if set, else no W&B; `pip install wandb`)",
    )
    wandb_group: str | None = opt(None, "W&B run group")
    wandb_mode: Literal["online", "offline", "disabled"] | None = opt(
        None,
        "`offline` writes the W&B run under `<output_dir>/wandb` without network (`wandb sync` later); `null`: "
        "W&B's own choice (the `WANDB_MODE` environment variable, else `online`). Checked before anything is built",
    )
    progress: bool = opt(True, "console progress bar with ETA")
    dump_rollouts: bool = opt(False, "write every rollout's samples to `rollouts/<id>.jsonl`")
    trace: bool = opt(
        False,
        "write a timeline of the run (generation, reward, log-probs, training, weight sync, "
        "checkpoints, eval) to `trace.json` in the Chrome / Perfetto trace format; open it in "
        "ui.perfetto.dev ([tracing.md](tracing.md))",
    )
    recover: Literal["off", "auto"] = opt(
        "off",
        "`auto`: resume from the newest complete checkpoint in `output_dir` (falling back to older ones if "
        "it is damaged; `load` only when there is none), write recover checkpoints every `recover_interval_s` and on "
        "SIGTERM ([reliability.md](reliability.md)); `off`: start from scratch unless `load` is set",
    )
    recover_interval_s: float = opt(
        600.0,
        "`recover: auto`: seconds between recover checkpoints (written at the "
        "end of the first rollout, offline: optimizer step, past the interval)",
        gt=0,
    )
    max_restarts: int = opt(
        0,
        "relaunch training after a crash up to this many times, resuming with "
        "`recover: auto` (`--max-restarts` of `reinforge train` and `reinforge offline`); 0: no supervisor",
        ge=0,
    )
    stall_timeout_s: float | None = opt(1800.0, "seconds without progress before the stall doctor acts", gt=0)
    stall_action: Literal["fail", "restart"] = opt(
        "fail", "after a stall: `fail` (exit status 124, not relaunched) or `restart` (75: `--max-restarts` relaunches)"
    )


def _check_function_path(key: str, path: str | None) -> None:
    if path is not None and ":" not in path:
        raise ConfigError(f"{key}={path!r} must look like 'package.module:function'")
