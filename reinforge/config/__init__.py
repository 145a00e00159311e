"""Configuration: one dataclass per concern (``sections.py``: how a run runs;
``learning.py``: reward, algorithm, offline methods, critic; ``judge.py``, ``agent.py``, ``sandbox.py``),
composed into :class:`Config` (``root.py``),
read from YAML plus ``key=value`` overrides (``loader.py``); every key's help and bounds sit
beside its field (``fields.opt``) and ``docs/config.md`` is generated from them (``docs.py``)."""

from .agent import AgentConfig
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
from .root import SECTIONS, Config
from .sandbox import SandboxConfig
from .sections import (
    ClusterConfig,
    DataConfig,
    EngineConfig,
    EvalConfig,
    ModelConfig,
    RolloutConfig,
    RunConfig,
    TrainConfig,
)

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
