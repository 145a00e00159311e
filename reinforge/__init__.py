"""reinforge: reinforcement-learning post-training of large language models."""

__version__ = "0.1.0"
