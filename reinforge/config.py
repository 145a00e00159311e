"""Configuration: one dataclass per concern, composed into :class:`Config`.

Sources, later ones winning: the dataclass defaults, a YAML file (and the file named by its
top-level ``base:`` key, read first), ``key=value`` overrides from the command line. Keys are
written ``section.key`` (``rollout.n_samples_per_prompt=8``);
a key that exists in exactly one section may also be written bare (``n_samples_per_prompt=8``).
Values of overrides are parsed as YAML (``8`` is an int, ``[1, 2]`` a list, ``null`` None).

Key names follow slime's command-line flags where slime has one (``rollout_batch_size``,
``n_samples_per_prompt``, ``num_steps_per_rollout``, ``max_tokens_per_gpu``, ``eps_clip``...).
Every key is documented in ``docs/config.md``; unknown keys and invalid values raise
:class:`ConfigError` naming the key and, where the value came from, the file.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A configuration key or value is invalid; the message names the key and the fix."""


@dataclass
class ModelConfig:
    path: str = "smollm2-135m-instruct"  # HF folder or known model name (`reinforge models list`)
    random_init: bool = False  # ignore stored weights (tests, benchmarks)
    gradient_checkpointing: bool = False
    # training precision: "auto" = bf16 autocast with fp32 master weights on GPU, fp32 on CPU
    train_dtype: Literal["auto", "fp32", "bf16"] = "auto"


@dataclass
class DataConfig:
    # "reasoning_gym:<task>" or a .jsonl file (slime's --prompt-data)
    prompt_data: str = "reasoning_gym:basic_arithmetic"
    # keyword arguments of reasoning_gym.create_dataset (e.g. min_terms, max_digits)
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    num_prompts: int = 10000  # size of a reasoning-gym training source
    # held-out prompts: a .jsonl file or reasoning_gym source; null = the training source's
    # task with eval_seed (reasoning-gym) or no evaluation (jsonl)
    eval_prompt_data: str | None = None
    n_eval_prompts: int = 64
    eval_seed: int = 1_000_003
    input_key: str = "prompt"
    label_key: str = "label"
    metadata_key: str = "metadata"
    apply_chat_template: bool = True
    system_prompt: str | None = None  # prepended as a system message when the prompt has none
    rollout_max_prompt_len: int = 512  # longer prompts (in tokens) are dropped and counted
    rollout_shuffle: bool = True
    seed: int = 42  # shuffling and reasoning-gym generation seed


@dataclass
class RolloutConfig:
    rollout_batch_size: int = 8  # prompts per rollout
    n_samples_per_prompt: int = 8
    rollout_max_response_len: int = 256
    rollout_temperature: float = 1.0
    rollout_top_p: float = 1.0
    rollout_top_k: int = -1
    rollout_stop: list[str] = field(default_factory=list)
    rollout_stop_token_ids: list[int] = field(default_factory=list)  # added to the model's EOS ids
    backend: Literal["embedded", "hf", "vllm", "sglang"] = "embedded"
    dtype: Literal["auto", "fp32", "bf16"] = "auto"  # engine weights/KV: auto = bf16 on GPU, fp32 on CPU
    max_num_seqs: int = 256  # engine slots (concurrent sequences)
    kv_cache_memory_fraction: float = 0.3  # GPU: share of free memory for the KV cache
    max_prefill_tokens: int = 16384
    sync_interval: int = 8  # decode steps between host syncs
    cuda_graph: bool = True
    # SGLang (backend: sglang): given servers, or launched by reinforge with these extra server flags
    sglang_urls: list[str] = field(default_factory=list)
    # extra server flags: {mem_fraction_static: 0.7} -> --mem-fraction-static 0.7
    sglang_server_args: dict[str, Any] = field(default_factory=dict)
    sglang_router: bool = False  # put sglang-router in front of several servers
    sglang_weight_update: Literal["tensor", "distributed", "disk"] = "tensor"
    sglang_host: str = "127.0.0.1"
    sglang_port_base: int = 15000  # launched servers take free ports from here up
    sglang_launch_timeout: float = 600.0  # seconds for a launched server to answer /health_generate
    rollout_function_path: str | None = None  # "module:function", replaces the default rollout
    custom_generate_function_path: str | None = None  # "module:function", per-sample generate
    seed: int = 1234


@dataclass
class RewardConfig:
    # auto: reasoning-gym scorer for reasoning-gym prompts, math-verify for other labels
    type: Literal["auto", "reasoning_gym", "math", "exact_match", "custom"] = "auto"
    function_path: str | None = None  # "module:function" for type=custom (slime's --custom-rm-path)
    answer_extraction: Literal["tag", "tag_or_last_number", "boxed", "last_number", "none"] = "tag_or_last_number"
    timeout: float = 10.0  # seconds per sample; a timeout scores 0 and is counted
    concurrency: int = 16  # reward calls in flight at once
    correct_threshold: float = 1.0  # a sample is "correct" (accuracy, pass@k) when reward >= this


ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gae")


@dataclass
class AlgoConfig:
    # grpo | dr_grpo | rloo | reinforce_plus_plus | reinforce_plus_plus_baseline | gae (PPO with a critic)
    advantage_estimator: Literal["grpo", "dr_grpo", "rloo", "reinforce_plus_plus",
                                 "reinforce_plus_plus_baseline", "gae"] = "grpo"
    grpo_std_normalization: bool = True
    gamma: float = 1.0  # discount (gae, reinforce_plus_plus)
    lambd: float = 0.95  # GAE lambda (slime: --lambd)
    policy_loss: Literal["ppo", "gspo"] = "ppo"  # token-level PPO clip, or GSPO's sequence-level ratio
    eps_clip: float = 0.2
    eps_clip_high: float | None = None  # null = eps_clip; larger = DAPO clip-higher
    eps_clip_c: float | None = None  # dual-clip constant (> 1) for negative advantages
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: Literal["k1", "k2", "k3", "low_var_kl"] = "low_var_kl"
    use_kl_in_reward: bool = False  # subtract kl_coef * KL (k1) from each token's reward
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    loss_agg_mode: Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean",
                           "seq_mean_token_sum_norm"] = "token_mean"
    use_tis: bool = False  # importance-sampling correction between engine and trainer log-probs
    tis_mode: Literal["truncate", "mask"] = "truncate"  # truncate: TIS; mask: MIS
    tis_clip: float = 2.0  # upper cap of the importance weight
    tis_clip_low: float = 0.0  # lower bound (mask mode): tokens below it are masked too
    # DAPO dynamic sampling: drop groups whose rewards are all equal, sample more prompts
    dynamic_sampling: bool = False
    dynamic_sampling_max_rounds: int = 4  # generation rounds per rollout at most (then train on what was kept)
    overlong_filter: bool = False  # mask truncated samples out of the loss
    overlong_buffer_len: int | None = None  # DAPO soft over-long punishment: buffer length (tokens)
    overlong_penalty_factor: float = 1.0  # ... and its maximum penalty
    reward_clip: float | None = None  # clamp rewards to [-reward_clip, reward_clip]
    normalize_rewards: bool = False  # standardise rewards over the rollout before advantages


@dataclass
class CriticConfig:
    """The value model of PPO (``algo.advantage_estimator: gae``)."""

    path: str | None = None  # initial weights; null = model.path (a value head is added, zero-initialised)
    lr: float = 1e-5
    value_clip: float | None = 0.2  # clipped value loss range; null = unclipped
    lr_warmup_iters: int = 0
    clip_grad: float = 1.0
    weight_decay: float = 0.0
    num_warmup_rollouts: int = 0  # rollouts that train only the critic (verl's critic_warmup)


@dataclass
class TrainConfig:
    num_rollout: int = 10  # rollouts (RL iterations) to run
    num_steps_per_rollout: int = 1  # optimizer steps per rollout
    max_tokens_per_gpu: int = 8192  # token budget of one micro-batch (padded tokens count)
    lr: float = 1e-6
    lr_warmup_iters: int = 0  # optimizer steps of linear warm-up
    lr_decay_style: Literal["constant", "cosine", "linear"] = "constant"
    min_lr: float = 0.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    seed: int = 1234
    device: str = "auto"  # auto = cuda when available, else cpu
    fsdp_cpu_offload: bool = False  # FSDP2 CPUOffloadPolicy (parameters, gradients, optimizer state on CPU)


@dataclass
class EvalConfig:
    eval_interval: int | None = None  # rollouts between evaluations; null = only before and after
    eval_before_train: bool = True
    n_samples_per_eval_prompt: int = 4  # sampled completions for pass@1 / pass@k (0 = greedy only)
    eval_max_response_len: int | None = None  # null = rollout_max_response_len
    eval_temperature: float = 1.0
    eval_top_p: float = 1.0
    pass_k: list[int] = field(default_factory=lambda: [1, 4])


@dataclass
class ClusterConfig:
    """Placement (slime's flag names). On machines without GPUs "GPU" counts mean processes."""

    mode: Literal["local", "ray"] = "local"  # local: one process; ray: trainer and engine actors
    actor_num_nodes: int = 1
    actor_num_gpus_per_node: int = 1  # trainer ranks per node (FSDP2 data parallel)
    rollout_num_gpus: int = 1  # GPUs for rollout engines (in colocate mode: shared with trainers)
    rollout_num_gpus_per_engine: int = 1
    colocate: bool = False  # engines on the trainers' GPUs (sleep while training) or on their own
    ray_address: str | None = None  # existing cluster ("auto", "ray://..."); null: start a local one
    num_cpus_per_worker: float = 1.0
    weight_sync_bucket_mb: int = 256  # weight sync sends tensors in buckets of about this size
    offload_engine_weights: bool = False  # colocate: move engine weights to CPU while training


@dataclass
class RunConfig:
    output_dir: str = "runs/default"  # metrics, eval tables, checkpoints
    save_interval: int | None = None  # rollouts between checkpoints (always one at the end)
    save_final: bool = True
    keep_last_n_checkpoints: int | None = 2
    load: str | None = None  # checkpoint dir (or a run's checkpoints/ dir) to resume from
    tensorboard: bool = True
    progress: bool = True  # console progress bar with ETA
    dump_rollouts: bool = False  # write every rollout's samples to rollouts/<id>.jsonl


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "rollout": RolloutConfig,
    "reward": RewardConfig,
    "algo": AlgoConfig,
    "critic": CriticConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "cluster": ClusterConfig,
    "run": RunConfig,
}


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    run: RunConfig = field(default_factory=RunConfig)

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step: rollout_batch_size * n_samples_per_prompt / num_steps_per_rollout."""
        r = self.rollout
        return r.rollout_batch_size * r.n_samples_per_prompt // self.train.num_steps_per_rollout

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> "Config":
        """Check values and their combinations; raises :class:`ConfigError` naming the key."""
        r, t, a, e, d, rw = self.rollout, self.train, self.algo, self.eval, self.data, self.reward
        positive = {
            "rollout.rollout_batch_size": r.rollout_batch_size,
            "rollout.n_samples_per_prompt": r.n_samples_per_prompt,
            "rollout.rollout_max_response_len": r.rollout_max_response_len,
            "rollout.max_num_seqs": r.max_num_seqs,
            "rollout.sync_interval": r.sync_interval,
            "rollout.max_prefill_tokens": r.max_prefill_tokens,
            "train.num_steps_per_rollout": t.num_steps_per_rollout,
            "train.max_tokens_per_gpu": t.max_tokens_per_gpu,
            "data.rollout_max_prompt_len": d.rollout_max_prompt_len,
            "data.num_prompts": d.num_prompts,
            "reward.concurrency": rw.concurrency,
        }
        for key, value in positive.items():
            if value < 1:
                raise ConfigError(f"{key} must be >= 1, got {value}")
        for key, value in {"train.num_rollout": t.num_rollout, "data.n_eval_prompts": d.n_eval_prompts,
                           "eval.n_samples_per_eval_prompt": e.n_samples_per_eval_prompt,
                           "train.lr_warmup_iters": t.lr_warmup_iters}.items():
            if value < 0:
                raise ConfigError(f"{key} must be >= 0, got {value}")
        for key, value in {"run.save_interval": self.run.save_interval, "eval.eval_interval": e.eval_interval,
                           "run.keep_last_n_checkpoints": self.run.keep_last_n_checkpoints}.items():
            if value is not None and value < 1:
                raise ConfigError(f"{key} must be >= 1 or null, got {value}")
        samples = r.rollout_batch_size * r.n_samples_per_prompt
        if samples % t.num_steps_per_rollout:
            raise ConfigError(
                f"rollout.rollout_batch_size * rollout.n_samples_per_prompt = {samples} samples is not divisible "
                f"by train.num_steps_per_rollout={t.num_steps_per_rollout}: each optimizer step needs the same "
                f"global batch size")
        if r.rollout_temperature < 0 or e.eval_temperature < 0:
            raise ConfigError("rollout.rollout_temperature and eval.eval_temperature must be >= 0")
        for key, value in {"rollout.rollout_top_p": r.rollout_top_p, "eval.eval_top_p": e.eval_top_p}.items():
            if not 0 < value <= 1:
                raise ConfigError(f"{key} must be in (0, 1], got {value}")
        if r.backend != "sglang" and (r.sglang_urls or r.sglang_server_args or r.sglang_router):
            raise ConfigError(f"rollout.sglang_* settings need rollout.backend=sglang (it is {r.backend})")
        if not 0 < r.kv_cache_memory_fraction < 1:
            raise ConfigError(f"rollout.kv_cache_memory_fraction must be in (0, 1), got {r.kv_cache_memory_fraction}")
        if a.eps_clip <= 0:
            raise ConfigError(f"algo.eps_clip must be > 0, got {a.eps_clip}")
        if a.eps_clip_high is not None and a.eps_clip_high < a.eps_clip:
            raise ConfigError(
                f"algo.eps_clip_high={a.eps_clip_high} < algo.eps_clip={a.eps_clip}: the upper clip range must be at "
                f"least the lower one (set eps_clip_high to null to use eps_clip for both)")
        if a.use_kl_loss and a.kl_loss_coef <= 0:
            raise ConfigError("algo.use_kl_loss=true needs algo.kl_loss_coef > 0")
        if not a.use_kl_loss and a.kl_loss_coef > 0:
            raise ConfigError("algo.kl_loss_coef > 0 has no effect unless algo.use_kl_loss=true")
        if a.use_tis and a.tis_clip < 1:
            raise ConfigError(f"algo.tis_clip must be >= 1, got {a.tis_clip}")
        if a.use_tis and not 0 <= a.tis_clip_low < 1:
            raise ConfigError(f"algo.tis_clip_low must be in [0, 1), got {a.tis_clip_low}")
        if a.eps_clip_c is not None and a.eps_clip_c <= 1:
            raise ConfigError(f"algo.eps_clip_c must be > 1 (dual clip), got {a.eps_clip_c}")
        if a.use_kl_in_reward and a.kl_coef <= 0:
            raise ConfigError("algo.use_kl_in_reward=true needs algo.kl_coef > 0")
        if not a.use_kl_in_reward and a.kl_coef > 0:
            raise ConfigError("algo.kl_coef > 0 has no effect unless algo.use_kl_in_reward=true "
                              "(for a KL term in the loss use algo.use_kl_loss and algo.kl_loss_coef)")
        if not 0 <= a.gamma <= 1 or not 0 <= a.lambd <= 1:
            raise ConfigError(f"algo.gamma and algo.lambd must be in [0, 1], got {a.gamma}, {a.lambd}")
        if a.dynamic_sampling and a.dynamic_sampling_max_rounds < 1:
            raise ConfigError("algo.dynamic_sampling_max_rounds must be >= 1")
        if a.dynamic_sampling and r.n_samples_per_prompt < 2:
            raise ConfigError("algo.dynamic_sampling needs rollout.n_samples_per_prompt >= 2")
        if a.overlong_buffer_len is not None and not 0 < a.overlong_buffer_len < r.rollout_max_response_len:
            raise ConfigError(f"algo.overlong_buffer_len must be in (0, rollout.rollout_max_response_len="
                              f"{r.rollout_max_response_len}), got {a.overlong_buffer_len}")
        if a.reward_clip is not None and a.reward_clip <= 0:
            raise ConfigError(f"algo.reward_clip must be > 0, got {a.reward_clip}")
        if a.advantage_estimator in ("grpo", "dr_grpo", "rloo") and r.n_samples_per_prompt < 2:
            raise ConfigError(f"algo.advantage_estimator={a.advantage_estimator} compares samples of one prompt: "
                              f"it needs rollout.n_samples_per_prompt >= 2")
        c = self.cluster
        for key in ("actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus", "rollout_num_gpus_per_engine",
                    "weight_sync_bucket_mb"):
            if getattr(c, key) < 1:
                raise ConfigError(f"cluster.{key} must be >= 1, got {getattr(c, key)}")
        if c.rollout_num_gpus % c.rollout_num_gpus_per_engine:
            raise ConfigError(f"cluster.rollout_num_gpus={c.rollout_num_gpus} is not a multiple of "
                              f"cluster.rollout_num_gpus_per_engine={c.rollout_num_gpus_per_engine}")
        if c.mode == "ray" and r.backend in ("embedded", "hf") and c.rollout_num_gpus_per_engine != 1:
            raise ConfigError(f"rollout.backend={r.backend} runs one engine per GPU: "
                              f"cluster.rollout_num_gpus_per_engine "
                              f"must be 1 (tensor parallelism needs rollout.backend=vllm)")
        if c.mode == "ray" and c.colocate and c.rollout_num_gpus > c.actor_num_nodes * c.actor_num_gpus_per_node:
            raise ConfigError(f"cluster.colocate=true puts engines on the trainers' GPUs: cluster.rollout_num_gpus="
                              f"{c.rollout_num_gpus} exceeds actor_num_nodes * actor_num_gpus_per_node = "
                              f"{c.actor_num_nodes * c.actor_num_gpus_per_node}")
        if c.mode == "local" and (c.actor_num_nodes * c.actor_num_gpus_per_node > 1 or c.rollout_num_gpus > 1):
            raise ConfigError("cluster.mode=local runs one trainer and one engine: set cluster.mode=ray for "
                              "several GPUs or nodes")
        if self.critic.lr <= 0:
            raise ConfigError(f"critic.lr must be > 0, got {self.critic.lr}")
        if rw.type == "custom" and not rw.function_path:
            raise ConfigError("reward.type=custom needs reward.function_path: 'module:function'")
        if rw.function_path and rw.type not in ("custom", "auto"):
            raise ConfigError(f"reward.function_path is set but reward.type={rw.type!r}; use type custom")
        if rw.timeout <= 0:
            raise ConfigError(f"reward.timeout must be > 0 seconds, got {rw.timeout}")
        for k in e.pass_k:
            if k < 1 or (k > max(e.n_samples_per_eval_prompt, 1)):
                raise ConfigError(
                    f"eval.pass_k={e.pass_k}: each k must be in [1, eval.n_samples_per_eval_prompt="
                    f"{e.n_samples_per_eval_prompt}]")
        if t.lr <= 0:
            raise ConfigError(f"train.lr must be > 0, got {t.lr}")
        if len(r.rollout_stop_token_ids) > 6:
            raise ConfigError("rollout.rollout_stop_token_ids: at most 6 ids (the model's EOS ids take the rest of 8)")
        for key, path in {"rollout.rollout_function_path": r.rollout_function_path,
                          "rollout.custom_generate_function_path": r.custom_generate_function_path,
                          "reward.function_path": rw.function_path}.items():
            if path is not None and ":" not in path:
                raise ConfigError(f"{key}={path!r} must look like 'package.module:function'")
        return self


# --------------------------------------------------------------------------- loading

def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


_SCALARS: dict[type, tuple[Any, str]] = {  # type -> (accepts value?, what the error says is expected)
    bool: (lambda v: isinstance(v, bool), "true or false"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    str: (lambda v: isinstance(v, str), "a string"),
}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (int -> float allowed); return the value."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: expected {' or '.join(_type_name(a) for a in args)}, got {value!r}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {list(choices)}")
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp in _SCALARS:
        accepts, expected = _SCALARS[tp]
        if not accepts(value):
            raise ConfigError(f"{key}: expected {expected}, got {value!r}")
        return float(value) if tp is float else value
    raise ConfigError(f"{key}: unsupported type {tp}")


def _section_fields(section: str) -> dict[str, Any]:
    cls = SECTIONS[section]
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _locate(key: str) -> tuple[str, str]:
    """'rollout.n_samples_per_prompt' or a bare unique 'n_samples_per_prompt' -> (section, name)."""
    if "." in key:
        section, name = key.split(".", 1)
        if section not in SECTIONS:
            raise ConfigError(f"unknown config section {section!r} in {key!r}; sections: {', '.join(SECTIONS)}"
                              + _suggest(section, SECTIONS))
        if name not in _section_fields(section):
            raise ConfigError(f"unknown config key {key!r}" + _suggest(name, _section_fields(section), section))
        return section, name
    owners = [s for s in SECTIONS if key in _section_fields(s)]
    if len(owners) == 1:
        return owners[0], key
    if len(owners) > 1:
        raise ConfigError(f"config key {key!r} is ambiguous: write one of {', '.join(f'{s}.{key}' for s in owners)}")
    every = {f"{s}.{n}" for s in SECTIONS for n in _section_fields(s)}
    bare = {n for s in SECTIONS for n in _section_fields(s)}
    raise ConfigError(f"unknown config key {key!r}" + _suggest(key, bare | every))


def _suggest(name: str, options, section: str | None = None) -> str:
    close = difflib.get_close_matches(name, list(options), n=3, cutoff=0.6)
    if not close:
        return ""
    prefix = f"{section}." if section else ""
    return "; did you mean " + " or ".join(f"{prefix}{c}" for c in close) + "?"


def _flatten(raw: dict[str, Any], origin: str) -> list[tuple[str, Any]]:
    """YAML mapping -> [(dotted key, value)]; sections are mappings, bare keys are allowed."""
    out = []
    for k, v in raw.items():
        if not isinstance(k, str):
            raise ConfigError(f"{origin}: key {k!r} is not a string")
        if k in SECTIONS:
            if v is None:
                continue
            if not isinstance(v, dict):
                raise ConfigError(f"{origin}: section {k!r} must be a mapping of keys to values")
            out.extend((f"{k}.{name}", value) for name, value in v.items())
        else:
            out.append((k, v))
    return out


def parse_override(text: str) -> tuple[str, Any]:
    """'rollout.n_samples_per_prompt=8' -> ('rollout.n_samples_per_prompt', 8)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key=value (e.g. train.lr=1e-6)")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("-").replace("-", "_")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str) and _looks_numeric(value):  # YAML reads 1e-6 as a string
        value = float(value)
    return key, value


def _looks_numeric(s: str) -> bool:
    try:
        float(s)
        return s.strip().lower() not in ("nan", "inf", "-inf", "infinity")
    except ValueError:
        return False


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Build a validated :class:`Config` from defaults, an optional YAML file and overrides.

    Raises:
        ConfigError: unknown key, wrong type or invalid combination (the message names the
            key and the file or ``command line`` it came from).
        FileNotFoundError: ``path`` does not exist.
    """
    values: dict[tuple[str, str], tuple[Any, str]] = {}
    if path is not None:
        _read_yaml(Path(path), values, seen=())
    for text in overrides or []:
        key, value = parse_override(text)
        try:
            values[_locate(key)] = (value, "command line")
        except ConfigError as e:
            raise ConfigError(f"command line: {e}") from None
    return config_from_values(values)


def _read_yaml(path: Path, values: dict[tuple[str, str], tuple[Any, str]], seen: tuple[Path, ...]) -> None:
    """Add a YAML file's keys to ``values``; a top-level ``base: other.yaml`` (relative to the
    file) is read first, so the file only states what differs from its base."""
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} not found")
    if path.resolve() in seen:
        raise ConfigError(f"{path}: 'base' files include each other")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    base = raw.pop("base", None)
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError(f"{path}: base must be a path to another YAML file")
        _read_yaml(path.parent / base, values, seen + (path.resolve(),))
    for key, value in _flatten(raw, str(path)):
        try:
            values[_locate(key)] = (value, str(path))
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None


def config_from_values(values: dict[tuple[str, str], tuple[Any, str]], check_explicit: bool = True) -> Config:
    sections = {}
    for section, cls in SECTIONS.items():
        hints = _section_fields(section)
        kwargs = {}
        for (s, name), (value, origin) in values.items():
            if s != section:
                continue
            if isinstance(value, str) and hints[name] in (float, float | None) and _looks_numeric(value):
                value = float(value)  # YAML reads 1e-6 (no dot) as a string
            try:
                kwargs[name] = _coerce(value, hints[name], f"{section}.{name}")
            except ConfigError as e:
                raise ConfigError(f"{origin}: {e}") from None
        sections[section] = cls(**kwargs)
    cfg = Config(**sections)
    if check_explicit:
        _check_explicit_keys(cfg, set(values))
    return cfg.validate()


def _check_explicit_keys(cfg: Config, given: set[tuple[str, str]]) -> None:
    """Refuse settings that the chosen algorithm would silently ignore."""
    est = cfg.algo.advantage_estimator
    if est != "gae":
        critic_keys = sorted(f"critic.{n}" for s, n in given if s == "critic")
        if critic_keys or ("algo", "lambd") in given:
            keys = critic_keys + (["algo.lambd"] if ("algo", "lambd") in given else [])
            raise ConfigError(f"{', '.join(keys)} set, but algo.advantage_estimator={est} uses no critic: "
                              f"use advantage_estimator=gae (PPO with a critic) or remove them")
    if ("algo", "gamma") in given and est not in ("gae", "reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        raise ConfigError(f"algo.gamma set, but algo.advantage_estimator={est} does not discount")
    if ("algo", "grpo_std_normalization") in given and est != "grpo":
        raise ConfigError(f"algo.grpo_std_normalization applies to advantage_estimator=grpo, not {est}")


def config_from_dict(d: dict[str, Any]) -> Config:
    """Inverse of :meth:`Config.to_dict` (used when resuming from a checkpoint)."""
    values = {}
    for key, value in _flatten(d, "config"):
        values[_locate(key)] = (value, "saved config")
    return config_from_values(values, check_explicit=False)


def dump_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
