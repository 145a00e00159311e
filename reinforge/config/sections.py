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

ESTIMATORS = registered("reinforge.algo.advantages:ADV_ESTIMATORS")
POLICY_LOSSES = registered("reinforge.algo.losses:POLICY_LOSSES")
KL_ESTIMATORS = registered("reinforge.algo.losses:KL_ESTIMATORS")
LOSS_AGG_MODES = registered("reinforge.algo.losses:LOSS_AGG_MODES")
BACKENDS = registered("reinforge.rollout.backends:BACKENDS")
OFFLINE_METHODS = registered("reinforge.algo.preference:OFFLINE_METHODS")


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
    path: str = opt("smollm2-135m-instruct", "Hugging Face folder, a known model name (`reinforge models list`, "
                    "converted on first use), or a Hugging Face model id (`Qwen/Qwen2.5-0.5B-Instruct`, "
                    "`Org/Name@revision`) already in the local hub cache (`HF_HUB_CACHE`; read offline)")
    random_init: bool = opt(False, "ignore the stored weights and initialise randomly (tests, benchmarks)")
    gradient_checkpointing: bool = opt(False, "recompute layer activations in the backward pass (less memory, "
                                       "~30% more compute)")
    recompute_num_layers: int | Literal["auto"] | None = opt(
        None, "with `gradient_checkpointing`: recompute only the first N decoder layers and keep the others' "
        "activations (Megatron-LM's `--recompute-method block --recompute-num-layers`): less compute for more "
        "memory; `null`: every layer; `auto`: the fewest layers with which the micro-batch fits the GPU (the "
        "planner, [planner.md](planner.md); sets `gradient_checkpointing`; a CPU run: `null`); reinforge's own "
        "model code only", ge=0)
    torch_compile: bool = opt(False, "`torch.compile` each decoder layer of the trained model (fuses the elementwise "
                              "kernels of the norms, RoPE and SiLU in forward and backward; the first steps "
                              "compile); reinforge's own model code only, not with LoRA")
    fused_kernels: bool = opt(True, "fused Triton kernels for RMSNorm, RoPE and SiLU-and-multiply, forward and "
                              "backward, in the trained models (fewer kernel launches): Liger-Kernel's "
                              "(`pip install liger-kernel`; without it a warning and eager PyTorch); GPU only, off "
                              "with `torch_compile`; `false`: eager PyTorch")
    train_dtype: Literal["auto", "fp32", "bf16"] = opt(
        "auto", "`auto`: bf16 autocast with fp32 master weights on GPU, fp32 on CPU; `fp32`; `bf16`")
    lora_rank: int = opt(0, "LoRA rank r (`peft`); 0 trains every weight. Only the adapters are optimised; "
                         "engines and exports get the merged weights; the reference model is the base (adapters "
                         "off)", ge=0)
    lora_alpha: float = opt(16.0, "LoRA alpha (the update is scaled by alpha / r)", gt=0)
    lora_dropout: float = opt(0.0, "dropout on the adapters' input", ge=0, lt=1)
    lora_target_modules: list[str] = opt(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                         "names of the Linear modules that get adapters (PEFT's target_modules)")


@dataclass
class DataConfig(Section):
    name = "data"
    prompt_data: str = opt("reasoning_gym:basic_arithmetic",
                           "`reasoning_gym:<task>`, or a `.jsonl` / `.json` / `.parquet` file or saved `datasets` "
                           "folder of prompts, slime's or verl's layout ([data.md](data.md)) (slime's `--prompt-data`)")
    task_kwargs: dict[str, Any] = opt({}, "keyword arguments of `reasoning_gym.create_dataset` "
                                      "(e.g. `{min_terms: 2, max_digits: 2}`); ignored, with a warning, for a file")
    num_prompts: int = opt(10000, "number of problems generated for a reasoning-gym training source", ge=1)
    eval_prompt_data: str | None = opt(None, "held-out prompts (a task or a file, as `prompt_data`); `null`: the "
                                       "training task with `eval_seed` (reasoning-gym), or `n_eval_prompts` rows of "
                                       "the `prompt_data` file drawn with `eval_seed` and left out of training (when "
                                       "it has at least twice as many; else no eval, with a warning)")
    n_eval_prompts: int = opt(64, "held-out prompts evaluated (0 disables evaluation)", ge=0)
    eval_seed: int = opt(1_000_003, "seed of the held-out reasoning-gym problems (differs from `seed`)")
    input_key: str = opt("prompt", "key of the prompt (a string or a list of chat messages); keys may be dotted "
                         "paths into nested objects")
    label_key: str | None = opt("label", "key of the reference answer (`reward_model.ground_truth` is found in verl "
                                "rows without `label`); a key that no row holds is refused; `null`: no labels")
    metadata_key: str = opt("metadata", "key of per-prompt metadata (passed to reward functions)")
    apply_chat_template: bool = opt(True, "render prompts with the tokenizer's chat template and a generation prompt")
    system_prompt: str | None = opt(None, "system message added to prompts that have none")
    rollout_max_prompt_len: int = opt(512, "prompts longer than this many tokens are dropped (counted in the log)",
                                      ge=1)
    rollout_shuffle: bool = opt(True, "shuffle prompts each epoch (seeded: `seed + epoch`)")
    seed: int = opt(42, "shuffling and reasoning-gym generation seed")


@dataclass
class RolloutConfig(Section):
    name = "rollout"
    rollout_batch_size: int = opt(8, "prompts per rollout", ge=1)
    n_samples_per_prompt: int = opt(8, "completions per prompt (the GRPO group size)", ge=1)
    rollout_max_response_len: int = opt(256, "max new tokens per completion", ge=1)
    rollout_temperature: float = opt(1.0, "sampling temperature; the trainer scores tokens at the same temperature",
                                     ge=0)
    rollout_top_p: float = opt(1.0, "nucleus sampling (1 disables)", gt=0, le=1)
    rollout_top_k: int = opt(-1, "top-k sampling (<= 0 disables)")
    rollout_stop: list[str] = opt([], "stop strings (the completion ends with the token that completes one)")
    rollout_stop_token_ids: list[int] = opt([], "stop token ids, added to the model's EOS ids (at most 6)")
    rollout_function_path: str | None = opt(None, "`module:function` replacing the default rollout "
                                            "(see `RolloutContext`)")
    custom_generate_function_path: str | None = opt(
        None, "`module:function`, `async def generate(ctx, sample, params) -> Sample`, producing each sample "
        "(slime's `--custom-generate-function-path`); `reinforge.rollout.agent:generate` is the tool-using agent "
        "(docs/agents.md)")
    seed: int = opt(1234, "sampling seed (each rollout reseeds the engine from `seed` and the rollout id)")
    max_staleness: int = opt(
        0, "asynchronous RL ([design.md](design.md#asynchronous-rl)): engines generate rollout `i` with policy version "
        ">= `i - max_staleness` while the trainer trains (AReaL's `max_head_offpolicyness`). 0 is the synchronous "
        "loop; 1 is one-step off-policy", ge=0)
    partial_rollout: bool = opt(
        False, "keep unfinished samples and continue them under newer weights, their tokens, log-probs and "
        "per-token policy versions kept (slime's `--partial-rollout`). With `max_staleness` > 0 a weight update "
        "interrupts the sequences in flight and continues them (AReaL's interruptible generation); false: they "
        "finish under the weights they started with. With `over_sampling_batch_size` the samples the early stop "
        "cuts are carried into the next rollout; false: their groups are dropped")
    over_sampling_batch_size: int | None = opt(
        None, "synchronous loop, default rollout, embedded engine ([design.md](design.md#over-sampling-and-early-stop)"
        "): prompts in flight per rollout (slime's `--over-sampling-batch-size`, APRIL); generation stops once "
        "`rollout_batch_size` groups are complete and the rest are aborted (`partial_rollout`: carried into the next "
        "rollout). Must be >= `rollout_batch_size`; null: every prompt's samples finish", ge=1)

    def check(self) -> None:
        if self.partial_rollout and self.max_staleness == 0 and self.over_sampling_batch_size is None:
            raise ConfigError("rollout.partial_rollout=true needs rollout.max_staleness > 0 or "
                              "rollout.over_sampling_batch_size (the synchronous loop otherwise never leaves a sample "
                              "unfinished)")
        o = self.over_sampling_batch_size
        if o is not None:
            if o < self.rollout_batch_size:
                raise ConfigError(f"rollout.over_sampling_batch_size={o} is below rollout.rollout_batch_size="
                                  f"{self.rollout_batch_size}: it counts all prompts in flight, the trained ones "
                                  f"included; set it >= {self.rollout_batch_size} (or null)")
            if self.max_staleness > 0:
                raise ConfigError(f"rollout.over_sampling_batch_size is for the synchronous loop: it cannot be "
                                  f"combined with rollout.max_staleness={self.max_staleness} (set one of them "
                                  f"to null / 0)")
            for key in ("rollout_function_path", "custom_generate_function_path"):
                if getattr(self, key):
                    raise ConfigError(f"rollout.over_sampling_batch_size drives the default rollout's engine "
                                      f"requests; rollout.{key} replaces them: unset one of the two")
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
    backend: str = opt("embedded", "rollout engine (docs/engines.md): `embedded` (reinforge's engine), `hf` "
                       "(transformers `generate`, any architecture), `vllm`, `sglang`", choices=BACKENDS)
    dtype: Literal["auto", "fp32", "bf16"] = opt("auto", "engine weights (and KV cache): `auto` = bf16 on GPU, "
                                                 "fp32 on CPU")
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = opt(
        "auto", "KV cache storage (vLLM's and SGLang's `kv_cache_dtype`): `auto` = `engine.dtype`; `fp8` (= "
        "`fp8_e4m3`, GPUs of compute capability 8.9+) or `fp8_e5m2`: 8-bit floats, scale 1, saturated: half the "
        "bytes per cached token, so long-context decode reads half as much and the cache holds twice the tokens; "
        "the engine's log-probs then differ more from the trainer's (`train/logprob_abs_diff`; "
        "`algo.use_tis` corrects for it). Embedded, vLLM and SGLang engines")
    max_num_seqs: int | Literal["auto"] = opt(
        256, "engine slots: sequences decoded at once (vLLM: `max_num_seqs`), at most; an engine is built with no "
        "more slots than the run holds at once (one rollout, `rollout_batch_size * n_samples_per_prompt`, or one "
        "evaluation pass, `n_eval_prompts * max(1, n_samples_per_eval_prompt)`; `reinforge generate`: `--n`), so "
        "the embedded engine's KV cache is sized by the run; `auto`: those sequences, capped at what the KV cache "
        "holds at prompt + 3/4 of the response each (the planner, [planner.md](planner.md); a CPU run: 256)", ge=1)
    kv_cache_memory_fraction: float = opt(
        0.3, "GPU: share of free memory the KV cache may take (vLLM: `gpu_memory_utilization`; SGLang: "
        "`--mem-fraction-static`)", gt=0, lt=1)
    max_prefill_tokens: int = opt(16384, "padded tokens per prefill batch (embedded engine); a longer prompt (or "
                                  "a preempted sequence's recompute) is prefilled in chunks of this many tokens",
                                  ge=1)
    sync_interval: int = opt(8, "decode steps between host reads of finished sequences", ge=1)
    overlap_schedule: bool = opt(
        True, "embedded engine on a GPU: launch the next `sync_interval` decode steps before reading back the last "
        "ones, so the host's scheduling hides behind GPU work (SGLang's overlap scheduler, vLLM's "
        "`async_scheduling`); a sequence that stops early holds its slot one interval longer")
    cuda_graph: bool = opt(True, "capture decode steps as CUDA graphs (GPU)")
    kv_block_size: int = opt(
        0, "tokens per block of the embedded engine's paged KV cache (vLLM: `block_size`); 0 = 16 on a GPU (Triton "
        "paged attention), one block of the whole sequence length elsewhere", ge=0)
    num_kv_blocks: int = opt(
        0, "cap on the embedded engine's KV-cache blocks (vLLM: `num_gpu_blocks_override`); 0 = as many as "
        "`max_num_seqs` sequences of full length need, or as `kv_cache_memory_fraction` holds on a GPU", ge=0)
    sglang_urls: list[str] = opt([], "`backend: sglang`: use these running servers instead of launching them")
    sglang_server_args: dict[str, Any] = opt({}, "extra `sglang.launch_server` flags: `{mem_fraction_static: 0.7}` "
                                             "-> `--mem-fraction-static 0.7` (slime's `--sglang-*`)")
    sglang_router: bool = opt(False, "put `sglang-router` in front of several launched servers")
    sglang_weight_update: Literal["tensor", "distributed", "disk"] = opt(
        "tensor", "`tensor` (same machine, IPC handles), `distributed` (NCCL broadcast), `disk`")
    sglang_host: str = opt("127.0.0.1", "host launched servers bind to")
    sglang_port_base: int = opt(15000, "launched servers take free ports from here up (never the same twice)")
    sglang_launch_timeout: float = opt(600.0, "seconds for a launched server to answer `/health_generate`", gt=0)

    def check(self) -> None:
        if self.backend != "sglang" and (self.sglang_urls or self.sglang_server_args or self.sglang_router):
            raise ConfigError(f"engine.sglang_* settings need engine.backend=sglang (it is {self.backend})")
        if self.kv_cache_dtype != "auto" and self.backend == "hf":
            raise ConfigError(f"engine.kv_cache_dtype={self.kv_cache_dtype}: the hf backend (transformers `generate`) "
                              "keeps its cache in the model's dtype; use engine.backend=embedded, vllm or sglang, or "
                              "engine.kv_cache_dtype=auto")


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
    type: Literal["auto", "reasoning_gym", "math", "exact_match", "custom", "model", "judge"] = opt(
        "auto", "`auto` (reasoning-gym scorer for reasoning-gym prompts, else math-verify), `reasoning_gym`, `math`, "
        "`exact_match`, `custom`, `model` (a trained reward model, `reward.model_path`), `judge` (an LLM judge: "
        "[agents.md](agents.md#llm-as-judge-rewards))")
    function_path: str | None = opt(None, "`module:function` for `type: custom`: `fn(sample) -> float | dict`, "
                                    "sync or async (slime's `--custom-rm-path`)")
    answer_extraction: Literal["tag", "tag_or_last_number", "boxed", "last_number", "none"] = opt(
        "tag_or_last_number", "`tag` (`<answer>...</answer>`), `tag_or_last_number`, `boxed`, `last_number`, `none`")
    timeout: float = opt(10.0, "seconds per sample (`judge`: per request); a timeout scores 0 and is counted in "
                         "`reward/timeouts`", gt=0)
    concurrency: int = opt(16, "reward calls in flight (with `isolation: process`, worker processes at most)", ge=1)
    isolation: Literal["process", "thread"] = opt(
        "process", "where a `custom` function runs. `process`: worker processes (started when needed, kept between "
        "rollouts): a function that calls `os._exit` or crashes ends its worker only (the sample scores 0), a call "
        "past `timeout` is ended by stopping its worker. `thread`: threads of the trainer (one memory: a model or "
        "client loaded once is shared; a timed-out call keeps running, and an exit that bypasses Python ends the "
        "run). Built-in rewards run in threads")
    correct_threshold: float = opt(
        1.0, "a sample counts as correct (`eval/greedy_accuracy`, `eval/pass@k`, `rollout/correct`) when its reward is "
        "at least this. With `type: model` it is a threshold on the reward model's score, and the evaluation reports "
        "`eval/greedy_score_above_threshold` and `eval/score_above_threshold@k` instead (`rollout/correct` keeps its "
        "name: the share of scores at or above the threshold)")
    model_path: str | None = opt(None, "`type: model`: a reward model: a `*ForSequenceClassification` folder, or a "
                                 "run / checkpoint directory of `reinforge offline` with `offline.method: rm`")
    model_device: str = opt("auto", "`type: model`: where the reward model runs (`auto`: the trainer's device)")
    model_batch_size: int = opt(64, "`type: model`: samples scored per forward pass", ge=1)
    judge_url: str | None = opt(None, "`type: judge`: an OpenAI-compatible base URL (`http://127.0.0.1:8000/v1`)")
    judge_model: str | None = opt(None, "`type: judge`: the model name sent to the judge")
    judge_template: str | None = opt(None, "`type: judge`: prompt with `{question}`, `{response}`, `{label}` (unset: "
                                     "asks for a score from 0 to 10 on the last line)")
    judge_score_regex: str | None = opt(None, "`type: judge`: the last match is the score (its last group, if any); "
                                        "unset: the last number")
    judge_max_score: float = opt(10.0, "`type: judge`: the score is divided by this (in [0, 1])", gt=0)
    judge_retries: int = opt(2, "`type: judge`: retries of a failed request (error, timeout, HTTP 429 / 5xx)", ge=0)
    judge_cache_size: int = opt(4096, "`type: judge`: scores kept in memory (same question/response/label)", ge=0)

    def check(self) -> None:
        if self.type == "model" and not self.model_path:
            raise ConfigError("reward.type=model needs reward.model_path: a reward model folder")
        if self.model_path and self.type != "model":
            raise ConfigError(f"reward.model_path is set but reward.type={self.type!r}; use type model")
        if self.type == "custom" and not self.function_path:
            raise ConfigError("reward.type=custom needs reward.function_path: 'module:function'")
        if self.function_path and self.type not in ("custom", "auto"):
            raise ConfigError(f"reward.function_path is set but reward.type={self.type!r}; use type custom")
        _check_function_path("reward.function_path", self.function_path)
        if self.type == "judge" and not (self.judge_url and self.judge_model):
            raise ConfigError("reward.type=judge needs reward.judge_url (OpenAI-compatible) and reward.judge_model")


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
    eps_clip_c: float | None = opt(None, "dual-clip constant (> 1, e.g. 3) bounding the loss of negative "
                                   "advantages", gt=1)
    use_kl_loss: bool = opt(False, "add a KL penalty to a frozen reference model to the loss")
    kl_loss_coef: float = opt(0.0, "its coefficient", ge=0)
    kl_loss_type: str = opt("low_var_kl", "KL estimator (`low_var_kl` is clamped k3)", choices=KL_ESTIMATORS)
    use_kl_in_reward: bool = opt(False, "subtract `kl_coef * KL` (k1, per token) from the reward instead")
    kl_coef: float = opt(0.0, "its coefficient", ge=0)
    entropy_coef: float = opt(0.0, "entropy bonus coefficient")
    loss_agg_mode: str = opt("token_mean", "how per-token losses become one (verl's names)", choices=LOSS_AGG_MODES)
    use_tis: bool = opt(False, "importance-sampling correction between the engine's and the trainer's log-probs")
    tis_mode: Literal["truncate", "mask", "reject"] = opt(
        "truncate", "`truncate` (TIS: weight `min(w, tis_clip)`), `mask` (MIS / IcePop: weight `w` inside "
        "`[tis_clip_low, tis_clip]`, 0 outside) or `reject` (drop the tokens outside, no weight: verl's `rollout_rs`)")
    tis_clip: float = opt(2.0, "upper cap of the importance weight", ge=1)
    tis_clip_low: float = opt(0.0, "lower bound of the weight in `mask` and `reject` modes", ge=0, lt=1)
    use_rollout_routing_replay: bool = opt(
        False, "mixture-of-experts models: the engine records each generated token's experts and the trainer's "
        "policy forward passes use them at the response positions (slime's `--use-rollout-routing-replay`; "
        "[algorithms.md](algorithms.md#rollout-routing-replay)); needs `engine.backend: embedded`")
    use_decoupled_loss: bool | None = opt(
        None, "decoupled PPO objective (AReaL, Fu et al. 2025): clip against the trainer's proximal log-probs and "
        "weight by `pi_prox / pi_behav` with the engine's log-probs ([algorithms.md](algorithms.md#decoupled-ppo)); "
        "`null`: on when `rollout.max_staleness` > 0")
    dynamic_sampling: bool = opt(False, "DAPO dynamic sampling: drop groups with equal rewards, sample more prompts "
                                 "until the batch is full")
    dynamic_sampling_max_rounds: int = opt(4, "generation rounds per rollout at most; then train on the groups kept",
                                           ge=1)
    overlong_filter: bool = opt(False, "exclude truncated samples from the loss")
    overlong_buffer_len: int | None = opt(None, "DAPO soft over-long punishment: penalise the last this-many tokens "
                                          "before the length limit", gt=0)
    overlong_penalty_factor: float = opt(1.0, "the punishment's maximum")
    reward_clip: float | None = opt(None, "clamp rewards to `[-reward_clip, reward_clip]`", gt=0)
    normalize_rewards: bool = opt(False, "standardise rewards over the rollout (mean 0, std 1) before the estimator")

    @property
    def needs_critic(self) -> bool:
        """Whether the advantage estimator uses a value model (the one place this is decided)."""
        from ..algo.advantages import ADV_ESTIMATORS

        return bool(ADV_ESTIMATORS.info(self.advantage_estimator).get("needs_critic"))

    @property
    def needs_reference(self) -> bool:
        """Whether a frozen reference model is loaded (KL in the loss or in the reward)."""
        return self.use_kl_loss or self.use_kl_in_reward

    def check(self) -> None:
        if self.eps_clip_high is not None and self.eps_clip_high < self.eps_clip:
            raise ConfigError(
                f"algo.eps_clip_high={self.eps_clip_high} < algo.eps_clip={self.eps_clip}: the upper clip range must "
                f"be at least the lower one (set eps_clip_high to null to use eps_clip for both)")
        if self.use_kl_loss and self.kl_loss_coef <= 0:
            raise ConfigError("algo.use_kl_loss=true needs algo.kl_loss_coef > 0")
        if not self.use_kl_loss and self.kl_loss_coef > 0:
            raise ConfigError("algo.kl_loss_coef > 0 has no effect unless algo.use_kl_loss=true")
        if self.use_kl_in_reward and self.kl_coef <= 0:
            raise ConfigError("algo.use_kl_in_reward=true needs algo.kl_coef > 0")
        if not self.use_kl_in_reward and self.kl_coef > 0:
            raise ConfigError("algo.kl_coef > 0 has no effect unless algo.use_kl_in_reward=true "
                              "(for a KL term in the loss use algo.use_kl_loss and algo.kl_loss_coef)")


@dataclass
class OfflineConfig(Section):
    """Offline post-training with `reinforge offline` (docs/offline.md): supervised fine-tuning, reward
    models and preference optimisation on a fixed dataset. The policy is `model.path`; the optimizer,
    schedule, precision and micro-batch budget are the `train.*` keys; `data.system_prompt`,
    `data.apply_chat_template` and `data.seed` (shuffling, eval split) apply; checkpoints and logging are
    the `run.*` keys, and `run.save_interval` / `eval.eval_interval` count optimizer steps here."""

    name = "offline"
    method: str = opt("dpo", "what to train (docs/algorithms.md#offline-methods)", choices=OFFLINE_METHODS)
    train_data: str | None = opt(None, "training examples: a `.jsonl` / `.json` / `.parquet` file or a saved "
                                 "`datasets` folder in one of TRL's formats, detected per row ([data.md](data.md); keys below)")
    eval_data: str | None = opt(None, "held-out examples in the same format (`null`: `eval_fraction` of train_data)")
    eval_fraction: float = opt(0.0, "share of train_data held out for evaluation when eval_data is null", ge=0, lt=1)
    messages_key: str = opt("messages", "SFT: key of the chat (a list of `{role, content}`; loss on assistant turns)")
    prompt_key: str = opt("prompt", "key of the prompt (a string or a list of messages); SFT also takes "
                          "prompt + completion")
    chosen_key: str = opt("chosen", "pairs: key of the preferred response (a string or assistant message(s))")
    rejected_key: str = opt("rejected", "pairs: key of the dispreferred response")
    completion_key: str = opt("completion", "KTO / SFT: key of the response")
    text_key: str = opt("text", "SFT: key of plain text (language modeling: loss on every token, no chat template)")
    kto_label_key: str = opt("label", "KTO: key of the desirability label (true / false)")
    margin_key: str | None = opt(None, "RM: key of an optional per-pair margin (Llama 2's margin loss)")
    max_length: int = opt(1024, "longest prompt + response, in tokens", ge=2)
    max_prompt_length: int = opt(512, "with `truncation: truncate`, prompts are cut to their last this-many tokens",
                                 ge=1)
    truncation: Literal["drop", "truncate"] = opt(
        "drop", "examples longer than `max_length`: `drop` them, or `truncate` (prompt from the left to "
        "`max_prompt_length`, then the response from the right); both are counted in the log")
    num_epochs: int = opt(1, "passes over train_data", ge=1)
    global_batch_size: int = opt(32, "examples (pairs for preference methods) per optimizer step", ge=1)
    beta: float = opt(0.1, "DPO / IPO / CPO / SimPO / KTO temperature beta; ORPO's odds-ratio weight lambda", gt=0)
    label_smoothing: float = opt(0.0, "DPO / CPO / SimPO: probability that a pair's label is flipped (cDPO)",
                                 ge=0, lt=0.5)
    simpo_gamma: float = opt(0.5, "SimPO target reward margin gamma", ge=0)
    cpo_alpha: float = opt(1.0, "CPO: weight of the NLL (behaviour cloning) term on the chosen responses", ge=0)
    kto_desirable_weight: float = opt(1.0, "KTO lambda_D: weight of desirable examples", gt=0)
    kto_undesirable_weight: float = opt(1.0, "KTO lambda_U: weight of undesirable examples", gt=0)
    precompute_ref_log_probs: bool = opt(True, "DPO / IPO / KTO: compute the reference log-probs once before "
                                         "training (no reference model in memory while training); false keeps a "
                                         "frozen reference model and runs it on every batch")
    packing: bool = opt(False, "SFT: pack several examples into one row of up to `train.max_tokens_per_gpu` tokens "
                        "(attention stays within each example)")
    shuffle: bool = opt(True, "shuffle the examples every epoch (seeded: `data.seed + epoch`)")


@dataclass
class CriticConfig(Section):
    """Used only with `algo.advantage_estimator: gae`. The critic has its own optimizer,
    learning-rate schedule and checkpoint; AdamW's betas and eps are the `train.*` ones."""

    name = "critic"
    path: str | None = opt(None, "initial weights of the value model (`null`: `model.path`); a zero-initialised "
                           "value head is added")
    lr: float = opt(1e-5, "critic learning rate (AdamW)", gt=0)
    lr_warmup_iters: int = opt(0, "optimizer steps of linear warm-up", ge=0)
    lr_decay_style: Literal["constant", "cosine", "linear"] = opt(
        "constant", "`constant`, `linear` or `cosine` decay to `min_lr` at the last step")
    min_lr: float = opt(0.0, "final learning rate of a decay", ge=0)
    value_clip: float | None = opt(0.2, "clipped value loss range (`null`: plain squared error)", gt=0)
    clip_grad: float = opt(1.0, "gradient-norm clipping", gt=0)
    weight_decay: float = opt(0.0, "AdamW weight decay", ge=0)
    num_warmup_rollouts: int = opt(0, "rollouts at the start that train only the critic", ge=0)


@dataclass
class TrainConfig(Section):
    name = "train"
    num_rollout: int = opt(10, "rollouts (RL iterations) to run", ge=0)
    num_steps_per_rollout: int = opt(1, "optimizer steps per rollout", ge=1)
    max_tokens_per_gpu: int | Literal["auto"] = opt(
        8192, "tokens per micro-batch (with padding for `packing: none` and `shared_prompt`; real tokens for "
        "`sequences`); `auto`: the largest that fits the GPU's memory beside everything else, at most 32768 and at "
        "least one sequence (the planner, [planner.md](planner.md); a CPU run: 8192). A value that cannot fit is "
        "refused at start with the one that does", ge=1)
    packing: Literal["none", "sequences", "shared_prompt"] = opt(
        "none", "layout of the RL trainer's forward pass (docs/packing.md): `none` one right-padded row per sample "
        "(any model); `sequences` samples side by side without padding (varlen attention on the GPU); "
        "`shared_prompt` one row per prompt group, its prompt computed once for all its responses. The last two need "
        "a Llama / Qwen2 / Qwen3 (or -MoE) model (reinforge's own model code) and compute the same log-probs")
    log_prob_chunk_size: int = opt(2048, "response tokens per chunk of the log-prob / entropy computation over "
                                   "the vocabulary (bounds its fp32 memory: ~3 x chunk x vocab x 4 bytes)", ge=1)
    lr: float = opt(1e-6, "peak learning rate (AdamW)", gt=0)
    lr_warmup_iters: int = opt(0, "optimizer steps of linear warm-up", ge=0)
    lr_decay_style: Literal["constant", "cosine", "linear"] = opt(
        "constant", "`constant`, `linear` or `cosine` decay to `min_lr` at the last step")
    min_lr: float = opt(0.0, "final learning rate of a decay", ge=0)
    weight_decay: float = opt(0.0, "AdamW weight decay", ge=0)
    adam_beta1: float = opt(0.9, "AdamW beta1", ge=0, lt=1)
    adam_beta2: float = opt(0.999, "AdamW beta2", ge=0, lt=1)
    adam_eps: float = opt(1e-8, "AdamW epsilon", gt=0)
    clip_grad: float = opt(1.0, "gradient-norm clipping", gt=0)
    moe_aux_loss_coeff: float = opt(0.0, "coefficient of the mixture-of-experts load-balancing loss (Switch "
                                    "Transformer's, over the layers as transformers pools it) added to the policy "
                                    "loss; needs a `qwen3_moe` / `qwen2_moe` model (slime's `--moe-aux-loss-coeff`)",
                                    ge=0)
    seed: int = opt(1234, "torch / numpy / python seed, and the seed of mini-batch shuffling")
    device: str = opt("auto", "`auto` (cuda when available), `cpu`, `cuda`, `cuda:1`, ...")
    fsdp_cpu_offload: bool = opt(False, "FSDP2 CPU offload of parameters, gradients and optimizer state "
                                 "(several trainer ranks)")
    tensor_model_parallel_size: int = opt(1, "trainer ranks that split each decoder layer's projections (DTensor "
                                          "tensor parallelism; docs/parallelism.md)", ge=1)
    context_parallel_size: int = opt(1, "trainer ranks that split each micro-batch's positions (Ulysses "
                                     "all-to-all attention over heads; docs/parallelism.md)", ge=1)
    expert_model_parallel_size: int = opt(1, "data-parallel trainer ranks that split each mixture-of-experts layer's "
                                          "experts (num_experts / size each; tokens sent to their experts by "
                                          "all-to-all; must divide num_experts and the data-parallel ranks; "
                                          "docs/parallelism.md)", ge=1)


@dataclass
class EvalConfig(Section):
    name = "eval"
    eval_interval: int | None = opt(None, "rollouts (offline: optimizer steps) between evaluations (always before "
                                    "and after training)", ge=1)
    eval_before_train: bool = opt(True, "evaluate the initial policy")
    n_samples_per_eval_prompt: int = opt(4, "sampled completions per prompt for pass@1 / pass@k (0: greedy only)",
                                         ge=0)
    eval_max_response_len: int | None = opt(None, "max new tokens in evaluation (`null`: "
                                            "`rollout_max_response_len`)", ge=1)
    eval_temperature: float = opt(1.0, "sampling temperature of the sampled completions", ge=0)
    eval_top_p: float = opt(1.0, "nucleus sampling in evaluation", gt=0, le=1)
    pass_k: list[int] = opt([1, 4], "the k of each reported pass@k (each at most `n_samples_per_eval_prompt`)")

    def check(self) -> None:
        for k in self.pass_k:
            if k < 1 or k > max(self.n_samples_per_eval_prompt, 1):
                raise ConfigError(f"eval.pass_k={self.pass_k}: each k must be in [1, eval.n_samples_per_eval_prompt="
                                  f"{self.n_samples_per_eval_prompt}]")


@dataclass
class ClusterConfig(Section):
    """Placement; see [design.md](design.md#scale-out). Names as slime's flags. On machines without
    GPUs the "GPU" counts are processes (gloo instead of NCCL)."""

    name = "cluster"
    mode: Literal["local", "ray"] = opt("local", "`local`: one trainer and one engine in this process; `ray`: "
                                        "trainer ranks and engines as Ray actors")
    actor_num_nodes: int = opt(1, "nodes with trainer ranks", ge=1)
    actor_num_gpus_per_node: int = opt(1, "trainer ranks (FSDP2 data parallel) per node", ge=1)
    rollout_num_gpus: int = opt(1, "GPUs for rollout engines (with `colocate`: shared with the trainers)", ge=1)
    rollout_num_gpus_per_engine: int = opt(1, "GPUs per engine (1 for the embedded engine; tensor parallelism with "
                                           "vLLM)", ge=1)
    colocate: bool = opt(False, "engines on the trainers' GPUs (they sleep while the trainers train) instead of "
                         "their own")
    ray_address: str | None = opt(None, "address of an existing Ray cluster (`auto`, `ray://host:10001`); `null` "
                                  "starts a local one")
    num_cpus_per_worker: float = opt(1.0, "CPUs reserved per trainer rank and per engine", gt=0)
    weight_sync_bucket_mb: int = opt(256, "weight sync sends the policy in buckets of about this many MB", ge=1)
    offload_engine_weights: bool = opt(False, "colocate (or `offload_rollout`): move engine weights to the CPU while "
                                       "the trainers train")
    offload_rollout: bool | Literal["auto"] = opt(
        False, "local mode: the engine frees its KV cache while the trainer trains (slime's `--offload-rollout`): the "
        "memory goes to the trainer's activations (e.g. fewer `model.recompute_num_layers`), at the cost of "
        "reallocating the cache and recapturing its CUDA graphs each rollout; Ray `colocate` engines always do this; "
        "`auto`: on where it lets the trainer keep more (the planner, [planner.md](planner.md); a CPU run: off)")
    memory_check: Literal["error", "warn", "off"] = opt(
        "error", "CPU-mode Ray placements: an estimate of the memory every process needs (docs/reliability.md) "
        "against the available memory: `error` refuses to start, `warn` logs, `off` skips (local mode only warns)")
    max_engine_restarts: int = opt(3, "Ray: a rollout engine actor that dies during generation is replaced (new "
                                   "actor in its bundle, current weights re-synced, its requests re-queued) up to "
                                   "this many times per run; 0: the run fails", ge=0)

    @property
    def num_trainers(self) -> int:
        return self.actor_num_nodes * self.actor_num_gpus_per_node

    def check(self) -> None:
        if self.rollout_num_gpus % self.rollout_num_gpus_per_engine:
            raise ConfigError(f"cluster.rollout_num_gpus={self.rollout_num_gpus} is not a multiple of "
                              f"cluster.rollout_num_gpus_per_engine={self.rollout_num_gpus_per_engine}")
        if self.mode == "ray" and self.colocate and self.rollout_num_gpus > self.num_trainers:
            raise ConfigError(f"cluster.colocate=true puts engines on the trainers' GPUs: cluster.rollout_num_gpus="
                              f"{self.rollout_num_gpus} exceeds actor_num_nodes * actor_num_gpus_per_node = "
                              f"{self.num_trainers}")
        if self.mode == "local" and (self.num_trainers > 1 or self.rollout_num_gpus > 1):
            raise ConfigError("cluster.mode=local runs one trainer and one engine: set cluster.mode=ray for "
                              "several GPUs or nodes")


@dataclass
class RunConfig(Section):
    name = "run"
    output_dir: str = opt("runs/default", "run directory: config.yaml, metrics.jsonl, tensorboard/, eval/, "
                          "eval_table.txt, checkpoints/")
    save_interval: int | None = opt(None, "rollouts (offline: optimizer steps) between checkpoints", ge=1)
    save_final: bool = opt(True, "checkpoint after the last rollout")
    keep_last_n_checkpoints: int | None = opt(2, "keep the new checkpoint and the newest intact older ones, this many in "
                                              "all; delete older and damaged ones (`null` keeps all)", ge=1)
    save_optimizer: Literal["all", "newest", "none"] = opt(
        "newest", "AdamW's state (8 bytes per trained parameter) in checkpoints (slime's `--no-save-optim`, TRL's "
        "`save_only_model`): in `all`, in the `newest` only, or `none`; a resume without it says it is not exact")
    load: str | None = opt(None, "resume from a checkpoint, a `checkpoints/` directory or a run directory "
                           "(`--load` on the CLI)")
    overwrite: bool = opt(False, "`reinforge train` / `offline` refuse an `output_dir` that already holds a run "
                          "(`metrics.jsonl` or `checkpoints/`) unless they resume it (`recover: auto`, "
                          "`--max-restarts`, `load` inside it); `true` deletes that directory first")
    tensorboard: bool = opt(True, "write TensorBoard event files")
    wandb_project: str | None = opt(None, "log the same metrics to this Weights & Biases project (`null`: the "
                                    "`WANDB_PROJECT` environment variable if set, else no W&B; `pip install wandb`)")
    wandb_group: str | None = opt(None, "W&B run group")
    wandb_mode: Literal["online", "offline", "disabled"] | None = opt(
        None, "`offline` writes the W&B run under `<output_dir>/wandb` without network (`wandb sync` later); `null`: "
        "W&B's own choice (the `WANDB_MODE` environment variable, else `online`). Checked before anything is built")
    progress: bool = opt(True, "console progress bar with ETA")
    dump_rollouts: bool = opt(False, "write every rollout's samples to `rollouts/<id>.jsonl`")
    trace: bool = opt(False, "write a timeline of the run (generation, reward, log-probs, training, weight sync, "
                      "checkpoints, eval) to `trace.json` in the Chrome / Perfetto trace format; open it in "
                      "ui.perfetto.dev ([tracing.md](tracing.md))")
    recover: Literal["off", "auto"] = opt(
        "off", "`auto`: resume from the newest complete checkpoint in `output_dir` (falling back to older ones if "
        "it is damaged; `load` only when there is none), write recover checkpoints every `recover_interval_s` and on "
        "SIGTERM ([reliability.md](reliability.md)); `off`: start from scratch unless `load` is set")
    recover_interval_s: float = opt(600.0, "`recover: auto`: seconds between recover checkpoints (written at the "
                                    "end of the first rollout past the interval)", gt=0)
    max_restarts: int = opt(0, "relaunch training after a crash up to this many times, resuming with "
                            "`recover: auto` (`--max-restarts` on the CLI); 0: no supervisor", ge=0)


def _check_function_path(key: str, path: str | None) -> None:
    if path is not None and ":" not in path:
        raise ConfigError(f"{key}={path!r} must look like 'package.module:function'")
