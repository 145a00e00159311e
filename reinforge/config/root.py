"""The root configuration: the sections composed into :class:`Config`, and the checks that
span several sections (one section's own checks are in its class)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from .agent import AgentConfig
from .cluster import ClusterConfig
from .data import DataConfig
from .distill import DistillConfig
from .engine import EngineConfig
from .eval import EvalConfig
from .fields import ConfigError, registry
from .judge import JudgeConfig, check_judge
from .learning import AlgoConfig, CriticConfig, OfflineConfig, RewardConfig
from .model import ModelConfig
from .rollout import RolloutConfig
from .run import RunConfig
from .sandbox import SandboxConfig
from .train import TrainConfig

SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "rollout": RolloutConfig,
    "engine": EngineConfig,
    "reward": RewardConfig,
    "judge": JudgeConfig,
    "agent": AgentConfig,
    "sandbox": SandboxConfig,
    "algo": AlgoConfig,
    "critic": CriticConfig,
    "distill": DistillConfig,
    "offline": OfflineConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "cluster": ClusterConfig,
    "run": RunConfig,
}

TOOL_CALL_FORMATS = registry("reinforge.tools.formats:TOOL_CALL_FORMATS")
ROLLOUT_KINDS = registry("reinforge.rollout.kinds:ROLLOUT_KINDS")
log = logging.getLogger(__name__)


AGENT_LOOP = "reinforge.rollout.agent:generate"  # the custom generate function of the agent loop


@dataclass
class Config:
    """The run's configuration: one field per section of :data:`SECTIONS`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    offline: OfflineConfig = field(default_factory=OfflineConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    run: RunConfig = field(default_factory=RunConfig)

    @property
    def decoupled_loss(self) -> bool:
        """Whether the policy loss is the decoupled PPO objective: ``algo.use_decoupled_loss``, or
        when it is null, whether the run is asynchronous (``rollout.max_staleness`` > 0)."""
        a = self.algo.use_decoupled_loss
        return self.rollout.max_staleness > 0 if a is None else a

    @property
    def needs_old_log_probs(self) -> bool:
        """Whether the rollout's log-probs under the policy that generated it are recomputed by the
        trainer before training (the one place this is decided): several optimizer steps per rollout
        (the later steps' ratios are against them) or KL in the reward. With one step and neither,
        the step's own forward pass gives them (detached)."""
        return self.train.num_steps_per_rollout > 1 or self.algo.use_kl_in_reward

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step: rollout_batch_size * n_samples_per_prompt / num_steps_per_rollout."""
        r = self.rollout
        return r.rollout_batch_size * r.n_samples_per_prompt // self.train.num_steps_per_rollout

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> Config:
        """Check every section, then the combinations across sections.

        Raises:
            ConfigError: naming the key(s) and the fix.
        """
        for name in SECTIONS:
            getattr(self, name).validate()
        check_judge(self.reward, self.judge)
        r, t, a, c = self.rollout, self.train, self.algo, self.cluster
        pp = t.pipeline_model_parallel_size
        samples = r.rollout_batch_size * r.n_samples_per_prompt
        if samples % t.num_steps_per_rollout:
            raise ConfigError(
                f"rollout.rollout_batch_size * rollout.n_samples_per_prompt = {samples} samples is not divisible "
                f"by train.num_steps_per_rollout={t.num_steps_per_rollout}: each optimizer step needs the same "
                f"global batch size"
            )
        if self.model.recompute_num_layers not in (None, 0, "auto") and not self.model.gradient_checkpointing:
            raise ConfigError(
                f"model.recompute_num_layers={self.model.recompute_num_layers} applies with "
                f"model.gradient_checkpointing=true: set that, or model.recompute_num_layers=null (or 0: none)"
            )
        if c.offload_rollout is True and (c.mode != "local" or r.max_staleness > 0):
            raise ConfigError(
                f"cluster.offload_rollout=true frees the engine's KV cache while the trainer trains in "
                f"cluster.mode=local with rollout.max_staleness=0 (here mode={c.mode}, max_staleness="
                f"{r.max_staleness}): Ray colocated engines sleep anyway (cluster.colocate), and an "
                f"asynchronous rollout generates during training"
            )
        if t.optimizer_offload and (t.fsdp_cpu_offload or (c.mode == "ray" and c.num_trainers > 1)):
            raise ConfigError(
                "train.optimizer_offload keeps AdamW's moments of one unsharded trainer rank in CPU memory: with "
                + (
                    "train.fsdp_cpu_offload they are there already (set one of the two)"
                    if t.fsdp_cpu_offload
                    else f"{c.num_trainers} trainer ranks use train.fsdp_cpu_offload=true instead"
                )
            )
        if a.dynamic_sampling and r.n_samples_per_prompt < 2:
            raise ConfigError("algo.dynamic_sampling needs rollout.n_samples_per_prompt >= 2")
        if a.overlong_buffer_len is not None and a.overlong_buffer_len >= r.rollout_max_response_len:
            raise ConfigError(
                f"algo.overlong_buffer_len must be in (0, rollout.rollout_max_response_len="
                f"{r.rollout_max_response_len}), got {a.overlong_buffer_len}"
            )
        g = self.agent
        self._resolve_rollout_mode()
        e = self.engine
        if r.partial_rollout and e.backend != "embedded":
            raise ConfigError(
                f"rollout.partial_rollout=true needs engine.backend=embedded (it is {e.backend}): "
                f"only the embedded engine can interrupt and continue generation"
            )
        if r.over_sampling_batch_size is not None and (e.backend != "embedded" or c.mode != "local"):
            raise ConfigError(
                f"rollout.over_sampling_batch_size steps the engine itself and aborts the samples left "
                f"at the early stop: it needs engine.backend=embedded and cluster.mode=local (they are "
                f"{e.backend} and {c.mode})"
            )
        if e.backend == "hf" and r.mode == "agent" and g.stop_after_tool_call:
            if TOOL_CALL_FORMATS().get(g.tool_call_format).stop:
                raise ConfigError(
                    "agent.stop_after_tool_call=true ends turns with a stop string, which "
                    "engine.backend=hf does not support: set agent.stop_after_tool_call=false"
                )
        if g.max_turn_tokens is not None and g.max_turn_tokens > r.rollout_max_response_len:
            raise ConfigError(
                f"agent.max_turn_tokens={g.max_turn_tokens} exceeds rollout.rollout_max_response_len="
                f"{r.rollout_max_response_len}, the budget of the whole response"
            )
        from ..algo.registries import ADV_ESTIMATORS

        task_advantage = not self.distill.enabled or self.distill.use_task_reward  # OPD alone: no group needed
        if (
            ADV_ESTIMATORS.info(a.advantage_estimator).get("group_based")
            and r.n_samples_per_prompt < 2
            and task_advantage
        ):
            raise ConfigError(
                f"algo.advantage_estimator={a.advantage_estimator} compares samples of one prompt: "
                f"it needs rollout.n_samples_per_prompt >= 2"
            )
        if g.turn_reward == "discounted":
            if not ADV_ESTIMATORS.info(a.advantage_estimator).get("token_level"):
                token_level = ", ".join(n for n in ADV_ESTIMATORS if ADV_ESTIMATORS.info(n).get("token_level"))
                raise ConfigError(
                    f"agent.turn_reward=discounted places each turn's reward at its own tokens, but "
                    f"algo.advantage_estimator={a.advantage_estimator} gives every token of a sample one "
                    f"advantage from its total reward: use a token-level estimator ({token_level}) or "
                    f"agent.turn_reward=sum (the turns' rewards added up, what {a.advantage_estimator} sees anyway)"
                )
            if not r.custom_generate_function_path:
                raise ConfigError(
                    "agent.turn_reward=discounted needs multi-turn episodes: set "
                    "rollout.custom_generate_function_path=reinforge.rollout.agent:generate"
                )
        if r.max_staleness > 0:
            if a.needs_critic:
                raise ConfigError(
                    f"rollout.max_staleness={r.max_staleness} is not supported with "
                    f"algo.advantage_estimator={a.advantage_estimator} (a critic): use a critic-free "
                    f"estimator (grpo, rloo, reinforce_plus_plus...) or rollout.max_staleness=0"
                )
            if c.mode == "ray" and c.colocate:
                raise ConfigError(
                    f"rollout.max_staleness={r.max_staleness} generates while the trainers train: it "
                    f"needs engines on their own GPUs (cluster.colocate=false)"
                )
        if a.use_rollout_routing_replay:
            if e.backend != "embedded":
                raise ConfigError(
                    f"algo.use_rollout_routing_replay=true needs an engine that records each token's "
                    f"experts: engine.backend={e.backend} does not; use engine.backend=embedded"
                )
            if r.custom_generate_function_path:
                raise ConfigError(
                    "algo.use_rollout_routing_replay=true is not supported with "
                    "rollout.custom_generate_function_path (multi-turn / agent samples carry no "
                    "recorded routes): unset one of them"
                )
            for key, size in (("context_parallel_size", t.context_parallel_size), ("pipeline_model_parallel_size", pp)):
                if size > 1:
                    raise ConfigError(
                        f"algo.use_rollout_routing_replay=true is not supported with train.{key}={size}: set it to 1"
                    )
        self._check_parallel_layout()
        if c.mode == "ray" and e.backend in ("embedded", "hf") and c.rollout_num_gpus_per_engine != 1:
            raise ConfigError(
                f"engine.backend={e.backend} runs one engine per GPU: "
                f"cluster.rollout_num_gpus_per_engine must be 1 (tensor parallelism needs "
                f"engine.backend=vllm)"
            )
        return self

    def _resolve_rollout_mode(self) -> None:
        """``rollout.mode`` (``reinforge.rollout.kinds:ROLLOUT_KINDS``) and the keys it sets: a kind
        with a ``generate`` function (``agent``: the agent loop) makes it
        ``rollout.custom_generate_function_path``; a kind's ``needs`` key must be set. The old switches
        still read, each with a one-line note: ``custom_generate_function_path`` = the agent loop
        (``mode: agent``), ``over_sampling_batch_size`` alone (``mode: over_sampling``). An ``agent``
        section that only the agent loop reads (``agent.environment`` other than ``tools``,
        ``agent.tools``, ``agent.mcp_servers``) switches ``default`` to ``agent`` when no custom
        generate or rollout function is set (a custom rollout reads what it wants); otherwise the
        section would be silently ignored by single-turn sampling."""
        g, r = self.agent, self.rollout
        if r.mode == "default":
            if r.custom_generate_function_path == AGENT_LOOP:
                log.warning(f"rollout.custom_generate_function_path={AGENT_LOOP} is now written rollout.mode=agent")
                r.mode = "agent"
            elif r.over_sampling_batch_size is not None:
                log.warning("rollout.over_sampling_batch_size alone is now written with rollout.mode=over_sampling")
                r.mode = "over_sampling"
            elif not (r.custom_generate_function_path or r.rollout_function_path) and (
                g.environment != "tools" or g.tools or g.mcp_servers
            ):
                r.mode = "agent"
        kind = ROLLOUT_KINDS().info(r.mode)
        needs = kind.get("needs")
        if needs and getattr(r, needs) is None:
            raise ConfigError(f"rollout.mode={r.mode} needs rollout.{needs} (docs/config.md#rollout)")
        if r.over_sampling_batch_size is not None and r.mode != "over_sampling":
            raise ConfigError(
                f"rollout.over_sampling_batch_size is read by rollout.mode=over_sampling; with rollout.mode={r.mode} "
                f"unset it"
            )
        if kind.get("own_requests"):  # it makes the engine requests itself: a custom function would replace them
            for key in ("rollout_function_path", "custom_generate_function_path"):
                if getattr(r, key):
                    raise ConfigError(
                        f"rollout.over_sampling_batch_size drives the default rollout's engine "
                        f"requests; rollout.{key} replaces them: unset one of the two"
                    )
        generate = kind.get("generate")
        if generate:
            for key in ("custom_generate_function_path", "rollout_function_path"):
                if getattr(r, key) not in (None, generate):
                    raise ConfigError(
                        f"rollout.mode={r.mode} makes each sample with {generate}; rollout.{key}={getattr(r, key)} "
                        f"replaces it: unset one of the two"
                    )
            r.custom_generate_function_path = generate

    def _check_parallel_layout(self) -> None:
        """The trainer's layout (:mod:`reinforge.parallel_layout`) against the Ray placement's trainer
        ranks, and what pipeline parallelism does not combine with yet."""
        from ..parallel_layout import Layout

        t, c, pp = self.train, self.cluster, self.train.pipeline_model_parallel_size
        if c.mode == "ray":
            world = (
                f"cluster.actor_num_nodes={c.actor_num_nodes} x cluster.actor_num_gpus_per_node="
                f"{c.actor_num_gpus_per_node}"
            )
            try:
                Layout.of_train(t, c.num_trainers, world)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        if pp == 1:
            return
        unsupported = [
            (self.algo.needs_critic, f"algo.advantage_estimator={self.algo.advantage_estimator} (a critic)"),
            (self.model.lora_rank > 0, f"model.lora_rank={self.model.lora_rank} (LoRA)"),
            (t.moe_aux_loss_coeff > 0, f"train.moe_aux_loss_coeff={t.moe_aux_loss_coeff}"),
        ]
        for bad, what in unsupported:
            if bad:
                raise ConfigError(
                    f"train.pipeline_model_parallel_size={pp} does not combine with {what} yet: set "
                    f"train.pipeline_model_parallel_size=1, or change that key"
                )
