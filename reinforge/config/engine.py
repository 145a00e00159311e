"""The ``engine`` section: the rollout engine (backend, precision, sizes, scheduling; vLLM's and SGLang's
names where they have one)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .fields import ConfigError, Section, opt, registered

BACKENDS = registered("reinforge.rollout.backends:BACKENDS")


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
