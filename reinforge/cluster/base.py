"""The cluster as the RL loop sees it: trainer ranks behind named methods, and the rollout engine.

:class:`Cluster` is the one interface of a placement; ``cluster.mode`` chooses the
implementation from :data:`PLACEMENTS` (``local``: one trainer and one engine in this process;
``ray``: trainer ranks and engines as Ray actors). The loop calls the same methods either way
and never asks which it has (slime's ``RayTrainGroup``: ``async_train``, ``update_weights``...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..records import RolloutEngine
from ..utils.registry import Registry

if TYPE_CHECKING:
    from ..config import Config
    from ..train.rollout_share import RolloutBatch


@dataclass
class ClusterSpec:
    """What a placement needs besides the config: model folders, tokenizer, sizes."""

    base_path: Path  # the policy's (and reference model's) Hugging Face folder
    critic_path: Path | None  # initial critic weights (None: base_path)
    tokenizer: Any
    pad_id: int
    max_model_len: int  # longest prompt + response an engine must hold


class Cluster(Protocol):
    """Trainer ranks (policy, reference, critic) and rollout engine(s) of one run.

    Every trainer method runs on every rank with the same arguments and returns rank 0's result.
    A rollout reaches the ranks once (:meth:`score`); what is computed from it per token stays on
    the ranks, and the driver receives metrics only.
    """

    engine: RolloutEngine  # generation; a pool of engines behind the same interface in Ray mode
    has_reference: bool  # a frozen reference model is loaded (KL)
    has_critic: bool  # a value model is trained (estimators registered needs_critic)

    def score(self, batch: RolloutBatch) -> dict[str, float]:
        """Hand the rollout to the trainer ranks (Ray: put in the object store once, every rank
        reads it; local: the same object). Each rank takes its share of whole groups and computes
        their old / reference log-probs, critic values and advantages, kept there for :meth:`train`
        (``TrainWorker.score``). Returns the advantage statistics and the shaped-reward mean."""
        ...

    def train(self, rollout_id: int) -> dict[str, float]:
        """The critic's and the policy's ``train.num_steps_per_rollout`` optimizer steps on the
        rollout :meth:`score` handed over (``TrainWorker.train``); metrics averaged over the steps,
        with a critic ``time/train_critic``."""
        ...

    def before_train(self) -> None:
        """Hand the GPUs to the trainers (colocated engines sleep)."""
        ...

    def after_train(self) -> None:
        """Hand them back (engines wake up)."""
        ...

    def sync_weights(self, version: int) -> dict[str, float]:
        """Push the policy's weights into every engine; its results carry ``version`` from now on.
        Returns ``{"time/sync": seconds}``."""
        ...

    def save(self, directory: Path, optimizer: bool = True) -> None:
        """The trainers' part of a checkpoint (sharded model, with ``optimizer`` the optimizer
        state, HF folder)."""
        ...

    def load(self, directory: Path) -> list[str]:
        """Load the trainers' state; returns the models whose optimizer state was not in the
        checkpoint (``TrainWorker.load``)."""
        ...

    def shutdown(self) -> None: ...


PLACEMENTS: Registry[Callable[[Config, ClusterSpec], Cluster]] = Registry("placement", "cluster.mode")
PLACEMENTS.register("local", "reinforge.cluster.local:LocalCluster")
PLACEMENTS.register("ray", "reinforge.cluster.ray_cluster:RayCluster")


def build_cluster(cfg: Config, spec: ClusterSpec) -> Cluster:
    """The placement ``cluster.mode`` names, built (its module imported only now)."""
    return PLACEMENTS.get(cfg.cluster.mode)(cfg, spec)
