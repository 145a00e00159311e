"""The ``model`` section: which model is trained and how its layers run (checkpointing, compile, fused
kernels, LoRA). ``docs/config.md`` is generated from these declarations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .fields import Section, opt

DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


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
