"""Derived random seeds: every stream of randomness in a run is seeded from a config seed and an
index (rollout id, request index, engine index), so a resumed run draws the same numbers.

``derive(base, stream, index) = base * stream + index``; distinct primes keep the streams of one
base seed apart. The constants are part of what makes resumption exact: changing one changes
every run's samples.
"""

from __future__ import annotations

ENGINE_ROLLOUT = 1_000_003  # engine sampling per rollout: derive(rollout.seed, ENGINE_ROLLOUT, rollout_id)
REQUEST = 1_000_003  # per-request seeds of server engines: derive(engine seed, REQUEST, request index)
ACTOR_SHUFFLE = 1_000_003  # actor mini-batch order: derive(train.seed, ACTOR_SHUFFLE, rollout_id)
CRITIC_SHUFFLE = 1_000_033  # critic mini-batch order: derive(train.seed, CRITIC_SHUFFLE, rollout_id)
EVAL_OFFSET = 10_000_000  # evaluation at step s samples with the engine seed of "rollout" EVAL_OFFSET + s
ENGINE_INDEX = 7919  # engine i of several adds ENGINE_INDEX * i to the rollout seed


def derive(base: int, stream: int, index: int) -> int:
    """The seed of item ``index`` of random stream ``stream`` under config seed ``base``."""
    return base * stream + index
