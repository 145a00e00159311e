"""The ``rollout`` section: what is sampled and how rollouts are made (batch sizes after slime's flags:
``rollout_batch_size``, ``n_samples_per_prompt``; asynchrony, partial rollouts, custom functions). The
engine that samples is the ``engine`` section."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import ConfigError, Section, check_function_path, opt, registered


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
            check_function_path(f"rollout.{key}", getattr(self, key))
