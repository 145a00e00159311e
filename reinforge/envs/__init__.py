"""Environments of multi-turn (agentic) rollouts: the interface (``base.py``), the tool-calling
environment (``tool_env.py``) and the shipped example environments. See docs/agents.md."""

from .base import ENVIRONMENTS, EnvContext, Environment, EnvironmentFailure, Step, Turn, load_environment

__all__ = ["ENVIRONMENTS", "EnvContext", "Environment", "EnvironmentFailure", "Step", "Turn", "load_environment"]
