"""The ``eval`` section: evaluations during training and ``reinforge eval`` (greedy accuracy, pass@k)."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import ConfigError, Section, opt


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
