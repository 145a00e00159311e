"""The configuration sections of what is learned: the reward, the RL algorithm, the offline methods and
the critic (one dataclass each; the sections of how a run runs have a module each).

Key names follow slime's command-line flags where slime has one (``eps_clip``, ``kl_coef``...).
``docs/config.md`` is generated from these declarations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .fields import ConfigError, Section, check_function_path, opt, registered, registry

ESTIMATORS = registered("reinforge.algo.registries:ADV_ESTIMATORS")
POLICY_LOSSES = registered("reinforge.algo.registries:POLICY_LOSSES")
KL_ESTIMATORS = registered("reinforge.algo.registries:KL_ESTIMATORS")
LOSS_AGG_MODES = registered("reinforge.algo.registries:LOSS_AGG_MODES")
OFFLINE_METHODS = registered("reinforge.algo.registries:OFFLINE_METHODS")
REWARD_TYPES = registered("reinforge.reward.registry:REWARDS")
REWARDS = registry("reinforge.reward.registry:REWARDS")
_NEEDED = {"model_path": "a reward model folder", "function_path": "'module:function'"}


@dataclass
class RewardConfig(Section):
    """A custom reward (`type: custom`, `function_path: "module:function"`) is `fn(sample)`, plain or `async`,
    returning a number or a dict. A dict holds the scalar reward under `"reward"` or under `"score"` (verl's
    `compute_score` convention; not both); its other keys are kept in `sample.reward_info`, and the numeric ones
    (bools too) are averaged into the metrics as `reward_info/<key>` (`eval/reward_info/<key>` in evaluations):
    `{"score": 1.0, "format_ok": 1}`. A function that raises, returns anything else (a dict with neither key, a
    non-finite number, a string) or times out scores 0 and is counted (`reward/errors`, `reward/timeouts`); the
    first failure of each kind is logged in one line naming the function, the sample and the exception. A run
    stops (exit status 1, one line) after 3 rollouts in a row whose every reward failed, and a shorter run whose
    every reward failed ends with exit status 1 too."""

    name = "reward"
    type: str = opt(
        "auto",
        "`auto` (reasoning-gym scorer for reasoning-gym prompts, else math-verify), `reasoning_gym`, `math`, "
        "`exact_match`, `custom`, `model` (a trained reward model, `reward.model_path`), `judge` (an LLM judge, "
        "the `judge` section: [agents.md](agents.md#llm-as-judge-rewards)); registered in "
        "`reinforge.reward.registry:REWARDS`",
        choices=REWARD_TYPES,
    )
    function_path: str | None = opt(
        None,
        "`module:function` for `type: custom`: `fn(sample) -> float | dict`, "
        "sync or async (slime's `--custom-rm-path`)",
    )
    answer_extraction: Literal["tag", "tag_or_last_number", "boxed", "last_number", "none"] = opt(
        "tag_or_last_number", "`tag` (`<answer>...</answer>`), `tag_or_last_number`, `boxed`, `last_number`, `none`"
    )
    timeout: float = opt(
        10.0,
        "seconds per sample (`judge`: per request); a timeout scores 0 and is counted in `reward/timeouts`; a "
        "judge's timeout is a judge error instead: counted in `reward/judge_errors`, the sample left out, not scored 0",
        gt=0,
    )
    concurrency: int = opt(
        16,
        "reward calls in flight of a custom function or a judge (with `isolation: process`, worker processes at "
        "most); the built-in rewards run one after another (local Python: threads would take turns on the GIL)",
        ge=1,
    )
    isolation: Literal["process", "thread"] = opt(
        "process",
        "where a `custom` function runs. `process`: worker processes (started when needed, kept between "
        "rollouts): a function that calls `os._exit` or crashes ends its worker only (the sample scores 0), a call "
        "past `timeout` is ended by stopping its worker. `thread`: threads of the trainer (one memory: a model or "
        "client loaded once is shared; a timed-out call keeps running, and an exit that bypasses Python ends the "
        "run). Built-in rewards run in threads",
    )
    correct_threshold: float = opt(
        1.0,
        "a sample counts as correct (`eval/greedy_accuracy`, `eval/pass@k`, `rollout/correct`) when its reward is "
        "at least this. With `type: model` it is a threshold on the reward model's score, and the evaluation reports "
        "`eval/greedy_score_above_threshold` and `eval/score_above_threshold@k` instead (`rollout/correct` keeps its "
        "name: the share of scores at or above the threshold)",
    )
    model_path: str | None = opt(
        None,
        "`type: model`: a reward model: a `*ForSequenceClassification` folder, or a "
        "run / checkpoint directory of `reinforge offline` with `offline.method: rm`",
    )
    model_device: str = opt("auto", "`type: model`: where the reward model runs (`auto`: the trainer's device)")
    model_batch_size: int = opt(64, "`type: model`: samples scored per forward pass", ge=1)
    worker_max_memory_mb: int = opt(
        4096,
        "`isolation: process`: a reward worker whose resident memory (RSS) is past this many MiB once its calls are "
        "answered is replaced by a new one, with a warning (a function that keeps memory between calls would grow "
        "its worker without end); 0: no limit",
        ge=0,
    )

    @property
    def properties(self) -> dict[str, Any]:
        """The registered properties of ``type`` (``reinforge.reward.registry:REWARDS``: ``label``,
        ``needs``, ``judge``, ``preference``...), which the data checks and the run read."""
        return REWARDS().info(self.type)

    def check(self) -> None:
        rewards = REWARDS()
        kind = rewards.info(self.type)

        def users(prop: str, value: object = True) -> str:  # the types with this property
            return " or ".join(n for n in rewards.names() if n != "auto" and rewards.info(n).get(prop) == value)

        needs = kind.get("needs")
        if needs and not getattr(self, needs):
            raise ConfigError(f"reward.type={self.type} needs reward.{needs}: {_NEEDED[needs]}")
        if self.model_path and needs != "model_path":
            raise ConfigError(
                f"reward.model_path is set but reward.type={self.type!r}; use type {users('needs', 'model_path')}"
            )
        if self.function_path and not kind.get("takes_function_path"):
            raise ConfigError(
                f"reward.function_path is set but reward.type={self.type!r}; use type {users('takes_function_path')}"
            )
        check_function_path("reward.function_path", self.function_path)


@dataclass
class AlgoConfig(Section):
    """See [algorithms.md](algorithms.md) for the formulas and sources. Settings that the chosen
    estimator would ignore (`critic.*` or `algo.lambd` without `gae`, `algo.gamma` with an estimator
    that does not discount, `grpo_std_normalization` with another estimator) are refused."""

    name = "algo"
    advantage_estimator: str = opt("grpo", "advantage estimator (`gae` is PPO with a critic)", choices=ESTIMATORS)
    grpo_std_normalization: bool = opt(True, "divide GRPO advantages by the group's reward std")
    gamma: float = opt(1.0, "discount per policy token (`gae`, `reinforce_plus_plus`)", ge=0, le=1)
    lambd: float = opt(0.95, "GAE lambda (slime's `--lambd`)", ge=0, le=1)
    policy_loss: str = opt("ppo", "`ppo` (token ratio) or `gspo` (sequence-level ratio)", choices=POLICY_LOSSES)
    eps_clip: float = opt(0.2, "PPO clip range below 1 (and above, unless `eps_clip_high` is set)", gt=0)
    eps_clip_high: float | None = opt(None, "PPO clip range above 1 (DAPO clip-higher uses 0.28)")
    eps_clip_c: float | None = opt(
        None, "dual-clip constant (> 1, e.g. 3) bounding the loss of negative advantages", gt=1
    )
    use_kl_loss: bool = opt(False, "add a KL penalty to a frozen reference model to the loss")
    kl_loss_coef: float = opt(0.0, "its coefficient", ge=0)
    kl_loss_type: str = opt("low_var_kl", "KL estimator (`low_var_kl` is clamped k3)", choices=KL_ESTIMATORS)
    use_kl_in_reward: bool = opt(False, "subtract `kl_coef * KL` (k1, per token) from the reward instead")
    kl_coef: float = opt(0.0, "its coefficient", ge=0)
    entropy_coef: float = opt(0.0, "entropy bonus coefficient")
    loss_agg_mode: str = opt("token_mean", "how per-token losses become one (verl's names)", choices=LOSS_AGG_MODES)
    use_tis: bool = opt(False, "importance-sampling correction between the engine's and the trainer's log-probs")
    tis_mode: Literal["truncate", "mask", "reject"] = opt(
        "truncate",
        "`truncate` (TIS: weight `min(w, tis_clip)`), `mask` (MIS / IcePop: weight `w` inside "
        "`[tis_clip_low, tis_clip]`, 0 outside) or `reject` (drop the tokens outside, no weight: verl's `rollout_rs`)",
    )
    tis_clip: float = opt(2.0, "upper cap of the importance weight", ge=1)
    tis_clip_low: float = opt(
        0.0,
        "lower bound of the weight in `mask` and `reject` modes; the bounds are on `w = pi_train / pi_rollout`: "
        "verl's `low_high` thresholds bound `pi_rollout / pi_train`, so verl's `[L, H]` is `[1/H, 1/L]` here (the "
        "same numbers keep the same tokens only when `tis_clip_low = 1 / tis_clip`)",
        ge=0,
        lt=1,
    )
    use_rollout_routing_replay: bool = opt(
        False,
        "mixture-of-experts models: the engine records each generated token's experts and the trainer's "
        "policy forward passes use them at the response positions (slime's `--use-rollout-routing-replay`; "
        "[algorithms.md](algorithms.md#rollout-routing-replay)); needs `engine.backend: embedded`",
    )
    use_decoupled_loss: bool | None = opt(
        None,
        "decoupled PPO objective (AReaL, Fu et al. 2025): clip against the trainer's proximal log-probs and "
        "weight by `pi_prox / pi_behav` with the engine's log-probs, uncapped unless `use_tis` sets its mode's factor "
        "(AReaL's current code applies no such weight unless its `rejection_sampling` is set: "
        "[algorithms.md](algorithms.md#decoupled-ppo)); `null`: on when `rollout.max_staleness` > 0",
    )
    dynamic_sampling: bool = opt(
        False, "DAPO dynamic sampling: drop groups with equal rewards, sample more prompts until the batch is full"
    )
    dynamic_sampling_max_rounds: int = opt(
        4, "generation rounds per rollout at most; then train on the groups kept", ge=1
    )
    overlong_filter: bool = opt(False, "exclude truncated samples from the loss")
    overlong_buffer_len: int | None = opt(
        None, "DAPO soft over-long punishment: penalise the last this-many tokens before the length limit", gt=0
    )
    overlong_penalty_factor: float = opt(1.0, "the punishment's maximum")
    reward_clip: float | None = opt(None, "clamp rewards to `[-reward_clip, reward_clip]`", gt=0)
    normalize_rewards: bool = opt(False, "standardise rewards over the rollout (mean 0, std 1) before the estimator")

    @property
    def needs_critic(self) -> bool:
        """Whether the advantage estimator uses a value model (the one place this is decided)."""
        from ..algo.registries import ADV_ESTIMATORS

        return bool(ADV_ESTIMATORS.info(self.advantage_estimator).get("needs_critic"))

    @property
    def needs_reference(self) -> bool:
        """Whether a frozen reference model is loaded (KL in the loss or in the reward)."""
        return self.use_kl_loss or self.use_kl_in_reward

    def check(self) -> None:
        if self.eps_clip_high is not None and self.eps_clip_high < self.eps_clip:
            raise ConfigError(
                f"algo.eps_clip_high={self.eps_clip_high} < algo.eps_clip={self.eps_clip}: the upper clip range must "
                f"be at least the lower one (set eps_clip_high to null to use eps_clip for both)"
            )
        if self.use_kl_loss and self.kl_loss_coef <= 0:
            raise ConfigError("algo.use_kl_loss=true needs algo.kl_loss_coef > 0")
        if not self.use_kl_loss and self.kl_loss_coef > 0:
            raise ConfigError("algo.kl_loss_coef > 0 has no effect unless algo.use_kl_loss=true")
        if self.use_kl_in_reward and self.kl_coef <= 0:
            raise ConfigError("algo.use_kl_in_reward=true needs algo.kl_coef > 0")
        if not self.use_kl_in_reward and self.kl_coef > 0:
            raise ConfigError(
                "algo.kl_coef > 0 has no effect unless algo.use_kl_in_reward=true "
                "(for a KL term in the loss use algo.use_kl_loss and algo.kl_loss_coef)"
            )


@dataclass
class OfflineConfig(Section):
    """Offline post-training with `reinforge offline` (docs/offline.md): supervised fine-tuning, reward
    models and preference optimisation on a fixed dataset. The policy is `model.path`; the optimizer,
    schedule, precision and micro-batch budget are the `train.*` keys; `data.system_prompt`,
    `data.apply_chat_template` and `data.seed` (shuffling, eval split) apply; checkpoints and logging are
    the `run.*` keys, and `run.save_interval` / `eval.eval_interval` count optimizer steps here."""

    name = "offline"
    method: str = opt("dpo", "what to train (docs/algorithms.md#offline-methods)", choices=OFFLINE_METHODS)
    train_data: str | None = opt(
        None,
        "training examples: a `.jsonl` / `.json` / `.parquet` file or a saved "
        "`datasets` folder in one of TRL's formats, detected per row ([data.md](data.md); keys below)",
    )
    eval_data: str | None = opt(None, "held-out examples in the same format (`null`: `eval_fraction` of train_data)")
    eval_fraction: float = opt(0.0, "share of train_data held out for evaluation when eval_data is null", ge=0, lt=1)
    messages_key: str = opt("messages", "SFT: key of the chat (a list of `{role, content}`; loss on assistant turns)")
    prompt_key: str = opt(
        "prompt", "key of the prompt (a string or a list of messages); SFT also takes prompt + completion"
    )
    chosen_key: str = opt("chosen", "pairs: key of the preferred response (a string or assistant message(s))")
    rejected_key: str = opt("rejected", "pairs: key of the dispreferred response")
    completion_key: str = opt("completion", "KTO / SFT: key of the response")
    text_key: str = opt("text", "SFT: key of plain text (language modeling: loss on every token, no chat template)")
    kto_label_key: str = opt("label", "KTO: key of the desirability label (true / false)")
    margin_key: str | None = opt(None, "RM: key of an optional per-pair margin (Llama 2's margin loss)")
    max_length: int = opt(1024, "longest prompt + response, in tokens", ge=2)
    max_prompt_length: int = opt(
        512, "with `truncation: truncate`, prompts are cut to their last this-many tokens", ge=1
    )
    truncation: Literal["drop", "truncate"] = opt(
        "drop",
        "examples longer than `max_length`: `drop` them, or `truncate` (prompt from the left to "
        "`max_prompt_length`, then the response from the right); both are counted in the log",
    )
    num_epochs: int = opt(1, "passes over train_data", ge=1)
    global_batch_size: int = opt(32, "examples (pairs for preference methods) per optimizer step", ge=1)
    beta: float = opt(0.1, "DPO / IPO / CPO / SimPO / KTO temperature beta; ORPO's odds-ratio weight lambda", gt=0)
    label_smoothing: float = opt(
        0.0, "DPO / CPO / SimPO: probability that a pair's label is flipped (cDPO)", ge=0, lt=0.5
    )
    simpo_gamma: float = opt(0.5, "SimPO target reward margin gamma", ge=0)
    cpo_alpha: float = opt(1.0, "CPO: weight of the NLL (behaviour cloning) term on the chosen responses", ge=0)
    kto_desirable_weight: float = opt(1.0, "KTO lambda_D: weight of desirable examples", gt=0)
    kto_undesirable_weight: float = opt(1.0, "KTO lambda_U: weight of undesirable examples", gt=0)
    precompute_ref_log_probs: bool = opt(
        True,
        "DPO / IPO / KTO: compute the reference log-probs once before "
        "training (no reference model in memory while training); false keeps a "
        "frozen reference model and runs it on every batch",
    )
    packing: bool = opt(
        False,
        "SFT: pack several examples into one row of up to `train.max_tokens_per_gpu` tokens "
        "(attention stays within each example)",
    )
    shuffle: bool = opt(True, "shuffle the examples every epoch (seeded: `data.seed + epoch`)")
    gkd_beta: float = opt(
        0.5,
        "GKD (`method: gkd`, the teacher `distill.teacher_path`): the generalized JSD's beta, 0 the forward KL "
        "KL(teacher || student), 1 the reverse KL (TRL `GKDConfig.beta`)",
        ge=0,
        le=1,
    )
    gkd_temperature: float = opt(
        1.0,
        "GKD: both distributions softened by it, and the student's samples drawn at it (TRL `GKDConfig.temperature`)",
        gt=0,
    )
    gkd_lmbda: float = opt(
        0.0,
        "GKD: the share of optimizer steps whose responses the student samples itself (on-policy; a seeded draw per "
        "step), the rest using the dataset's (TRL `GKDConfig.lmbda`, there 0.5 by default); 0: the dataset's only",
        ge=0,
        le=1,
    )
    gkd_max_new_tokens: int = opt(
        128, "GKD with `gkd_lmbda` > 0: most tokens of a student sample (TRL `GKDConfig.max_new_tokens`)", ge=1
    )

    def check(self) -> None:
        if self.gkd_lmbda > 0 and self.method != "gkd":
            raise ConfigError(
                f"offline.gkd_lmbda={self.gkd_lmbda} applies to offline.method=gkd only (got {self.method!r}): "
                f"set offline.gkd_lmbda=0 or offline.method=gkd"
            )


@dataclass
class CriticConfig(Section):
    """Used only with `algo.advantage_estimator: gae`. The critic has its own optimizer,
    learning-rate schedule and checkpoint; AdamW's betas and eps are the `train.*` ones."""

    name = "critic"
    path: str | None = opt(
        None, "initial weights of the value model (`null`: `model.path`); a zero-initialised value head is added"
    )
    lr: float = opt(1e-5, "critic learning rate (AdamW)", gt=0)
    lr_warmup_iters: int = opt(0, "optimizer steps of linear warm-up", ge=0)
    lr_decay_style: Literal["constant", "cosine", "linear"] = opt(
        "constant", "`constant`, `linear` or `cosine` decay to `min_lr` at the last step"
    )
    min_lr: float = opt(0.0, "final learning rate of a decay", ge=0)
    value_clip: float | None = opt(0.2, "clipped value loss range (`null`: plain squared error)", gt=0)
    clip_grad: float = opt(1.0, "gradient-norm clipping", gt=0)
    weight_decay: float = opt(0.0, "AdamW weight decay", ge=0)
    num_warmup_rollouts: int = opt(0, "rollouts at the start that train only the critic", ge=0)
