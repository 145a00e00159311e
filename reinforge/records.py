"""Records that flow through a rollout: sampling parameters, engine requests/results, samples."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: reward worker processes import this module without torch
    import torch


@dataclass
class SamplingParams:
    """How to sample one completion.

    ``temperature`` 0 means greedy decoding. ``top_k`` <= 0 and ``top_p`` >= 1 disable those
    filters. Generation stops at any id in ``stop_token_ids`` (the stop token is kept in the
    output so the policy learns to stop), when the decoded text contains one of ``stop``
    (tokens after the one that completes the string are dropped), or after ``max_new_tokens``.
    ``ignore_eos`` disables every stop condition but the length (fixed-length benchmarks).
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False


@dataclass
class GenerateRequest:
    """``n`` completions of one tokenized prompt (the engine prefills the prompt once)."""

    prompt_ids: list[int]
    params: SamplingParams
    n: int = 1
    request_id: str | int | None = None


class FinishReason(str, enum.Enum):
    STOP = "stop"  # a stop token or stop string ended the completion
    LENGTH = "length"  # max_new_tokens (or the engine's context limit) was reached
    ABORT = "abort"  # the request was aborted

    @classmethod
    def parse(cls, value: str | None) -> FinishReason:
        """An engine's finish reason ("stop" / "length" / "abort"); anything else counts as length."""
        return cls._value2member_map_.get(value, cls.LENGTH)  # type: ignore[return-value]


@dataclass
class GenerateResult:
    """One completion: generated token ids, the log-prob of each under the sampling
    distribution's temperature (fp32, ``log_softmax(logits / T)``; T=1 for greedy), and why it ended."""

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: FinishReason
    weight_version: int = 0
    # policy version of each token when they differ (a partial rollout continued after a weight
    # update); None: every token has ``weight_version``
    token_versions: list[int] | None = None
    # a mixture-of-experts model's experts behind each token when the engine records them (rollout
    # routing replay): [len(token_ids), num_moe_layers, k] uint8 / int16 on the CPU, row j the experts
    # of the position that predicted token j; None when not recorded
    routed_experts: torch.Tensor | None = None


@runtime_checkable
class RolloutEngine(Protocol):
    """What the RL loop needs from an inference engine (embedded, vLLM, SGLang)."""

    weight_version: int

    def generate(self, requests: list[GenerateRequest]) -> list[list[GenerateResult]]:
        """Results in request order; request i gets ``requests[i].n`` results."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new policy weights (Hugging Face names) in place; later results carry ``version``."""
        ...

    def reseed(self, seed: int) -> None:
        """Restart the sampling random stream from ``seed``."""
        ...

    def sleep(self, offload_weights: bool = False) -> None:
        """Release the KV cache (and the weights' device memory with ``offload_weights``) so a
        colocated trainer can use the memory."""
        ...

    def wake_up(self) -> None:
        """Undo :meth:`sleep`."""
        ...

    def shutdown(self) -> None: ...


@runtime_checkable
class InterruptibleEngine(RolloutEngine, Protocol):
    """An engine whose generation can be cut short and continued (asynchronous RL with
    ``rollout.partial_rollout``; the embedded engine and the Ray pool of them)."""

    def interrupt(self) -> None:
        """Callable from another thread: a running ``generate`` returns at its next step boundary,
        unfinished samples ending with ``FinishReason.ABORT`` and the tokens generated so far;
        calls return at once until :meth:`resume`."""
        ...

    def resume(self) -> None: ...


@runtime_checkable
class ReplicatedEngine(RolloutEngine, Protocol):
    """Several engines behind one interface (the Ray ``EnginePool``)."""

    infos: list[dict[str, Any]]  # per engine: index, node, GPU
    restarts: int  # engines replaced after a failure so far


class Status(str, enum.Enum):
    """Sample status, as slime's ``Sample.Status``."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass
class Sample:
    """One prompt + one sampled response, with everything the trainer needs.

    ``tokens`` holds prompt and response token ids; the last ``response_length`` of them are
    the response. ``loss_mask`` and ``rollout_log_probs`` have one entry per response token
    (``loss_mask`` 0 for tokens not produced by the policy, e.g. tool outputs in a multi-turn
    rollout). ``reward`` is the scalar the advantage estimator uses; ``reward_info`` keeps
    the reward function's extra fields. Field names follow slime's ``Sample``.
    """

    prompt: str | list[dict[str, Any]]
    tokens: list[int]
    response_length: int
    response: str = ""
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    index: int = 0  # position of the sample in its rollout
    group_index: int = 0  # position of its prompt in the rollout
    reward: float | None = None
    reward_info: dict[str, Any] = field(default_factory=dict)
    loss_mask: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)
    status: Status = Status.PENDING
    weight_version: int = 0  # policy version that generated the response (its first token, if several did)
    # policy version of each response token, when they differ (partial rollouts); empty: all are weight_version
    weight_versions: list[int] = field(default_factory=list)
    # rollout routing replay (``algo.use_rollout_routing_replay``): [response_length, num_moe_layers, k]
    # uint8 / int16 CPU tensor, the experts each MoE layer used at the position that predicted each
    # response token (slime's ``rollout_routed_experts``); None for dense models or when not recorded
    routed_experts: torch.Tensor | None = None

    def token_versions(self) -> list[int]:
        """The policy version of each of the ``response_length`` response tokens."""
        return list(self.weight_versions) if self.weight_versions else [self.weight_version] * self.response_length

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def response_ids(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (for dumping rollouts), without ``routed_experts``."""
        d = dict(self.__dict__)
        d["status"] = self.status.value
        d.pop("routed_experts")  # tokens x layers x k ints per sample: training input, too big for a dump
        return d
