"""Reward functions and the manager that runs them over a rollout."""

from .extract import extract_answer
from .manager import RewardManager
from .functions import exact_match_reward, math_reward, reasoning_gym_reward

__all__ = ["RewardManager", "exact_match_reward", "extract_answer", "math_reward", "reasoning_gym_reward"]
