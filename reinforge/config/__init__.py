"""Configuration: one dataclass per concern, a module per section (``model.py``, ``data.py``, ``rollout.py``,
``engine.py``, ``judge.py``, ``agent.py``, ``sandbox.py``, ``distill.py``, ``train.py``, ``eval.py``,
``cluster.py``, ``run.py``; ``learning.py``: reward, algorithm, offline methods, critic), each a
:class:`~.fields.Section`, composed into :class:`Config` (``root.py``), read from YAML plus ``key=value``
overrides (``loader.py``); every key's help and bounds sit beside its field (``fields.opt``) and
``docs/config.md`` is generated from them (``docs.py``)."""

from .agent import AgentConfig
from .cluster import ClusterConfig
from .data import DataConfig
from .engine import EngineConfig
from .eval import EvalConfig
from .fields import ConfigError
from .judge import JudgeConfig
from .learning import AlgoConfig, CriticConfig, OfflineConfig, RewardConfig
from .loader import (
    config_dict,
    config_from_dict,
    config_from_values,
    config_yaml,
    dump_config,
    load_config,
    parse_override,
    unused_keys,
)
from .model import ModelConfig
from .rollout import RolloutConfig
from .root import SECTIONS, Config
from .run import RunConfig
from .sandbox import SandboxConfig
from .train import TrainConfig

__all__ = [
    "ConfigError",
    "Config",
    "SECTIONS",
    "load_config",
    "config_from_dict",
    "config_from_values",
    "dump_config",
    "config_dict",
    "config_yaml",
    "unused_keys",
    "parse_override",
    "AgentConfig",
    "AlgoConfig",
    "ClusterConfig",
    "CriticConfig",
    "DataConfig",
    "EngineConfig",
    "EvalConfig",
    "JudgeConfig",
    "ModelConfig",
    "OfflineConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "SandboxConfig",
    "TrainConfig",
]
